"""Several readers, one hub: a document's shards, each read by its own source agent, composed in one target cache.

Each shard's target tokens are encoded on their own, so the document's target ids are the shards' ids one after
another (after the target's BOS prefix, once) and every shard starts at a known offset o_i. Each source agent
prefills its shard alone (it never sees the others) and its window is translated as usual (mot.prepare_source,
mot.translate_window); the translated keys come out rotated at positions P..P+n_i−1, so they are un-rotated there and
rotated again at P+o_i..P+o_i+n_i−1 (a RoPE model's keys carry their position only in that rotation). Each shard's
sparse indices (from its own source's attention) are shifted by o_i into the document's grid. One replay of the
whole document (method.md §6) with the composed window and indices gives the hub's cache: its dense bottom layers
(below num_bottom_full_attn) attend across the whole document, while its sparse layers and the window read only their
own shard and the BOS prefix, as the shard's source did; the question, appended later, attends to every position.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..errors import ConfigError, ContextError
from . import hf
from .channels import sparse_source_layer
from .models import LoadedModel, kv_cache_bytes
from .mot import (MoT, SourceContext, after_prefix, check_finite, check_pair, per_layer_kv, prepare_source, replay,
                  rotate_block, sparse_indices, target_context_ids, translate_direct, translate_window)


@dataclass
class ShardedTranslation:
    """A document read shard by shard by separate source agents and replayed once by the target (the hub)."""

    target_ids: torch.Tensor  # [1, N] the shards' target tokens one after another (no BOS)
    offsets: tuple[int, ...]  # o_i: where each shard's tokens start in target_ids
    sources: list[SourceContext]  # each agent's own context: its shard alone, aligned to that shard's target tokens
    window_keys: torch.Tensor  # [1, N, W, H_T] the composed injected keys, rotated at the document's positions
    window_values: torch.Tensor  # [1, N, W, H_T]
    sparse_indices: dict[int, torch.Tensor]  # target layer -> [1, 1, P + N, P + k] over the document
    mixed_kv: list[hf.KV]  # the hub's replayed cache, all layers, [1, n_kv_T, P + N, d_T]
    prefix_len: int  # P: the target's BOS positions (never translated)
    # seconds per stage: "source_prefill" and "alignment" summed over the agents, "source_prefill_max" the slowest
    # agent's (the agents' wall time when they read in parallel), "translator" summed, "replay" the one replay
    # (composing the indices included)
    timings: dict[str, float] = field(default_factory=dict)
    shard_timings: list[dict[str, float]] = field(default_factory=list)  # each agent's alignment, prefill, translator
    source_bytes: tuple[int, ...] = ()  # fp16 bytes of each agent's cache of its shard (its BOS prefix included)
    hub_bytes: int = 0  # fp16 bytes of the hub's cache of the document (its BOS prefix included)

    @property
    def lengths(self) -> tuple[int, ...]:
        """n_i: each shard's target tokens."""
        return tuple(int(src.target_ids.shape[1]) for src in self.sources)


def place_keys(target: LoadedModel, layers, keys: torch.Tensor, prefix_len: int, offset: int) -> torch.Tensor:
    """Keys [1, n, W, H] rotated at positions P..P+n−1 -> the same keys rotated at P+offset..P+offset+n−1.

    Un-rotating and rotating again (rather than rotating by `offset` alone) also holds for a rotary table with an
    attention scale other than 1, whose rotations do not compose."""
    if offset == 0:
        return keys
    unrotated = rotate_block(target, layers, keys, prefix_len, inverse=True)
    return rotate_block(target, layers, unrotated, prefix_len + offset, inverse=False)


