"""Reading the target on a cache: seed distribution, answer likelihood and the residual trace (method.md §9.2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...engine import hf
from ...engine.hf import KV
from ...engine.models import LoadedModel
from ...errors import ConfigError


# ----- residual trace ---------------------------------------------------------------------------------------


@dataclass
class CacheTrace:
    """The target reading the suffix, the seed and the teacher-forced answer tokens on top of one cache."""

    seed_logprobs: torch.Tensor  # [V] float32 log-softmax of the next-token logits after the seed
    answer_logprob: float  # mean log p(a_j | cache, suffix, a_<j) of the teacher-forced answer tokens (nan: not asked)
    residual: torch.Tensor | None = None  # [J, L+1, D] residual states at every layer boundary, per answer token
    attn: torch.Tensor | None = None  # [J, L, D] what each block's attention sub-block adds at that token
    mlp: torch.Tensor | None = None  # [J, L, D] what each block's MLP sub-block adds


def _logprobs(logits: torch.Tensor) -> torch.Tensor:
    return logits.float().log_softmax(-1)


def _answer_tensor(answer_ids: Sequence[int], device) -> torch.Tensor:
    answer = torch.tensor([list(answer_ids)], device=device)  # (1, J)
    if answer.shape[1] == 0:
        raise ConfigError("no answer tokens to trace")
    return answer


def _cache_trace(logp: torch.Tensor, answer: torch.Tensor, res, attn, mlp) -> CacheTrace:
    """logp [J+1, V] (after the seed, then after each answer token; or [1, V], after the seed only) and the per-token
    residuals -> a CacheTrace."""
    answer_lp = float(logp[:-1].gather(-1, answer[0, :, None]).mean()) if len(logp) > 1 else float("nan")
    as_float = lambda t: None if t is None else t.to(torch.promote_types(t.dtype, torch.float32))  # fp16 → fp32
    return CacheTrace(logp[0], answer_lp, as_float(res), as_float(attn), as_float(mlp))


@torch.no_grad()
def trace_cache(target: LoadedModel, kv: list[KV] | None, suffix_ids: torch.Tensor, answer_ids: Sequence[int],
                residuals: bool = True, stepwise: bool = False) -> CacheTrace:
    """Append suffix + seed to the cache, then the teacher-forced answer tokens; read residuals at the answer tokens.

    stepwise=True follows method.md §9.2 literally: each answer token is run singly and the cache is
    extended with its own new KV. The default feeds suffix and answer tokens in one causal forward
    (:func:`trace_caches`), which computes the same states (a unit test checks the two agree) at a quarter of
    the cost. residuals=False skips the hooks (seed distribution and answer likelihood only).
    """
    if not stepwise:
        return trace_caches(target, [kv], suffix_ids, answer_ids, residuals)[0]
    answer = _answer_tensor(answer_ids, suffix_ids.device)
    out = hf.run(target.model, suffix_ids, kv, logits_to_keep=1)
    rows, cache, res_l, attn_l, mlp_l = [_logprobs(out.logits[0, -1])], out.kv, [], [], []
    for token in answer[0]:
        step = token.view(1, 1)
        if residuals:
            tr = hf.residual_trace(target.model, step, cache, logits_to_keep=1)
            res_l.append(tr.residual[:, 0, -1])  # (L+1, D)
            attn_l.append(tr.attn[:, 0, -1])  # (L, D)
            mlp_l.append(tr.mlp[:, 0, -1])
            result = tr.result
        else:
            result = hf.run(target.model, step, cache, logits_to_keep=1)
        rows.append(_logprobs(result.logits[0, -1]))
        cache = result.kv  # teacher forcing: this cache's own KV of the answer token
    res, attn, mlp = (torch.stack(x) for x in (res_l, attn_l, mlp_l)) if residuals else (None, None, None)
    return _cache_trace(torch.stack(rows), answer, res, attn, mlp)


@torch.no_grad()
def trace_caches(target: LoadedModel, kvs: Sequence[list[KV] | None], suffix_ids: torch.Tensor,
                 answer_ids: Sequence[int], residuals: bool = True, answer_likelihood: bool = True) -> list[CacheTrace]:
    """trace_cache's one causal forward for several caches of one length at once (one batched forward: the native,
    translated and control caches of a context), one CacheTrace per cache, in order.

    answer_likelihood=False: the output layer runs at the seed position only (the answer tokens still run through
    every layer for the residuals); answer_logprob is then nan.
    """
    answer = _answer_tensor(answer_ids, suffix_ids.device)
    j_count, s_count = answer.shape[1], suffix_ids.shape[1]
    keep = j_count + 1 if answer_likelihood else torch.tensor([s_count - 1], device=suffix_ids.device)
    ids = torch.cat([suffix_ids, answer], dim=1).expand(len(kvs), -1)  # (B, S+J)
    if any(kv is None for kv in kvs) and not all(kv is None for kv in kvs):
        raise ValueError("caches traced as one batch must all hold the same positions (or all be None)")
    kv = None if kvs[0] is None else (kvs[0] if len(kvs) == 1 else hf.stack_caches(list(kvs)))
    if residuals:
        tr = hf.residual_trace(target.model, ids, kv, logits_to_keep=keep)
        logits = tr.result.logits
        # (L+1|L, B, S+J, D) -> per row (J, L+1|L, D) at the answer tokens
        per_row = [x[:, :, s_count:].permute(1, 2, 0, 3) for x in (tr.residual, tr.attn, tr.mlp)]
    else:
        logits = hf.run(target.model, ids, kv, logits_to_keep=keep).logits
        per_row = [[None] * len(kvs)] * 3
    return [_cache_trace(_logprobs(logits[b]), answer, per_row[0][b], per_row[1][b], per_row[2][b])
            for b in range(len(kvs))]


@torch.no_grad()
def trace_prompted(target: LoadedModel, kvs: Sequence[list[KV]], seed_logprobs: Sequence[torch.Tensor],
                   answer_ids: Sequence[int]) -> list[CacheTrace]:
    """trace_caches for caches that already hold the suffix (an answers batch's prompt step: answers.PromptedCache)
    with the seed's log-probs read there: only the teacher-forced answer tokens run, one batched forward, no output
    layer (answer_logprob nan). The same states as trace_caches up to float rounding (a unit test checks it)."""
    answer = _answer_tensor(answer_ids, kvs[0][0][0].device)
    kv = kvs[0] if len(kvs) == 1 else hf.stack_caches(list(kvs))
    tr = hf.residual_trace(target.model, answer.expand(len(kvs), -1), kv, logits_to_keep=None)
    per_row = [x.permute(1, 2, 0, 3) for x in (tr.residual, tr.attn, tr.mlp)]  # (B, J, L+1|L, D)
    return [_cache_trace(seed[None], answer, per_row[0][b], per_row[1][b], per_row[2][b])
            for b, seed in enumerate(seed_logprobs)]
