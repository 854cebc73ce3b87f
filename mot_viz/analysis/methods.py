"""The ways of sharing one context side by side (method.md §15): each method's answer, the time to its first answer
token stage by stage, the bytes it hands the target, and the per-layer K/V error of its cache against native.

The caches and answers come from the evaluator's own code (mot_viz.sharing.caches.condition_caches and
mot_viz.eval.answers.answers_from_caches, as mot_viz.eval.evaluate.example_rows builds them; the text relay from
mot_viz.sharing.relay; the linear map as mot_viz.sharing.linear.linear_cache), the bytes handed over from
mot_viz.sharing.costs.handed_bytes and the
time to the first answer token from mot_viz.eval.answers.first_token_seconds. Pure functions: no Streamlit. The
methods:

* ``native`` — the target prefills the context itself (the reference);
* ``no_context`` — only the question;
* ``mot`` — the checkpoint's translation of the window, replayed;
* ``linear`` — the closed-form map of the same window on the same source context, replayed as the MoT's is;
* ``direct`` — a full-depth map without replay: every layer translated, the target never reads the context;
* ``kvcomm`` — the source's own K/V at the chosen layers, token 0 elsewhere (same-shape pairs only);
* ``relay`` / ``relay_q`` — the source writes a message (a summary; background for the question) and the target
  reads only that.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pandas as pd
import torch

from ..engine import hf
from ..engine.alignment import encode
from ..engine.cache_errors import KV_NAMES, layer_errors, token_vectors
from ..engine.layout import context_positions
from ..engine.models import LoadedModel, kv_cache_bytes
from ..engine.mot import MoT, Translation, replay_window, translate_window
from ..engine.prompts import QAExample, build_prompt
from ..eval.answers import MAX_NEW_TOKENS, answers_from_caches, first_token_seconds
from ..sharing import registry
from ..sharing.caches import condition_caches
from ..sharing.costs import handed_bytes
from ..sharing.kvcomm import KVCommSelection
from ..sharing.relay import RELAY_CONDITIONS, RELAY_TOKENS

METHODS = ("native", "no_context", "mot", "linear", "direct", "kvcomm", "relay", "relay_q")
METHOD_LABELS = {
    "native": "native (the target reads the context)",
    "no_context": "no context (question only)",
    "mot": "MoT (translated window, replayed)",
    "linear": "linear map (same window, replayed)",
    "direct": "direct map (every layer, no replay)",
    "kvcomm": "KVComm (the source's K/V at chosen layers)",
    "relay": "text relay (summary)",
    "relay_q": "text relay (background for the question)",
}
# the methods that hand the target a cache of the context the source read (mot, linear, direct, kvcomm)
CACHE_METHODS = registry.names(lambda m: m.reads_source and not m.message and not m.tie, METHODS)
FIRST_TOKEN = "first answer token"
STAGES = ("source prefill", "alignment", "translation", "replay", "cache assembly", "message writing",
          "target prefill", "target prefill of the message", FIRST_TOKEN)
# the stages that can run before the question arrives, once the source has read the context: its prefill, and the
# writing of relay's message, which needs no question (relay_q's does: its writing stays after the question)
AHEAD_STAGES = {"source prefill": None,  # stage -> the methods it is ahead for (None: all)
                "message writing": registry.names(lambda m: m.message and not m.for_question)}
# a translation's timing keys -> the stage names every method shares
_TRANSLATION_STAGES = {"source_prefill": "source prefill", "alignment": "alignment", "translator": "translation",
                       "replay": "replay", "assemble": "cache assembly"}


@dataclass(frozen=True)
class MethodsResult:
    """What the methods computed for one context; every table has a ``method`` column (METHODS)."""

    answers: pd.DataFrame  # method, answer, score (F1 / correct; NaN without a gold answer), exact_match
    stages: pd.DataFrame  # method, stage (STAGES), seconds: the stages up to the first answer token, in order
    handed_over: pd.DataFrame  # method, what, bytes (mot_viz.sharing.costs.handed_bytes: caches in fp16),
    # full_cache_bytes (a full target cache of the context, fp16)
    kv_error: pd.DataFrame  # method, layer, kv, carries (the layer holds what the source sent), mse, rel_l2, cosine
    messages: dict[str, str] = field(default_factory=dict)  # relay method -> the source's message
    kvcomm_layers: tuple[int, ...] = ()  # the layers kvcomm shares (when computed)

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
    """Whether a method's stage can run before the question arrives (AHEAD_STAGES)."""
    return stage in AHEAD_STAGES and (AHEAD_STAGES[stage] is None or method in AHEAD_STAGES[stage])


