"""The K/V error of a cache against the target's native cache, per token and per layer: what the Per-layer cache error
page shows (mot_viz.analysis.cache_metrics), what layer_error.csv and patching.csv record beside each layer
(mot_viz.eval.layer_error, mot_viz.eval.patching) and what the other pages' error columns read.

One token's K (or V) in one layer is the vector of all its KV heads concatenated, ``H = n_kv·d_h`` — the translator's
block layout (mot_viz.engine.layout).
"""

from __future__ import annotations

import torch

from .channels import Channels
from .layout import context_positions, to_block
from .mot import Translation

KV_NAMES = ("K", "V")
COMPARISONS = {
    "translated": "translated window (what the translator wrote) vs native",
    "replayed": "replayed cache (what the target keeps after injection) vs native",
}
_EPS = 1e-12


def token_vectors(x: torch.Tensor) -> torch.Tensor:
    """One layer's K or V [1, n_kv, N, d_h] -> per-token vectors [N, n_kv·d_h] (float32)."""
    return to_block([x])[0, :, 0].float()


def per_token_errors(candidate: torch.Tensor, reference: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token MSE, relative L2 error ‖c−r‖/‖r‖ and cosine of two [N, H] sets of vectors; each [N]."""
    diff = candidate - reference
    ref_norm = reference.norm(dim=-1)
    cos = (candidate * reference).sum(-1) / (candidate.norm(dim=-1) * ref_norm).clamp(min=_EPS)
    return {"mse": diff.pow(2).mean(-1), "rel_l2": diff.norm(dim=-1) / ref_norm.clamp(min=_EPS), "cosine": cos}


def layer_errors(candidate: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """Whole-layer MSE, relative L2 error (Frobenius) and mean per-token cosine of two [N, H] sets."""
    diff = candidate - reference
    return {
        "mse": float(diff.pow(2).mean()),
        "rel_l2": float(diff.norm() / reference.norm().clamp(min=_EPS)),
        "cosine": float(per_token_errors(candidate, reference)["cosine"].mean()),
    }


def compared_caches(translation: Translation, channels: Channels, comparison: str) -> dict[int, tuple]:
    """Target layer -> (candidate K/V, native K/V) over the N_t context positions, for one comparison."""
    if translation.native_kv is None:
        raise ValueError("this translation was computed without the native cache")
    p = translation.prefix_len  # the target's BOS prefix is never translated: compare context positions only
    native = [context_positions(kv, p) for kv in translation.native_kv]
    if comparison == "translated":
        return {t: (translation.injected_kv[i], native[t]) for i, t in enumerate(channels.target_layers)}
    if comparison == "replayed":
        return {t: (context_positions(kv, p), native[t]) for t, kv in enumerate(translation.mixed_kv)}
    raise ValueError(f"comparison must be one of {tuple(COMPARISONS)}, got {comparison!r}")


def kv_cosine(a: list, b: list) -> float:
    """Cosine between two caches, all layers' K and V flattened together (method.md §8 'Cosine')."""
    flat_a = torch.cat([t.flatten().float() for kv in a for t in kv])
    flat_b = torch.cat([t.flatten().float() for kv in b for t in kv])
    return float(torch.nn.functional.cosine_similarity(flat_a, flat_b, dim=0))
