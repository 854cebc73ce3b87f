"""One edge of MoT end to end: source prefill → token alignment → translation → replay into the target.

:class:`MoT` bundles what a checkpoint holds (translator, channels, replay settings, the two model
specs); :func:`translate` runs it on a context and returns a :class:`Translation` that every metric,
figure and page reads from, so the work is done once per input.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ..errors import CheckpointError, ConfigError, ContextError, TranslationError
from . import hf
from .alignment import (TokenAlignment, align_ids, apply_alignment, decode, encode, identity_alignment,
                        remap_sparse_indices)
from .channels import Channels, sparse_source_layer
from .layout import context_positions, from_block, to_block, window_blocks
from .models import LoadedModel, ModelSpec
from .replay_config import ReplayConfig
from .synthetic import is_synthetic
from .translator import GateOverride, KVTranslator, TranslatorConfig, TranslatorOutput

KV = hf.KV


class MoT(nn.Module):
    """A trained (or freshly initialised) translator for one ordered model pair."""

    def __init__(self, source: ModelSpec, target: ModelSpec, channels: Channels, translator: TranslatorConfig,
                 replay: ReplayConfig | None = None):
        super().__init__()
        if translator.window != channels.window:
            raise ConfigError(f"translator window {translator.window} != {channels.window} channels")
        if max(channels.source_layers) >= source.num_layers or max(channels.target_layers) >= target.num_layers:
            raise ConfigError("channels point past the last layer of the source or target model")
        extra = translator.linear_extra_layers
        if any(l >= source.num_layers or l in channels.source_layers for l in extra):
            raise ConfigError(f"linear_extra_layers {list(extra)} must be source layers (0–{source.num_layers - 1}) "
                              f"outside the channel list {list(channels.source_layers)}")
        self.source, self.target, self.channels = source, target, channels
        self.replay = replay or ReplayConfig()
        self.translator = KVTranslator(translator)
        if self.translator.linear is not None:
            self.translator.linear.select_inputs(translator, self.input_layers)
        if self.replay.direct:
            check_direct(self)

    @classmethod
    def build(cls, source: ModelSpec, target: ModelSpec, channels: Channels, replay: ReplayConfig | None = None,
              **translator_kwargs) -> "MoT":
        cfg = TranslatorConfig(source.kv_hidden, target.kv_hidden, channels.window, **translator_kwargs)
        return cls(source, target, channels, cfg, replay)

    @property
    def input_layers(self) -> tuple[int, ...]:
        """The source layers the translator reads, in its input's order: the channel list's, then the linear map's
        extra layers (linear_extra_layers)."""
        return tuple(self.channels.source_layers) + self.translator.config.linear_extra_layers

    @property
    def full_depth(self) -> bool:
        """Whether the window holds every target layer (what a direct map, ReplayConfig.direct, needs)."""
        return self.channels.target_layers == tuple(range(self.target.num_layers))

    def sparse_layers(self) -> list[int]:
        """Target layers replayed with sparse attention: all from num_bottom_full_attn up, plus the window."""
        if self.replay.topk_sparse_attn is None or self.replay.direct:
            return []
        nb = self.replay.num_bottom_full_attn
        return [l for l in range(self.target.num_layers) if l >= nb or l in self.channels.target_layers]


@dataclass
class SourceContext:
    """The source side of one context, re-tokenized from the target's text and aligned to the target grid."""

    source_ids: torch.Tensor  # [1, N_s] the context's source tokens (no BOS)
    target_ids: torch.Tensor  # [1, N_t] the context's target tokens (no BOS)
    alignment: TokenAlignment
    source_kv: list[KV]  # every source layer over the context tokens, [1, n_kv_S, N_s, d_S]
    # source layer -> top-k key positions [1, 1, N_s, k] of each context query's head-averaged attention over
    # the context (the BOS prefix excluded), kept by the source prefill itself (method.md §6, sparse indices)
    source_topk: dict[int, torch.Tensor]
    target_prefix_len: int = 0  # BOS positions the target's caches start with
    source_prefix_len: int = 0  # BOS positions the source's prefill started with (dropped from source_kv)


