"""The ways of sharing one context side by side (method.md §15): each method's answer, the time to its first answer
token stage by stage, the bytes it hands the target, and the per-layer K/V error of its cache against native.

The caches and answers come from the evaluator's own code (mot_viz.sharing.caches.condition_caches and
mot_viz.eval.answers.answers_from_caches, as mot_viz.eval.evaluate.example_rows builds them; the text relay from
mot_viz.sharing.relay; the linear map as mot_viz.sharing.linear.linear_cache), the bytes handed over from
mot_viz.sharing.costs.handed_bytes and the
time to the first answer token from mot_viz.eval.answers.first_token_seconds. Pure functions: no Streamlit. The
methods are the sharing registry's that have a name on this page (Method.short): native (the reference), no context,
the MoT, the linear map, the direct map, kvcomm (same-shape pairs only) and the two text relays; each says its stages
(Method.stages), what it hands over (Method.handed_what) and which target layers hold what the source sent
(Method.carries).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch

from ..engine import hf
from ..engine.alignment import encode
from ..engine.cache_errors import KV_NAMES, layer_errors, token_vectors
from ..engine.layout import context_positions
from ..engine.models import LoadedModel, kv_cache_bytes
from ..engine.mot import MoT, Translation
from ..engine.prompts import QAExample, build_prompt
from ..eval.answers import MAX_NEW_TOKENS, answers_from_caches, first_token_seconds
from ..sharing import registry
from ..sharing.caches import condition_caches
from ..sharing.relay import TOKENS_OPTION



def relays() -> tuple[str, ...]:
    """The methods this page shows that hand over a message, in the registry's order."""
    return registry.names(lambda m: bool(m.short) and m.message)


def methods() -> tuple[str, ...]:
    """The methods this page shows (those with a short name, Method.short), in its order: those handing over a cache
    (or nothing), then those handing a message."""
    return registry.names(lambda m: bool(m.short) and not m.message) + relays()


def method_labels() -> dict[str, str]:
    """Each method's name on this page."""
    return {name: registry.method(name).short for name in methods()}


def cache_methods_shown() -> tuple[str, ...]:
    """The methods that hand the target a cache of the context the source read (mot, linear, direct, kvcomm)."""
    return registry.names(lambda m: m.reads_source and not m.message and not m.tie, methods())


FIRST_TOKEN = "first answer token"
STAGES = ("source prefill", "alignment", "translation", "replay", "cache assembly", "message writing",
          "target prefill", "target prefill of the message", FIRST_TOKEN)
# the stages that can run before the question arrives, once the source has read the context: its prefill, and the
# writing of a message that needs no question (relay's; relay_q's writing stays after the question)
AHEAD_STAGES = ("source prefill", "message writing")


@dataclass(frozen=True)
class MethodsResult:
    """What the methods computed for one context; every table has a ``method`` column (methods())."""

    answers: pd.DataFrame  # method, answer, score (F1 / correct; NaN without a gold answer), exact_match
    stages: pd.DataFrame  # method, stage (STAGES), seconds: the stages up to the first answer token, in order
    handed_over: pd.DataFrame  # method, what, bytes (Method.handed_bytes: caches in fp16),
    # full_cache_bytes (a full target cache of the context, fp16)
    kv_error: pd.DataFrame  # method, layer, kv, carries (the layer holds what the source sent), mse, rel_l2, cosine
    messages: dict[str, str] = field(default_factory=dict)  # relay method -> the source's message
    recorded: dict = field(default_factory=dict)  # what the methods' artifacts recorded (kvcomm's layer choice)

    def first_token_seconds(self) -> pd.Series:
        """Seconds from the text to the first answer token per method (the sum of its stages)."""
        return self.stages.groupby("method", sort=False)["seconds"].sum()

    def after_question_seconds(self) -> pd.Series:
        """Seconds from the question's arrival to the first answer token per method: its stages but those done
        ahead (AHEAD_STAGES)."""
        later = self.stages[[not is_ahead(m, s) for m, s in zip(self.stages["method"], self.stages["stage"])]]
        return later.groupby("method", sort=False)["seconds"].sum().reindex(
            self.stages["method"].unique(), fill_value=0.0)


