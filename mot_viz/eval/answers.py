"""What the target answers from each cache: native context, no context, MoT-translated, random control.

Used by the evaluator (mot_viz.eval.evaluate) and the app alike, so both score answers the same way
(method.md §8): the prompt's context part is cached (natively or translated), its suffix is appended
natively, then the target decodes greedily (extractive) or scores each choice label (closed set, rule a).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..engine import hf
from ..engine.alignment import encode
from ..engine.controls import random_control_window
from ..engine.models import LoadedModel
from ..engine.mot import MoT, Translation, empty_context_cache, replay_window, translate, translate_window
from ..engine.prompts import Prompt, QAExample, build_prompt, choice_label_texts
from ..errors import ConfigError, ContextError
from ..train.mean_vector import MeanVectors
from .kvcomm import KVCommSelection, kvcomm_cache
from .qa_metrics import exact_match, normalize_answer, postprocess_generation, squad_f1
from .relay import RELAY_CONDITIONS, RELAY_TOKENS, Relay, relay

CONDITIONS = ("native", "no_context", "mot", "random")  # what every evaluation and the app answer under
MAX_NEW_TOKENS = 24  # greedy answer length of the evaluator, the app and the benchmarks
# on request: mean needs the mean native window (mot_viz.train.mean_vector.mean_vectors); relay and relay_q have the
# source write a message the target reads instead of the context (mot_viz.eval.relay)
EXTRA_CONDITIONS = ("mean", *RELAY_CONDITIONS, "kvcomm", "direct")
CONDITION_LABELS = {
    "native": "Native context (target prefilled the text itself)",
    "no_context": "No context (question only)",
    "mot": "MoT-translated cache",
    "random": "Random-window control (norm-matched noise)",
    "mean": "Mean-vector control (window = mean native K/V, no context-specific content)",
    "relay": "Text relay (the source's summary of the context, read by the target)",
    "relay_q": "Question-aware text relay (the source's background for the question, read by the target)",
    "kvcomm": "Selective layer sharing (KVComm: the source's own K/V at the chosen layers, token 0 elsewhere)",
    "direct": "Full-depth direct map (every layer's K/V translated, no replay: the target never reads the context)",
}


@dataclass
class Answer:
    """One condition's answer to one example."""

    condition: str
    text: str  # post-processed generation, or the chosen label
    score: float | None  # F1 (extractive) or correctness 0/1 (closed set); None without a gold answer
    exact_match: float | None  # extractive with a gold answer only
    choice_logprobs: tuple[float, ...] | None  # closed set only: mean log p per label
    seconds: float  # time to answer from the cache (excludes building the cache)


# the caches that hold no context-specific content in the MoT's window, or no context at all: where one gives the
# MoT's answer, that answer does not show the translation carried the passage
TIE_CONDITIONS = ("random", "mean", "no_context")
TIE_LABELS = {"random": "random-window control", "mean": "mean-vector control",
              "no_context": "question alone (no context)"}  # as a sentence names them


def ties_with_mot(answers: dict[str, str]) -> list[str]:
    """The conditions of TIE_CONDITIONS whose answer (condition -> answer text, as answered) is the MoT's, compared as
    SQuAD compares answers (normalize_answer); [] without a MoT answer."""
    if "mot" not in answers:
        return []
    mot = normalize_answer(answers["mot"])
    return [c for c in TIE_CONDITIONS if c in answers and normalize_answer(answers[c]) == mot]


def random_control_cache(mot: MoT, target: LoadedModel, translation: Translation, seed: int = 0) -> list[hf.KV]:
    """Replay with the norm-matched random window (method.md §9.2), drawn independently for K and V."""
    out = translation.translated
    k, v = random_control_window(*translation.native_window_blocks(mot.channels), out.keys, out.values, seed)
    with torch.no_grad():
        return replay_window(mot, target, translation, k, v)


