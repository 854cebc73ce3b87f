"""The processor of ``interlat``, a latent hand-off (Interlat as the MoT authors compare with it, method.md §15). The
source's last-layer hidden states over the context (one per source token) pass through a small processor — a linear
to the target's hidden size, self-attention over the context, LayerNorms, an adaptive projection, values clamped to
±10 — and enter the target as its input embeddings: the target runs a full forward over those positions, in the
text's tokens' place, behind its own BOS, and answers from that cache. Its cache is the target's own computation over
other positions than the text's, so no layer of it compares with native's position by position.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..engine import hf
from ..engine.alignment import decode, encode
from ..engine.models import LoadedModel, ModelSpec
from ..engine.mot import empty_context_cache, native_cache
from .rival_caches import answer_logits

NAME = "interlat"
CLAMP = 10.0  # the processor's output bound (the recipe's)


class AdaptiveProjection(nn.Module):
    """x · scale, plus a GELU MLP of it, times an output scale (both scales learnt; the recipe's initialisation)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.2))
        self.output_scale = nn.Parameter(torch.tensor(0.1))
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden), nn.Linear(hidden, hidden))
        nn.init.normal_(self.mlp[0].weight, std=0.02)
        nn.init.zeros_(self.mlp[0].bias)
        nn.init.xavier_uniform_(self.mlp[3].weight, gain=1e-2)
        nn.init.zeros_(self.mlp[3].bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaled = x * self.scale
        return (scaled + self.mlp(scaled)) * self.output_scale


def divisor_heads(hidden: int, wanted: int) -> int:
    """The most heads up to `wanted` that divide `hidden`."""
    return next(h for h in range(min(wanted, hidden), 0, -1) if hidden % h == 0)


class HiddenProcessor(nn.Module):
    """Source hidden states [B, N_s, hidden_S] → target input embeddings [B, N_s, hidden_T]."""

    def __init__(self, source: ModelSpec, target: ModelSpec, arch: dict):
        super().__init__()
        width = target.hidden_size
        self.project = nn.Linear(source.hidden_size, width) if source.hidden_size != width else nn.Identity()
        self.attention = nn.MultiheadAttention(width, divisor_heads(width, arch["heads"]), dropout=arch["dropout"],
                                               batch_first=True)
        nn.init.xavier_uniform_(self.attention.in_proj_weight, gain=1 / math.sqrt(3))
        nn.init.zeros_(self.attention.in_proj_bias)
        nn.init.zeros_(self.attention.out_proj.bias)
        self.pre_norm = nn.LayerNorm(width, eps=1e-6)
        self.post_norm = nn.LayerNorm(width, eps=1e-6)
        self.adaptive = AdaptiveProjection(width)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        normed = self.pre_norm(self.project(hidden))
        attended = self.attention(normed, normed, normed, need_weights=False)[0]
        return self.adaptive(self.post_norm(normed + attended)).clamp(-CLAMP, CLAMP)


NETWORKS = {NAME: (HiddenProcessor, {"heads": 8, "dropout": 0.1})}  # the recipe's processor, whole


def source_hidden(source: LoadedModel, text: str) -> torch.Tensor:
    """The source's last-layer hidden states [1, N_s, hidden_S] over the context's own source tokens (no grad)."""
    ids = source.ids_tensor(source.prefix_ids + encode(source.tokenizer, text))
    with torch.no_grad():
        hidden = source.model.base_model(input_ids=ids, use_cache=False).last_hidden_state
    return hidden[:, len(source.prefix_ids):]


def latent_forward(target: LoadedModel, embeds: torch.Tensor) -> list[hf.KV]:
    """The target's cache from its forward over input embeddings [1, N, hidden_T], behind its own BOS prefix."""
    return hf.run(target.model, None, empty_context_cache(target), logits_to_keep=None, embeds=embeds).kv


def latent_cache(net: HiddenProcessor, hidden: torch.Tensor, target: LoadedModel) -> list[hf.KV]:
    """The target's cache from its forward over the processed latents of the source's hidden states."""
    return latent_forward(target, net(hidden))


def loss(net, source, target, row, progress, other_row=None):
    """Interlat's loss (as read in prosopher/MoT, alg/interlat): the target's cross-entropy over the latent cache,
    plus a plan-similarity term (0.7·KL + 0.3·(1 − cosine) of its next-token distributions against those over its
    own cache of the text) and a margin (0.69 − JS) against a mismatched latent (`other_row`: another row, whose
    context's hidden states the recipe takes from the next row of its batch; none: the term is left out), weighted as
    the recipe weighs them by their size."""
    hidden = source_hidden(source, decode(target.tokenizer, row.context[0].tolist()))
    logits = answer_logits(target, latent_cache(net, hidden, target), row)
    ce = F.cross_entropy(logits, row.labels[0])
    with torch.no_grad():
        plan = answer_logits(target, native_cache(target, row.context), row)
    kl = F.kl_div(F.log_softmax(logits, -1), F.softmax(plan, -1).clamp_min(1e-8), reduction="batchmean")
    cosine = F.cosine_similarity(F.softmax(logits, -1).reshape(-1), F.softmax(plan, -1).reshape(-1), dim=0)
    plan_loss = 0.7 * kl + 0.3 * (1 - cosine)
    plan_weight = 0.01 + 0.04 * min(1.0, max(0.0, plan_loss.detach().item() / 4.0))
    total, terms = ce + plan_weight * plan_loss, {"ce": ce.detach().item(), "plan": plan_loss.detach().item()}
    if other_row is not None:
        other = source_hidden(source, decode(target.tokenizer, other_row.context[0].tolist()))
        with torch.no_grad():
            wrong = answer_logits(target, latent_cache(net, other, target), row)
        p, q = F.softmax(logits, -1).clamp_min(1e-8), F.softmax(wrong, -1).clamp_min(1e-8)
        mid = 0.5 * (p + q)
        js = 0.5 * F.kl_div(p.log(), mid, reduction="batchmean") + 0.5 * F.kl_div(q.log(), mid, reduction="batchmean")
        margin = torch.clamp(0.69 - js, min=0.0)
        total = total + (0.01 + 0.49 * min(1.0, max(0.0, margin.detach().item() / 0.69))) * margin
        terms["contrast"] = margin.detach().item()
    return total, terms


LOSSES = {NAME: loss}