@dataclass
class Translation:
    """Everything computed for one context on one edge; read by metrics, figures and pages."""

    text: str
    source: SourceContext
    translated: TranslatorOutput  # window blocks on the target grid, with routing
    injected_kv: list[KV]  # the translated K/V per window layer, [1, n_kv_T, N_t, d_T]
    mixed_kv: list[KV]  # the replayed target cache, all layers, [1, n_kv_T, P + N_t, d_T]
    native_kv: list[KV] | None  # the target's own cache of the context (dense), same shapes
    sparse_indices: dict[int, torch.Tensor]  # target layer -> [1, 1, P + N_t, P + k]
    prefix_len: int = 0  # P: BOS positions the target's caches start with (never translated)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage
    # window layer -> (post-RoPE query [1, H, P + N_t, d], scaling, sliding window) of the native prefill, which
    # records them on the way (the attention-output fidelity reads them instead of running the target again)
    native_queries: dict[int, tuple[torch.Tensor, float, int | None]] | None = None
    # the same, of the replay: the queries that read the translated K/V (method.md §13's attention-output cosine)
    replay_queries: dict[int, tuple[torch.Tensor, float, int | None]] | None = None
    # the replay's state on entering the window's first layer: another window's replay starts there (replay_window)
    window_start: hf.LayerStart | None = None

    @property
    def target_ids(self) -> torch.Tensor:
        return self.source.target_ids

    def native_window_blocks(self, channels: Channels) -> tuple[torch.Tensor, torch.Tensor]:
        """The native K and V blocks [1, N_t, W, H_T] at the window layers (context positions only)."""
        if self.native_kv is None:
            raise ValueError("this translation was computed without the native cache")
        return window_blocks(self.native_kv, channels.target_layers, self.prefix_len)


def target_context_ids(target: LoadedModel, text: str, max_tokens: int | None = None) -> torch.Tensor:
    """The target's token ids [1, N_t] of a context (no BOS), checked against the model's limit."""
    if not text or not text.strip():
        raise ContextError("The context is empty. Type or choose a passage to translate.")
    ids = encode(target.tokenizer, text)
    limit = max_tokens or target.spec.max_positions - len(target.prefix_ids)
    if len(ids) > limit:
        raise ContextError(
            f"The context is {len(ids)} target tokens long; this pair allows at most {limit}. Shorten the context."
        )
    return target.ids_tensor(ids)


