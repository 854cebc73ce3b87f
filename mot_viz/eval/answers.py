"""What the target answers from each cache (the caches: mot_viz.sharing.caches.condition_caches).

Used by the evaluator (mot_viz.eval.evaluate) and the app alike, so both score answers the same way
(method.md §8): the prompt's context part is cached (natively or translated), its suffix is appended
natively, then the target decodes greedily (extractive) or scores each choice label (closed set, rule a).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..engine import hf
from ..engine.alignment import encode
from ..engine.models import LoadedModel
from ..engine.mot import MoT, Translation
from ..engine.prompts import QAExample, build_prompt, choice_label_texts
from ..errors import ContextError
from ..sharing.caches import condition_caches
from ..sharing.mot import MOT
from ..sharing.registry import REGISTRY, choices, labels
from .policy import DEFAULTS
from .qa_metrics import exact_match, normalize_answer, postprocess_generation, squad_f1

CONDITIONS = DEFAULTS["evaluate"]  # what every evaluation and the app answer under
MAX_NEW_TOKENS = 24  # greedy answer length of the evaluator, the app and the benchmarks
CONDITION_LABELS = {name: label for name, label in labels().items() if name in choices("evaluate")}  # the evaluator's


@dataclass
class Answer:
    """One condition's answer to one example."""

    condition: str
    text: str  # post-processed generation, or the chosen label
    score: float | None  # F1 (extractive) or correctness 0/1 (closed set); None without a gold answer
    exact_match: float | None  # extractive with a gold answer only
    choice_logprobs: tuple[float, ...] | None  # closed set only: mean log p per label
    seconds: float  # time to answer from the cache (excludes building the cache)


# the caches that hold no context-specific content in the MoT's window, then those with no context at all (Method.tie):
# where one gives the MoT's answer, that answer does not show the translation carried the passage
TIE_LABELS = {name: m.tie for name, m in sorted(REGISTRY.items(), key=lambda item: not item[1].comparable)
              if m.tie}  # as a sentence names them
TIE_CONDITIONS = tuple(TIE_LABELS)


def ties_with_mot(answers: dict[str, str]) -> list[str]:
    """The conditions of TIE_CONDITIONS whose answer (condition -> answer text, as answered) is the MoT's, compared as
    SQuAD compares answers (normalize_answer); [] without a MoT answer."""
    if MOT.name not in answers:
        return []
    mot = normalize_answer(answers[MOT.name])
    return [c for c in TIE_CONDITIONS if c in answers and normalize_answer(answers[c]) == mot]


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


def answer_all(mot: MoT, source: LoadedModel, target: LoadedModel, example: QAExample,
               translation: Translation | None = None, seed: int = 0,
               max_new_tokens: int = MAX_NEW_TOKENS) -> dict[str, Answer]:
    """Answers of every condition for one example."""
    caches = condition_caches(mot, source, target, example, translation, seed, CONDITIONS)
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