def mean_vector_cache(mot: MoT, target: LoadedModel, translation: Translation, means: MeanVectors) -> list[hf.KV]:
    """Replay with every window token's K/V replaced by the layer's mean native K/V (method.md §13, "Mean vector").

    `means`: the mean native window of this target and window layers; the sparse indices are the translation's.
    """
    k, v = means.blocks(translation.target_ids.shape[1])
    with torch.no_grad():
        return replay_window(mot, target, translation, k, v)


def linear_cache(mot: MoT, linear: MoT, source: LoadedModel, target: LoadedModel, translation: Translation) -> list[hf.KV]:
    """The closed-form map's window on the translation's own source context, replayed as the MoT's was."""
    with torch.no_grad():
        out = translate_window(linear, translation.source, source, target)
        return replay_window(mot, target, translation, out.keys, out.values)


def answer_is_complete(text: str) -> bool:
    """Whether decoding can stop: post-processing (method.md §8: strip, then cut at the first line break) would cut
    this text at a line break after its first non-blank character, so no later token can change the scored answer.
    A leading blank line does not end the answer (the model may put its answer on the next line)."""
    body = text.lstrip()
    return "\n" in body or "\r" in body


def check_question_fits(target: LoadedModel, kv: list[hf.KV] | None, question_tokens: int, answer_tokens: int) -> None:
    """Raise ContextError unless the cached context, the question and the answer fit the target's positions."""
    context = 0 if kv is None else max(k.shape[2] for k, _ in kv)  # its BOS prefix included
    needed = context + question_tokens + answer_tokens
    if needed > target.spec.max_positions:
        raise ContextError(
            f"The context ({context} tokens), the question ({question_tokens}) and the answer (up to {answer_tokens}) "
            f"need {needed} positions; the target model '{target.spec.name}' allows at most "
            f"{target.spec.max_positions} tokens. Shorten the context or the question "
            "(python -m mot_viz.eval.evaluate: lower --max_context_tokens or --max_new_tokens)."
        )


@dataclass(frozen=True)
class Question:
    """One example's question as the target reads it after a cache of the context, encoded once per example however
    many conditions answer it: the prompt's suffix and, for a closed-set example, each choice label."""

    suffix_ids: torch.Tensor  # [1, S] on the target's device
    labels: list[str]  # closed set only: the choice labels, in order
    label_ids: list[list[int]]  # the ids of " " + each label


def encode_question(target: LoadedModel, example: QAExample, suffix_text: str | None = None) -> Question:
    """The Question of `example` (suffix_text: its prompt's suffix, built from the example when not given)."""
    suffix = suffix_text if suffix_text is not None else build_prompt(example, target.chat_frame).suffix_text
    labels = choice_label_texts(example) if example.kind == "closed" else []
    return Question(target.ids_tensor(encode(target.tokenizer, suffix)), labels,
                    [encode(target.tokenizer, " " + lab) for lab in labels])


def answer_from_cache(target: LoadedModel, kv: list[hf.KV] | None, example: QAExample, condition: str,
                      max_new_tokens: int = MAX_NEW_TOKENS, suffix_text: str | None = None,
                      plan: hf.AttentionPlan | None = None, question: Question | None = None) -> Answer:
    """The target's answer to `example` given a cache of its context (None: no context), under `plan` if given;
    `question`: the example's encode_question, when already made (else encoded here from suffix_text).

    Raises ContextError when the context, the question and the longest answer do not fit the target's positions.
    """
    question = question or encode_question(target, example, suffix_text)
    suffix_ids, labels, label_ids = question.suffix_ids, question.labels, question.label_ids
    check_question_fits(target, kv, suffix_ids.shape[1], max(map(len, label_ids)) if labels else max_new_tokens)
    start = time.perf_counter()
    if example.kind == "closed":
        logps = tuple(hf.continuation_logprob(target.model, kv, suffix_ids, ids, plan) for ids in label_ids)
        pick = max(range(len(labels)), key=lambda i: logps[i])
        return Answer(condition, labels[pick], float(pick == example.label), None, logps, time.perf_counter() - start)
    with hf.active_plan(plan):
        tokens = hf.greedy_generate(
            target.model, kv, suffix_ids, max_new_tokens, hf.eos_ids(target.model, target.tokenizer),
            stop_when=lambda generated: answer_is_complete(
                target.tokenizer.decode(generated, skip_special_tokens=True)))
    return _scored(example, condition, target.tokenizer.decode(tokens, skip_special_tokens=True),
                   time.perf_counter() - start)


