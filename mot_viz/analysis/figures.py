"""Plotly figures of the app: DataFrames (or small tensors) in, figures out; no Streamlit here.

Token axes are categorical with labels ``"<index> <token>"``: the index keeps repeated tokens apart, and
whitespace is drawn visibly (``␣`` space, ``↵`` newline, ``⇥`` tab) so a reader can see token boundaries.
Every hover shows the exact value.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
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


def _token_axis(fig: go.Figure, n: int, **selector) -> None:
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
    _token_axis(fig, len(labels))
    fig.update_yaxes(title_text="target layer", dtick=1)
    fig.update_layout(title=title, height=260 + 22 * len(z.index))
    return fig


# ----- expert routing ----------------------------------------------------------------------------


def gates_heatmap(gates: pd.DataFrame, title: str) -> go.Figure:
    """Expert × token heatmap of router gates (rows of mot_viz.analysis.cache_metrics.gate_table); 0 = dropped by top-k."""
    z = gates.pivot(index="expert", columns="token_index", values="gate").sort_index()
    tokens = gates.drop_duplicates("token_index").sort_values("token_index")["token"].tolist()
    fig = go.Figure(go.Heatmap(
        z=z.values, x=axis_labels(tokens), y=[f"expert {e}" for e in z.index], zmin=0, zmax=1,
        colorscale="Blues", colorbar_title="gate",
        hovertemplate="%{y}<br>token %{x}<br>gate %{z:.6g}<extra></extra>",
    ))
    _token_axis(fig, len(tokens))
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
        import math

        fig.add_hline(y=math.log(top_k), line_dash="dot", annotation_text=f"even split over top-{top_k}")
    _token_axis(fig, len(labels))
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


# ----- token alignment ---------------------------------------------------------------------------


def alignment_heatmap(matrix: torch.Tensor, target_tokens: Sequence[str], source_tokens: Sequence[str],
                      value_name: str) -> go.Figure:
    """Target tokens (rows) × source tokens (columns) heatmap of the alignment `matrix` [N_t, N_s]."""
    fig = go.Figure(go.Heatmap(
        z=matrix.float().numpy(), x=axis_labels(source_tokens), y=axis_labels(target_tokens), colorscale="Blues",
        colorbar_title=value_name,
        hovertemplate="target %{y}<br>source %{x}<br>" + value_name + " %{z:.6g}<extra></extra>",
    ))
    _token_axis(fig, len(source_tokens))
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


# ----- training ----------------------------------------------------------------------------------

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


# ----- logit lens (mot_viz.analysis.logit_lens) ----------------------------------------------------------

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


# ----- evaluation results folders (analysis.eval_runs) ---------------------------------------------------------------------------------------------------

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
