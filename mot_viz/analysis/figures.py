"""Plotly figures of one translation's pages (answers, cache error, token alignment, cache space), and the token
axes and window shading every figure module of the app shares: DataFrames (or small tensors) in, figures out; no
Streamlit here. The other pages' figures live beside it: routing_figures, training_figures, lens_figures,
run_figures, method_figures, multi_agent_figures.

Token axes are categorical with labels ``"<index> <token>"``: the index keeps repeated tokens apart, and
whitespace is drawn visibly (``␣`` space, ``↵`` newline, ``⇥`` tab) so a reader can see token boundaries.
Every hover shows the exact value.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

_WHITESPACE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"})
KIND_COLOURS = {"native target": "#1f77b4", "translated": "#d62728", "replayed target": "#2ca02c",
                "source (aligned)": "#9467bd", "linear map": "#ff7f0e", "second translator": "#8c564b"}
COMPARISON_COLOURS = {"translated": "#d62728", "replayed": "#2ca02c"}
METRIC_TITLES = {"mse": "MSE", "rel_l2": "relative L2 error", "cosine": "cosine similarity"}


def show_whitespace(text: str) -> str:
    """`text` with spaces, newlines and tabs drawn as visible symbols; an empty string as ∅."""
    return text.translate(_WHITESPACE) if text else "∅"


def token_labels(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token id decoded on its own (special tokens kept), whitespace made visible."""
    return [show_whitespace(tokenizer.decode([int(i)], skip_special_tokens=False)) for i in ids]


def axis_labels(tokens: Sequence[str]) -> list[str]:
    """Unique categorical axis labels ``"<index> <token>"``."""
    return [f"{i} {t}" for i, t in enumerate(tokens)]


def shade_window(fig: go.Figure, window: Sequence[int], subplots: int = 1) -> None:
    """Shade the injection window (layers min..max) over the full height of subplots 1..`subplots` (row-major).

    What fig.add_vrect(row=, col=) draws, as one layout update: add_vrect re-scans every subplot on each call,
    which cost the Per-layer cache error page ~15 ms of its figure for six bands.
    """
    axis = lambda i: "" if i == 1 else str(i)
    fig.update_layout(shapes=list(fig.layout.shapes) + [
        dict(type="rect", xref=f"x{axis(i)}", yref=f"y{axis(i)} domain", x0=min(window) - 0.5, x1=max(window) + 0.5,
             y0=0, y1=1, fillcolor="orange", opacity=0.12, line_width=0) for i in range(1, subplots + 1)])


def token_axis(fig: go.Figure, n: int, **selector) -> None:
    # categorical, so plotly thins long label lists by itself instead of overprinting them
    fig.update_xaxes(type="category", tickangle=-60, automargin=True, nticks=min(n, 60), **selector)


# ----- answers -----------------------------------------------------------------------------------


