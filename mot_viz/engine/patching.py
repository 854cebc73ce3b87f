"""Layer patching: which target layer's translated K/V cost the answer (activation patching on caches).

Two caches of one context hold the same positions: the target's own (native) and a translated one (the MoT's
replayed cache, a linear map's, the full-depth direct map's, KVComm's). Patching swaps K and V between them at
chosen layers (and, optionally, chosen context positions), and the target reads the question and the gold answer,
teacher-forced, over each patched cache:

* **restoring** layer l: the translated cache with the native K/V at l — how much of the gap to native comes back;
* **breaking** layer l: the native cache with the translated K/V at l — how much of native is lost.

Each reading is the gold answer's mean log-probability per token (hf.continuation_logprobs, the closed-set score
of method.md §8 rule a), and its **share** of the native − translated gap: restoring (patched − translated) / gap,
breaking (native − patched) / gap. The caches are built once by the caller; a reading re-runs only the question and
the answer over the patched cache, without the output layer (one pass of it scores every reading's answer positions
at the end, hf.continuation_scores), and only from its lowest patched layer up (below it the patched cache is the one
it was patched from, so the question's and the answer's states there are that cache's reading's). A layer is patched
as its K/V, not as the computation that made them: in a replayed cache every layer from the window's first up is the
target's own K/V of hidden states the window moved (method.md §6), so restoring one such layer puts back what that
layer would have cached natively, and the layers above it keep what the shifted states gave them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from . import hf
from .alignment import char_spans, encode
from .hf import KV
from .models import ModelSpec
from .prompts import QAExample, choice_label_texts
from ..errors import ConfigError

DIRECTIONS = ("restore", "break")
ALL_POSITIONS = "all"  # the bucket name of a patch at every position of the cache
ANSWER_SENTENCE, REST = "answer sentence", "rest"  # the buckets answer_sentence_buckets makes
BATCH = 8  # patched caches read in one decoder forward (the output layer then runs once over every reading)
# a patched reading starts at its lowest patched layer, from the state the unpatched cache's reading had there (below
# it the two caches are the same, so are the question's and the answer's hidden states); read at the call (False:
# every reading runs every layer, the plain path the fast one is tested and benchmarked against)
REUSE_LOWER_LAYERS = True
MIN_GAP = 1e-6  # a native − translated gap below this (nats) has no share to move: the share is NaN


def answer_token_ids(tokenizer, example: QAExample, max_tokens: int | None = 4) -> list[int]:
    """The first ≤ max_tokens tokens (all: None) of " " + the first non-empty gold answer, or of " " + the gold
    label (closed set)."""
    if example.kind == "closed":
        text = choice_label_texts(example)[example.label]
    else:
        text = next((a for a in example.answers if a.strip()), "")
        if not text:
            raise ConfigError(f"example {example.id!r} has no non-empty gold answer to teacher-force")
    return encode(tokenizer, " " + text.strip())[:max_tokens]


def check_layers(layers: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """The layers, ascending and unique; ConfigError names any outside the target's 0 … num_layers − 1."""
    outside = sorted({int(l) for l in layers if not 0 <= int(l) < num_layers})
    if outside:
        raise ConfigError(f"layer{'s' if len(outside) > 1 else ''} {', '.join(map(str, outside))} outside the "
                          f"target's {num_layers} layers: choose among 0 … {num_layers - 1}")
    return tuple(sorted({int(l) for l in layers}))


def check_positions(positions: Sequence[int], length: int, what: str = "positions") -> tuple[int, ...]:
    """The cache positions, ascending and unique; ConfigError names any outside the cache's 0 … length − 1."""
    outside = sorted({int(p) for p in positions if not 0 <= int(p) < length})
    if outside:
        shown = ", ".join(map(str, outside[:5])) + (" …" if len(outside) > 5 else "")
        raise ConfigError(f"{what} {shown} outside the context's cache of {length} positions: choose among "
                          f"0 … {length - 1}")
    return tuple(sorted({int(p) for p in positions}))


def patch(cache: list[KV], donor: list[KV], layers: Sequence[int], positions: Sequence[int] | None = None) -> list[KV]:
    """`cache` with `donor`'s K and V at `layers` (at every position, or only at `positions` of the sequence axis).

    Both caches: per layer (K, V) [B, n_kv, N, d_h] of the same shapes. Neither is changed: an unpatched layer is
    the cache's own tensors, a patched one a new tensor.
    """
    if len(cache) != len(donor):
        raise ConfigError(f"the donor cache has {len(donor)} layers, the patched one {len(cache)}: patch caches "
                          "of one target")
    layers = set(check_layers(layers, len(cache)))
    index = None
    if positions is not None:
        index = torch.tensor(check_positions(positions, cache[0][0].shape[2]), dtype=torch.long,
                             device=cache[0][0].device)
    out = []
    for l, ((k, v), (dk, dv)) in enumerate(zip(cache, donor)):
        if k.shape != dk.shape or v.shape != dv.shape:
            raise ConfigError(f"layer {l}: the donor's K/V {tuple(dk.shape)} differ in shape from the cache's "
                              f"{tuple(k.shape)}: patch two caches of the same context and target")
        if l not in layers:
            out.append((k, v))
        elif index is None:
            out.append((dk, dv))
        else:
            out.append((k.index_copy(2, index, dk.index_select(2, index)),
                        v.index_copy(2, index, dv.index_select(2, index))))
    return out