@torch.no_grad()
def prepare_source(mot: MoT | None, source: LoadedModel, target: LoadedModel, target_ids: torch.Tensor,
                   timings: dict[str, float] | None = None, with_attention: bool = True) -> SourceContext:
    """Re-tokenize the target context for the source, prefill the source, align the tokens (method.md §2).

    timings, if given, receives the seconds spent in "alignment" and "source_prefill". The prefill keeps the
    top-k source positions the sparse replay needs (so source_prefill includes choosing them); without
    with_attention it keeps none (nothing for sparse replay; the training bank and the ways of sharing trained without
    a MoT need none: `mot` may then be None).
    """
    timings = {} if timings is None else timings
    t0 = time.perf_counter()
    t_ids = target_ids[0].tolist()
    text = decode(target.tokenizer, t_ids)
    s_ids = encode(source.tokenizer, text)
    if not s_ids:
        raise ContextError("The source tokenizer produced no tokens for this context.")
    limit = source.spec.max_positions - len(source.prefix_ids)
    if len(s_ids) > limit:  # past it, GPT-2 fails with an IndexError and a RoPE model extrapolates silently
        raise ContextError(
            f"The context is {len(s_ids)} tokens long for the source model '{source.spec.name}', which allows at most "
            f"{limit}. Shorten the context (python -m mot_viz.eval.evaluate: lower --max_context_tokens)."
        )
    # one tokenizer, or two synthetic models reading one id stream (synthetic.SYNTHETIC_ALIGNMENT)
    shared = source.spec.name == target.spec.name or is_synthetic(source.spec.name) and is_synthetic(target.spec.name)
    same = shared and s_ids == t_ids
    alignment = identity_alignment(len(t_ids)) if same else align_ids(source.tokenizer, s_ids, target.tokenizer, t_ids, text)
    timings["alignment"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    p = len(source.prefix_ids)
    k_top = mot.replay.topk_sparse_attn if with_attention else None
    needed = {sparse_source_layer(mot.channels, l, mot.source.num_layers) for l in mot.sparse_layers()} if k_top else ()
    plan = hf.AttentionPlan(record_topk={l: (k_top, p) for l in needed})
    out = hf.run(source.model, source.ids_tensor(source.prefix_ids + s_ids), plan=plan, logits_to_keep=None)
    # the source's BOS position is dropped: only context tokens are aligned and translated
    kv = [context_positions(layer, p) for layer in out.kv]
    timings["source_prefill"] = time.perf_counter() - t0
    return SourceContext(source.ids_tensor(s_ids), target_ids, alignment, kv, out.topk, len(target.prefix_ids), p)


def with_prefix(indices: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Context indices [B, 1, N, k] -> indices over prefix + context [B, 1, P+N, P+k].

    Every query also attends to the P prefix (BOS) positions, Gemma's attention sink; prefix queries
    attend to the prefix only. Padding uses the sentinel P+N, which is always masked.
    """
    if prefix_len == 0:
        return indices
    b, _, n, k = indices.shape
    sentinel = prefix_len + n
    prefix = torch.arange(prefix_len, device=indices.device).view(1, 1, 1, prefix_len)
    context_rows = torch.cat([prefix.expand(b, 1, n, prefix_len), indices + prefix_len], dim=-1)
    prefix_rows = torch.full((b, 1, prefix_len, prefix_len + k), sentinel, dtype=indices.dtype, device=indices.device)
    prefix_rows[..., :prefix_len] = prefix
    return torch.cat([prefix_rows, context_rows], dim=2)


def sparse_indices(mot: MoT, src: SourceContext) -> dict[int, torch.Tensor]:
    """Top-k key indices per sparse target layer, from the mapped source layer, on the target grid."""
    per_source: dict[int, torch.Tensor] = {}
    out = {}
    for layer in mot.sparse_layers():
        s_layer = sparse_source_layer(mot.channels, layer, mot.source.num_layers)
        if s_layer not in per_source:
            idx = src.source_topk[s_layer]  # (1, 1, N_s, k), chosen by the source prefill
            idx = idx if src.alignment.identity else remap_sparse_indices(idx, src.alignment)
            per_source[s_layer] = with_prefix(idx, src.target_prefix_len)
        out[layer] = per_source[s_layer]
    return out


def rotate_block(lm: LoadedModel, layers, keys: torch.Tensor, prefix_len: int, inverse: bool) -> torch.Tensor:
    """Rotate (or un-rotate) a key block [1, N, W, H] of `layers` with the model's own RoPE at positions P..P+N-1."""
    positions = torch.arange(prefix_len, prefix_len + keys.shape[1], device=keys.device)
    per_layer = from_block(keys, lm.spec.num_kv_heads)
    return to_block([hf.rotate_keys(lm.model, l, k, positions, inverse) for l, k in zip(layers, per_layer)])


def translator_inputs(mot: MoT, src: SourceContext, source: LoadedModel) -> tuple[torch.Tensor, torch.Tensor]:
    """The aligned source blocks [1, N_t, W (+ extra layers), H_S] the translator reads, in its key space: the channel
    list's window, then the layers only its linear map reads (MoT.input_layers)."""
    layers = mot.input_layers
    keys, values = window_blocks(src.source_kv, layers)  # (1, N_s, W, H_S) each
    if mot.translator.config.key_space == "pre_rope":
        keys = rotate_block(source, layers, keys, src.source_prefix_len, inverse=True)
    return apply_alignment(keys, src.alignment), apply_alignment(values, src.alignment)  # (1, N_t, W, H_S)


def translator_targets(mot: MoT, target: LoadedModel, native_kv: list[KV], prefix_len: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The native window blocks [1, N_t, W, H_T] in the translator's key space: what it should write."""
    keys, values = window_blocks(native_kv, mot.channels.target_layers, prefix_len)
    if mot.translator.config.key_space == "pre_rope":
        keys = rotate_block(target, mot.channels.target_layers, keys, prefix_len, inverse=True)
    return keys, values


def translate_window(mot: MoT, src: SourceContext, source: LoadedModel, target: LoadedModel,
                     override: GateOverride | None = None) -> TranslatorOutput:
    """Aligned source window blocks through the K and V translators; keys come out in the cache's (post-RoPE) space.

    override: a what-if on the mixtures' gates (GateOverride); None is the router's own choice.
    """
    weight = next(mot.translator.parameters())  # the translator may sit on another device or dtype than the models
    keys, values = (x.to(weight.device, weight.dtype) for x in translator_inputs(mot, src, source))
    out = mot.translator(keys, values, override=override)
    out.keys, out.values = out.keys.to(target.device), out.values.to(target.device)
    if mot.translator.config.key_space == "pre_rope":  # the target's own rotary embedding places the keys
        out.keys = rotate_block(target, mot.channels.target_layers, out.keys, src.target_prefix_len, inverse=False)
    return out


def replay(target: LoadedModel, target_ids: torch.Tensor, target_layers: tuple[int, ...], window_keys: torch.Tensor,
           window_values: torch.Tensor, sparse: dict[int, torch.Tensor] | None,
           cache_injected_window: bool = False, start: hf.LayerStart | None = None) -> list[KV]:
    """Replay the context with window blocks [1, N_t, W, H_T] injected at target_layers; returns the mixed cache.

    target_ids [1, N_t] are the context tokens; the target's BOS prefix (if any) is prepended and keeps
    its own K/V. The window layers' cache entries are the native-like K/V recomputed from the perturbed
    hidden states, unless cache_injected_window (method.md §6, step 3). start: the state entering the window's first
    layer from an earlier replay of these ids with the same sparse indices (:attr:`Translation.window_start`), so
    the layers below the window, which no injected K/V reaches, are not run again.
    """
    return _replay(target, target_ids, target_layers, window_keys, window_values, sparse, cache_injected_window,
                   start).kv


def _replay(target: LoadedModel, target_ids: torch.Tensor, target_layers: tuple[int, ...], window_keys: torch.Tensor,
            window_values: torch.Tensor, sparse: dict[int, torch.Tensor] | None, cache_injected_window: bool = False,
            start: hf.LayerStart | None = None, keep_start: bool = False,
            keep_queries: bool = False) -> hf.ForwardResult:
    """:func:`replay`, as the forward's result; keep_start keeps the state entering the window (result.start),
    keep_queries the window layers' queries (result.queries)."""
    if start is not None and start.layer != target_layers[0]:
        raise ValueError(f"a replay of the window {target_layers} starts at layer {target_layers[0]}, not {start.layer}")
    injected = per_layer_kv(window_keys, window_values, target.spec.num_kv_heads)
    plan = hf.AttentionPlan(inject=dict(zip(target_layers, injected)), sparse=sparse or {}, start=start,
                            keep_start=target_layers[0] if keep_start else None,
                            record_queries=set(target_layers) if keep_queries else set())
    result = hf.run(target.model, _with_bos(target, target_ids), plan=plan, logits_to_keep=None)
    if cache_injected_window:
        for layer, (k, v) in zip(target_layers, injected):
            k0, v0 = result.kv[layer]
            p = k0.shape[2] - k.shape[2]
            result.kv[layer] = (torch.cat([k0[:, :, :p], k], 2), torch.cat([v0[:, :, :p], v], 2))
    return result


def unread_window_layers(target_layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """Window layers whose translated K/V reach no entry of the replayed cache: the target's last layer, if the window
    holds it. Injected K/V change only their layer's attention output, which reaches the cache through the K/V of
    the layers above (method.md §6, step 3); above the last layer there are none (its output feeds only next-token
    logits, which a cache-only replay does not compute)."""
    return tuple(layer for layer in target_layers if layer == num_layers - 1)


def per_layer_kv(keys: torch.Tensor, values: torch.Tensor, n_kv: int) -> list[KV]:
    """Window blocks [1, N, W, H] -> per window layer (K, V), each [1, n_kv, N, d_h]."""
    return list(zip(from_block(keys, n_kv), from_block(values, n_kv)))


def replay_window(mot: MoT, target: LoadedModel, translation: "Translation", window_keys: torch.Tensor,
                  window_values: torch.Tensor) -> list[KV]:
    """Another window [1, N_t, W, H_T] (a control, a what-if) replayed over a translation's context the way it was
    replayed: its sparse indices, and from the state its own replay had on entering the window."""
    return _window_replay(mot, target, translation, window_keys, window_values).kv


def _window_replay(mot: MoT, target: LoadedModel, translation: "Translation", window_keys: torch.Tensor,
                   window_values: torch.Tensor, keep_queries: bool = False) -> hf.ForwardResult:
    """:func:`replay_window`, as the forward's result (with keep_queries, the window layers' queries too)."""
    return _replay(target, translation.target_ids, mot.channels.target_layers, window_keys, window_values,
                   translation.sparse_indices, start=translation.window_start, keep_queries=keep_queries)


def _with_bos(lm: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    prefix = torch.tensor([lm.prefix_ids] * ids.shape[0], dtype=ids.dtype, device=ids.device).view(ids.shape[0], -1)
    return torch.cat([prefix, ids], dim=1)


@torch.no_grad()
def native_cache(target: LoadedModel, target_ids: torch.Tensor, plan: hf.AttentionPlan | None = None) -> list[KV]:
    """The target's own dense cache of the context [1, N_t] (after its BOS prefix, if any).

    plan: what to record on the way (e.g. ``record_queries``; read it from the plan afterwards).
    """
    return hf.run(target.model, _with_bos(target, target_ids), plan=plan, logits_to_keep=None).kv


def _timed_native(mot: MoT, target: LoadedModel, target_ids: torch.Tensor, timings: dict) -> tuple[list[KV], dict]:
    """The target's own cache of the context with the window layers' queries recorded, timed as "native_prefill"."""
    t0 = time.perf_counter()
    plan = hf.AttentionPlan(record_queries=set(mot.channels.target_layers))
    native = native_cache(target, target_ids, plan)
    timings["native_prefill"] = time.perf_counter() - t0
    return native, plan.queries


@torch.no_grad()
def empty_context_cache(lm: LoadedModel) -> list[KV] | None:
    """The cache a model starts from with no context: its BOS prefix, or nothing."""
    return hf.run(lm.model, lm.ids_tensor(lm.prefix_ids), logits_to_keep=None).kv if lm.prefix_ids else None


def translate(mot: MoT, source: LoadedModel, target: LoadedModel, text: str, with_native: bool = True,
              max_tokens: int | None = None, override: GateOverride | None = None) -> Translation:
    """Translate one context end to end (no grad). Timings in seconds per stage; override: see translate_window."""
    check_pair(mot, source, target)
    if mot.replay.direct:
        return translate_direct(mot, source, target, text, with_native, max_tokens)
    timings = {}
    with torch.no_grad():
        target_ids = target_context_ids(target, text, max_tokens)
        src = prepare_source(mot, source, target, target_ids, timings)
        t0 = time.perf_counter()
        translated = translate_window(mot, src, source, target, override)
        timings["translator"] = time.perf_counter() - t0
        check_finite("translated window", translated.keys, translated.values)
        t0 = time.perf_counter()
        sparse = sparse_indices(mot, src) if mot.replay.topk_sparse_attn else {}
        replayed = _replay(target, target_ids, mot.channels.target_layers, translated.keys, translated.values, sparse,
                           keep_start=True, keep_queries=True)
        mixed = replayed.kv
        timings["replay"] = time.perf_counter() - t0
        check_finite("replayed cache", *(t for kv in mixed for t in kv))
        native, native_queries = _timed_native(mot, target, target_ids, timings) if with_native else (None, None)
    injected = per_layer_kv(translated.keys, translated.values, mot.target.num_kv_heads)
    return Translation(text, src, translated, injected, mixed, native, sparse, prefix_len=len(target.prefix_ids),
                       timings=timings, native_queries=native_queries, replay_queries=replayed.queries,
                       window_start=replayed.start)


def check_direct(mot: MoT) -> None:
    """Raise ConfigError unless the MoT's window holds every target layer (a cache without replay needs them all)."""
    if not mot.full_depth:
        raise ConfigError(
            f"Replay 'none' uses the translated K/V as the whole cache, but this checkpoint translates target layers "
            f"{list(mot.channels.target_layers)} of {mot.target.num_layers}. Use a full-depth map (python -m "
            "mot_viz.train.quickfit --direct), or another replay mode.")


def translate_direct(mot: MoT, source: LoadedModel, target: LoadedModel, text: str, with_native: bool = True,
                     max_tokens: int | None = None) -> Translation:
    """translate without replay (ReplayConfig.direct, method.md §15): the translated K/V of every target layer after
    the target's own BOS prefix are the cache (mixed_kv); the target runs over its BOS only, never over the context.
    Timings: alignment, source_prefill, translator, "assemble" (the BOS prefix and the concatenation), and
    native_prefill with with_native."""
    check_direct(mot)
    timings = {}
    with torch.no_grad():
        target_ids = target_context_ids(target, text, max_tokens)
        src = prepare_source(mot, source, target, target_ids, timings, with_attention=False)
        t0 = time.perf_counter()
        translated = translate_window(mot, src, source, target)
        timings["translator"] = time.perf_counter() - t0
        check_finite("translated window", translated.keys, translated.values)
        t0 = time.perf_counter()
        injected = per_layer_kv(translated.keys, translated.values, mot.target.num_kv_heads)
        mixed = after_prefix(target, injected)
        timings["assemble"] = time.perf_counter() - t0
        native, native_queries = _timed_native(mot, target, target_ids, timings) if with_native else (None, None)
    return Translation(text, src, translated, injected, mixed, native, {}, prefix_len=len(target.prefix_ids),
                       timings=timings, native_queries=native_queries)


def after_prefix(target: LoadedModel, kv: list[KV], layers=None) -> list[KV]:
    """A cache of the context alone [1, n_kv, N, d] per layer behind the target's own BOS prefix cache (if any);
    `layers`: the target layers `kv` holds, in order (default every layer)."""
    prefix = empty_context_cache(target)
    if prefix is None:
        return kv
    prefix = prefix if layers is None else [prefix[l] for l in layers]
    return [(torch.cat([pk, k.to(pk.dtype)], 2), torch.cat([pv, v.to(pv.dtype)], 2))
            for (pk, pv), (k, v) in zip(prefix, kv, strict=True)]


def translate_again(mot: MoT, source: LoadedModel, target: LoadedModel, base: Translation,
                    override: GateOverride) -> Translation:
    """base's context translated again with the mixtures' gates overridden (the Expert routing page's what-if).

    Nothing before the translator depends on the gates, nor do the replay's layers below the window: base's source
    prefill, alignment, sparse indices, native cache and replay state on entering the window are reused, and only
    the translator and the replay from the window up run again.
    """
    timings = {}
    with torch.no_grad():
        t0 = time.perf_counter()
        translated = translate_window(mot, base.source, source, target, override)
        timings["translator"] = time.perf_counter() - t0
        check_finite("translated window", translated.keys, translated.values)
        t0 = time.perf_counter()
        replayed = _window_replay(mot, target, base, translated.keys, translated.values, keep_queries=True)
        timings["replay"] = time.perf_counter() - t0
    injected = per_layer_kv(translated.keys, translated.values, mot.target.num_kv_heads)
    return replace(base, translated=translated, injected_kv=injected, mixed_kv=replayed.kv, timings=timings,
                   replay_queries=replayed.queries)


def check_finite(what: str, *tensors: torch.Tensor) -> None:
    """Raise TranslationError when any tensor holds NaN or Inf: such a cache never reaches a page or a score."""
    for t in tensors:
        if not torch.isfinite(t).all():
            raise TranslationError(
                f"The {what} holds NaN or Inf values. The checkpoint's weights or the models' activations "
                "overflow: load the models in float32 and re-export or retrain the checkpoint."
            )


def check_pair(mot: MoT, source: LoadedModel, target: LoadedModel) -> None:
    """Raise CheckpointError if the loaded models are not the ones this MoT was made for."""
    for role, want, got in (("source", mot.source, source.spec), ("target", mot.target, target.spec)):
        if want.fingerprint != got.fingerprint and is_synthetic(want.name) != is_synthetic(got.name):
            made, loaded = (("a synthetic", "a real"), ("a real", "a synthetic"))[is_synthetic(got.name)]
            raise CheckpointError(
                f"This MoT was made for {made} {role} model '{want.name}', but the loaded {role} is {loaded} model "
                f"'{got.name}': random weights and trained ones never share a translator. For synthetic models write "
                "one of a recipe's shape (python -m mot_viz.train.synthetic_checkpoint --source … --target … --out …); "
                "for real ones choose a checkpoint trained for them."
            )
        if want.fingerprint != got.fingerprint:
            raise CheckpointError(
                f"This MoT was made for {role} model '{want.name}' ({want.model_type}, {want.num_layers} layers, "
                f"fingerprint {want.fingerprint}), but the loaded {role} is '{got.name}' ({got.model_type}, "
                f"{got.num_layers} layers, fingerprint {got.fingerprint}). Choose a checkpoint trained for this pair, "
                "or pick the models it was trained for."
            )
