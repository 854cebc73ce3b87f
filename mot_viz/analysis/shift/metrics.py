"""The §9.2 shift metrics as pure functions: residual traces in, numbers and DataFrames out.

Imports no model code (torch, numpy and pandas only): a CacheTrace is read by its tensors alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd
import torch

from ...errors import ConfigError

if TYPE_CHECKING:
    from .trace import CacheTrace

TRACE_CONDITIONS = ("full_mix", "random")  # compared against native in the residual trace
MIN_SHIFT = 1e-12  # tokens whose initial shift is smaller are skipped (§9.2)


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


class TokenShifts(NamedTuple):
    """The §9.2 metrics of one condition's answer tokens, and how many tokens had no shift to measure."""

    shifts: list[TokenShift]
    skipped: int  # tokens whose initial shift ‖s‖ < MIN_SHIFT: no direction to decompose along


def token_shifts(native: CacheTrace, other: CacheTrace, window_start: int, k0: int, condition: str = "full_mix",
                 example: int = 0) -> TokenShifts:
    """§9.2 metrics of every answer token of `other` against `native`.

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
    return TokenShifts(out, skipped)


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


def kl_divergence(ref_logprobs: torch.Tensor, cand_logprobs: torch.Tensor) -> float:
    """KL(ref‖cand) = Σ p_ref (log p_ref − log p_cand) of float32 log-softmaxes [V]."""
    ref = ref_logprobs.double()
    return float((ref.exp() * (ref - cand_logprobs.double())).sum())