def compose_indices(per_shard: list[torch.Tensor], offsets: tuple[int, ...], lengths: tuple[int, ...],
                    prefix_len: int) -> torch.Tensor:
    """Each shard's sparse indices [1, 1, P + n_i, P + k_i] (mot.with_prefix's grid) -> [1, 1, P + N, P + k] over the
    document, k = max k_i.

    Prefix columns (< P) stay; a shard's context index c (P ≤ c < P + n_i) becomes c + o_i; its sentinel (P + n_i, the
    duplicates' and the padding's) becomes the document's sentinel P + N, which is always masked, as is the padding
    of a shard with fewer than k indices. Every shard's queries thus see the prefix and keys of their own shard only.
    The prefix rows are the first shard's (they attend to the prefix only, the same in every shard).
    """
    sentinel = prefix_len + sum(lengths)
    width = max(idx.shape[-1] for idx in per_shard)

    def shifted(idx: torch.Tensor, offset: int, n: int) -> torch.Tensor:
        idx = torch.where(idx >= prefix_len + n, sentinel, torch.where(idx >= prefix_len, idx + offset, idx))
        return torch.nn.functional.pad(idx, (0, width - idx.shape[-1]), value=sentinel)

    rows = [shifted(per_shard[0][:, :, :prefix_len], 0, lengths[0])]
    rows += [shifted(idx[:, :, prefix_len:], o, n) for idx, o, n in zip(per_shard, offsets, lengths, strict=True)]
    return torch.cat(rows, dim=2)


def check_shards(mot: MoT, source: LoadedModel, target: LoadedModel, shard_texts: list[str]) -> None:
    """Raise unless the shards can be translated and composed: the pair is the checkpoint's (check_pair), there is a
    shard, and several shards need a target with rotary embeddings (ConfigError), whose keys can be moved."""
    check_pair(mot, source, target)
    if not shard_texts:
        raise ContextError("There are no shards to translate. Pass the document's shards (shard_document).")
    if len(shard_texts) > 1 and not hf.has_rope(target.model):
        raise ConfigError(f"The target model '{target.spec.name}' ({target.spec.model_type}) has no rotary position "
                          "embedding: its positions live in the hidden states, so a shard's translation cannot be "
                          "moved to its offset. Compose shards for a RoPE target (Llama, Qwen2, Gemma 3), or translate "
                          "the whole text at once (mot_viz.engine.mot.translate).")


def translate_shards(mot: MoT, source: LoadedModel, target: LoadedModel, shard_texts: list[str]) -> ShardedTranslation:
    """Translate each shard from its own source agent, place the shards at their offsets in one window and replay
    the whole document once (no grad). The shards' texts, joined, are the document (shard_document's pieces).

    Raises ConfigError for several shards on a target without rotary embeddings (GPT-2, OPT: its positions live in
    the hidden states, so a translated shard cannot be moved), ContextError for an empty shard or a document longer
    than the target allows.
    """
    check_shards(mot, source, target, shard_texts)
    layers, p = mot.channels.target_layers, len(target.prefix_ids)
    timings = {"source_prefill": 0.0, "source_prefill_max": 0.0, "alignment": 0.0, "translator": 0.0}
    with torch.no_grad():
        ids = [target_context_ids(target, text) for text in shard_texts]  # each [1, n_i]
        lengths = tuple(int(i.shape[1]) for i in ids)
        offsets = tuple(sum(lengths[:i]) for i in range(len(lengths)))
        limit = target.spec.max_positions - p
        if sum(lengths) > limit:
            raise ContextError(f"The shards hold {sum(lengths)} target tokens together; the target model "
                               f"'{target.spec.name}' allows at most {limit}. Shorten the document.")
        sources, keys, values, per_shard, shard_timings = [], [], [], [], []
        for shard_ids, offset in zip(ids, offsets):
            own = {}
            src = prepare_source(mot, source, target, shard_ids, own)  # this agent sees its shard only
            start = time.perf_counter()
            out = translate_window(mot, src, source, target)
            own["translator"] = time.perf_counter() - start
            check_finite("translated window", out.keys, out.values)
            sources.append(src)
            keys.append(place_keys(target, layers, out.keys, p, offset))
            values.append(out.values)
            per_shard.append(sparse_indices(mot, src) if mot.replay.topk_sparse_attn else {})
            shard_timings.append(own)
            for stage in ("source_prefill", "alignment", "translator"):
                timings[stage] += own[stage]
            timings["source_prefill_max"] = max(timings["source_prefill_max"], own["source_prefill"])
        target_ids, window_keys, window_values = torch.cat(ids, 1), torch.cat(keys, 1), torch.cat(values, 1)
        start = time.perf_counter()
        composed, by_source = {}, {}
        for layer in per_shard[0]:  # a target layer reading the same source layer shares its indices
            s_layer = sparse_source_layer(mot.channels, layer, mot.source.num_layers)
            if s_layer not in by_source:
                by_source[s_layer] = compose_indices([s[layer] for s in per_shard], offsets, lengths, p)
            composed[layer] = by_source[s_layer]
        mixed = replay(target, target_ids, layers, window_keys, window_values, composed)
        timings["replay"] = time.perf_counter() - start
        check_finite("replayed cache", *(t for kv in mixed for t in kv))
    source_bytes = tuple(kv_cache_bytes(source.spec, src.source_prefix_len + int(src.source_ids.shape[1]))
                         for src in sources)
    return ShardedTranslation(target_ids, offsets, sources, window_keys, window_values, composed, mixed, p, timings,
                              shard_timings, source_bytes, kv_cache_bytes(target.spec, p + sum(lengths)))


