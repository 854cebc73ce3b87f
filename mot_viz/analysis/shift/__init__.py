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

Modules, in the order data flows: ``cases`` (contexts, window caches), ``trace`` (the target read on a
cache), ``metrics`` (the pure §9.2 maths), ``window`` (one window on one context), ``start_sweep`` (§9.1
and its saved results), ``figures`` (plotly). The names below are re-exported: ``from mot_viz import shift``.
"""

from __future__ import annotations

from ...engine.layout import window_blocks
from .cases import (KV, WINDOW_CONDITIONS, ContextCase, ReplayFn, answer_token_ids, case_from_example, case_from_text,
                    window_caches)
from .metrics import (MIN_SHIFT, TRACE_CONDITIONS, ShiftSummary, TokenShift, TokenShifts, WindowShift, kl_divergence,
                      structural_advantage, summarize, token_shifts, tokens_frame, trajectory_rows, trajectory_summary)
from .start_sweep import (MODE_LABELS, MODES, ProgressFn, SweepConfig, SweepResult, _map_profile, error_profile,
                          find_sweeps, perturbed_window, sweep, valid_starts)
from .trace import CacheTrace, trace_cache, trace_caches
from .window import KL_PAIRS, WindowAnalysis, WindowRun, _mot_replay, analyse_translation, run_window

__all__ = [
    "KV", "WINDOW_CONDITIONS", "ContextCase", "ReplayFn", "answer_token_ids", "case_from_example", "case_from_text",
    "window_caches", "window_blocks",
    "CacheTrace", "trace_cache", "trace_caches",
    "MIN_SHIFT", "TRACE_CONDITIONS", "ShiftSummary", "TokenShift", "TokenShifts", "WindowShift", "kl_divergence",
    "structural_advantage", "summarize", "token_shifts", "tokens_frame", "trajectory_rows", "trajectory_summary",
    "KL_PAIRS", "WindowAnalysis", "WindowRun", "analyse_translation", "run_window",
    "MODE_LABELS", "MODES", "ProgressFn", "SweepConfig", "SweepResult", "error_profile", "find_sweeps",
    "perturbed_window", "sweep", "valid_starts",
]
