"""Plotly figures of the propagated-shift analysis (mot_viz.analysis.shift): DataFrames in, figures out; no Streamlit.

Conditions are drawn the same way everywhere: the injected window ("full_mix": MoT-translated, or the
perturbation in the training-free modes) in red, the norm-matched random control in grey, dashed.
Boundary indices k count residual states h_0..h_L: k0 = t_{W−1} + 1 is the first state after the window.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

COLOURS = {"full_mix": "#d62728", "random": "#7f7f7f", "native": "#1f77b4", "dir_only": "#9467bd",
           "mag_only": "#ff7f0e"}
LABELS = {"full_mix": "injected window (full_mix)", "random": "random control", "native": "native",
          "dir_only": "dir_only (its direction, native norm)", "mag_only": "mag_only (native direction, its norm)"}
DASH = {"full_mix": "solid", "random": "dash", "native": "dot", "dir_only": "dashdot", "mag_only": "longdash"}


def _reference_one(fig: go.Figure, **selector) -> None:
    fig.add_hline(y=1, line_dash="dot", line_color="black", opacity=0.6, **selector)


def rho_trajectory_figure(trajectories: pd.DataFrame, token_index: int = 0, title: str | None = None) -> go.Figure:
    """ρ_k = ‖Δh_k‖/‖s‖ against the boundary k for one answer-token index (rows of WindowShift.trajectories()).

    Solid: median over contexts; dotted: mean. Above the line at 1 the upper layers amplify the initial
    shift, below it they shrink it.
    """
    fig = go.Figure()
    rows = trajectories[trajectories["token_index"] == token_index]
    for cond in ("full_mix", "random"):
        part = rows[rows["condition"] == cond].sort_values("k")
        if part.empty:
            continue
        fig.add_scatter(x=part["k"], y=part["median_rho"], name=f"{LABELS[cond]}: median", mode="lines+markers",
                        line=dict(color=COLOURS[cond], dash=DASH[cond]), customdata=part["n"],
                        hovertemplate="k=%{x}<br>median ρ %{y:.4g}<br>n=%{customdata}<extra></extra>")
        fig.add_scatter(x=part["k"], y=part["mean_rho"], name=f"{LABELS[cond]}: mean", mode="lines",
                        line=dict(color=COLOURS[cond], dash="dot", width=1),
                        hovertemplate="k=%{x}<br>mean ρ %{y:.4g}<extra></extra>")
    _reference_one(fig)
    fig.update_layout(title=title or f"Shift trajectory ρ_k, answer token {token_index}", height=400,
                      xaxis_title="residual boundary k (k0 = first state after the window … L = last)",
                      yaxis_title="ρ_k = ‖Δh_k‖ / ‖s‖", legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(dtick=1)
    return fig


def correction_trajectory_figure(trajectories: pd.DataFrame, token_index: int = 0) -> go.Figure:
    """Medians of α_k/‖s‖ (against the shift), β_k/‖s‖ (sideways) and the correction cosine along k."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("correction along / across the shift (÷‖s‖)",
                                                        "correction cosine α_k/‖c_k‖"))
    rows = trajectories[trajectories["token_index"] == token_index]
    for cond in ("full_mix", "random"):
        part = rows[rows["condition"] == cond].sort_values("k")
        if part.empty:
            continue
        for col, width, name in (("median_alpha_rel", 2.5, "α/‖s‖"), ("median_beta_rel", 1.2, "β/‖s‖")):
            fig.add_scatter(x=part["k"], y=part[col], name=f"{LABELS[cond]}: {name}", mode="lines+markers",
                            line=dict(color=COLOURS[cond], dash=DASH[cond], width=width),
                            marker=dict(symbol="circle" if name.startswith("α") else "x"),
                            hovertemplate="k=%{x}<br>" + name + " %{y:.4g}<extra></extra>", row=1, col=1)
        fig.add_scatter(x=part["k"], y=part["median_cos"], name=f"{LABELS[cond]}: cos", mode="lines+markers",
                        line=dict(color=COLOURS[cond], dash=DASH[cond]), showlegend=False,
                        hovertemplate="k=%{x}<br>cos %{y:.4f}<extra></extra>", row=1, col=2)
    fig.add_hline(y=0, line_color="black", opacity=0.4, row=1, col=1)
    fig.add_hline(y=0, line_color="black", opacity=0.4, row=1, col=2)
    fig.update_yaxes(range=[-1.05, 1.05], row=1, col=2)
    fig.update_xaxes(title_text="residual boundary k", dtick=1)
    fig.update_layout(height=400, legend=dict(orientation="h", y=-0.3))
    return fig


