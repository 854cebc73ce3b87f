"""Logit lens and attention on the context under each cache of one context (pure tensors in, tables out).

The lens reads the target's own residual stream after every layer through the target's own final norm and output
layer (hf.final_readout): under the native cache (the target prefilled the text itself), the MoT-translated
(replayed) cache, the linear map's replayed cache and no context. It shows where in the target's depth the
prediction of the next answer token forms and where a translated cache moves it. It reads only the question's and
the answer's positions: the context's cache is fixed input here, so the lens does not show how the cache was built.
An intermediate layer's readout is what the final layers would make of that state at once; the model was not
trained for that, so early layers read as noise for every cache alike (compare conditions, not absolute values).

Positions are aligned across caches by teacher forcing: every cache reads the same question and the same answer
tokens (the native cache's greedy answer), so position i predicts answer token i under every cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from ..engine import hf
from ..engine.alignment import encode
from ..engine.models import LoadedModel
from ..engine.mot import MoT, Translation, empty_context_cache
from ..errors import ContextError
from ..eval.answers import answer_is_complete, check_question_fits
from ..sharing.linear import LINEAR, linear_cache
from ..sharing.registry import FLOOR, REFERENCE, TRANSLATED

TOP_TOKENS = 5  # tokens listed per layer and condition
LENS_ANSWER_TOKENS = 8  # native answer tokens the lens follows (each costs a decoding step)
# the longest question (the prompt after the context) the lens reads: its trace keeps every layer's state at each of
# the question's tokens under each cache, so what it holds grows with this length
LENS_QUESTION_TOKENS = 512


@dataclass(frozen=True)
class LensTrace:
    """The residual stream and attention of each cache over the question and the answer (computed once per
    context and question; the lens of any one position reads it)."""

    conditions: tuple[str, ...]
    # P = A (the positions the lens reads: the question's last, then each answer token but the last)
    residual: dict[str, torch.Tensor]  # condition -> [L + 1, P, D]: input of layer 0 … output of layer L-1
    attention: dict[str, list[torch.Tensor]]  # condition -> per layer [H, P, cache + S + A - 1] (float32)
    cache_len: dict[str, int]  # condition -> positions its context cache holds (its BOS prefix included)
    prefix_len: int  # BOS positions every context cache starts with (never translated)
    suffix_len: int  # S: the question's tokens
    answer_ids: tuple[int, ...]  # A: the tokens each position predicts in turn (position 0: the question's last)
    sliding: tuple[int | None, ...]  # per layer: its sliding window, or None for a global layer
    context_error_v: dict[str, torch.Tensor]  # condition -> [L, n_kv, cache] relative V error to native per position

    @property
    def positions(self) -> int:
        return len(self.answer_ids)


def check_lens_question(target: LoadedModel, native_kv: list[hf.KV], question_tokens: int, answer_tokens: int) -> None:
    """Raise ContextError, before any work, unless the lens can read a question of `question_tokens` target tokens
    followed by `answer_tokens`: at most LENS_QUESTION_TOKENS, and the context, question and answer within the
    target's positions (answers.check_question_fits)."""
    if question_tokens > LENS_QUESTION_TOKENS:
        raise ContextError(f"The question is {question_tokens} target tokens long; the logit lens reads a question of "
                           f"at most {LENS_QUESTION_TOKENS} (it keeps every layer's state at each of them). Shorten "
                           "the question.")
    check_question_fits(target, native_kv, question_tokens, answer_tokens)


