"""The network of ``c2c-pr``, a single projection path (the MoT authors' projection baseline of C2C, method.md §15). The top
N = min(L_S, L_T) layers of the two models aligned from the last one down (target layer t reads source layer
t + L_S − N); one MLP for K and one for V, the same for every layer (as read in prosopher/MoT, alg/c2c), maps each
token's source K (V) at that layer to the target's, in place of the target's own. Below the top N layers the target
keeps the cache of its own prefill of the context. With N = L_T (every pair whose target is the shallower, as
SmolLM2 → Gemma 3) the projection replaces the target's every layer: its prefill would be overwritten whole, so it is
not run, and the target answers from the projected cache with no replay.
"""

from __future__ import annotations

import torch
from torch import nn

from ..engine.models import ModelSpec
from ..engine.mot import native_cache
from .rival_caches import cache_loss, source_blocks, target_cache

NAME = "c2c-pr"


def projected_layers(source: ModelSpec, target: ModelSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(source layers, target layers) of the projection: the top N = min(L_S, L_T) of each, last aligned to last."""
    n = min(source.num_layers, target.num_layers)
    return (tuple(range(source.num_layers - n, source.num_layers)),
            tuple(range(target.num_layers - n, target.num_layers)))


def projection_mlp(in_width: int, out_width: int, dim: int, depth: int, mlp_ratio: int) -> nn.Sequential:
    """LayerNorm, then depth − 1 GELU layers (the first max(dim, out) wide, the next max(that, out · ratio)), then a
    linear to the output width (the recipe's projector)."""
    layers: list[nn.Module] = [nn.LayerNorm(in_width)]
    width, inner = in_width, max(dim, out_width)
    for _ in range(depth - 1):
        layers += [nn.Linear(width, inner), nn.GELU()]
        width, inner = inner, max(inner, out_width * max(1, mlp_ratio))
    return nn.Sequential(*layers, nn.Linear(width, out_width))


class ProjectionPath(nn.Module):
    """Source K and V blocks [B, N, layers, H_S] → target blocks [B, N, layers, H_T], one MLP each."""

    def __init__(self, source: ModelSpec, target: ModelSpec, arch: dict):
        super().__init__()
        self.source_layers, self.target_layers = projected_layers(source, target)
        self.key_space = arch["key_space"]
        make = lambda: projection_mlp(source.kv_hidden, target.kv_hidden, arch["dim"], arch["depth"],
                                      arch["mlp_ratio"])
        self.keys, self.values = make(), make()

    def forward(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys(keys), self.values(values)


NETWORK = ProjectionPath
# the recipe (prosopher/MoT configs/train_c2c_pr.json): projector_dim 1024, depth 2, mlp_ratio 4; keys are projected
# before rotation here (docs/decisions.md: a departure for pairs whose tokens and positions differ)
DEFAULTS = {"dim": 1024, "depth": 2, "mlp_ratio": 4, "key_space": "pre_rope"}


def projected_cache(net: ProjectionPath, src, source, target, native=None):
    """The target's cache of the context: the projection at the top N layers, the target's own prefill (`native`,
    computed when not given) below them where N < L_T."""
    keys, values = source_blocks(src, source, net.source_layers, net.key_space)
    keys, values = net(keys, values)
    top = target_cache(target, keys, values, net.key_space, net.target_layers)
    first = net.target_layers[0]
    if not first:
        return top
    native = native_cache(target, src.target_ids) if native is None else native
    return [*native[:first], *top]


loss = cache_loss(projected_cache)  # the recipe's: the target's next-token cross-entropy over the projected cache