def is_ahead(method: str, stage: str) -> bool:
    """Whether a method's stage can run before the question arrives (AHEAD_STAGES): the source's prefill always, a
    message's writing when the message needs no question."""
    if stage == "message writing":
        way = registry.REGISTRY.get(method)
        return way is not None and way.message and not way.for_question
    return stage in AHEAD_STAGES


def combine(*results: MethodsResult) -> MethodsResult:
    """Several results of one context as one (e.g. the cache methods and the relay, computed apart)."""
    def cat(name: str) -> pd.DataFrame:
        return pd.concat([getattr(r, name) for r in results], ignore_index=True)
    return MethodsResult(cat("answers"), cat("stages"), cat("handed_over"), cat("kv_error"),
                         {k: v for r in results for k, v in r.messages.items()},
                         {k: v for r in results for k, v in r.recorded.items()})


def _suffix_ids(target: LoadedModel, example: QAExample, suffix_text: str | None) -> torch.Tensor:
    suffix = suffix_text if suffix_text is not None else build_prompt(example, target.chat_frame).suffix_text
    return target.ids_tensor(encode(target.tokenizer, suffix))


def _answer_rows(answers: dict) -> list[dict]:
    return [{"method": m, "answer": a.text, "score": float("nan") if a.score is None else a.score,
             "exact_match": float("nan") if a.exact_match is None else a.exact_match} for m, a in answers.items()]


def kv_error_rows(method: str, cache: list[hf.KV], native: list[hf.KV], prefix_len: int,
                  carries: tuple[int, ...], layers: tuple[int, ...] | None = None) -> list[dict]:
    """Per layer (all, or `layers`) and K/V: the cache's error against the native one over the context positions
    (mot_viz.analysis.cache_metrics.layer_errors); ``carries``: the layers that hold what the source sent."""
    rows = []
    for layer in (range(len(native)) if layers is None else layers):
        cand, ref = context_positions(cache[layer], prefix_len), context_positions(native[layer], prefix_len)
        for j, kv in enumerate(KV_NAMES):
            rows.append({"method": method, "layer": layer, "kv": kv, "carries": layer in carries,
                         **layer_errors(token_vectors(cand[j]), token_vectors(ref[j]))})
    return rows


@torch.no_grad()
def cache_methods(mot: MoT, source: LoadedModel, target: LoadedModel, example: QAExample, translation: Translation,
                  suffix_text: str | None = None, artifacts=None, options=None,
                  max_new_tokens: int = MAX_NEW_TOKENS) -> MethodsResult:
    """native, no context, MoT and every other method on this page that hands over a cache and has what it loads
    (`artifacts`, by method name: Method.load, e.g. the linear map, the direct map, kvcomm's layer choice) on the
    translation's context: each cache built as the evaluator builds it, its time to the first answer token by stage,
    its answer (the batch of mot_viz.eval.answers.answers_from_caches; kvcomm under its plan), what it hands over and
    its per-layer K/V error against native. `options`: the run's options, by Option.name.
    """
    artifacts = artifacts or {}
    conditions = tuple(m for m in methods() if m not in relays() and registry.method(m).has(artifacts.get(m)))
    built = condition_caches(mot, source, target, example, translation, conditions=conditions, options=options,
                             artifacts=artifacts)
    caches = dict(built.kv)
    n_target, p = int(translation.target_ids.shape[1]), translation.prefix_len
    full = kv_cache_bytes(target.spec, n_target)
    suffix_ids = _suffix_ids(target, example, suffix_text)
    stages, handed, errors = {}, [], []
    for name, kv in caches.items():
        m = registry.method(name)
        carries = m.carries(mot, artifacts.get(name))
        window = len(carries) if carries else 0
        stages[name] = built.stages(name) + [(FIRST_TOKEN, first_token_seconds(target, kv, suffix_ids,
                                                                                 built.plans.get(name)))]
        b = built.built[name]
        handed.append({"method": name, "what": m.handed_what(b, target.spec, window),
                       "bytes": int(m.handed_bytes(b, n_target, target.spec, window, source.spec)),
                       "full_cache_bytes": full})
        if carries is not None:  # a cache of the context: against native's, at every layer or (the source's own
            # K/V) at the layers it shares
            errors += kv_error_rows(name, kv, translation.native_kv, p, carries,
                                    layers=None if m.comparable else carries)
    answers = answers_from_caches(target, caches, example, max_new_tokens, suffix_text, plans=built.plans)
    return MethodsResult(pd.DataFrame(_answer_rows(answers)), _stage_table(stages), pd.DataFrame(handed),
                         pd.DataFrame(errors), recorded=registry.recorded(artifacts))