def combine(*results: MethodsResult) -> MethodsResult:
    """Several results of one context as one (e.g. the cache methods and the relay, computed apart)."""
    def cat(name: str) -> pd.DataFrame:
        return pd.concat([getattr(r, name) for r in results], ignore_index=True)
    return MethodsResult(cat("answers"), cat("stages"), cat("handed_over"), cat("kv_error"),
                         {k: v for r in results for k, v in r.messages.items()},
                         next((r.kvcomm_layers for r in results if r.kvcomm_layers), ()))


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
                  suffix_text: str | None = None, linear: MoT | None = None, direct: MoT | None = None,
                  kvcomm: KVCommSelection | None = None, max_new_tokens: int = MAX_NEW_TOKENS) -> MethodsResult:
    """native, no context, MoT and (when given) the linear map, the direct map and kvcomm on the translation's
    context: each cache built as the evaluator builds it, its time to the first answer token by stage, its answer
    (the batch of mot_viz.eval.answers.answers_from_caches; kvcomm under its plan), what it hands over and its
    per-layer K/V error against native.

    linear: a linear checkpoint of the MoT's window (replayed as the MoT's is); direct: a full-depth map without
    replay; kvcomm: the layer choice of a same-shape pair (mot_viz.sharing.kvcomm.kvcomm_selection).
    """
    conditions = ("native", "no_context", "mot") + (("direct",) if direct is not None else ()) + \
        (("kvcomm",) if kvcomm is not None else ())
    built = condition_caches(mot, source, target, example, translation, conditions=conditions, kvcomm=kvcomm,
                             direct=direct)
    caches, timings = dict(built.kv), translation.timings
    n_target, p = int(translation.target_ids.shape[1]), translation.prefix_len
    stages = {"native": [("target prefill", built.seconds["native"])],
              "no_context": [("target prefill", built.seconds["no_context"])],
              "mot": _translation_stages(timings)}
    # native hands over nothing (the target reads the text): its row is what a full cache would move instead
    what = {"native": "a full target cache of the context, were it handed over", "no_context": "nothing",
            "mot": f"the translated window's K/V ({mot.channels.window} layers)"}
    errors = kv_error_rows("mot", translation.mixed_kv, translation.native_kv, p, mot.channels.target_layers)
    if linear is not None:  # mot_viz.sharing.linear.linear_cache, its two steps timed apart
        start = time.perf_counter()
        out = translate_window(linear, translation.source, source, target)
        mapped = time.perf_counter() - start
        start = time.perf_counter()
        caches["linear"] = replay_window(mot, target, translation, out.keys, out.values)
        stages["linear"] = [("source prefill", timings["source_prefill"]), ("alignment", timings["alignment"]),
                            ("translation", mapped), ("replay", time.perf_counter() - start)]
        what["linear"] = f"the mapped window's K/V ({linear.channels.window} layers)"
        errors += kv_error_rows("linear", caches["linear"], translation.native_kv, p, linear.channels.target_layers)
    if direct is not None:  # its own translation of the text, its stages kept by condition_caches
        stages["direct"] = _translation_stages(built.direct.timings)
        what["direct"] = f"every layer's translated K/V ({target.spec.num_layers} layers)"
        errors += kv_error_rows("direct", caches["direct"], translation.native_kv, p, direct.channels.target_layers)
    if kvcomm is not None:
        stages["kvcomm"] = [("source prefill", built.seconds["kvcomm"])]
        what["kvcomm"] = f"the source's own K/V at {len(kvcomm.layers)} of {target.spec.num_layers} layers"
        errors += kv_error_rows("kvcomm", caches["kvcomm"], translation.native_kv, p, kvcomm.layers,
                                layers=kvcomm.layers)
    windows = {"mot": mot.channels.window, "linear": linear.channels.window if linear is not None else 0}
    handed = {m: (text, int(handed_bytes(m, n_target, target.spec, windows.get(m, 0), kvcomm=kvcomm,
                                           source=source.spec))) for m, text in what.items()}
    suffix_ids = _suffix_ids(target, example, suffix_text)
    for method, kv in caches.items():
        stages[method].append((FIRST_TOKEN, first_token_seconds(target, kv, suffix_ids, built.plans.get(method))))
    answers = answers_from_caches(target, caches, example, max_new_tokens, suffix_text, plans=built.plans)
    full = kv_cache_bytes(target.spec, n_target)
    return MethodsResult(
        pd.DataFrame(_answer_rows(answers)), _stage_table(stages),
        pd.DataFrame([{"method": m, "what": text, "bytes": b, "full_cache_bytes": full}
                      for m, (text, b) in handed.items()]),
        pd.DataFrame(errors), kvcomm_layers=kvcomm.layers if kvcomm is not None else ())