@dataclass
class DirectShards:
    """A document's shards each translated by a full-depth map without replay (translate_direct), composed in one
    cache: every layer's translated K/V of shard i placed at its offset o_i, behind the target's BOS prefix."""

    mixed_kv: list[hf.KV]  # the hub's cache, all layers, [1, n_kv_T, P + N, d_T]
    offsets: tuple[int, ...]  # o_i: where each shard's tokens start after the prefix
    # "source_prefill", "alignment", "translator" summed over the agents, "source_prefill_max" the slowest agent's,
    # "assemble" moving the keys and joining the shards
    timings: dict[str, float] = field(default_factory=dict)
    source_bytes: tuple[int, ...] = ()  # fp16 bytes of each agent's cache of its shard
    source_tokens: tuple[int, ...] = ()  # each agent's cache of its shard, in source tokens (its BOS prefix included)


def translate_shards_direct(direct: MoT, source: LoadedModel, target: LoadedModel,
                            shard_texts: list[str]) -> DirectShards:
    """Translate each shard alone with the full-depth map `direct` and join the shards' caches in document order, each
    shard's keys moved from P..P+n_i−1 to P+o_i..P+o_i+n_i−1 at every layer (place_keys). The target computes
    nothing over the document, so no layer reads across shards: each position holds what its own shard gave.

    Raises ConfigError for several shards on a target without rotary embeddings, ContextError for a document longer
    than the target allows (as translate_shards)."""
    check_shards(direct, source, target, shard_texts)
    p, layers = len(target.prefix_ids), direct.channels.target_layers
    timings = {"source_prefill": 0.0, "source_prefill_max": 0.0, "alignment": 0.0, "translator": 0.0}
    parts, offsets, source_tokens, at = [], [], [], 0
    for text in shard_texts:
        one = translate_direct(direct, source, target, text, with_native=False)
        for stage in ("source_prefill", "alignment", "translator"):
            timings[stage] += one.timings[stage]
        timings["source_prefill_max"] = max(timings["source_prefill_max"], one.timings["source_prefill"])
        parts.append(one.translated)
        offsets.append(at)
        source_tokens.append(one.source.source_prefix_len + int(one.source.source_ids.shape[1]))
        at += int(one.target_ids.shape[1])
    if at > target.spec.max_positions - p:
        raise ContextError(f"The shards hold {at} target tokens together; the target model '{target.spec.name}' "
                           f"allows at most {target.spec.max_positions - p}. Shorten the document.")
    start = time.perf_counter()
    with torch.no_grad():
        keys = torch.cat([place_keys(target, layers, out.keys, p, o) for out, o in zip(parts, offsets)], 1)
        values = torch.cat([out.values for out in parts], 1)
        mixed = after_prefix(target, per_layer_kv(keys, values, target.spec.num_kv_heads))
    timings["assemble"] = time.perf_counter() - start
    return DirectShards(mixed, tuple(offsets), timings, tuple(kv_cache_bytes(source.spec, n) for n in source_tokens),
                        tuple(source_tokens))
