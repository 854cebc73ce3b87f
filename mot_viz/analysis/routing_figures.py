"""Plotly figures of the mixture's routing (the Expert routing page): gates per token, routing entropy, expert
usage, and the what-if's replayed cache under each gate choice. DataFrames in, figures out; no Streamlit."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .figures import axis_labels, shade_window, token_axis


def gates_heatmap(gates: pd.DataFrame, title: str) -> go.Figure:
    """Expert × token heatmap of router gates (rows of mot_viz.analysis.cache_metrics.gate_table); 0 = dropped by top-k."""
    z = gates.pivot(index="expert", columns="token_index", values="gate").sort_index()
    tokens = gates.drop_duplicates("token_index").sort_values("token_index")["token"].tolist()
    fig = go.Figure(go.Heatmap(
        z=z.values, x=axis_labels(tokens), y=[f"expert {e}" for e in z.index], zmin=0, zmax=1,
        colorscale="Blues", colorbar_title="gate",
        hovertemplate="%{y}<br>token %{x}<br>gate %{z:.6g}<extra></extra>",
    ))
    token_axis(fig, len(tokens))
    fig.update_layout(title=title, height=200 + 40 * len(z.index))
    return fig


def entropy_figure(per_token: pd.DataFrame, top_k: int) -> go.Figure:
    """Routing entropy per token for K and V (rows of mot_viz.analysis.cache_metrics.token_routing_table)."""
    labels = axis_labels(per_token["token"])
    fig = go.Figure()
    for kv, colour in (("K", "#1f77b4"), ("V", "#ff7f0e")):
        fig.add_scatter(x=labels, y=per_token[f"{kv}_entropy"], mode="lines", name=kv, line_color=colour,
                        customdata=per_token[f"{kv}_kept"],
                        hovertemplate="token %{x}<br>entropy %{y:.4f} nats<br>kept experts %{customdata}<extra>"
                                      + kv + "</extra>")
    if top_k > 1:
        fig.add_hline(y=math.log(top_k), line_dash="dot", annotation_text=f"even split over top-{top_k}")
    token_axis(fig, len(labels))
    fig.update_layout(title="Routing entropy per token", yaxis_title="entropy (nats)", height=360)
    return fig


def expert_usage_figure(usage: pd.DataFrame) -> go.Figure:
    """Importance and load shares per expert, K and V side by side (cache_metrics.expert_usage rows + a kv column)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("importance share (sum of gates)", "load share (tokens kept)"))
    for kv, colour in (("K", "#1f77b4"), ("V", "#ff7f0e")):
        rows = usage[usage["kv"] == kv]
        for c, column in enumerate(("importance_share", "load_share"), start=1):
            fig.add_bar(x=[f"expert {e}" for e in rows["expert"]], y=rows[column], name=kv, legendgroup=kv,
                        marker_color=colour, showlegend=c == 1,
                        hovertemplate="%{x}<br>" + column.replace("_", " ") + " %{y:.4f}<extra>" + kv + "</extra>",
                        row=1, col=c)
    n = usage["expert"].nunique()
    for c in (1, 2):
        fig.add_hline(y=1 / n, line_dash="dot", row=1, col=c)
    fig.update_layout(barmode="group", height=360, legend_title_text="mixture")
    return fig


def what_if_figure(errors: pd.DataFrame, window: Sequence[int]) -> go.Figure:
    """Cosine to native per target layer, K and V, of the replayed cache under each gate choice ("choice" column
    of stacked cache_error_table rows); the injection window shaded."""
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_titles=["K", "V"])
    replayed = errors[errors["comparison"] == "replayed"]
    for c, kv in enumerate(("K", "V"), start=1):
        for i, (choice, rows) in enumerate(replayed[replayed["kv"] == kv].groupby("choice", sort=False)):
            rows = rows.sort_values("layer")
            fig.add_scatter(x=rows["layer"], y=rows["cosine"], mode="lines+markers", name=choice, legendgroup=choice,
                            showlegend=c == 1, line_dash="solid" if i == 0 else "dash",
                            hovertemplate=f"{kv} layer %{{x}}<br>cosine %{{y:.4f}}<extra>{choice}</extra>",
                            row=1, col=c)
    shade_window(fig, window, subplots=2)
    fig.update_xaxes(title_text="target layer (shaded: injection window)", dtick=1)
    fig.update_yaxes(title_text="replayed cache: cosine to native", col=1)
    fig.update_layout(height=380, legend_title_text="gates", legend=dict(orientation="h", y=-0.25))
    return fig
