"""Plotly figures of evaluation results folders example by example (mot_viz.analysis.eval_runs): each example's
difference against a property of it, and two runs' scores against each other. DataFrames in, figures out; no Streamlit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go


X_AXES = {"context_tokens": "context length (target tokens)", "evidence_fraction": "evidence depth (share of the "
          "document before the evidence)", "turn": "turn of the conversation"}


def delta_figure(table: pd.DataFrame, delta: str, x: str):
    """Each example's `delta` (a wide table's "mot − native") against `x` (a key of X_AXES), a colour per group;
    the hover names the example."""
    fig = go.Figure()
    for group, part in table.groupby("group", sort=False):
        fig.add_trace(go.Scatter(x=part[x], y=part[delta], mode="markers", name=str(group), opacity=0.7,
                                 customdata=part[["example"]].to_numpy(),
                                 hovertemplate="%{customdata[0]}<br>" + X_AXES[x] + " %{x}<br>" + delta
                                               + " %{y:+.3f}<extra>" + str(group) + "</extra>"))
    fig.add_hline(y=0, line_dash="dot", line_color="#7f7f7f")
    fig.update_layout(xaxis_title=X_AXES[x], yaxis_title=delta, height=420, legend_title_text="group",
                      margin=dict(t=30))
    return fig


def comparison_figure(pairs: pd.DataFrame, labels: tuple[str, str]):
    """Each example's score in run a (x) against run b (y) of a RunComparison's `pairs`, with the diagonal: points
    below it are examples a wins, above it b wins. Equal scores overlap: the marker's size counts them."""
    counted = pairs.groupby(["score_a", "score_b"]).agg(n=("example", "size"),
                                                       examples=("example", lambda s: ", ".join(s[:5]))).reset_index()
    fig = go.Figure(go.Scatter(x=counted["score_a"], y=counted["score_b"], mode="markers",
                               marker=dict(size=6 + 3 * np.sqrt(counted["n"]), color="#1f77b4", opacity=0.6),
                               customdata=counted[["n", "examples"]].to_numpy(), name="examples",
                               hovertemplate=f"{labels[0]} %{{x:.3f}}<br>{labels[1]} %{{y:.3f}}<br>%{{customdata[0]}} "
                                             "example(s): %{customdata[1]}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(dash="dot", color="#7f7f7f"),
                             name="equal", hoverinfo="skip"))
    fig.update_layout(xaxis_title=f"score in {labels[0]}", yaxis_title=f"score in {labels[1]}", height=440,
                      margin=dict(t=30), showlegend=False)
    return fig