@torch.no_grad()
def relay_methods(mot: MoT, source: LoadedModel, target: LoadedModel, example: QAExample, translation: Translation,
                  relay_tokens: int = RELAY_TOKENS,
                  max_new_tokens: int = MAX_NEW_TOKENS, conditions: tuple[str, ...] = RELAY_CONDITIONS
                  ) -> MethodsResult:
    """The text relays (mot_viz.eval.relay through condition_caches): the source writes its message (at most
    `relay_tokens` tokens), the target prefills only it and answers. They hand over the message's bytes and produce
    no cache of the context, so they have no K/V error. The target reads the message in the prompt it answers
    ``native`` in for a dataset example (build_prompt, the message in the passage's place), and the question after it.
    """
    built = condition_caches(mot, source, target, example, translation, conditions=conditions,
                             relay_tokens=relay_tokens)
    suffix_ids = _suffix_ids(target, example, None)
    stages = {c: [("message writing", r.generate_seconds), ("target prefill of the message", r.prefill_seconds),
                  (FIRST_TOKEN, first_token_seconds(target, r.kv, suffix_ids))] for c, r in built.relays.items()}
    answers = answers_from_caches(target, dict(built.kv), example, max_new_tokens)
    full = kv_cache_bytes(target.spec, int(translation.target_ids.shape[1]))
    handed = [{"method": c, "what": f"the message's text ({r.tokens} source tokens, UTF-8)",
               "bytes": int(handed_bytes(c, 0, target.spec, 0, relay=r)), "full_cache_bytes": full}
              for c, r in built.relays.items()]
    return MethodsResult(pd.DataFrame(_answer_rows(answers)), _stage_table(stages), pd.DataFrame(handed),
                         pd.DataFrame(columns=["method", "layer", "kv", "carries", "mse", "rel_l2", "cosine"]),
                         {c: r.message for c, r in built.relays.items()})


def _translation_stages(timings: dict[str, float]) -> list[tuple[str, float]]:
    """A translation's stages (its target's native prefill apart) under the names every method shares."""
    return [(name, timings[key]) for key, name in _TRANSLATION_STAGES.items() if key in timings]


def _stage_table(stages: dict[str, list[tuple[str, float]]]) -> pd.DataFrame:
    return pd.DataFrame([{"method": m, "stage": s, "seconds": float(v)} for m, rows in stages.items() for s, v in rows])


def summary_table(result: MethodsResult, metric: str | None) -> pd.DataFrame:
    """One row per method, in METHODS' order: its answer, score, seconds to the first answer token (from the text,
    and from the question's arrival: the stages done ahead left out) and bytes handed over (metric: "F1" /
    "correct"; None when the context has no gold answer: no score column)."""
    table = result.answers.set_index("method")
    table = table.join(result.first_token_seconds().rename("seconds to the first answer token"))
    table = table.join(result.after_question_seconds().rename("seconds after the question"))
    table = table.join(result.handed_over.set_index("method")[["what", "bytes"]].rename(
        columns={"what": "handed over", "bytes": "bytes handed over"}))
    table = table.reindex([m for m in METHODS if m in table.index]).reset_index()
    table.insert(1, "label", table["method"].map(METHOD_LABELS))
    table = table.drop(columns="exact_match" if metric != "F1" else [])
    return table.rename(columns={"score": metric}) if metric else table.drop(columns="score")