def correction_split_figure(summary: pd.DataFrame) -> go.Figure:
    """One window: α_L/‖s‖ and its attention and MLP shares, and β_L/‖s‖, per condition.

    summary: one row per condition with columns condition, alpha_rel, attn_share, mlp_share, beta_rel
    (ShiftSummary fields). attn_share + mlp_share = α_L/‖s‖.
    """
    parts = [("alpha_rel", "α_L/‖s‖ (total, against the shift)"), ("attn_share", "attention share of α"),
             ("mlp_share", "MLP share of α"), ("beta_rel", "β_L/‖s‖ (sideways)")]
    fig = go.Figure()
    for _, row in summary.iterrows():
        cond = row["condition"]
        fig.add_bar(x=[label for _, label in parts], y=[row[c] for c, _ in parts], name=LABELS.get(cond, cond),
                    marker_color=COLOURS.get(cond), hovertemplate="%{x}<br>%{y:.4g}<extra></extra>")
    fig.add_hline(y=0, line_color="black", opacity=0.4)
    fig.update_layout(barmode="group", height=380, yaxis_title="÷ ‖s‖ (means over answer tokens)",
                      title="Who corrects the shift: attention vs MLP (positive = pushes back against it)")
    return fig


def shift_vs_start_figure(summary: pd.DataFrame, relative: bool = False) -> go.Figure:
    """Initial shift ‖s‖ and last-state shift ‖Δh_L‖ against the window start, and the shrink ratio ρ_L.

    summary: SweepResult.summary (one row per start). Early windows: a small initial shift but many
    upper layers that may amplify it (propagated shift); late windows: no layers left to correct it
    (last-state shift ≈ initial shift). relative=True divides by the native residual norm at that boundary.
    """
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("relative shift ‖Δh‖/‖h_nat‖" if relative else "shift norm (log scale)",
                                        "shrink ratio ρ_L = ‖Δh_L‖/‖s‖ (log scale; < 1: corrected)"))
    s = summary.sort_values("start")
    init, final = ("initial_rel_shift", "final_rel_shift") if relative else ("initial_shift", "final_shift")
    for cond in ("full_mix", "random"):
        if f"{cond}_{init}" not in s:
            continue
        for col, name, symbol in ((init, "initial shift ‖s‖ (at k0)", "circle-open"),
                                  (final, "last-state shift ‖Δh_L‖", "circle")):
            width = 2.5 if col == final else 1.5
            fig.add_scatter(x=s["start"], y=s[f"{cond}_{col}"], name=f"{LABELS[cond]}: {name}", mode="lines+markers",
                            marker=dict(symbol=symbol, size=8), line=dict(color=COLOURS[cond], dash=DASH[cond],
                                                                          width=width),
                            hovertemplate="start %{x}<br>" + name + " %{y:.4g}<extra></extra>", row=1, col=1)
        fig.add_scatter(x=s["start"], y=s[f"{cond}_median_final_shrink"], name=f"{LABELS[cond]}: median ρ_L",
                        mode="lines+markers", line=dict(color=COLOURS[cond], dash=DASH[cond]),
                        customdata=s[f"{cond}_shrink_fraction"],
                        hovertemplate="start %{x}<br>median ρ_L %{y:.4g}<br>share with ρ_L<1: %{customdata:.2f}"
                                      "<extra></extra>", row=2, col=1)
        fig.add_scatter(x=s["start"], y=s[f"{cond}_final_shrink"], name=f"{LABELS[cond]}: mean ρ_L", mode="lines",
                        line=dict(color=COLOURS[cond], dash="dot", width=1),
                        hovertemplate="start %{x}<br>mean ρ_L %{y:.4g}<extra></extra>", row=2, col=1)
    _reference_one(fig, row=2, col=1)
    if not relative:
        fig.update_yaxes(type="log", row=1, col=1)
    fig.update_yaxes(type="log", row=2, col=1)
    fig.update_xaxes(title_text="window start t0 (first injected target layer)", dtick=1, row=2, col=1)
    fig.update_layout(height=620, legend=dict(orientation="h", y=-0.15))
    return fig


