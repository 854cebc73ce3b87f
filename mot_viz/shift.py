"""Propagated translation shift vs last-state shift (method.md §9.1 and §9.2).

An injected window moves the target's residual stream at the answer tokens. This module measures
by how much, where, and what the upper layers do about it:

* **Residual trace** (§9.2). For each teacher-forced answer token, the target's residual states
  h_0..h_L and each block's attention and MLP additions, read on the native cache, on the cache
  replayed with the injected window ("full_mix") and on the norm-matched random-window control.
  With Δh_k = h_k^mix − h_k^nat and k0 = t_{W−1} + 1, the *initial shift* is s = Δh_{k0} and the
  *last-state shift* is Δh_L; ρ_k, α_k, β_k and the correction cosine say whether layers k0..L−1
  shrink the shift (ρ_L < 1) and whether they push against it (α > 0) or sideways (β).
* **Injection-start sweep** (§9.1). For every valid window start: the task metric and the
  next-token KL of full_mix and of the dir_only / mag_only controls, plus the trace metrics.
  Three ways of filling the window, recorded as ``mode`` everywhere:

  - ``"trained"``: a translator trained for that start (see ``scripts/shift_sweep.py``);
  - ``"perturbation"``: the native window plus a random direction of fixed relative size
    (training-free, seconds on a CPU);
  - ``"checkpoint-error-profile"``: the native window plus a random direction whose per-(token,
    layer) relative size is a loaded checkpoint's own error ‖Tr − N‖/‖N‖ (training-free).

  In the two training-free modes the "random control" is a second, independent draw of the same
  law as the injected window, so MoT-vs-random differences there measure noise, not structure.

Everything is float64 once the traces are read; frames are long-format pandas DataFrames for plotting.
Caches are plain lists of (K, V), each [B, n_kv, N, d_h], as everywhere in MoT Viz.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from . import hf
from .alignment import encode
from .answers import answer_from_cache
from .channels import Channels, injection_channels
from .controls import dir_only, mag_only, random_window, relative_perturbation
from .data import QAExample, build_prompt, choice_label_texts
from .errors import ConfigError
from .layout import window_blocks
from .models import LoadedModel
from .mot import MoT, Translation, native_cache, replay, target_context_ids, translate

KV = hf.KV
MODES = ("trained", "perturbation", "checkpoint-error-profile")
MODE_LABELS = {
    "trained": "trained translator per start",
    "perturbation": "training-free: native window + random perturbation of fixed relative size",
    "checkpoint-error-profile": "training-free: native window + random perturbation with the checkpoint's error profile",
}
TRACE_CONDITIONS = ("full_mix", "random")  # compared against native in the residual trace
WINDOW_CONDITIONS = ("full_mix", "dir_only", "mag_only", "random")
KL_PAIRS = (("native", "dir_only"), ("native", "mag_only"), ("native", "full_mix"),
            ("full_mix", "dir_only"), ("full_mix", "mag_only"))  # method.md §9.1
MIN_SHIFT = 1e-12  # tokens whose initial shift is smaller are skipped (§9.2)
_PERTURBATION_SEED_OFFSET = 7919  # keeps the injected perturbation's draws apart from the random control's


# ----- contexts -------------------------------------------------------------------------------------------


@dataclass
class ContextCase:
    """One context as the target reads it in the analysis."""

    target_ids: torch.Tensor  # [1, N_t] context tokens (cached; translated or perturbed)
    suffix_ids: torch.Tensor  # [1, S] appended natively; its last token is the seed
    answer_ids: list[int]  # teacher-forced answer tokens (≤ 4)
    context_text: str
    example: QAExample | None = None  # for the task metric; None for free text


def answer_token_ids(tokenizer, example: QAExample, max_tokens: int = 4) -> list[int]:
    """The first ≤ max_tokens tokens of " " + the first non-empty gold answer, or of " " + the gold label (closed set)."""
    if example.kind == "closed":
        text = choice_label_texts(example)[example.label]
    else:
        text = next((a for a in example.answers if a.strip()), "")
        if not text:
            raise ConfigError(f"example {example.id!r} has no non-empty gold answer to teacher-force")
    return encode(tokenizer, " " + text.strip())[:max_tokens]


def case_from_example(target: LoadedModel, example: QAExample, max_answer_tokens: int = 4) -> ContextCase:
    """The context, suffix and teacher-forced answer tokens of a QA example (prompts as in method.md §8)."""
    prompt = build_prompt(example, target.chat_frame)
    ids = target_context_ids(target, prompt.context_text)
    suffix = torch.tensor([encode(target.tokenizer, prompt.suffix_text)])
    return ContextCase(ids, suffix, answer_token_ids(target.tokenizer, example, max_answer_tokens),
                       prompt.context_text, example)


@torch.no_grad()
def case_from_text(target: LoadedModel, context_text: str, suffix_text: str, example: QAExample | None = None,
                   max_answer_tokens: int = 4) -> ContextCase:
    """A context with its own suffix (e.g. typed in the app).

    The teacher-forced answer is the example's gold answer (or gold label) when it has one, else the
    native cache's own greedy answer tokens.
    """
    ids = target_context_ids(target, context_text)
    suffix = torch.tensor([encode(target.tokenizer, suffix_text or "")])
    if suffix.shape[1] == 0:
        raise ConfigError("the suffix is empty; the analysis needs at least the seed token (ask a question)")
    has_gold = example is not None and (example.kind == "closed" or any(a.strip() for a in example.answers))
    if has_gold:
        answer = answer_token_ids(target.tokenizer, example, max_answer_tokens)
    else:
        native = native_cache(target, ids)
        answer = hf.greedy_generate(target.model, native, suffix, max_answer_tokens,
                                    hf.eos_ids(target.model, target.tokenizer))
    if not answer:
        raise ConfigError("no answer tokens to teacher-force (the target stops at once): give a gold answer")
    return ContextCase(ids, suffix, answer, context_text, example if has_gold else None)


# ----- caches ---------------------------------------------------------------------------------------------


ReplayFn = Callable[[torch.Tensor, torch.Tensor], list[KV]]  # (K block, V block) [1, N, W, H] -> cache


@torch.no_grad()
def window_caches(replay_fn: ReplayFn, native_k: torch.Tensor, native_v: torch.Tensor, window_k: torch.Tensor,
                  window_v: torch.Tensor, conditions: Sequence[str] = WINDOW_CONDITIONS, seed: int = 0,
                  full_mix: list[KV] | None = None) -> dict[str, list[KV]]:
    """The caches replayed with the injected window and its controls (method.md §9.1, §9.2).

    native_*, window_*: blocks [1, N, W, H]. The random window is drawn K first, then V, from one
    generator seeded with `seed`, exactly like ``answers.random_control_cache``. A full_mix cache
    already replayed (a Translation's mixed cache) can be passed in to save its replay.
    """
    out: dict[str, list[KV]] = {}
    for cond in conditions:
        if cond == "full_mix":
            out[cond] = full_mix if full_mix is not None else replay_fn(window_k, window_v)
        elif cond == "dir_only":
            out[cond] = replay_fn(dir_only(native_k, window_k), dir_only(native_v, window_v))
        elif cond == "mag_only":
            out[cond] = replay_fn(mag_only(native_k, window_k), mag_only(native_v, window_v))
        elif cond == "random":
            gen = torch.Generator().manual_seed(seed)
            k = random_window(native_k, window_k, gen)
            v = random_window(native_v, window_v, gen)
            out[cond] = replay_fn(k, v)
        else:
            raise ConfigError(f"unknown window condition {cond!r}; choose from {WINDOW_CONDITIONS}")
    return out


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


# ----- §9.2 metrics ---------------------------------------------------------------------------------------


@dataclass
class TokenShift:
    """The §9.2 metrics of one answer token, one condition against native. Trajectories run over k = k0..L."""

    condition: str
    example: int
    token_index: int  # j, position in the teacher-forced answer
    initial_shift: float  # ‖s‖ = ‖Δh_{k0}‖
    window_input_norm: float  # ‖h_{t0}^nat‖
    pre_window_shift: float  # ‖Δh_{t0}‖: shift already present below the window (sparse replay, not §9.2)
    final_shift: float  # ‖Δh_L‖, the last-state shift
    initial_rel_shift: float  # ‖s‖/‖h_{k0}^nat‖ (residual norms grow with depth; not in §9.2)
    final_rel_shift: float  # ‖Δh_L‖/‖h_L^nat‖ (not in §9.2)
    final_shrink: float  # ρ_L
    alpha: float  # α_L
    alpha_rel: float  # α_L/‖s‖
    beta: float  # β_L
    beta_rel: float  # β_L/‖s‖
    cos: float  # α_L/‖c_L‖ (0 when ‖c_L‖ ≤ 1e-12)
    attn_share: float  # −⟨A, u⟩/‖s‖, A = Σ_{l=k0}^{L−1} Δattn_l
    mlp_share: float  # −⟨M, u⟩/‖s‖; attn_share + mlp_share = α_L/‖s‖
    rho: list[float]  # ρ_k
    alpha_rel_k: list[float]  # α_k/‖s‖
    beta_rel_k: list[float]  # β_k/‖s‖
    cos_k: list[float]


def token_shifts(native: CacheTrace, other: CacheTrace, window_start: int, k0: int, condition: str = "full_mix",
                 example: int = 0) -> tuple[list[TokenShift], int]:
    """§9.2 metrics of every answer token of `other` against `native`; returns (shifts, tokens skipped for ‖s‖ < 1e-12).

    window_start = t_0, k0 = t_{W−1} + 1 (boundary indices into h_0..h_L).
    """
    num_layers = native.residual.shape[1] - 1
    if not 0 <= window_start < k0 <= num_layers:
        raise ConfigError(f"need 0 <= t0 < k0 <= L={num_layers}, got t0={window_start}, k0={k0}")
    dh = other.residual.double() - native.residual.double()  # (J, L+1, D)
    d_attn = (other.attn.double() - native.attn.double())[:, k0:].sum(1)  # (J, D): A
    d_mlp = (other.mlp.double() - native.mlp.double())[:, k0:].sum(1)  # (J, D): M
    out, skipped = [], 0
    for j in range(dh.shape[0]):
        s = dh[j, k0]
        s_norm = float(s.norm())
        if s_norm < MIN_SHIFT:
            skipped += 1
            continue
        u = s / s_norm
        traj = dh[j, k0:]  # (K, D), k = k0..L
        c = traj - s
        alpha = -(c @ u)  # (K,)
        beta = (c + alpha[:, None] * u).norm(dim=-1)
        c_norm = c.norm(dim=-1)
        cos = torch.where(c_norm > MIN_SHIFT, alpha / c_norm.clamp(min=MIN_SHIFT), torch.zeros_like(alpha))
        rho = traj.norm(dim=-1) / s_norm
        out.append(TokenShift(
            condition=condition, example=example, token_index=j, initial_shift=s_norm,
            window_input_norm=float(native.residual[j, window_start].double().norm()),
            pre_window_shift=float(dh[j, window_start].norm()), final_shift=float(traj[-1].norm()),
            initial_rel_shift=s_norm / max(float(native.residual[j, k0].double().norm()), MIN_SHIFT),
            final_rel_shift=float(traj[-1].norm()) / max(float(native.residual[j, -1].double().norm()), MIN_SHIFT),
            final_shrink=float(rho[-1]), alpha=float(alpha[-1]), alpha_rel=float(alpha[-1]) / s_norm,
            beta=float(beta[-1]), beta_rel=float(beta[-1]) / s_norm, cos=float(cos[-1]),
            attn_share=float(-(d_attn[j] @ u)) / s_norm, mlp_share=float(-(d_mlp[j] @ u)) / s_norm,
            rho=rho.tolist(), alpha_rel_k=(alpha / s_norm).tolist(), beta_rel_k=(beta / s_norm).tolist(),
            cos_k=cos.tolist(),
        ))
    return out, skipped


@dataclass
class ShiftSummary:
    """§9.2 aggregation over all valid (example, answer-token) pairs of one condition."""

    n_tokens: int
    n_skipped: int
    initial_shift: float  # nan-aware means from here on, unless named otherwise
    window_input_norm: float
    pre_window_shift: float
    final_shift: float
    initial_rel_shift: float
    final_rel_shift: float
    final_shrink: float
    median_final_shrink: float
    shrink_fraction: float  # share of tokens with ρ_L < 1
    alpha: float
    alpha_rel: float
    beta: float
    beta_rel: float
    cos: float
    attn_share: float
    mlp_share: float


_MEAN_FIELDS = ("initial_shift", "window_input_norm", "pre_window_shift", "final_shift", "initial_rel_shift",
                "final_rel_shift", "final_shrink", "alpha",
                "alpha_rel", "beta", "beta_rel", "cos", "attn_share", "mlp_share")


def _nanmean(values: list[float]) -> float:
    arr = np.asarray(values, dtype=float)
    return float(np.nanmean(arr)) if np.isfinite(arr).any() else math.nan


def summarize(shifts: Sequence[TokenShift], n_skipped: int = 0) -> ShiftSummary:
    """Means (nan-aware), the median ρ_L and the shrink fraction of a set of token shifts."""
    means = {f: _nanmean([getattr(t, f) for t in shifts]) for f in _MEAN_FIELDS}
    finals = np.asarray([t.final_shrink for t in shifts], dtype=float)
    finite = finals[np.isfinite(finals)]
    return ShiftSummary(
        n_tokens=len(shifts), n_skipped=n_skipped, **means,
        median_final_shrink=float(np.median(finite)) if finite.size else math.nan,
        shrink_fraction=float((finite < 1).mean()) if finite.size else math.nan,
    )


def structural_advantage(full: ShiftSummary, random: ShiftSummary) -> dict[str, float]:
    """How much more the upper layers correct the injected window than the random control (§9.2)."""
    return {"shrink_advantage": random.final_shrink - full.final_shrink, "cos_advantage": full.cos - random.cos}


def tokens_frame(shifts: Sequence[TokenShift]) -> pd.DataFrame:
    """One row per (condition, example, answer token) with the final values."""
    cols = ["condition", "example", "token_index", *_MEAN_FIELDS]
    return pd.DataFrame([{c: getattr(t, c) for c in cols} for t in shifts], columns=cols)


def trajectory_rows(shifts: Sequence[TokenShift], k0: int) -> pd.DataFrame:
    """One row per (condition, example, answer token, boundary k) with ρ_k, α_k/‖s‖, β_k/‖s‖, cos_k."""
    rows = [
        {"condition": t.condition, "example": t.example, "token_index": t.token_index, "k": k0 + i,
         "rho": t.rho[i], "alpha_rel": t.alpha_rel_k[i], "beta_rel": t.beta_rel_k[i], "cos": t.cos_k[i]}
        for t in shifts for i in range(len(t.rho))
    ]
    return pd.DataFrame(rows, columns=["condition", "example", "token_index", "k", "rho", "alpha_rel", "beta_rel", "cos"])


def trajectory_summary(rows: pd.DataFrame, by: Sequence[str] = ("condition", "token_index", "k")) -> pd.DataFrame:
    """Per (condition, answer-token index, k): median and mean ρ, medians of α/‖s‖, β/‖s‖ and cos (§9.2)."""
    cols = [*by, "median_rho", "mean_rho", "median_alpha_rel", "median_beta_rel", "median_cos", "n"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    g = rows.groupby(list(by), sort=True)
    out = pd.DataFrame({
        "median_rho": g["rho"].median(), "mean_rho": g["rho"].mean(), "median_alpha_rel": g["alpha_rel"].median(),
        "median_beta_rel": g["beta_rel"].median(), "median_cos": g["cos"].median(), "n": g["rho"].size(),
    }).reset_index()
    return out[cols]


@dataclass
class WindowShift:
    """The §9.2 analysis of one injection window over one or more contexts."""

    mode: str
    window_start: int  # t_0
    window_end: int  # t_{W−1}
    num_layers: int  # L_T
    shifts: list[TokenShift] = field(default_factory=list)  # both conditions
    skipped: dict[str, int] = field(default_factory=dict)  # condition -> tokens skipped (‖s‖ < 1e-12)

    @property
    def k0(self) -> int:
        """The residual boundary just after the window."""
        return self.window_end + 1

    @property
    def num_upper_layers(self) -> int:
        return self.num_layers - self.k0

    def of(self, condition: str) -> list[TokenShift]:
        return [t for t in self.shifts if t.condition == condition]

    def summary(self, condition: str) -> ShiftSummary:
        return summarize(self.of(condition), self.skipped.get(condition, 0))

    def tokens(self) -> pd.DataFrame:
        return tokens_frame(self.shifts)

    def trajectories(self) -> pd.DataFrame:
        return trajectory_summary(trajectory_rows(self.shifts, self.k0))

    def summary_frame(self) -> pd.DataFrame:
        """One row per condition: the ShiftSummary fields, plus the window's t0, k0 and mode."""
        rows = [{"condition": c, "mode": self.mode, "start": self.window_start, "k0": self.k0,
                 **asdict(self.summary(c))} for c in TRACE_CONDITIONS if self.of(c) or c in self.skipped]
        return pd.DataFrame(rows)


# ----- one window on one context ----------------------------------------------------------------------------


@dataclass
class WindowRun:
    """Everything measured for one window on one context."""

    shifts: list[TokenShift]
    skipped: dict[str, int]
    kl: dict[str, float]  # "ref||cand" -> KL of the next-token distributions after the seed
    scores: dict[str, float]  # condition -> task score (F1 or accuracy); empty without an example
    answer_logprob: dict[str, float]  # condition -> mean log p of the teacher-forced gold answer tokens


def kl_divergence(ref_logprobs: torch.Tensor, cand_logprobs: torch.Tensor) -> float:
    """KL(ref‖cand) = Σ p_ref (log p_ref − log p_cand) of float32 log-softmaxes [V]."""
    ref = ref_logprobs.double()
    return float((ref.exp() * (ref - cand_logprobs.double())).sum())


def run_window(target: LoadedModel, case: ContextCase, native_trace: CacheTrace, caches: dict[str, list[KV]],
               channels: Channels, example_index: int = 0, task_metric: bool = True,
               native_score: float | None = None, max_new_tokens: int = 16) -> WindowRun:
    """Trace, KL and task metric of the given window caches against native, for one context."""
    logps = {"native": native_trace.seed_logprobs}
    answer_lp = {"native": native_trace.answer_logprob}
    shifts: list[TokenShift] = []
    skipped: dict[str, int] = {}
    for cond, kv in caches.items():
        traced = cond in TRACE_CONDITIONS
        trace = trace_cache(target, kv, case.suffix_ids, case.answer_ids, residuals=traced)
        logps[cond], answer_lp[cond] = trace.seed_logprobs, trace.answer_logprob
        if traced:
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


def analyse_translation(mot: MoT, source: LoadedModel, target: LoadedModel, case: ContextCase,
                        translation: Translation | None = None, seed: int = 0,
                        conditions: Sequence[str] = ("full_mix", "random"), task_metric: bool = False,
                        max_new_tokens: int = 16) -> tuple[WindowShift, WindowRun]:
    """§9.2 for a checkpoint's own window on one context: native vs the MoT cache vs the random control.

    The MoT cache is replayed the way the checkpoint replays (sparse if it is sparse); the shift
    already present below the window then shows up as ``pre_window_shift``.
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
                           conditions, seed, full_mix=translation.mixed_kv)
    native_trace = trace_cache(target, translation.native_kv, case.suffix_ids, case.answer_ids)
    native_score = None
    if task_metric and case.example is not None:
        native_score = answer_from_cache(target, translation.native_kv, case.example, "native", max_new_tokens).score
    run = run_window(target, case, native_trace, caches, channels, 0, task_metric, native_score, max_new_tokens)
    ws = WindowShift("trained", channels.start, channels.end, target.spec.num_layers, run.shifts, run.skipped)
    return ws, run


def _mot_replay(mot: MoT, target: LoadedModel, translation: Translation) -> ReplayFn:
    """Replay windows the way this MoT does (its sparse indices for this context)."""
    return lambda k, v: replay(target, translation.target_ids, mot.channels.target_layers, k, v,
                               translation.sparse_indices)


# ----- §9.1 injection-start sweep ---------------------------------------------------------------------------


def valid_starts(num_target_layers: int, window: int, num_source_layers: int | None = None) -> list[int]:
    """Every start whose window fits the target (and, given the source depth, maps inside the source, §3)."""
    starts = []
    for s in range(0, num_target_layers - window + 1):
        try:
            injection_channels(num_source_layers or num_target_layers, num_target_layers, s, window)
        except ConfigError:
            continue
        starts.append(s)
    if not starts:
        raise ConfigError(f"no injection window of size {window} fits a {num_target_layers}-layer target")
    return starts


@dataclass
class SweepConfig:
    """One injection-start sweep (method.md §9.1 with the §9.2 trace at each start)."""

    mode: str = "perturbation"  # trained | perturbation | checkpoint-error-profile
    window: int = 4  # W, target layers per window
    starts: tuple[int, ...] | None = None  # None: every valid start
    perturbation_size: float = 0.5  # perturbation mode: ‖δ‖/‖N‖ per (token, layer) vector
    seed: int = 0  # random directions: perturbation and random control
    controls: bool = True  # also replay dir_only and mag_only
    task_metric: bool = True  # greedy answers (F1 / accuracy); off for a quick KL + trace sweep
    max_new_tokens: int = 16  # greedy answer length for the task metric
    max_answer_tokens: int = 4  # teacher-forced answer tokens traced

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, not {self.mode!r}")
        if self.window < 1:
            raise ConfigError("window must be >= 1")
        if self.perturbation_size < 0:
            raise ConfigError("perturbation_size must be >= 0")


@dataclass
class SweepResult:
    """A finished sweep as data: what was run, and long-format frames for plots and CSV."""

    meta: dict  # config, pair, dataset, n, timings, mode
    summary: pd.DataFrame  # one row per start
    tokens: pd.DataFrame  # one row per (start, condition, example, answer token)
    trajectories: pd.DataFrame  # per (start, condition, token_index, k): median/mean ρ, medians of α/‖s‖, β/‖s‖, cos
    per_example: pd.DataFrame  # one row per (start, example): scores and KLs

    def save(self, folder: str | Path) -> Path:
        """Write meta.json and summary/tokens/trajectories/per_example CSVs into folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "meta.json").write_text(json.dumps(self.meta, indent=2, default=str))
        for name in ("summary", "tokens", "trajectories", "per_example"):
            getattr(self, name).to_csv(folder / f"{name}.csv", index=False, float_format="%.7g")  # float32-level digits
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "SweepResult":
        folder = Path(folder)
        meta = json.loads((folder / "meta.json").read_text())
        frames = {n: pd.read_csv(folder / f"{n}.csv") for n in ("summary", "tokens", "trajectories", "per_example")}
        return cls(meta, **frames)