@dataclass(frozen=True)
class PromptedCache:
    """What an answers batch computed for one condition's cache in its prompt step: the question's K/V appended to
    that cache and the log-probabilities of the first answer token there. The Per-layer page's first-token KL and
    the Shift page's trace would otherwise compute them again (each runs the question over the same cache)."""

    question_kv: list[hf.KV]  # per layer, the K/V of the question's positions only, each [1, n_kv, S, d_h]
    first_logprobs: torch.Tensor  # [V] float32 log p of the first answer token

    def kv(self, context_kv: list[hf.KV]) -> list[hf.KV]:
        """The whole cache after the prompt step: the condition's own cache of the context, then the question."""
        return [(torch.cat([k, qk], dim=2), torch.cat([v, qv], dim=2))
                for (k, v), (qk, qv) in zip(context_kv, self.question_kv, strict=True)]


def answers_from_caches(target: LoadedModel, caches: dict[str, list[hf.KV] | None], example: QAExample,
                        max_new_tokens: int = MAX_NEW_TOKENS, suffix_text: str | None = None,
                        prompted: dict[str, PromptedCache] | None = None,
                        plans: dict[str, hf.AttentionPlan] | None = None,
                        question: Question | None = None) -> dict[str, Answer]:
    """answer_from_cache for every condition, with the extractive answers decoded as one batch (the no-context
    cache, shorter than the others, left-padded: hf.greedy_generate_batch). Each answer's seconds are the batch's
    decoding time shared evenly among its rows. prompted: filled with a PromptedCache per batch row that needed no
    padding (the conditions whose caches hold the whole context), if given. plans: condition -> the plan its cache is
    read under (a kvcomm cache's hidden positions); those conditions are answered one by one, outside the batch.
    question: the example's encode_question, when the caller has made it (else encoded here from suffix_text)."""
    question = question or encode_question(target, example, suffix_text)  # once, whatever the number of conditions
    plans = plans or {}
    batched = [c for c in caches if c not in plans]
    batch = batched if example.kind == "extractive" and len(batched) > 1 else []
    out = {}
    if batch:
        suffix_ids = question.suffix_ids
        for condition in batch:
            check_question_fits(target, caches[condition], suffix_ids.shape[1], max_new_tokens)

        def keep_prompted(kv: list[hf.KV], logprobs: torch.Tensor) -> None:
            n_question = suffix_ids.shape[1]
            longest = kv[0][0].shape[2] - n_question
            for row, condition in enumerate(batch):
                cache = caches[condition]
                if cache is not None and cache[0][0].shape[2] == longest:  # not padded
                    question = [(k[row : row + 1, :, -n_question:].clone(), v[row : row + 1, :, -n_question:].clone())
                                for k, v in kv]
                    prompted[condition] = PromptedCache(question, logprobs[row].clone())

        start = time.perf_counter()
        rows = hf.greedy_generate_batch(
            target.model, [caches[c] for c in batch], suffix_ids, max_new_tokens,
            hf.eos_ids(target.model, target.tokenizer),
            stop_when=lambda generated: answer_is_complete(target.tokenizer.decode(generated, skip_special_tokens=True)),
            on_prompt=None if prompted is None else keep_prompted)
        seconds = (time.perf_counter() - start) / len(batch)
        for condition, tokens in zip(batch, rows):
            out[condition] = _scored(example, condition, target.tokenizer.decode(tokens, skip_special_tokens=True),
                                     seconds)
    for condition, kv in caches.items():
        if condition not in out:
            out[condition] = answer_from_cache(target, kv, example, condition, max_new_tokens,
                                               plan=plans.get(condition), question=question)
    return {c: out[c] for c in caches}


