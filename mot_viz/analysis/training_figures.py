"""Plotly figures of what fitting a checkpoint recorded: its training logs' curves and its window fidelity
(mot_viz.train.window_fidelity). DataFrames in, figures out; no Streamlit."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots


LOSS_COLUMNS = ("loss", "ce", "mse_k", "mse_v", "tr_mse",  # replay stage (log.jsonl)
                "tr_mse_k", "tr_mse_v", "val_mse_k", "val_mse_v")  # bank stage (bank_log.jsonl)
BALANCE_COLUMNS = ("gate_importance_cv2", "gate_load_cv2", "gate_importance_entropy", "balance")


def training_figure(log: pd.DataFrame, step: str = "step") -> go.Figure:
    """Loss terms, learning rate and gate balance against the optimiser step (rows of a checkpoint's log.jsonl,
    or with step="bank_step" of its bank_log.jsonl)."""
    panels = [("losses", [c for c in LOSS_COLUMNS if c in log]), ("learning rate", [c for c in ("lr",) if c in log]),
              ("gate balance", [c for c in BALANCE_COLUMNS if c in log])]
    panels = [(title, cols) for title, cols in panels if cols]
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, subplot_titles=[t for t, _ in panels],
                        vertical_spacing=0.08)
    for r, (_, columns) in enumerate(panels, start=1):
        for column in columns:
            fig.add_scatter(x=log[step], y=log[column], mode="lines+markers", name=column,
                            hovertemplate="step %{x}<br>" + column + " %{y:.6g}<extra></extra>", row=r, col=1)
    fig.update_xaxes(title_text="optimiser step" if step == "step" else "bank-stage step", row=len(panels))
    fig.update_layout(height=260 * len(panels) + 80)
    return fig


FIDELITY_TITLES = {"centered_cos_k": "K centered cosine", "centered_cos_v": "V centered cosine",
                   "attn_out_cos": "attention-output cosine", "raw_cos_k": "K raw cosine", "raw_cos_v": "V raw cosine",
                   "rel_err_k": "K relative error", "rel_err_v": "V relative error"}
CANDIDATE_COLOURS = {"translator": "#d62728", "linear": "#ff7f0e", "mean vector": "#7f7f7f", "second": "#9467bd"}


def fidelity_figure(rows: pd.DataFrame, metrics: Sequence[str] = ("centered_cos_k", "centered_cos_v", "attn_out_cos")
                    ) -> go.Figure:
    """Window fidelity per window layer (rows of mot_viz.train.window_fidelity.translation_fidelity), one panel per metric."""
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[FIDELITY_TITLES[m] for m in metrics])
    for c, metric in enumerate(metrics, start=1):
        for candidate, part in rows.groupby("candidate", sort=False):
            part = part.sort_values("layer")
            fig.add_scatter(x=part["layer"], y=part[metric], mode="lines+markers", name=candidate,
                            legendgroup=candidate, showlegend=c == 1,
                            line_color=CANDIDATE_COLOURS.get(candidate, "#1f77b4"),
                            hovertemplate=f"layer %{{x}}<br>{FIDELITY_TITLES[metric]} %{{y:.3f}}<extra>{candidate}</extra>",
                            row=1, col=c)
        fig.update_xaxes(title_text="target layer (window)", dtick=1, row=1, col=c)
    fig.update_layout(height=360, legend_title_text="window written by")
    return fig