@torch.no_grad()
def relay_methods(mot: MoT, source: LoadedModel, target: LoadedModel, example: QAExample, translation: Translation,
                  relay_tokens: int = TOKENS_OPTION.default,
                  max_new_tokens: int = MAX_NEW_TOKENS, conditions: tuple[str, ...] | None = None
                  ) -> MethodsResult:
    """The text relays (mot_viz.sharing.relay through condition_caches): the source writes its message (at most
    `relay_tokens` tokens), the target prefills only it and answers. They hand over the message's bytes and produce
    no cache of the context, so they have no K/V error. The target reads the message in the prompt it answers
    ``native`` in for a dataset example (build_prompt, the message in the passage's place), and the question after it.
    """
    built = condition_caches(mot, source, target, example, translation, conditions=conditions or relays(),
                             options={TOKENS_OPTION.name: relay_tokens})
    suffix_ids = _suffix_ids(target, example, None)
    stages = {c: built.stages(c) + [(FIRST_TOKEN, first_token_seconds(target, kv, suffix_ids))]
              for c, kv in built.kv.items()}
    answers = answers_from_caches(target, dict(built.kv), example, max_new_tokens)
    full = kv_cache_bytes(target.spec, int(translation.target_ids.shape[1]))
    handed = [{"method": c, "what": registry.method(c).handed_what(b, target.spec, 0),
               "bytes": int(registry.method(c).handed_bytes(b, 0, target.spec, 0)), "full_cache_bytes": full}
              for c, b in built.built.items()]
    return MethodsResult(pd.DataFrame(_answer_rows(answers)), _stage_table(stages), pd.DataFrame(handed),
                         pd.DataFrame(columns=["method", "layer", "kv", "carries", "mse", "rel_l2", "cosine"]),
                         {c: b.held.message for c, b in built.built.items()})


def _stage_table(stages: dict[str, list[tuple[str, float]]]) -> pd.DataFrame:
    return pd.DataFrame([{"method": m, "stage": s, "seconds": float(v)} for m, rows in stages.items() for s, v in rows])


def summary_table(result: MethodsResult, metric: str | None) -> pd.DataFrame:
    """One row per method, in methods()' order: its answer, score, seconds to the first answer token (from the text,
    and from the question's arrival: the stages done ahead left out) and bytes handed over (metric: "F1" /
    "correct"; None when the context has no gold answer: no score column)."""
    table = result.answers.set_index("method")
    table = table.join(result.first_token_seconds().rename("seconds to the first answer token"))
    table = table.join(result.after_question_seconds().rename("seconds after the question"))
    table = table.join(result.handed_over.set_index("method")[["what", "bytes"]].rename(
        columns={"what": "handed over", "bytes": "bytes handed over"}))
    table = table.reindex([m for m in methods() if m in table.index]).reset_index()
    table.insert(1, "label", table["method"].map(method_labels()))
    table = table.drop(columns="exact_match" if metric != "F1" else [])
    return table.rename(columns={"score": metric}) if metric else table.drop(columns="score")