def _scored(example: QAExample, condition: str, generated: str, seconds: float) -> Answer:
    """An extractive answer: post-processed (method.md §8) and scored against the gold answers if there are any."""
    text = postprocess_generation(generated)
    if not example.answers:  # free text typed in the app: nothing to score against
        return Answer(condition, text, None, None, None, seconds)
    return Answer(condition, text, squad_f1(text, example.answers), exact_match(text, example.answers), None, seconds)


@dataclass(frozen=True)
class ConditionCaches:
    """Each requested condition's cache of one context, and the seconds it took to build from the text.

    The one owner of these times, for the evaluator and the app alike: native = the target's own prefill;
    no_context = the empty cache; mot = every stage of the translation but the native prefill
    (:func:`translated_seconds`); random = the same plus its own replay (its noise is norm-matched to the
    translation's error, so it needs the translation); mean = its own replay (the mean native window is
    computed once per target and window, not per context); relay and relay_q = the source writing its message
    and the target's prefill of it (``relays`` holds the messages); direct = its own translation of the text by the
    full-depth map (source prefill, alignment, the map; no replay).

    ``ahead`` is the part of those seconds that can be done before the question arrives, once the source has read the
    context: the source's prefill (mot, random, direct; all of kvcomm, whose cache is the source's own) and
    ``relay``'s writing (its message needs no question); none elsewhere (relay_q writes for the question).
    """

    translation: Translation
    kv: dict[str, list[hf.KV] | None]
    seconds: dict[str, float]
    relays: dict[str, Relay] = field(default_factory=dict)  # relay conditions only
    plans: dict[str, hf.AttentionPlan] = field(default_factory=dict)  # kvcomm: answer its cache under this plan
    direct: Translation | None = None  # the "direct" condition's own translation (its stages in .timings)
    prompt: Prompt | None = None  # the example's prompt, built once: its context was translated, its suffix is asked
    ahead: dict[str, float] = field(default_factory=dict)  # condition -> seconds of its build done ahead of the question

    def after_question(self, condition: str) -> float:
        """The seconds of a condition's build left once the question arrives (seconds less ahead)."""
        return self.seconds[condition] - self.ahead.get(condition, 0.0)


def translated_seconds(translation: Translation) -> float:
    """Seconds to build the MoT cache: every stage of the translation except the target's native prefill."""
    return sum(v for stage, v in translation.timings.items() if stage != "native_prefill")


def check_direct_map(direct: MoT | None) -> None:
    """Raise ConfigError unless `direct` is a full-depth map without replay (the "direct" condition's cache)."""
    if direct is None or not direct.replay.direct:
        raise ConfigError("the 'direct' condition needs a full-depth map without replay: pass --direct "
                          "pretrained/smollm2-to-gemma3-direct (or a fit of python -m mot_viz.train.quickfit --direct)")


