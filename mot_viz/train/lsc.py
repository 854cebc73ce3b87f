"""The network of ``lsc``, a global shared latent space (LSC as the MoT authors compare with it, method.md §15). One
translator per model, not per pair: `to_shared` maps a token's K (and apart its V) at every layer of its model — a
[layers, H] block — into a latent of `slots` × `slot_dim`, and `from_shared` maps a latent out to that model's every
layer. The source's cache goes through the source's `to_shared` and the target's `from_shared` into the target's
full-depth cache, used as it is: no target prefill, no replay.

Each direction reads and writes through the same latent, so any model with its two translators can exchange caches
with any other without a translator per pair; the network trained here holds the source's `to_shared` and the
target's `from_shared` of one direction (docs/decisions.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..engine.models import ModelSpec
from ..engine.translator import CrossAttentionBlock
from .rival_caches import cache_loss, source_blocks, target_cache

NAME = "lsc"


class LayerStack(nn.Module):
    """The recipe's stack over a model's layers: a running stream starts from layer 0's projection and, layer by
    layer, cross-attends (over the context's tokens) to that layer's projection; every layer's stream is
    concatenated, normed and projected out. [B, N, layers, in] → [B, N, out]."""

    def __init__(self, layers: int, dim: int, heads: int, mlp_ratio: int, out: int):
        super().__init__()
        self.blocks = nn.ModuleList(CrossAttentionBlock(dim, heads, mlp_ratio) for _ in range(layers))
        self.norm = nn.LayerNorm(layers * dim)
        self.out = nn.Linear(layers * dim, out)

    def forward(self, projected: torch.Tensor) -> torch.Tensor:  # (B, N, layers, dim)
        hidden, collected = projected[:, :, 0], []
        for i, block in enumerate(self.blocks):
            hidden = block(hidden, projected[:, :, i])
            collected.append(hidden)
        return F.gelu(self.out(self.norm(torch.cat(collected, dim=-1))))


class ToShared(nn.Module):
    """A model's K (or V) block [B, N, L, H] → latent [B, N, slots, slot_dim]."""

    def __init__(self, spec: ModelSpec, arch: dict):
        super().__init__()
        self.slots, self.slot_dim = arch["slots"], arch["slot_dim"]
        self.norm = nn.LayerNorm(spec.kv_hidden)
        self.proj = nn.Linear(spec.kv_hidden, arch["dim"])
        self.stack = LayerStack(spec.num_layers, arch["dim"], arch["heads"], arch["mlp_ratio"],
                                self.slots * self.slot_dim)

    def forward(self, block: torch.Tensor) -> torch.Tensor:
        b, n = block.shape[:2]
        shared = self.stack(F.gelu(self.proj(self.norm(block))))
        return shared.view(b, n, self.slots, self.slot_dim)


class FromShared(nn.Module):
    """A latent [B, N, slots, slot_dim] → a model's K (or V) block [B, N, L, H]."""

    def __init__(self, spec: ModelSpec, arch: dict):
        super().__init__()
        self.layers, self.hidden, self.dim = spec.num_layers, spec.kv_hidden, arch["dim"]
        flat = arch["slots"] * arch["slot_dim"]
        self.norm = nn.LayerNorm(flat)
        self.proj = nn.Linear(flat, self.layers * self.dim)
        self.stack = LayerStack(self.layers, self.dim, arch["heads"], arch["mlp_ratio"], self.layers * self.hidden)

    def forward(self, shared: torch.Tensor) -> torch.Tensor:
        b, n = shared.shape[:2]
        expanded = F.gelu(self.proj(self.norm(shared.reshape(b, n, -1)))).view(b, n, self.layers, self.dim)
        return self.stack(expanded).view(b, n, self.layers, self.hidden)


class SharedLatent(nn.Module):
    """The source's to_shared and the target's from_shared, K and V apart."""

    def __init__(self, source: ModelSpec, target: ModelSpec, arch: dict):
        super().__init__()
        self.key_space = arch["key_space"]
        self.source_layers, self.target_layers = tuple(range(source.num_layers)), tuple(range(target.num_layers))
        self.key_to_shared, self.value_to_shared = ToShared(source, arch), ToShared(source, arch)
        self.key_from_shared, self.value_from_shared = FromShared(target, arch), FromShared(target, arch)

    def forward(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.key_from_shared(self.key_to_shared(keys)), self.value_from_shared(self.value_to_shared(values))


# the recipe (prosopher/MoT configs/train_lsc.json): translator_dim 512, 16 heads, mlp_ratio 4, 32 slots × 128; here
# narrower for two CPU cores and a shipped file under 15 MB (docs/decisions.md records the departure)
DEFAULTS = {"dim": 28, "heads": 4, "mlp_ratio": 4, "slots": 16, "slot_dim": 32, "key_space": "pre_rope"}


def latent_cache(net: SharedLatent, src, source, target):
    """The target's full-depth cache of the context through the shared latent."""
    keys, values = source_blocks(src, source, net.source_layers, net.key_space)
    keys, values = net(keys, values)
    return target_cache(target, keys, values, net.key_space)


NETWORKS = {NAME: (SharedLatent, DEFAULTS)}
LOSSES = {NAME: cache_loss(latent_cache)}  # the recipe's: the target's next-token cross-entropy over its cache