def lens_trace(target: LoadedModel, caches: dict[str, list[hf.KV] | None], suffix_ids: list[int],
               answer_ids: list[int] | None, prefix_len: int) -> LensTrace:
    """Run the question and the answer tokens over each cache with the residual stream and every layer's queries
    recorded. caches: condition -> the context's cache ("native" required; None = no context at all); answer_ids:
    the native cache's greedy answer (what every position is asked to predict), or None for the question alone:
    then the one position is the question's last, and its token native's top prediction there (no decoding).
    Only the positions the lens reads are kept (their states and attention), so what the trace holds grows with the
    question's length, not its square; a question the lens cannot read raises ContextError (check_lens_question)."""
    if REFERENCE not in caches:
        raise ValueError(f"the lens compares every cache with the native one: caches needs {REFERENCE!r}")
    if answer_ids is not None and not answer_ids:
        raise ValueError("the lens needs at least one answer token to predict (or answer_ids=None)")
    positions = len(answer_ids) if answer_ids else 1  # the question's last position, then each answer token's
    check_lens_question(target, caches[REFERENCE], len(suffix_ids), positions)
    model = target.model
    layers = hf.decoder_layers(model)
    ids = target.ids_tensor(list(suffix_ids) + list(answer_ids[:-1] if answer_ids else []))
    residual, attention, cache_len = {}, {}, {}
    groups: dict[int, list[str]] = {}  # caches of one length run as one batch (native, MoT and linear: one forward)
    for condition, kv in caches.items():
        cache_len[condition] = 0 if kv is None else kv[0][0].shape[2]
        groups.setdefault(cache_len[condition], []).append(condition)
    sliding: tuple[int | None, ...] = ()
    native_first = sorted(groups.values(), key=lambda members: REFERENCE not in members)
    for members in native_first:
        kvs = [caches[c] for c in members]
        kv = None if kvs[0] is None else (kvs[0] if len(kvs) == 1 else hf.stack_caches(kvs))
        plan = hf.AttentionPlan(record_queries=set(range(len(layers))))
        trace = hf.residual_trace(model, ids.expand(len(members), -1), kv=kv, plan=plan, logits_to_keep=1)
        queries = trace.result.queries
        probs = [hf.causal_probs(queries[layer][0][:, :, -positions:], k, queries[layer][1], queries[layer][2])
                 for layer, (k, _) in enumerate(trace.result.kv)]  # per layer (B, H, P, N_kv): the rows read only
        sliding = tuple(queries[layer][2] for layer in range(len(layers)))
        for row, condition in enumerate(members):
            residual[condition] = trace.residual[:, row, -positions:].float()  # (L + 1, P, D)
            if condition == REFERENCE and answer_ids is None:  # its logits at the question's last position
                answer_ids = [int(trace.result.logits[row, -1].argmax())]
            attention[condition] = [p[row] for p in probs]
    native = caches[REFERENCE]
    errors = {}
    for condition, kv in caches.items():
        if kv is None or cache_len[condition] != cache_len[REFERENCE]:
            continue
        errors[condition] = torch.stack([
            (v.float() - nv.float()).norm(dim=-1)[0] / nv.float().norm(dim=-1)[0].clamp_min(1e-12)
            for (_, v), (_, nv) in zip(kv, native, strict=True)])
    return LensTrace(tuple(caches), residual, attention, cache_len, prefix_len, len(suffix_ids), tuple(answer_ids),
                     sliding, errors)


@torch.no_grad()
def native_answer_ids(target: LoadedModel, native_kv: list[hf.KV], suffix_ids: list[int],
                      max_new_tokens: int = LENS_ANSWER_TOKENS) -> list[int]:
    """The native cache's greedy answer tokens (at most `max_new_tokens`), with the answers' stop rule
    (mot_viz.eval.answers); an answer that ends at once is its one stop token, so there is always a token to
    predict."""
    model, prompt = target.model, target.ids_tensor(suffix_ids)
    tokens = hf.greedy_generate(
        model, native_kv, prompt, max_new_tokens, hf.eos_ids(model, target.tokenizer),
        stop_when=lambda generated: answer_is_complete(target.tokenizer.decode(generated, skip_special_tokens=True)))
    return tokens or [int(hf.run(model, prompt, native_kv, logits_to_keep=1).logits[0, -1].argmax())]


