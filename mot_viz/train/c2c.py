"""The networks of C2C (method.md §15): ``c2c``, C2C's own fuser (below), and ``c2c-pr``, a single projection path (the
MoT authors' projection baseline of C2C, method.md §15). The top N = min(L_S, L_T) layers of the two models aligned
from the last one down (target layer t reads source layer t + L_S − N); one MLP for K and one for V, the same for
every layer (as read in prosopher/MoT, alg/c2c), maps each token's source K (V) at that layer to the target's, in
place of the target's own. Below the top N layers the target keeps the cache of its own prefill of the context. With
N = L_T (every pair whose target is the shallower, as SmolLM2 → Gemma 3) the projection replaces the target's every
layer: its prefill would be overwritten whole, so it is not run, and the target answers from the projected cache with
no replay.
"""

from __future__ import annotations

import torch
from torch import nn

from ..engine.models import ModelSpec
from ..engine.mot import native_cache
from ..engine.layout import window_blocks
from .rival_caches import cache_loss, rotated, source_blocks, target_cache

NAME = "c2c-pr"  # the projection path
FUSER = "c2c"  # C2C's own fuser


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


# the recipe (prosopher/MoT configs/train_c2c_pr.json): projector_dim 1024, depth 2, mlp_ratio 4; keys are projected
# before rotation here (docs/decisions.md: a departure for pairs whose tokens and positions differ)
PROJECTION_DEFAULTS = {"dim": 1024, "depth": 2, "mlp_ratio": 4, "key_space": "pre_rope"}


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


class LayerFuser(nn.Module):
    """C2C's projector of one target layer, K or V (thu-nics/C2C, method.md §15): the target's own and the aligned
    source layer's vectors of each token concatenated, a GELU MLP, a projection to the target's width, a sigmoid weight
    per token and head, and the layer's gate: target + gate · weight · projection."""

    def __init__(self, source_width: int, target_width: int, heads: int, dim: int):
        super().__init__()
        self.heads = heads
        self.mlp = nn.Sequential(nn.Linear(source_width + target_width, dim), nn.GELU(), nn.Linear(dim, dim),
                                 nn.GELU())
        self.project = nn.Linear(dim, target_width)
        self.weight = nn.Linear(dim, heads)

    def forward(self, own: torch.Tensor, sent: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # [B, N, H]
        hidden = self.mlp(torch.cat([own, sent], dim=-1))
        b, n, width = own.shape
        weight = torch.sigmoid(self.weight(hidden)).repeat_interleave(width // self.heads, dim=-1)
        return own + gate * weight * self.project(hidden)


class Fuser(nn.Module):
    """C2C's fuser: a LayerFuser for K and one for V at each of the top N target layers (last aligned to last), each
    layer's gate a logit sampled as a Gumbel-sigmoid at `temperature` in training and hard (open where the logit is
    above 0) at evaluation."""

    def __init__(self, source: ModelSpec, target: ModelSpec, arch: dict):
        super().__init__()
        self.source_layers, self.target_layers = projected_layers(source, target)
        self.key_space = arch["key_space"]
        make = lambda: nn.ModuleList(LayerFuser(source.kv_hidden, target.kv_hidden, target.num_kv_heads, arch["dim"])
                                     for _ in self.target_layers)
        self.keys, self.values = make(), make()
        self.gate_logits = nn.Parameter(torch.full((len(self.target_layers),), float(arch["gate_init"])))
        self.temperature_range = (float(arch["temperature_start"]), float(arch["temperature_end"]))
        self.temperature = self.temperature_range[0]

    def gates(self) -> torch.Tensor:
        if not self.training:
            return (self.gate_logits > 0).float()
        u = torch.rand_like(self.gate_logits).clamp(1e-6, 1 - 1e-6)
        return torch.sigmoid((self.gate_logits + torch.log(u) - torch.log1p(-u)) / self.temperature)

    def forward(self, own_k, own_v, sent_k, sent_v):  # blocks [B, N, layers, H]
        gates = self.gates()
        fuse = lambda fusers, own, sent: torch.stack(
            [f(own[:, :, i], sent[:, :, i], gates[i]) for i, f in enumerate(fusers)], dim=2)
        return fuse(self.keys, own_k, sent_k), fuse(self.values, own_v, sent_v)


# C2C's projector is 1,024 wide (~250M parameters for this pair); here 128 wide, under 15 MB in fp16
# (docs/decisions.md); the gates start open at logit 1.5 (the MoT authors' c2c) and anneal 1.0 → 0.1 (C2C's)
FUSER_DEFAULTS = {"dim": 128, "gate_init": 1.5, "temperature_start": 1.0, "temperature_end": 0.1,
                  "key_space": "pre_rope"}


def fused_cache(net: Fuser, src, source, target, native=None):
    """The target's own cache of the context (`native`, computed when not given) with the top N layers fused."""
    native = native_cache(target, src.target_ids) if native is None else native
    p = len(target.prefix_ids)
    own_k, own_v = window_blocks(native, net.target_layers, p)
    own_k = rotated(target, own_k, net.target_layers, p, net.key_space, inverse=True)
    sent_k, sent_v = source_blocks(src, source, net.source_layers, net.key_space)
    keys, values = net(own_k, own_v, sent_k, sent_v)
    top = target_cache(target, keys, values, net.key_space, net.target_layers)
    return [*native[:net.target_layers[0]], *top]


_fused_ce = cache_loss(fused_cache)


def fuser_loss(net, source, target, row, progress, other_row=None):
    """The target's next-token cross-entropy over its fused cache, the gates' temperature annealed with training."""
    start, end = net.temperature_range
    net.temperature = start + (end - start) * progress
    return _fused_ce(net, source, target, row, progress)


NETWORKS = {NAME: (ProjectionPath, PROJECTION_DEFAULTS), FUSER: (Fuser, FUSER_DEFAULTS)}
LOSSES = {NAME: cache_loss(projected_cache),  # the recipe's: the target's cross-entropy over the projected cache
          FUSER: fuser_loss}