def correction_vs_start_figure(summary: pd.DataFrame, condition: str = "full_mix") -> go.Figure:
    """α_L/‖s‖, its attention and MLP shares, β_L/‖s‖ and the correction cosine against the window start."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("correction ÷ ‖s‖ (means)", "correction cosine"))
    s = summary.sort_values("start")
    for col, name, colour, dash in (("alpha_rel", "α_L/‖s‖ (against the shift)", "#000000", "solid"),
                                    ("attn_share", "attention share of α", "#2ca02c", "solid"),
                                    ("mlp_share", "MLP share of α", "#ff7f0e", "solid"),
                                    ("beta_rel", "β_L/‖s‖ (sideways)", "#9467bd", "dash")):
        fig.add_scatter(x=s["start"], y=s[f"{condition}_{col}"], name=name, mode="lines+markers",
                        line=dict(color=colour, dash=dash), hovertemplate="start %{x}<br>%{y:.4g}<extra></extra>",
                        row=1, col=1)
    for cond in ("full_mix", "random"):
        if f"{cond}_cos" in s:
            fig.add_scatter(x=s["start"], y=s[f"{cond}_cos"], name=f"{LABELS[cond]}: cos", mode="lines+markers",
                            line=dict(color=COLOURS[cond], dash=DASH[cond]),
                            hovertemplate="start %{x}<br>cos %{y:.4f}<extra></extra>", row=1, col=2)
    fig.add_hline(y=0, line_color="black", opacity=0.4, row=1, col=1)
    fig.add_hline(y=0, line_color="black", opacity=0.4, row=1, col=2)
    fig.update_xaxes(title_text="window start t0", dtick=1)
    fig.update_layout(height=420, legend=dict(orientation="h", y=-0.25),
                      title=f"How the upper layers correct the shift ({LABELS.get(condition, condition)})")
    return fig


def metric_kl_figure(summary: pd.DataFrame, metric: str | None = None) -> go.Figure:
    """Task quality and next-token KL against the window start (§9.1).

    Top: the task metric per condition if the sweep computed it (f1_* or accuracy_*), else the mean
    log-likelihood of the teacher-forced gold answer tokens (answer_logprob_*), with native as reference.
    Bottom: KL(ref‖cand) of the next-token distributions after the seed, log scale.
    """
    s = summary.sort_values("start")
    prefix = metric if metric and f"{metric}_full_mix" in s else "answer_logprob"
    top_title = {"f1": "F1", "accuracy": "accuracy"}.get(prefix, "gold-answer log-likelihood (mean log p per token)")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=(top_title, "next-token KL after the seed (log scale)"))
    for cond in ("native", "full_mix", "dir_only", "mag_only"):
        col = f"{prefix}_{cond}"
        if col in s:
            fig.add_scatter(x=s["start"], y=s[col], name=LABELS[cond], mode="lines+markers",
                            line=dict(color=COLOURS[cond], dash=DASH[cond]),
                            hovertemplate="start %{x}<br>%{y:.4g}<extra></extra>", row=1, col=1)
    kl_cols = [c for c in s.columns if c.startswith("kl_")]
    palette = ["#d62728", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
    for colour, col in zip(palette, kl_cols):
        name = "KL(" + col[3:].replace("||", " ‖ ") + ")"
        fig.add_scatter(x=s["start"], y=s[col].clip(lower=1e-9), name=name, mode="lines+markers",
                        line=dict(color=colour, dash="solid" if col.startswith("kl_native") else "dot"),
                        hovertemplate="start %{x}<br>" + name + " %{y:.4g}<extra></extra>", row=2, col=1)
    fig.update_yaxes(type="log", row=2, col=1)
    fig.update_xaxes(title_text="window start t0", dtick=1, row=2, col=1)
    fig.update_layout(height=620, legend=dict(orientation="h", y=-0.15))
    return fig
