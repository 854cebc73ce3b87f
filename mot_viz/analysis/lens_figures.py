"""Plotly figures of the logit lens and the question's attention on the context (mot_viz.analysis.logit_lens):
DataFrames in, figures out; no Streamlit."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .figures import shade_window, show_whitespace


LENS_COLOURS = {"native": "#1f77b4", "mot": "#2ca02c", "linear": "#ff7f0e", "no_context": "#7f7f7f",
                "second": "#9467bd"}
LENS_VALUES = {"kl_to_native_final": "KL(native final ‖ this layer), nats",
               "kl_to_native_layer": "KL(native same layer ‖ this layer), nats"}


def lens_heatmap(layers: pd.DataFrame, window: Sequence[int], value: str = "kl_to_native_final") -> go.Figure:
    """Layer × condition heat map of a lens KL (rows of logit_lens(...).layers), the injection window marked; the
    colour scale is log10(KL + 1e-4) so that small and large divergences both show, the hover gives the value."""
    order = [c for c in LENS_COLOURS if c in set(layers["condition"])]
    z = layers.pivot(index="layer", columns="condition", values=value)[order].sort_index()
    top1 = layers.pivot(index="layer", columns="condition", values="top1")[order].sort_index()
    fig = go.Figure(go.Heatmap(
        z=(z + 1e-4).map(math.log10).values, x=order, y=z.index, customdata=z.values,
        text=top1.map(show_whitespace).values, colorscale="Viridis",
        colorbar_title="log10 KL", hovertemplate="layer %{y}, %{x}<br>KL %{customdata:.4g} nats"
                                                "<br>top-1 %{text}<extra></extra>"))
    fig.add_hrect(y0=min(window) - 0.5, y1=max(window) + 0.5, line_color="orange", line_width=2,
                  annotation_text="injection window", annotation_position="top left")
    fig.update_yaxes(title_text="target layer (its output, read through the final norm)", dtick=1)
    fig.update_layout(title=LENS_VALUES[value], height=220 + 22 * len(z.index))
    return fig


def lens_rank_figure(layers: pd.DataFrame, window: Sequence[int], column: str = "token_rank") -> go.Figure:
    """The answer token's rank (log scale, 1 = top) layer by layer under each cache."""
    fig = go.Figure()
    for condition, colour in LENS_COLOURS.items():
        rows = layers[layers["condition"] == condition].sort_values("layer")
        if rows.empty:
            continue
        prob = "token_prob" if column == "token_rank" else "gold_prob"
        fig.add_scatter(x=rows["layer"], y=rows[column], mode="lines+markers", name=condition, line_color=colour,
                        customdata=list(zip(rows[prob], rows["top1"].map(show_whitespace))),
                        hovertemplate="layer %{x}<br>rank %{y}<br>p %{customdata[0]:.4g}<br>top-1 %{customdata[1]}"
                                      f"<extra>{condition}</extra>")
    shade_window(fig, window)
    fig.update_yaxes(type="log", autorange="reversed", title_text="rank of the token (1 = top)")
    fig.update_xaxes(title_text="target layer (shaded: injection window)", dtick=1)
    fig.update_layout(height=380)
    return fig


def attention_share_figure(shares: pd.DataFrame, window: Sequence[int]) -> go.Figure:
    """Per layer, the question's attention on the context (mean over heads) under each cache, and beside it the
    attention-weighted relative V error of what it reads there (rows of logit_lens.attention_shares)."""
    has_error = "read_error_v" in shares
    fig = make_subplots(rows=1, cols=2 if has_error else 1, horizontal_spacing=0.12,
                        subplot_titles=["attention on the context", "relative V error read there"][: 2 if has_error
                                                                                                    else 1])
    mean = shares.groupby(["condition", "layer"], sort=False).mean(numeric_only=True).reset_index()
    for condition, colour in LENS_COLOURS.items():
        rows = mean[mean["condition"] == condition].sort_values("layer")
        if rows.empty:
            continue
        fig.add_scatter(x=rows["layer"], y=rows["context"], mode="lines+markers", name=condition, line_color=colour,
                        legendgroup=condition, hovertemplate="layer %{x}<br>share %{y:.3f}"
                                                             f"<extra>{condition}</extra>", row=1, col=1)
        if has_error and rows["read_error_v"].notna().any():
            fig.add_scatter(x=rows["layer"], y=rows["read_error_v"], mode="lines+markers", name=condition,
                            line_color=colour, legendgroup=condition, showlegend=False,
                            hovertemplate="layer %{x}<br>rel. error %{y:.3f}" f"<extra>{condition}</extra>",
                            row=1, col=2)
    shade_window(fig, window, subplots=2 if has_error else 1)
    fig.update_xaxes(title_text="target layer", dtick=1)
    fig.update_layout(height=380)
    return fig
