"""Control windows built from the native and translated window blocks (method.md §9.1–§9.2).

All rescaling is per (token, layer) vector, with norms over the H axis (all KV heads concatenated).
"""

from __future__ import annotations

import torch


def _norm(x: torch.Tensor) -> torch.Tensor:
    return x.norm(dim=-1, keepdim=True)


def dir_only(native: torch.Tensor, translated: torch.Tensor) -> torch.Tensor:
    """Translated direction with the native norm. Blocks [B, N, W, H]."""
    return translated * _norm(native) / _norm(translated).clamp(min=1e-8)


def mag_only(native: torch.Tensor, translated: torch.Tensor) -> torch.Tensor:
    """Native direction with the translated norm."""
    return native * _norm(translated) / _norm(native).clamp(min=1e-8)


def _draw(native: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """ε ~ N(0, I) shaped like `native`, drawn from a CPU generator and moved to native's device: the same draw on
    every device (a seeded CPU generator cannot draw on CUDA, and a CUDA one would draw other numbers)."""
    return torch.randn(native.shape, generator=generator, dtype=native.dtype).to(native.device)


def random_window(native: torch.Tensor, translated: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Norm-matched random control: N + ε/‖ε‖ · ‖Tr − N‖, ε ~ N(0, I), per (token, layer) vector."""
    eps = _draw(native, generator)
    return native + eps / _norm(eps).clamp(min=1e-6) * _norm(translated - native)


def random_control_window(native_k: torch.Tensor, native_v: torch.Tensor, translated_k: torch.Tensor,
                          translated_v: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The norm-matched random control of a translated window (method.md §9.2): K drawn first, then V, from one
    generator seeded with `seed` (the Answers page, the Shift analysis page and the evaluator draw the same)."""
    gen = torch.Generator().manual_seed(seed)
    return random_window(native_k, translated_k, gen), random_window(native_v, translated_v, gen)


def relative_perturbation(native: torch.Tensor, size: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """N + a random direction scaled to size·‖N‖: the training-free sweep's injected window (method.md §9.1 (b))."""
    eps = _draw(native, generator)
    return native + eps / _norm(eps).clamp(min=1e-6) * size * _norm(native)
