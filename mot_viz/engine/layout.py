"""The one place where per-layer KV tensors and the translator's block layout are converted (method.md §1)."""

from __future__ import annotations

import torch


def to_block(per_layer: list[torch.Tensor]) -> torch.Tensor:
    """W tensors [B, n_kv, N, d_h] -> block [B, N, W, n_kv·d_h] (head index outer, head_dim inner)."""
    flat = [t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1) for t in per_layer]  # each (B, N, H)
    return torch.stack(flat, dim=2)


def context_positions(kv: tuple[torch.Tensor, torch.Tensor], prefix_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's K and V [B, n_kv, N, d_h] without the first `prefix_len` positions (a BOS prefix is never translated)."""
    return kv[0][:, :, prefix_len:], kv[1][:, :, prefix_len:]


def window_blocks(kv: list[tuple[torch.Tensor, torch.Tensor]], layers, prefix_len: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V blocks [B, N, W, H] of a cache's context positions (after a BOS prefix) at the given layers."""
    context = [context_positions(kv[l], prefix_len) for l in layers]
    return to_block([k for k, _ in context]), to_block([v for _, v in context])


def from_block(block: torch.Tensor, num_kv_heads: int) -> list[torch.Tensor]:
    """Block [B, N, W, H] -> W tensors [B, n_kv, N, H/n_kv]."""
    b, n, w, h = block.shape
    return [block[:, :, i].reshape(b, n, num_kv_heads, h // num_kv_heads).transpose(1, 2) for i in range(w)]
