"""The caches of one document in every setting of the several-readers evaluation (mot_viz.eval.shards): the one
reader's, k source agents' shards composed in one hub's replay, the shard holding the evidence alone, and each other
way of sharing as it reads a document by agents (Method.by_agents over an Agents); where each shard lies in the hub's
cache (the Multi-agent page's bands)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..data.long_context import LongExample, shard_document
from ..engine import hf
from ..engine.alignment import encode
from ..engine.models import LoadedModel, kv_cache_bytes
from ..engine.mot import MoT, Translation, empty_context_cache, translate
from ..engine.prompts import build_prompt
from ..engine.shards import translate_shards, translate_shards_direct
from ..sharing import registry
from ..sharing.registry import FLOOR, REFERENCE
from ..sharing.method import Built, Method


def mb(spec, tokens: int) -> float:
    """Megabytes of `tokens` positions of a model's cache in fp16."""
    return kv_cache_bytes(spec, tokens) / 1e6


@dataclass
class SettingCache:
    """One setting's cache of a document, the seconds of its stages and the memory it holds (fp16 MB)."""

    kv: list[hf.KV] | None
    shards: int  # source agents that read (0: none)
    timings: dict[str, float]
    hub_tokens: int  # positions of the hub's cache, its BOS prefix included
    source_tokens: int  # tokens the source agents' caches hold together, their BOS prefixes included
    source_mb: float  # the agents' caches together
    source_max_mb: float  # the largest agent's cache
    held: object | None = None  # what its way of sharing's costs and rows read beside the cache (Built.held)

    @property
    def built(self) -> Built:
        """The setting as a build its way of sharing's costs read (Method.handed_bytes, ...): its cache and what it
        holds beside it."""
        return Built(self.kv, 0.0, held=self.held)


def shard_prompts(context_text: str, document: str, shard_texts: list[str]) -> list[str]:
    """The texts the agents read: the shards, with the prompt's frame before the document on the first one and the
    frame after it on the last (joined, they are the prompt's context part)."""
    head, tail = context_text.split(document, 1)
    texts = list(shard_texts)
    texts[0], texts[-1] = head + texts[0], texts[-1] + tail
    return texts


@dataclass
class Agents:
    """One document as this evaluation hands it to a way of sharing (Method.by_agents): the one reader's translation
    and cache, and the settings composed from k source agents' parts (each agent reads its shard; the hub reads what
    they hand over)."""

    mot: MoT
    source: LoadedModel
    target: LoadedModel
    doc: LongExample
    context_text: str  # the prompt's context part: the document in the prompt's frame
    one: Translation  # the one reader's translation of the whole context
    whole: SettingCache  # the one reader's MoT cache
    options: Mapping = field(default_factory=dict)  # the run's options, by Option.name
    artifacts: Mapping = field(default_factory=dict)  # what each way of sharing loaded for the run, by method name
    _pieces: dict = field(default_factory=dict)

    def artifact(self, way: Method):
        """What `way` loaded for the run (Method.load), checked as every build checks it (Method.ready)."""
        way.ready(self.artifacts.get(way.name), self.example)
        return self.artifacts.get(way.name)

    @property
    def example(self):
        return self.doc.example

    def pieces(self, k: int) -> list:
        """The document cut into k shards between paragraphs (data.long_context.shard_document), cut once per k."""
        if k not in self._pieces:
            self._pieces[k] = shard_document(self.target.tokenizer, self.doc, k)
        return self._pieces[k]

    def texts(self, k: int) -> list[str]:
        """What the k agents read: the shards in the prompt's frame (shard_prompts)."""
        return shard_prompts(self.context_text, self.example.context, [s.text for s in self.pieces(k)])

    def composed(self, texts: list[str], by: MoT | None = None) -> SettingCache:
        """Each agent's text translated by `by` (default the MoT), the windows composed in one replay of the hub."""
        s = translate_shards(by or self.mot, self.source, self.target, texts)
        tokens = [src.source_prefix_len + int(src.source_ids.shape[1]) for src in s.sources]
        return SettingCache(s.mixed_kv, len(texts), s.timings, len(self.target.prefix_ids) + int(s.target_ids.shape[1]),
                            sum(tokens), sum(s.source_bytes) / 1e6, max(s.source_bytes) / 1e6)

    def read(self, kv: list[hf.KV], source_tokens: tuple[int, ...], held=None) -> SettingCache:
        """The hub's cache of what the agents handed over (`kv`; a message: the hub's prefill of it), each agent's
        cache holding `source_tokens` positions when done; `held`: what the way of sharing's costs read."""
        sizes = [kv_cache_bytes(self.source.spec, tokens) for tokens in source_tokens]
        return SettingCache(kv, len(source_tokens), {}, int(kv[0][0].shape[2]), sum(source_tokens),
                            sum(sizes) / 1e6, max(sizes) / 1e6, held)

    def joined(self, texts: list[str], by: MoT) -> SettingCache:
        """Each agent's text translated by the full-depth map `by` without replay, the caches joined at their
        offsets."""
        d = translate_shards_direct(by, self.source, self.target, texts)
        return SettingCache(d.mixed_kv, len(texts), d.timings, int(d.mixed_kv[0][0].shape[2]),
                            sum(d.source_tokens), sum(d.source_bytes) / 1e6, max(d.source_bytes) / 1e6)

    def replayed(self, kv: list[hf.KV], reads_source: bool) -> SettingCache:
        """A control's window replayed on the one reader's translation, untimed as in every evaluation; it holds the
        one reader's source cache when it reads the source's."""
        if reads_source:
            return replace(self.whole, kv=kv, timings={})
        return SettingCache(kv, 0, {}, self.whole.hub_tokens, 0, 0.0, 0.0)


