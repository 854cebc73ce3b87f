"""The full-depth direct map's per-layer maps (method.md §15): each window target layer gets its own affine map, from
its own channel's source K and V together, or, at the paper's top-k recipe, its K from the K of the k source layers
listed for it (linear_key_sources) and its V from the V of those listed for its V (linear_value_sources).

mot_viz.train.direct chooses the listed layers; engine.translator's LinearKVMap holds the maps and calls these.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError

SourceLists = tuple[tuple[int, ...], ...]  # by window layer, the source layers its map reads


def source_lists(lists) -> SourceLists:
    """linear_key_sources / linear_value_sources as tuples (JSON gives lists), each a list of distinct layers."""
    if not isinstance(lists, (list, tuple)) or not all(
            isinstance(l, (list, tuple)) and l and len(set(l)) == len(l)
            and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in l) for l in lists):
        raise ConfigError(f"a per-layer map's source lists must be lists of distinct layer indices, got {lists!r}")
    return tuple(tuple(l) for l in lists)


def check_source_lists(key_sources: SourceLists, value_sources: SourceLists, window: int, per_layer: bool) -> None:
    """Listed source layers belong to a per-layer map, one list per window layer for K and for V, all of one length."""
    if (key_sources or value_sources) and not (
            per_layer and len(key_sources) == len(value_sources) == window
            and len({len(s) for s in key_sources + value_sources}) == 1):
        raise ConfigError(f"linear_key_sources and linear_value_sources list the source layers of each of the "
                          f"{window} window layers of a per-layer map (linear_per_layer), the same number "
                          "for every layer")


class PerLayerLinear(nn.Module):
    """W affine maps side by side: [B, N, W, F] -> [B, N, W, O], window layer w through weight[w] and bias[w]
    (zeros until fitted: an unfitted map writes nothing)."""

    def __init__(self, window: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(window, in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(window, out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bnwf,wfo->bnwo", x, self.weight) + self.bias


def source_positions(key_sources: SourceLists, value_sources: SourceLists, input_layers: tuple[int, ...]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each window layer's listed source layers stand among the translator's input layers (MoT.input_layers):
    (K positions, V positions), each [W, k]."""
    missing = sorted({l for s in key_sources + value_sources for l in s} - set(input_layers))
    if missing:
        raise ConfigError(f"the per-layer map reads source layers {missing}, which are not among the translator's "
                          f"input layers {list(input_layers)}: add them to linear_extra_layers")
    where = {layer: i for i, layer in enumerate(input_layers)}
    return (torch.tensor([[where[l] for l in s] for s in key_sources]),  # (W, k)
            torch.tensor([[where[l] for l in s] for s in value_sources]))  # (W, k)


def listed_inputs(keys: torch.Tensor, values: torch.Tensor, key_positions: torch.Tensor,
                  value_positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Aligned source blocks [B, N, L_in, H_S] -> each window layer's K input (its key sources' K) and V input (its
    value sources' V), each [B, N, W, k·H_S]."""
    return (keys[:, :, key_positions.to(keys.device)].flatten(3),
            values[:, :, value_positions.to(values.device)].flatten(3))


def per_layer_reads(source_count: int, listed: bool) -> str:
    """What a per-layer map reads, in words (the app's explanations)."""
    if listed:
        return (f"each token's aligned source K (for a target layer's K) and V (for its V) of the {source_count} "
                "source layers that predict that target layer best on held-out text (a map per layer)")
    return "each token's aligned source K and V of each window layer's own source layer (a map per layer)"