def error_profile(translation: Translation, channels: Channels) -> tuple[torch.Tensor, torch.Tensor]:
    """The checkpoint's relative error ‖Tr − N‖/‖N‖ per (token, window layer), for K and V: each [1, N, W, 1]."""
    nk, nv = translation.native_window_blocks(channels)
    rel = lambda tr, n: (tr - n).norm(dim=-1, keepdim=True) / n.norm(dim=-1, keepdim=True).clamp(min=1e-8)
    return rel(translation.translated.keys, nk), rel(translation.translated.values, nv)


def _map_profile(profile: torch.Tensor, window: int) -> torch.Tensor:
    """A [1, N, W_ck, 1] profile onto `window` positions by relative position in the window."""
    w_ck = profile.shape[2]
    if w_ck == window:
        return profile
    idx = [round(i * (w_ck - 1) / (window - 1)) if window > 1 else (w_ck - 1) // 2 for i in range(window)]
    return profile[:, :, idx]


def perturbed_window(native_k: torch.Tensor, native_v: torch.Tensor, size_k: float | torch.Tensor,
                     size_v: float | torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The training-free injected window: N + a random direction of relative size `size` per (token, layer) vector.

    native_*: blocks [1, N, W, H]; size_*: a number (perturbation mode) or a [1, N, W_ck, 1] error profile
    (checkpoint-error-profile mode), mapped onto the W window positions by relative position.
    K is drawn first, then V, from one generator seeded with `seed`.
    """
    gen = torch.Generator().manual_seed(seed)
    window = native_k.shape[2]
    size_k = _map_profile(size_k, window) if isinstance(size_k, torch.Tensor) else size_k
    size_v = _map_profile(size_v, window) if isinstance(size_v, torch.Tensor) else size_v
    return relative_perturbation(native_k, size_k, gen), relative_perturbation(native_v, size_v, gen)


def _derived_seed(seed: int, example: int, start: int) -> int:
    return seed * 1_000_003 + example * 1009 + start


ProgressFn = Callable[[float, str], None]


def sweep(target: LoadedModel, cases: Sequence[ContextCase], cfg: SweepConfig, *,
          num_source_layers: int | None = None, mot_for_start: Callable[[int], MoT] | None = None,
          source: LoadedModel | None = None, profile_mot: MoT | None = None,
          progress: ProgressFn | None = None, meta: dict | None = None) -> SweepResult:
    """Run the injection-start sweep on the cases (method.md §9.1 + §9.2 per start).

    * perturbation: needs only the target;
    * checkpoint-error-profile: needs `profile_mot` (any window) and `source`;
    * trained: needs `mot_for_start(start) -> MoT` (trained with that injection window) and `source`.
    The training-free modes replay densely; trained MoTs replay the way they were trained.
    """
    if cfg.mode != "perturbation" and source is None:
        raise ConfigError(f"mode {cfg.mode!r} needs the source model")
    if cfg.mode == "trained" and mot_for_start is None:
        raise ConfigError("mode 'trained' needs mot_for_start")
    if cfg.mode == "checkpoint-error-profile" and profile_mot is None:
        raise ConfigError("mode 'checkpoint-error-profile' needs a loaded checkpoint (profile_mot)")
    if not cases:
        raise ConfigError("the sweep needs at least one context")
    l_t = target.spec.num_layers
    if num_source_layers is None and source is not None:
        num_source_layers = source.spec.num_layers
    starts = list(cfg.starts) if cfg.starts is not None else valid_starts(l_t, cfg.window, num_source_layers)
    conditions = ("full_mix", "dir_only", "mag_only", "random") if cfg.controls else ("full_mix", "random")
    t_begin = time.perf_counter()
    per_start: dict[int, list[WindowRun]] = {s: [] for s in starts}
    native_scores: list[float] = []
    total = len(cases) * len(starts)
    done = 0
    for ei, case in enumerate(cases):
        native = native_cache(target, case.target_ids)
        native_trace = trace_cache(target, native, case.suffix_ids, case.answer_ids)
        native_score = None
        if cfg.task_metric and case.example is not None:
            native_score = answer_from_cache(target, native, case.example, "native", cfg.max_new_tokens).score
            native_scores.append(native_score)
        profile = None
        if cfg.mode == "checkpoint-error-profile":
            translation = translate(profile_mot, source, target, case.context_text)
            profile = error_profile(translation, profile_mot.channels)
        for start in starts:
            channels = injection_channels(num_source_layers or l_t, l_t, start, cfg.window)
            nk, nv = window_blocks(native, channels.target_layers, len(target.prefix_ids))
            seed = _derived_seed(cfg.seed, ei, start)
            full_mix = None
            if cfg.mode == "trained":
                mot = mot_for_start(start)
                if mot.channels.target_layers != channels.target_layers:
                    raise ConfigError(f"the MoT for start {start} injects {mot.channels.target_layers}, "
                                      f"not {channels.target_layers}")
                tr = translate(mot, source, target, case.context_text, with_native=False)
                wk, wv, full_mix = tr.translated.keys, tr.translated.values, tr.mixed_kv
                replay_fn = _mot_replay(mot, target, tr)
            else:
                sizes = profile if profile is not None else (cfg.perturbation_size, cfg.perturbation_size)
                wk, wv = perturbed_window(nk, nv, *sizes, seed=seed + _PERTURBATION_SEED_OFFSET)
                replay_fn = lambda k, v, layers=channels.target_layers, ids=case.target_ids: \
                    replay(target, ids, layers, k, v, sparse=None)
            caches = window_caches(replay_fn, nk, nv, wk, wv, conditions, seed, full_mix)
            per_start[start].append(run_window(target, case, native_trace, caches, channels, ei, cfg.task_metric,
                                               native_score, cfg.max_new_tokens))
            done += 1
            if progress:
                progress(done / total, f"context {ei + 1}/{len(cases)}, window start {start}")
    return _collect(target, cases, cfg, starts, per_start, native_scores, num_source_layers,
                    time.perf_counter() - t_begin, meta or {})


def _collect(target: LoadedModel, cases: Sequence[ContextCase], cfg: SweepConfig, starts: list[int],
             per_start: dict[int, list[WindowRun]], native_scores: list[float], num_source_layers: int | None,
             seconds: float, meta: dict) -> SweepResult:
    l_t = target.spec.num_layers
    kinds = {c.example.kind for c in cases if c.example is not None}
    metric = "f1" if kinds == {"extractive"} else "accuracy" if kinds == {"closed"} else "score"
    rows, token_frames, traj_frames, example_rows = [], [], [], []
    for start in starts:
        runs = per_start[start]
        end = start + cfg.window - 1
        ws = WindowShift(cfg.mode, start, end, l_t, [t for r in runs for t in r.shifts],
                         {c: sum(r.skipped.get(c, 0) for r in runs) for c in TRACE_CONDITIONS})
        row: dict = {"mode": cfg.mode, "start": start, "end": end, "k0": ws.k0, "num_upper_layers": ws.num_upper_layers,
                     "n_examples": len(runs)}
        for ei, r in enumerate(runs):
            example_rows.append({"start": start, "example": ei, **{f"{metric}_{c}": v for c, v in r.scores.items()},
                                 **{f"answer_logprob_{c}": v for c, v in r.answer_logprob.items()},
                                 **{f"kl_{k}": v for k, v in r.kl.items()}})
        for cond in ("native", *WINDOW_CONDITIONS):
            vals = [r.answer_logprob[cond] for r in runs if cond in r.answer_logprob]
            if vals:
                row[f"answer_logprob_{cond}"] = float(np.mean(vals))
                if cond != "native":
                    row[f"delta_answer_logprob_{cond}"] = row[f"answer_logprob_{cond}"] - row["answer_logprob_native"]
        for cond in ("native", "full_mix", "dir_only", "mag_only"):
            vals = [r.scores[cond] for r in runs if cond in r.scores]
            if vals:
                row[f"{metric}_{cond}"] = float(np.mean(vals))
        for cond in ("full_mix", "dir_only", "mag_only"):
            if f"{metric}_{cond}" in row and f"{metric}_native" in row:
                row[f"delta_{cond}"] = row[f"{metric}_{cond}"] - row[f"{metric}_native"]
        for a, b in KL_PAIRS:
            vals = [r.kl[f"{a}||{b}"] for r in runs if f"{a}||{b}" in r.kl]
            if vals:
                row[f"kl_{a}||{b}"] = float(np.mean(vals))
        sums = {c: ws.summary(c) for c in TRACE_CONDITIONS}
        for cond, s in sums.items():
            row.update({f"{cond}_{k}": v for k, v in asdict(s).items()})
        row.update(structural_advantage(sums["full_mix"], sums["random"]))
        rows.append(row)
        tok = ws.tokens()
        tok.insert(0, "start", start)
        token_frames.append(tok)
        traj = ws.trajectories()
        traj.insert(0, "start", start)
        traj_frames.append(traj)
    meta = {
        "target": target.spec.name, **meta,  # a caller's names (e.g. bundled names) win over the spec's
        "mode": cfg.mode, "mode_label": MODE_LABELS[cfg.mode], "config": asdict(cfg), "metric": metric,
        "target_layers": l_t, "num_source_layers": num_source_layers,
        "starts": starts, "n_examples": len(cases), "seconds": round(seconds, 1),
        "native_metric": float(np.mean(native_scores)) if native_scores else None,
    }
    return SweepResult(meta, pd.DataFrame(rows), pd.concat(token_frames, ignore_index=True),
                       pd.concat(traj_frames, ignore_index=True), pd.DataFrame(example_rows))


def find_sweeps(root: str | Path, source: str | None = None, target: str | None = None) -> dict[str, Path]:
    """Saved sweeps under root (folders with meta.json), optionally only those of one model pair: name -> folder.

    Ordered as MODES (trained sweeps, the real curve, first), then by name; folders of unknown mode last.
    """
    root = Path(root)
    found: list[tuple[int, str, Path]] = []
    if not root.is_dir():
        return {}
    for meta_file in root.glob("*/meta.json"):
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if (source is None or meta.get("source") == source) and (target is None or meta.get("target") == target):
            rank = MODES.index(meta["mode"]) if meta.get("mode") in MODES else len(MODES)
            found.append((rank, meta_file.parent.name, meta_file.parent))
    return {name: folder for _, name, folder in sorted(found)}