def translation_lens_trace(mot: MoT, source: LoadedModel, target: LoadedModel, translation: Translation,
                           suffix_text: str, linear: MoT | None = None,
                           others: dict[str, list[hf.KV]] | None = None,
                           answer_tokens: int = LENS_ANSWER_TOKENS) -> LensTrace:
    """lens_trace of a translation's caches: native, the MoT's replayed cache, the linear map's (when `linear`, the
    pair's closed-form map of the same window, is given), `others` (e.g. a second checkpoint's replayed cache of the
    same context) and no context, over the question `suffix_text` and the native cache's greedy answer (at most
    `answer_tokens` of it; 0: the question alone, no decoding)."""
    suffix = encode(target.tokenizer, suffix_text)
    check_lens_question(target, translation.native_kv, len(suffix), max(answer_tokens, 1))  # before any work
    caches = {REFERENCE: translation.native_kv, TRANSLATED: translation.mixed_kv}
    if linear is not None:
        caches[LINEAR.name] = linear_cache(mot, linear, source, target, translation)
    caches.update(others or {})
    caches[FLOOR] = empty_context_cache(target)
    answer = native_answer_ids(target, translation.native_kv, suffix, answer_tokens) if answer_tokens else None
    return lens_trace(target, caches, suffix, answer, translation.prefix_len)


@dataclass(frozen=True)
class Lens:
    """The logit lens at one position (tables for the page, the CSV downloads and the prediction study)."""

    position: int  # 0: the question's last position (predicts the first answer token); i: after answer token i-1
    layers: pd.DataFrame  # condition, layer, kl_to_native_final, kl_to_native_layer, token_rank, token_prob, top1
    top: pd.DataFrame  # condition, layer, rank (1…TOP_TOKENS), token, prob
    first_top1: pd.DataFrame  # condition, first layer whose top-1 is the answer token (None: never)


@torch.no_grad()
def logit_lens(target: LoadedModel, trace: LensTrace, position: int = 0, gold_token: int | None = None) -> Lens:
    """Each layer's output at `position` read through the target's final norm and output layer, under each cache.

    Per layer and condition: KL(native's final distribution ‖ this layer's), KL(native's same-layer ‖ this
    layer's), the rank (1 = top) and probability of the answer token, the top-1 token; gold_token (the gold
    answer's first token, position 0 only): its rank and probability too. All KLs in nats.
    """
    if not 0 <= position < trace.positions:
        raise ValueError(f"position {position} is outside the {trace.positions} answer positions")
    conditions = trace.conditions
    states = torch.stack([trace.residual[c][1:, position] for c in conditions])  # (C, L, D): layer outputs
    logprobs = hf.final_readout(target.model)(states).float().log_softmax(-1)  # (C, L, V)
    native = logprobs[conditions.index(REFERENCE)]  # (L, V)
    final = native[-1]
    answer = trace.answer_ids[position]
    rows, top_rows, first = [], [], []
    tokenizer = target.tokenizer
    ranks = _rank(logprobs, answer)  # (C, L)
    gold_ranks = None if gold_token is None else _rank(logprobs, gold_token)
    kl_final = _kl(final, logprobs)  # (C, L)
    kl_layer = _kl(native, logprobs)  # (C, L)
    top_lp, top_i = logprobs.topk(TOP_TOKENS, dim=-1)  # (C, L, k)
    top_p = top_lp.exp()
    for c, condition in enumerate(conditions):
        for layer in range(logprobs.shape[1]):
            row = {"condition": condition, "layer": layer, "kl_to_native_final": float(kl_final[c, layer]),
                   "kl_to_native_layer": float(kl_layer[c, layer]), "token_rank": int(ranks[c, layer]),
                   "token_prob": float(logprobs[c, layer, answer].exp()),
                   "top1": tokenizer.decode([int(top_i[c, layer, 0])])}
            if gold_ranks is not None:
                row["gold_rank"] = int(gold_ranks[c, layer])
                row["gold_prob"] = float(logprobs[c, layer, gold_token].exp())
            rows.append(row)
            for r in range(TOP_TOKENS):
                top_rows.append({"condition": condition, "layer": layer, "rank": r + 1,
                                 "token": tokenizer.decode([int(top_i[c, layer, r])]),
                                 "prob": float(top_p[c, layer, r])})
        hits = (ranks[c] == 1).nonzero()
        first.append({"condition": condition, "first_top1_layer": int(hits[0]) if len(hits) else None})
    return Lens(position, pd.DataFrame(rows), pd.DataFrame(top_rows), pd.DataFrame(first))