def answers_figure(answers: pd.DataFrame) -> go.Figure:
    """Score and time per condition (columns: key (short name), score, seconds_cache, seconds_answer, answer)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("score vs the gold answer", "time (s)"))
    scored = answers.dropna(subset=["score"])
    fig.add_bar(x=scored["key"], y=scored["score"], customdata=scored["answer"], name="score", showlegend=False,
                marker_color="#4c78a8",
                hovertemplate="%{x}<br>score %{y:.4f}<br>answer: %{customdata}<extra></extra>", row=1, col=1)
    for column, name in (("seconds_cache", "building the cache"), ("seconds_answer", "answering")):
        fig.add_bar(x=answers["key"], y=answers[column], name=name,
                    hovertemplate="%{x}<br>" + name + " %{y:.3f} s<extra></extra>", row=1, col=2)
    fig.update_layout(barmode="stack", height=380, legend_title_text="time")
    fig.update_yaxes(range=[0, 1.05], row=1, col=1)
    return fig


# ----- per-layer cache error ---------------------------------------------------------------------


def layer_error_figure(table: pd.DataFrame, window: Sequence[int], second: pd.DataFrame | None = None,
                       direct: bool = False) -> go.Figure:
    """MSE, relative L2 and cosine per target layer for K and V (rows of mot_viz.analysis.cache_metrics.cache_error_table).

    The injection window is shaded; "translated" exists only there, "replayed" on every layer. `second`: the rows
    of a second checkpoint on the same context, overlaid as dashed lines ("… (2nd)"). direct: the selected checkpoint
    is a full-depth map without replay, whose translated K/V are the cache the target keeps: one curve, so named.
    """
    metrics = list(METRIC_TITLES)
    fig = make_subplots(rows=len(metrics), cols=2, shared_xaxes=True, column_titles=["K", "V"],
                        row_titles=[METRIC_TITLES[m] for m in metrics], vertical_spacing=0.06)
    tables = [(table, "", "solid")] + ([(second, " (2nd)", "dash")] if second is not None else [])
    for c, kv in enumerate(("K", "V"), start=1):
        for r, metric in enumerate(metrics, start=1):
            for (source, suffix, dash), (comparison, colour) in itertools.product(tables, COMPARISON_COLOURS.items()):
                if direct and not suffix and comparison == "replayed":
                    continue  # no replay: the kept cache is the translation, drawn once
                rows = source[(source["kv"] == kv) & (source["comparison"] == comparison)].sort_values("layer")
                name = ("translated = kept (no replay)" if direct and not suffix else comparison) + suffix
                fig.add_scatter(x=rows["layer"], y=rows[metric], mode="lines+markers", name=name,
                                legendgroup=name, showlegend=(r == 1 and c == 1), line_color=colour, line_dash=dash,
                                hovertemplate=f"{kv} layer %{{x}}<br>{METRIC_TITLES[metric]} %{{y:.6g}}"
                                              f"<extra>{name}</extra>",
                                row=r, col=c)
    shade_window(fig, window, subplots=2 * len(metrics))
    fig.update_xaxes(title_text="target layer (shaded: injection window)", dtick=1, row=len(metrics))
    fig.update_layout(height=720, legend_title_text="vs native")
    return fig


def error_heatmap(grid: pd.DataFrame, tokens: Sequence[str], window: Sequence[int], metric: str,
                  title: str) -> go.Figure:
    """Layer × token heatmap of a per-token error (rows of mot_viz.analysis.cache_metrics.cache_error_grid)."""
    z = grid.pivot(index="layer", columns="token", values="value").sort_index()
    labels = axis_labels(tokens)
    fig = go.Figure(go.Heatmap(
        z=z.values, x=[labels[i] for i in z.columns], y=z.index, colorscale="RdBu" if metric == "cosine" else "Viridis",
        zmid=0 if metric == "cosine" else None, colorbar_title=METRIC_TITLES[metric],
        hovertemplate="layer %{y}<br>token %{x}<br>" + METRIC_TITLES[metric] + " %{z:.6g}<extra></extra>",
    ))
    fig.add_hrect(y0=min(window) - 0.5, y1=max(window) + 0.5, line_color="orange", line_width=2,
                  annotation_text="injection window", annotation_position="top left")
    token_axis(fig, len(labels))
    fig.update_yaxes(title_text="target layer", dtick=1)
    fig.update_layout(title=title, height=260 + 22 * len(z.index))
    return fig



# ----- token alignment ---------------------------------------------------------------------------


def alignment_heatmap(matrix: torch.Tensor, target_tokens: Sequence[str], source_tokens: Sequence[str],
                      value_name: str) -> go.Figure:
    """Target tokens (rows) × source tokens (columns) heatmap of the alignment `matrix` [N_t, N_s]."""
    fig = go.Figure(go.Heatmap(
        z=matrix.float().numpy(), x=axis_labels(source_tokens), y=axis_labels(target_tokens), colorscale="Blues",
        colorbar_title=value_name,
        hovertemplate="target %{y}<br>source %{x}<br>" + value_name + " %{z:.6g}<extra></extra>",
    ))
    token_axis(fig, len(source_tokens))
    fig.update_yaxes(type="category", autorange="reversed", automargin=True, nticks=min(len(target_tokens), 60))
    fig.update_layout(xaxis_title="source tokens", yaxis_title="target tokens",
                      height=min(1400, 300 + 6 * len(target_tokens)))
    return fig


def alignment_table(matrix: torch.Tensor, target_tokens: Sequence[str], source_tokens: Sequence[str]) -> pd.DataFrame:
    """The nonzero cells of an alignment matrix [N_t, N_s] as rows (for CSV download)."""
    t, s = torch.nonzero(matrix, as_tuple=True)
    return pd.DataFrame({"target_index": t.tolist(), "target_token": [target_tokens[i] for i in t.tolist()],
                         "source_index": s.tolist(), "source_token": [source_tokens[i] for i in s.tolist()],
                         "value": matrix[t, s].tolist()})


# ----- cache space -------------------------------------------------------------------------------


EXPERT_COLOURS = ("#e377c2", "#17becf", "#bcbd22", "#8c564b", "#ff7f0e", "#7f7f7f", "#9467bd", "#2ca02c")


def cache_space_figure(points: pd.DataFrame, join: Sequence[str] = (), colour: str = "kind") -> go.Figure:
    """Scatter of projected K/V vectors (rows of cache_metrics.cache_space_table), one panel per space.

    join: kinds whose points are joined by a line to the same token's native point (how far, and which way, each
    token was moved). colour: "kind", or a column of `points` that colours the translated points instead —
    "expert" (categorical: the expert holding the token's largest gate) or "rel_l2" (continuous).
    """
    spaces = list(dict.fromkeys(points["space"]))
    titles = [f"{s}: {points.loc[points['space'] == s, 'projection'].iloc[0]}" for s in spaces]
    fig = make_subplots(rows=1, cols=len(spaces), subplot_titles=titles)
    hover = "token %{customdata[0]} %{customdata[1]}<br>(%{x:.4g}, %{y:.4g})"
    for c, space in enumerate(spaces, start=1):
        here = points[points["space"] == space]
        native = here[here["kind"] == "native target"].set_index("token_index")
        for kind in join:
            moved = here[here["kind"] == kind].set_index("token_index")
            if native.empty or moved.empty:
                continue
            xs, ys = [], []
            for i in moved.index.intersection(native.index):
                xs += [native.at[i, "x"], moved.at[i, "x"], None]
                ys += [native.at[i, "y"], moved.at[i, "y"], None]
            fig.add_scatter(x=xs, y=ys, mode="lines", name=f"native → {kind}", hoverinfo="skip",
                            line=dict(color=KIND_COLOURS.get(kind, "#999999"), width=0.7), opacity=0.45,
                            row=1, col=c)
        for kind, rows in here.groupby("kind", sort=False):
            custom = list(zip(rows["token_index"], rows["token"]))
            if kind == "translated" and colour == "expert" and "expert" in rows:
                for e, part in rows.groupby("expert"):
                    fig.add_scatter(x=part["x"], y=part["y"], mode="markers", name=f"translated, expert {int(e)}",
                                    marker=dict(color=EXPERT_COLOURS[int(e) % len(EXPERT_COLOURS)], size=7,
                                                symbol="diamond"),
                                    customdata=list(zip(part["token_index"], part["token"])),
                                    hovertemplate=hover + f"<extra>translated, expert {int(e)}</extra>", row=1, col=c)
                continue
            marker = dict(color=KIND_COLOURS.get(kind), size=6, opacity=0.75)
            if kind == "translated" and colour == "rel_l2" and "rel_l2" in rows:
                marker = dict(color=rows["rel_l2"], colorscale="Reds", size=7, symbol="diamond", showscale=True,
                              colorbar=dict(title="rel. L2<br>to native", x=1.02))
                custom = list(zip(rows["token_index"], rows["token"], rows["rel_l2"]))
            fig.add_scatter(x=rows["x"], y=rows["y"], mode="markers", name=kind, marker=marker, customdata=custom,
                            hovertemplate=hover + ("<br>rel. L2 %{customdata[2]:.3f}" if len(custom[0]) > 2 else "")
                                          + "<extra>" + kind + "</extra>",
                            row=1, col=c)
    fig.update_layout(height=520, legend_title_text="kind")
    return fig