def condition_caches(mot: MoT, source: LoadedModel, target: LoadedModel, example: QAExample | None,
                     translation: Translation | None = None, seed: int = 0,
                     conditions: tuple[str, ...] = CONDITIONS, means: MeanVectors | None = None,
                     relay_tokens: int = RELAY_TOKENS, kvcomm: KVCommSelection | None = None,
                     direct: MoT | None = None) -> ConditionCaches:
    """The translation of the example's context (or the one given) and the cache of each requested condition.

    The "mean" condition needs `means` (the mean native window of this target and window layers); the relay
    conditions need the example (its passage and question), their messages at most `relay_tokens` source tokens.
    The "kvcomm" condition needs `kvcomm`, its layer choice (mot_viz.eval.kvcomm.kvcomm_selection); its cache is
    answered under ``plans["kvcomm"]`` (answers_from_caches(plans=...)).
    """
    known = CONDITIONS + EXTRA_CONDITIONS
    unknown = set(conditions) - set(known)
    if unknown:
        raise ConfigError(f"unknown conditions {sorted(unknown)}; choose from {known}")
    if "direct" in conditions:
        check_direct_map(direct)
    if "kvcomm" in conditions and kvcomm is None:
        raise ConfigError("the 'kvcomm' condition needs its layer choice: pass kvcomm=kvcomm_selection(...)")
    if "mean" in conditions and means is None:
        raise ConfigError("the 'mean' condition needs the mean native window: pass means=mean_vectors(...)")
    if example is None and set(conditions) & set(RELAY_CONDITIONS):
        raise ConfigError("the relay conditions need the example (the source writes about its passage): pass example")
    prompt = None if example is None else build_prompt(example, target.chat_frame)
    if translation is None:
        translation = translate(mot, source, target, prompt.context_text)
    build = {
        "native": lambda: translation.native_kv,
        "no_context": lambda: empty_context_cache(target),
        "mot": lambda: translation.mixed_kv,
        "random": lambda: random_control_cache(mot, target, translation, seed),
        "mean": lambda: mean_vector_cache(mot, target, translation, means),
    }
    # what each cache needed from the translation (native and MoT caches are built by translate itself)
    before = {"native": translation.timings.get("native_prefill", 0.0), "mot": translated_seconds(translation),
              "random": translated_seconds(translation)}
    kv, seconds, relays, plans, directed = {}, {}, {}, {}, None
    ahead = {c: translation.timings.get("source_prefill", 0.0) for c in ("mot", "random") if c in conditions}
    for condition in (c for c in known if c in conditions):
        if condition in RELAY_CONDITIONS:  # the source writes from the passage the MoT's source read, the target reads
            relays[condition] = relay(source, target, example, condition, relay_tokens)
            kv[condition] = relays[condition].kv
            seconds[condition] = relays[condition].generate_seconds + relays[condition].prefill_seconds
            ahead[condition] = relays[condition].ahead_seconds
            continue
        if condition == "kvcomm":  # the source's own K/V of the target's tokens, read at the chosen layers only
            shared = kvcomm_cache(source, target, translation.target_ids, kvcomm)
            kv[condition], seconds[condition], plans[condition] = shared.kv, shared.seconds, shared.plan
            ahead[condition] = shared.seconds
            continue
        if condition == "direct":  # its own translation of the text by the full-depth map: no replay
            directed = translate(direct, source, target, translation.text, with_native=False)
            kv[condition], seconds[condition] = directed.mixed_kv, translated_seconds(directed)
            ahead[condition] = directed.timings.get("source_prefill", 0.0)
            continue
        start = time.perf_counter()
        kv[condition] = build[condition]()
        own = time.perf_counter() - start if condition not in ("native", "mot") else 0.0
        seconds[condition] = before.get(condition, 0.0) + own
    return ConditionCaches(translation, kv, seconds, relays, plans, directed, prompt, ahead)


def answer_all(mot: MoT, source: LoadedModel, target: LoadedModel, example: QAExample,
               translation: Translation | None = None, seed: int = 0,
               max_new_tokens: int = MAX_NEW_TOKENS) -> dict[str, Answer]:
    """Answers of every condition for one example."""
    caches = condition_caches(mot, source, target, example, translation, seed)
    return answers_from_caches(target, caches.kv, example, max_new_tokens)


@torch.no_grad()
def first_answer_logprobs(target: LoadedModel, kvs: list[list[hf.KV]], suffix_text: str) -> torch.Tensor:
    """log p [B, V] (float32) of the target's first answer token after each cache of the context (all of one length:
    native, translated, controls) and the question, the B caches run as one batch."""
    suffix_ids = target.ids_tensor(encode(target.tokenizer, suffix_text)).expand(len(kvs), -1)
    logits = hf.run(target.model, suffix_ids, kv=hf.stack_caches(kvs), logits_to_keep=1).logits
    return logits[:, -1].float().log_softmax(-1)


def first_token_seconds(target: LoadedModel, kv: list[hf.KV] | None, suffix_ids: torch.Tensor,
                        plan: hf.AttentionPlan | None = None) -> float:
    """Seconds for the target to read the question over a cache (under `plan`: kvcomm's) and give its first answer
    token's logits."""
    start = time.perf_counter()
    with torch.no_grad():
        hf.run(target.model, suffix_ids, kv, plan=plan)
    return time.perf_counter() - start
