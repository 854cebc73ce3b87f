"""Reading the target on a cache: seed distribution, answer likelihood and the residual trace (method.md §9.2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .. import hf
from ..errors import ConfigError
from ..hf import KV
from ..models import LoadedModel


# ----- residual trace ---------------------------------------------------------------------------------------


@dataclass
class CacheTrace:
    """The target reading the suffix, the seed and the teacher-forced answer tokens on top of one cache."""

    seed_logprobs: torch.Tensor  # [V] float32 log-softmax of the next-token logits after the seed
    answer_logprob: float  # mean log p(a_j | cache, suffix, a_<j) of the teacher-forced answer tokens
    residual: torch.Tensor | None = None  # [J, L+1, D] residual states at every layer boundary, per answer token
    attn: torch.Tensor | None = None  # [J, L, D] what each block's attention sub-block adds at that token
    mlp: torch.Tensor | None = None  # [J, L, D] what each block's MLP sub-block adds


def _logprobs(logits: torch.Tensor) -> torch.Tensor:
    return logits.float().log_softmax(-1)


@torch.no_grad()
def trace_cache(target: LoadedModel, kv: list[KV] | None, suffix_ids: torch.Tensor, answer_ids: Sequence[int],
                residuals: bool = True, stepwise: bool = False) -> CacheTrace:
    """Append suffix + seed to the cache, then the teacher-forced answer tokens; read residuals at the answer tokens.

    stepwise=True follows method.md §9.2 literally: each answer token is run singly and the cache is
    extended with its own new KV. The default feeds suffix and answer tokens in one causal forward,
    which computes the same states (a unit test checks the two agree) at a quarter of the cost.
    residuals=False skips the hooks (seed distribution and answer likelihood only).
    """
    answer = torch.tensor([list(answer_ids)], device=suffix_ids.device)  # (1, J)
    j_count, s_count = answer.shape[1], suffix_ids.shape[1]
    if j_count == 0:
        raise ConfigError("no answer tokens to trace")
    if not stepwise:
        ids = torch.cat([suffix_ids, answer], dim=1)  # (1, S+J)
        if residuals:
            tr = hf.residual_trace(target.model, ids, kv, logits_to_keep=j_count + 1)
            logits, res, attn, mlp = tr.result.logits, tr.residual[:, 0, s_count:], tr.attn[:, 0, s_count:], tr.mlp[:, 0, s_count:]
            res, attn, mlp = res.transpose(0, 1), attn.transpose(0, 1), mlp.transpose(0, 1)  # (J, L+1|L, D)
        else:
            logits = hf.run(target.model, ids, kv, logits_to_keep=j_count + 1).logits
            res = attn = mlp = None
        logp = _logprobs(logits[0])  # (J+1, V): after the seed, then after each answer token
    else:
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
        logp = torch.stack(rows)
        res, attn, mlp = (torch.stack(x) for x in (res_l, attn_l, mlp_l)) if residuals else (None, None, None)
    answer_lp = float(logp[:-1].gather(-1, answer[0, :, None]).mean())
    as_float = lambda t: None if t is None else t.to(torch.promote_types(t.dtype, torch.float32))  # fp16 → fp32
    return CacheTrace(logp[0], answer_lp, as_float(res), as_float(attn), as_float(mlp))
