"""One injection window on one context: trace, KL and task metric of its caches against native (§9.1, §9.2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ...engine.channels import Channels
from ...engine.hf import KV
from ...engine.models import LoadedModel
from ...engine.mot import MoT, Translation, replay_window, translate
from ...errors import ConfigError
from ...eval.answers import PromptedCache, answer_from_cache
from ...sharing.names import REFERENCE, TRANSLATED
from ...sharing.random_window import RANDOM
from .cases import ContextCase, ReplayFn, window_caches
from .metrics import TRACE_CONDITIONS, TokenShift, WindowShift, kl_divergence, token_shifts
from .trace import CacheTrace, trace_caches, trace_prompted

KL_PAIRS = (("native", "dir_only"), ("native", "mag_only"), ("native", "full_mix"),
            ("full_mix", "dir_only"), ("full_mix", "mag_only"))  # method.md §9.1


# ----- one window on one context ----------------------------------------------------------------------------


@dataclass
class WindowRun:
    """Everything measured for one window on one context."""

    shifts: list[TokenShift]
    skipped: dict[str, int]
    kl: dict[str, float]  # "ref||cand" -> KL of the next-token distributions after the seed
    scores: dict[str, float]  # condition -> task score (F1 or accuracy); empty without an example
    answer_logprob: dict[str, float]  # condition -> mean log p of the teacher-forced gold answer tokens


def run_window(target: LoadedModel, case: ContextCase, native_trace: CacheTrace, caches: dict[str, list[KV]],
               channels: Channels, example_index: int = 0, task_metric: bool = True,
               native_score: float | None = None, max_new_tokens: int = 16,
               traces: dict[str, CacheTrace] | None = None) -> WindowRun:
    """Trace, KL and task metric of the given window caches against native, for one context.

    The caches' traces are read in one batched forward (trace_caches), except those given in `traces`.
    """
    logps = {"native": native_trace.seed_logprobs}
    answer_lp = {"native": native_trace.answer_logprob}
    shifts: list[TokenShift] = []
    skipped: dict[str, int] = {}
    traces = dict(traces or {})
    missing = [c for c in caches if c not in traces]
    if missing:
        traces.update(zip(missing, trace_caches(target, [caches[c] for c in missing], case.suffix_ids, case.answer_ids,
                                                residuals=any(c in TRACE_CONDITIONS for c in missing))))
    for cond in caches:
        trace = traces[cond]
        logps[cond], answer_lp[cond] = trace.seed_logprobs, trace.answer_logprob
        if cond in TRACE_CONDITIONS:
            got, skip = token_shifts(native_trace, trace, channels.start, channels.end + 1, cond, example_index)
            shifts += got
            skipped[cond] = skip
    kl = {f"{a}||{b}": kl_divergence(logps[a], logps[b]) for a, b in KL_PAIRS if a in logps and b in logps}
    scores: dict[str, float] = {}
    if task_metric and case.example is not None:
        scores = {c: answer_from_cache(target, kv, case.example, c, max_new_tokens).score
                  for c, kv in caches.items() if c != "random"}
        if native_score is not None:
            scores["native"] = native_score
    return WindowRun(shifts, skipped, kl, scores, answer_lp)


class WindowAnalysis(NamedTuple):
    """A checkpoint's own window on one context: the §9.2 shifts, and everything measured on the way."""

    shift: WindowShift
    run: WindowRun


def analyse_translation(mot: MoT, source: LoadedModel, target: LoadedModel, case: ContextCase,
                        translation: Translation | None = None, seed: int = 0,
                        conditions: Sequence[str] = ("full_mix", "random"), task_metric: bool = False,
                        max_new_tokens: int = 16, random_kv: list[KV] | None = None,
                        answer_likelihood: bool = True,
                        prompted: dict[str, PromptedCache] | None = None) -> WindowAnalysis:
    """§9.2 for a checkpoint's own window on one context: native vs the MoT cache vs the random control.

    The MoT cache is replayed the way the checkpoint replays (sparse if it is sparse); the shift
    already present below the window then shows up as ``pre_window_shift``. random_kv: the random control's
    cache of this translation and seed if already built (answers.random_control_cache), to save its replay.
    answer_likelihood=False leaves the answer tokens' log-likelihood out (nan; the app's page does not show it).
    prompted: what an answers batch computed running the case's suffix over the native, MoT and random caches
    (answers.PromptedCache, keyed "native", "mot", "random"; the random one of this seed and of random_kv): only the
    answer tokens then run (the answer likelihood is then nan). Used only when it holds all three.
    """
    if translation is None:
        translation = translate(mot, source, target, case.context_text)
    if translation.native_kv is None:
        raise ConfigError("the translation must include the native cache (translate(..., with_native=True))")
    if not torch.equal(translation.target_ids, case.target_ids):
        raise ConfigError("the translation was made for another context than this case")
    channels = mot.channels
    nk, nv = translation.native_window_blocks(channels)
    replay_fn = _mot_replay(mot, target, translation)
    caches = window_caches(replay_fn, nk, nv, translation.translated.keys, translation.translated.values,
                           conditions, seed, ready={"full_mix": translation.mixed_kv}
                           | ({"random": random_kv} if random_kv is not None else {}))
    rows = {"full_mix": TRANSLATED, "random": RANDOM.name}  # window condition -> answers condition
    if prompted is not None and REFERENCE in prompted and all(rows.get(c) in prompted for c in caches):
        given = [prompted[REFERENCE]] + [prompted[rows[c]] for c in caches]
        if any(p.question_kv[0][0].shape[2] != case.suffix_ids.shape[1] for p in given):
            raise ConfigError("the prompted caches were made for another question than this case's suffix")
        contexts = [translation.native_kv] + [caches[c] for c in caches]
        traced = trace_prompted(target, [p.kv(ctx) for p, ctx in zip(given, contexts)],
                                [p.first_logprobs for p in given], case.answer_ids)
    else:  # native and the window caches hold the same positions: one batched forward traces them all
        traced = trace_caches(target, [translation.native_kv] + [caches[c] for c in caches], case.suffix_ids,
                              case.answer_ids, answer_likelihood=answer_likelihood)
    native_trace, traces = traced[0], dict(zip(caches, traced[1:]))
    native_score = None
    if task_metric and case.example is not None:
        native_score = answer_from_cache(target, translation.native_kv, case.example, "native", max_new_tokens).score
    run = run_window(target, case, native_trace, caches, channels, 0, task_metric, native_score, max_new_tokens,
                     traces)
    ws = WindowShift("trained", channels.start, channels.end, target.spec.num_layers, run.shifts, run.skipped)
    return WindowAnalysis(ws, run)


def _mot_replay(mot: MoT, target: LoadedModel, translation: Translation) -> ReplayFn:
    """Replay windows the way this MoT replayed this context (its sparse indices, from its state entering the window)."""
    return lambda k, v: replay_window(mot, target, translation, k, v)