@torch.no_grad()
def setting_caches(mot: MoT, source: LoadedModel, target: LoadedModel, doc: LongExample, shards: tuple[int, ...],
                   sharing: tuple[str, ...] = (), options: Mapping | None = None,
                   artifacts: Mapping | None = None) -> dict[str, SettingCache]:
    """Every setting's cache of one document (module docstring), in the order of conditions(shards, sharing); each
    way of sharing in `sharing` builds its own (Method.by_agents) from the run's `options` and what it loaded
    (`artifacts`, by method name: registry.load_artifacts)."""
    example = doc.example
    context_text = build_prompt(example, target.chat_frame).context_text
    p = len(target.prefix_ids)
    one = translate(mot, source, target, context_text)
    n, t = int(one.target_ids.shape[1]), one.timings
    src_tokens = one.source.source_prefix_len + int(one.source.source_ids.shape[1])
    reader = {**t, "source_prefill_max": t["source_prefill"], "native_prefill": np.nan}  # one agent, no hub prefill
    out = {REFERENCE: SettingCache(one.native_kv, 0, {"native_prefill": t["native_prefill"]}, p + n, 0, 0.0, 0.0),
           "whole": SettingCache(one.mixed_kv, 1, reader, p + n, src_tokens, mb(source.spec, src_tokens),
                                 mb(source.spec, src_tokens))}
    agents = Agents(mot, source, target, doc, context_text, one, out["whole"], options or {}, artifacts or {})
    ways = registry.methods(sharing)
    evidence, others = {}, {m.name: {m.name: m.by_agents(agents, None)} for m in ways}  # one reader first
    for k in shards:
        texts = agents.texts(k)
        out[f"shards_{k}"] = agents.composed(texts)
        holder = next((s for s in agents.pieces(k) if s.holds_evidence), None)
        if holder is not None:  # the answer's shard in the prompt's frame, as if it were the whole document
            alone = build_prompt(replace(example, context=holder.text.strip()), target.chat_frame).context_text
            evidence[f"evidence_{k}"] = agents.composed([alone])
        for m in ways:
            if not m.one_reader:
                others[m.name][f"{m.name}_{k}"] = m.by_agents(agents, k)
    out.update(evidence)
    for m in sharing:
        out.update(others[m])
    out[FLOOR] = SettingCache(empty_context_cache(target), 0, {}, p, 0, 0.0, 0.0)
    return out


def shard_spans(target: LoadedModel, doc: LongExample, shards: int) -> dict[str, tuple[int, int]]:
    """Where each of the document's `shards` lies in a hub's cache, as translate_shards places it: label
    ("shard i", "… (evidence)" for the one holding it) -> [start, end) positions, the BOS prefix counted."""
    pieces = shard_document(target.tokenizer, doc, shards)
    context_text = build_prompt(doc.example, target.chat_frame).context_text
    texts = shard_prompts(context_text, doc.example.context, [s.text for s in pieces])
    spans, at = {}, len(target.prefix_ids)
    for i, (piece, text) in enumerate(zip(pieces, texts, strict=True)):
        n = len(encode(target.tokenizer, text))
        spans[f"shard {i + 1}" + (" (evidence)" if piece.holds_evidence else "")] = (at, at + n)
        at += n
    return spans