def layer_groups(spec: ModelSpec, window: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """The named groups a scan reads by default: the injection window, and the global and sliding-window layers
    when the target has both kinds."""
    groups = {"window": tuple(window)}
    sliding = tuple(spec.sliding_layers)
    if sliding and len(sliding) < spec.num_layers:
        groups["global"] = tuple(l for l in range(spec.num_layers) if l not in sliding)
        groups["sliding"] = sliding
    return groups


def answer_sentence_buckets(tokenizer, context_text: str, answer: str, prefix_len: int,
                            first: int = 0) -> dict[str, tuple[int, ...]]:
    """The context's cache positions in two buckets: the tokens of the sentence holding the gold answer's first
    occurrence at or after character `first` (the passage, past any instruction), and the rest of the context.

    Sentences end at ". ", "? ", "! " or a line break. ConfigError when the answer is not in the context.
    """
    answer = answer.strip()
    start = context_text.find(answer, first) if answer else -1
    if start < 0:
        start = context_text.lower().find(answer.lower(), first) if answer else -1
    if start < 0:
        raise ConfigError(f"the gold answer {answer[:40]!r} is not in the context, so it has no sentence to patch: "
                          "patch all positions (leave the buckets out)")
    end = start + len(answer)
    stops = [context_text.rfind(mark, first, start) for mark in (". ", "? ", "! ", "\n")]
    begin = max([s + 1 for s in stops if s >= 0] + [first])
    after = [context_text.find(mark, end) for mark in (". ", "? ", "! ", "\n")]
    finish = min([a + 1 for a in after if a >= 0] + [len(context_text)])
    ids = encode(tokenizer, context_text)
    spans = char_spans(tokenizer, ids, context_text)
    inside = tuple(prefix_len + i for i, (a, b) in enumerate(spans) if a < finish and b > begin)
    rest = tuple(p for p in range(prefix_len, prefix_len + len(ids)) if p not in set(inside))
    return {ANSWER_SENTENCE: inside, REST: rest}


@dataclass(frozen=True)
class PatchReading:
    """One patched cache's reading: what was patched, and the gold answer's log-probability over it."""

    direction: str  # "restore" (translated cache, native K/V patched in) or "break" (native, translated patched in)
    target: str  # "layer <l>" or a group's name
    layers: tuple[int, ...]
    bucket: str  # the positions patched: "all", or a bucket's name
    logprob: float  # mean log p per gold answer token
    share: float  # of the native − translated gap: moved back (restore) or lost (break); NaN without a gap


@dataclass(frozen=True)
class PatchingScan:
    """A patching scan of one context and question: the two ends and every patched reading."""

    native: float  # the gold answer's mean log p per token over the native cache
    translated: float  # … over the translated one
    readings: tuple[PatchReading, ...]

    @property
    def gap(self) -> float:
        return self.native - self.translated

    def frame(self) -> pd.DataFrame:
        """One row per reading, with the two ends beside it."""
        rows = [{**vars(r), "layers": " ".join(map(str, r.layers)), "native": self.native,
                 "translated": self.translated} for r in self.readings]
        return pd.DataFrame(rows, columns=["direction", "target", "layers", "bucket", "logprob", "share", "native",
                                           "translated"])


def _share(direction: str, logprob: float, native: float, translated: float) -> float:
    gap = native - translated
    if abs(gap) < MIN_GAP:
        return float("nan")
    return (logprob - translated) / gap if direction == "restore" else (native - logprob) / gap


def _plan(hidden: Mapping[int, tuple[int, int]] | None, translated_layers: set[int]) -> hf.AttentionPlan | None:
    """The plan a reading runs under: the translated cache's hidden positions, at the layers that hold its K/V."""
    hide = {l: span for l, span in (hidden or {}).items() if l in translated_layers}
    return hf.AttentionPlan(hide=hide) if hide else None


@torch.no_grad()
def patching_scan(model, native: list[KV], translated: list[KV], question_ids: torch.Tensor,
                  answer_ids: Sequence[int], groups: Mapping[str, Sequence[int]] | None = None,
                  buckets: Mapping[str, Sequence[int]] | None = None, layers: Sequence[int] | None = None,
                  hidden: Mapping[int, tuple[int, int]] | None = None, batch: int = BATCH) -> PatchingScan:
    """Restoring and breaking each layer (`layers`, default every layer) and each named group, at every position
    and, per bucket (name -> cache positions), at that bucket's positions only.

    native, translated: the context's two caches, per layer (K, V) [1, n_kv, N, d_h]; question_ids [1, S]: the
    question as the target reads it after the context; answer_ids: the gold answer's tokens. hidden: layer ->
    positions (start, end) the translated cache's reader may not see (KVComm's unshared layers,
    KVCommCache.plan.hide); a reading hides them only where the translated K/V sit.
    """
    num_layers = len(native)
    if len(translated) != num_layers:
        raise ConfigError(f"the translated cache has {len(translated)} layers, the native {num_layers}: scan two "
                          "caches of one target")
    if not answer_ids:
        raise ConfigError("the gold answer has no tokens to read: give a question with a gold answer")
    layers = check_layers(range(num_layers) if layers is None else layers, num_layers)
    targets = [(f"layer {l}", (l,)) for l in layers]
    targets += [(name, check_layers(group, num_layers)) for name, group in (groups or {}).items()]
    length = native[0][0].shape[2]
    bucket_positions: dict[str, tuple[int, ...] | None] = {ALL_POSITIONS: None}
    for name, positions in (buckets or {}).items():
        bucket_positions[name] = check_positions(positions, length, f"bucket {name!r}: positions")
        if hidden:
            raise ConfigError("this cache hides positions at some layers (KVComm), so its positions cannot be patched "
                              "one bucket at a time: patch all positions (leave the buckets out)")
    answer = list(answer_ids)
    # (direction, target, layers, bucket) -> (patched cache, the layers holding translated K/V)
    jobs = [(None, "", (), "", native, set()), (None, "", (), "", translated, set(range(num_layers)))]
    for bucket, positions in bucket_positions.items():
        for name, group in targets:
            jobs.append(("restore", name, group, bucket, patch(translated, native, group, positions),
                         set(range(num_layers)) - (set(group) if positions is None else set())))
            jobs.append(("break", name, group, bucket, patch(native, translated, group, positions),
                         set(group)))
    plans = [_plan(hidden, held) for *_, held in jobs]
    logprobs: list[float] = [0.0] * len(jobs)
    if hidden:  # each reading hides its own layers: one forward each, one output-layer pass for all
        logprobs = hf.continuation_scores(model, torch.cat([
            hf.continuation_states(model, [cache], question_ids, answer, plans[i])
            for i, (*_, cache, _held) in enumerate(jobs)]), answer)
    elif REUSE_LOWER_LAYERS:
        logprobs = _readings_from_layer_starts(model, jobs, question_ids, answer, batch)
    else:
        for at in range(0, len(jobs), batch):
            chunk = jobs[at : at + batch]
            logprobs[at : at + len(chunk)] = hf.continuation_logprobs(model, [job[4] for job in chunk], question_ids,
                                                                      answer)
    native_lp, translated_lp = logprobs[0], logprobs[1]
    readings = tuple(PatchReading(direction, name, group, bucket, lp, _share(direction, lp, native_lp, translated_lp))
                     for (direction, name, group, bucket, _c, _h), lp in zip(jobs[2:], logprobs[2:]))
    return PatchingScan(native_lp, translated_lp, readings)


def _readings_from_layer_starts(model, jobs: list, question_ids: torch.Tensor, answer: list[int],
                                batch: int) -> list[float]:
    """The readings of `jobs` (the native and the translated cache, then the patched ones), each patched cache read
    from its lowest patched layer up: restoring starts from the translated cache's reading, breaking from the native
    one's (hf.LayerStart). The latest starts are read first, `batch` at a time, each batch from its lowest start,
    without the output layer; one output-layer pass then scores every reading (hf.continuation_scores)."""
    num_layers = len(jobs[0][4])
    ends, trace = hf.continuation_trace(model, [jobs[0][4], jobs[1][4]], question_ids, answer)
    # (start layer, job, the row of the unpatched reading it starts from: 0 native, 1 translated), latest first
    order = sorted(((min(group, default=num_layers), i, int(direction == "restore"))
                    for i, (direction, _n, group, *_rest) in enumerate(jobs[2:], 2)), reverse=True)
    read, states = [0, 1], [ends]  # the jobs read, in the order of their states' rows
    for at in range(0, len(order), batch):
        chunk = order[at : at + batch]
        layer = min(start for start, _i, _row in chunk)
        if layer == num_layers:  # nothing patched (an empty group): the unpatched reading itself
            read += [i for _s, i, _r in chunk]
            states.append(ends[[row for *_, row in chunk]])
            continue
        rows = [row for *_, row in chunk]
        start = hf.LayerStart(layer, trace.residual[layer][rows],
                              tuple((k[rows], v[rows]) for k, v in trace.result.kv[:layer]))
        states.append(hf.continuation_states(model, [jobs[i][4] for _s, i, _r in chunk], question_ids, answer,
                                             hf.AttentionPlan(start=start)))
        read += [i for _s, i, _r in chunk]
    logprobs = [0.0] * len(jobs)
    for i, lp in zip(read, hf.continuation_scores(model, torch.cat(states), answer)):
        logprobs[i] = lp
    return logprobs