# The lens's reductions over the vocabulary run a slice at a time (VOCABULARY_SLICE entries): on Gemma's 262k
# vocabulary a temporary the size of the (conditions, layers, vocabulary) log-probabilities costs more than the
# readout itself.
VOCABULARY_SLICE = 16384


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) in nats over the last dimension (log-probabilities in, broadcast like p_log − q_log)."""
    total = torch.zeros(torch.broadcast_shapes(p_log.shape[:-1], q_log.shape[:-1]))
    for start in range(0, q_log.shape[-1], VOCABULARY_SLICE):
        p = p_log[..., start: start + VOCABULARY_SLICE]
        total += (p.exp() * (p - q_log[..., start: start + VOCABULARY_SLICE])).sum(-1)
    return total


def _rank(logprobs: torch.Tensor, token: int) -> torch.Tensor:
    """The rank (1 = top) of `token` in each distribution over the last dimension: 1 + the tokens above it."""
    threshold = logprobs[..., token: token + 1]
    rank = torch.ones(logprobs.shape[:-1], dtype=torch.long)
    for start in range(0, logprobs.shape[-1], VOCABULARY_SLICE):
        rank += (logprobs[..., start: start + VOCABULARY_SLICE] > threshold).sum(-1)
    return rank


def attention_shares(trace: LensTrace, position: int = 0) -> pd.DataFrame:
    """Where the attention of the query at `position` goes, per layer, head and condition: the shares on the BOS
    prefix, on the context and on the question/answer tokens (sum 1), the context positions that query can see
    (a sliding-window layer sees only its last `window` positions) and, for a cache of the context's own length
    other than native, `read_error_v`: the relative V error (to native) of the context positions, averaged with the
    query's attention on them as weights, i.e. how far from native what the query reads from the context is."""
    index = trace.suffix_len - 1 + position  # the query's place after the context
    rows = []
    for condition in trace.conditions:
        start, end = trace.prefix_len, trace.cache_len[condition]  # context positions [start, end)
        if trace.cache_len[condition] == 0:
            start = end = 0
        for layer, probs in enumerate(trace.attention[condition]):
            p = probs[:, position]  # (H, keys)
            query_pos = trace.cache_len[condition] + index
            window = trace.sliding[layer]
            first_visible = max(0, query_pos - window + 1) if window else 0
            visible = max(0, end - max(start, first_visible))
            context = p[:, start:end].sum(-1)
            error = trace.context_error_v.get(condition)
            for head in range(p.shape[0]):
                row = {"condition": condition, "layer": layer, "head": head,
                       "bos": float(p[head, : min(trace.prefix_len, trace.cache_len[condition])].sum()),
                       "context": float(context[head]), "question": float(p[head, end:].sum()),
                       "sliding_window": window, "visible_context": visible}
                if error is not None and condition != REFERENCE:
                    kv_head = head * error.shape[1] // p.shape[0]
                    weight = p[head, start:end]
                    row["read_error_v"] = (float((weight * error[layer, kv_head, start:end]).sum() / weight.sum())
                                           if float(weight.sum()) > 0 else float("nan"))
                rows.append(row)
    return pd.DataFrame(rows)
