"""Plotly figures of the Multi-agent page: a conversation answered turn by turn from kept caches, and a hub's cache
of a document composed from several sources' shards. DataFrames in, figures out; no Streamlit here."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..sharing.registry import FLOOR, REFERENCE, TRANSLATED
from .figures import EXPERT_COLOURS, shade_window


# ----- conversations (mot_viz.eval.conversation) ------------------------------------------------------------

CONVERSATION_COLOURS = {REFERENCE: "#1f77b4", TRANSLATED: "#2ca02c", FLOOR: "#7f7f7f"}


def conversation_figure(live: pd.DataFrame, shipped: pd.DataFrame | None = None) -> go.Figure:
    """Per turn: F1 (with its 95% interval when `live` summarizes many conversations; `shipped`, the shipped mean
    over many conversations, as dashed lines with theirs), the cumulative seconds and the memory held (MoT in free
    and in retain mode), from rows of mot_viz.eval.conversation.summarize."""
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08,
                        subplot_titles=["F1 per turn", "cumulative seconds", "memory held (MB, fp16)"])
    for condition, colour in CONVERSATION_COLOURS.items():
        rows = live[live["condition"] == condition].sort_values("turn")
        if rows.empty:
            continue
        common = dict(line_color=colour, legendgroup=condition)
        fig.add_scatter(x=rows["turn"], y=rows["mean"], mode="markers+lines", name=condition, **common,
                        error_y=dict(type="data", array=rows["ci_high"] - rows["mean"],
                                     arrayminus=rows["mean"] - rows["ci_low"], thickness=1),
                        hovertemplate="turn %{x}<br>F1 %{y:.3f}" f"<extra>{condition}</extra>", row=1, col=1)
        if shipped is not None and condition in set(shipped["condition"]):
            s = shipped[shipped["condition"] == condition].sort_values("turn")
            fig.add_scatter(x=s["turn"], y=s["mean"], mode="lines", name=f"{condition} (shipped)", line_dash="dash",
                            showlegend=False, **common,
                            error_y=dict(type="data", array=s["ci_high"] - s["mean"],
                                         arrayminus=s["mean"] - s["ci_low"], thickness=1),
                            hovertemplate="turn %{x}<br>mean F1 %{y:.3f}"
                                          f"<extra>{condition}: shipped, n = {int(s['n'].iloc[0])}</extra>",
                            row=1, col=1)
        fig.add_scatter(x=rows["turn"], y=rows["cumulative_seconds"], mode="markers+lines", name=condition,
                        showlegend=False, **common, hovertemplate="turn %{x}<br>%{y:.2f} s" f"<extra>{condition}</extra>",
                        row=1, col=2)
        fig.add_scatter(x=rows["turn"], y=rows["memory_mb"], mode="markers+lines", showlegend=False, **common,
                        name=condition if condition != TRANSLATED else f"{condition} (free)",
                        hovertemplate="turn %{x}<br>%{y:.2f} MB" f"<extra>{condition}</extra>", row=1, col=3)
        if condition == TRANSLATED:  # its memory in retain mode too (conversation.summarize's memory_retain_mb)
            fig.add_scatter(x=rows["turn"], y=rows["memory_retain_mb"], mode="markers+lines", line_dash="dot",
                            name=f"{condition} (retain)", **common,
                            hovertemplate="turn %{x}<br>%{y:.2f} MB" f"<extra>{condition}, retain</extra>",
                            row=1, col=3)
    fig.update_xaxes(title_text="turn", dtick=1)
    fig.update_layout(height=380)
    return fig


def shard_error_figure(errors: pd.DataFrame, window: Sequence[int], kv: str = "K") -> go.Figure:
    """Per shard of a document, the hub's replayed cache error to native layer by layer: the composed shards (solid)
    beside one source having read the whole document (dashed); rows of analysis.cache_metrics.span_error_table with
    a "setting" column."""
    fig = go.Figure()
    rows = errors[errors["kv"] == kv]
    spans = list(dict.fromkeys(rows["span"]))
    for i, span in enumerate(spans):
        colour = EXPERT_COLOURS[i % len(EXPERT_COLOURS)]
        for setting, part in rows[rows["span"] == span].groupby("setting", sort=False):
            composed = setting.startswith("shards")
            part = part.sort_values("layer")
            name = f"{span}: {'composed shards' if composed else 'one source read it all'}"
            fig.add_scatter(x=part["layer"], y=part["rel_l2"], mode="lines+markers", name=name, line_color=colour,
                            line_dash="solid" if composed else "dash",
                            hovertemplate="layer %{x}<br>relative error %{y:.4f}" f"<extra>{name}</extra>")
    shade_window(fig, window)
    fig.update_xaxes(title_text="target layer (shaded: injection window)", dtick=1)
    fig.update_yaxes(title_text=f"{kv}: relative L2 error to native (mean over the shard's tokens)")
    fig.update_layout(height=400)
    return fig
