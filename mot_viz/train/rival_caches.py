"""The caches the networks trained here for other ways of sharing read and write (method.md §15): the source's K/V
of a context aligned to the target's tokens, and a target cache assembled from K/V blocks behind the target's own BOS;
keys in either key space (pre_rope: un-rotated before the network, rotated with the target's own RoPE after); a
training row and the target's cross-entropy on it, which every network's loss starts from."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine import hf
from ..engine.alignment import apply_alignment
from ..engine.layout import window_blocks
from ..engine.models import LoadedModel
from ..engine.mot import SourceContext, after_prefix, per_layer_kv, prepare_source, rotate_block

KEY_SPACES = ("pre_rope", "post_rope")  # the networks' key space (architecture key_space)


def rotated(lm: LoadedModel, keys: torch.Tensor, layers, prefix_len: int, space: str, inverse: bool) -> torch.Tensor:
    """A key block in `space`: pre_rope un-rotates (inverse) or rotates with the model's own RoPE; post_rope as is."""
    return rotate_block(lm, layers, keys, prefix_len, inverse) if space == "pre_rope" else keys


def source_blocks(src: SourceContext, source: LoadedModel, layers, space: str = "post_rope"
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The source's K and V blocks [1, N_t, len(layers), H_S] of a context at `layers`, aligned to the target's
    tokens (method.md §2); keys un-rotated for the pre_rope key space."""
    keys, values = window_blocks(src.source_kv, layers)
    keys = rotated(source, keys, layers, src.source_prefix_len, space, inverse=True)
    return apply_alignment(keys, src.alignment), apply_alignment(values, src.alignment)


def target_cache(target: LoadedModel, keys: torch.Tensor, values: torch.Tensor, space: str = "post_rope",
                 layers=None) -> list[hf.KV]:
    """The target's cache at `layers` (default every layer) from K and V blocks [1, N_t, len(layers), H_T] (keys
    rotated to the target's own positions for pre_rope), each behind its own BOS prefix."""
    layers = tuple(range(target.spec.num_layers)) if layers is None else tuple(layers)
    keys = rotated(target, keys, layers, len(target.prefix_ids), space, inverse=False)
    return after_prefix(target, per_layer_kv(keys, values, target.spec.num_kv_heads), layers)


@dataclass(frozen=True)
class Row:
    """One training row, target tokens: the context the source reads, the prompt the target reads over the
    network's cache and the next tokens it is scored on."""

    context: torch.Tensor  # [1, N_c]
    prompt: torch.Tensor  # [1, 64]
    labels: torch.Tensor  # [1, 64]


def answer_logits(target: LoadedModel, kv, row: Row) -> torch.Tensor:
    """The target's logits [64, vocab] over the row's prompt, read over `kv` (float32)."""
    return hf.run(target.model, row.prompt, kv).logits[0].float()


def answer_ce(target: LoadedModel, kv, row: Row) -> torch.Tensor:
    """The target's mean next-token cross-entropy on the row's labels, reading the prompt over `kv`."""
    return torch.nn.functional.cross_entropy(answer_logits(target, kv, row), row.labels[0])


def source_side(source: LoadedModel, target: LoadedModel, row: Row) -> SourceContext:
    """The source's prefill of the row's context, aligned to the target's tokens (no grad: the LMs are frozen)."""
    return prepare_source(None, source, target, row.context, with_attention=False)


def cache_loss(build_cache):
    """The loss of a network that writes the target's cache (`build_cache(net, source context, source, target)`):
    the target's cross-entropy over it."""

    def loss(net, source, target, row, progress, other_row=None):
        ce = answer_ce(target, build_cache(net, source_side(source, target, row), source, target), row)
        return ce, {"ce": ce.detach().item()}

    return loss
