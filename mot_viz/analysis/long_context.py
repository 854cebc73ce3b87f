"""What a translated window carries along a long document: per-position error, the sliding-window boundary, where the
evidence sits, and the retention-versus-length curve. Pure functions: a translation or tables in, tables or figures out.

Gemma 3 attends within a 512-token sliding window in five of every six layers; only its global layers see the whole
document. In a sliding layer the question reads directly only the K/V of the last `sliding_window` positions; what a
translation wrote further back reaches the answer only through the hidden states that later positions and layers
computed from it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..engine.cache_errors import KV_NAMES, compared_caches, per_token_errors, token_vectors
from ..engine.channels import Channels
from ..engine.models import ModelSpec
from ..engine.mot import Translation
from ..sharing.linear import LINEAR
from ..sharing.mean import MEAN
from ..sharing.registry import REFERENCE, TRANSLATED

CURVE_CONDITIONS = {TRANSLATED: "MoT", LINEAR.name: "linear map", MEAN.name: "mean-vector window"}


def layer_attention(spec: ModelSpec, layer: int) -> str:
    """How a target layer attends: "global" or "sliding (W)"."""
    return f"sliding ({spec.sliding_window})" if spec.sliding_window and layer in spec.sliding_layers else "global"


def evidence_token_range(translation: Translation, document: str, evidence: tuple[int, int] | None
                         ) -> tuple[int, int] | None:
    """The context positions [first, last) of the target tokens that overlap the evidence's characters (`evidence`
    is a span of `document`, which sits somewhere inside the translated text); None without evidence."""
    if evidence is None or document not in translation.text:
        return None
    offset = translation.text.index(document)
    lo, hi = evidence[0] + offset, evidence[1] + offset
    hits = [i for i, (a, b) in enumerate(translation.source.alignment.target_spans) if a < hi and b > lo]
    return (hits[0], hits[-1] + 1) if hits else None


def position_error_table(translation: Translation, channels: Channels, spec: ModelSpec,
                         bin_tokens: int = 64) -> pd.DataFrame:
    """Relative L2 error of the translated window and of the replayed cache against native, per window layer and
    per bin of `bin_tokens` context positions: layer, attention, comparison, kv, position (bin start), value."""
    frames = []
    for comparison in ("translated", "replayed"):
        for layer, (cand, ref) in compared_caches(translation, channels, comparison).items():
            if layer not in channels.target_layers:
                continue
            for j, kv in enumerate(KV_NAMES):
                values = per_token_errors(token_vectors(cand[j]), token_vectors(ref[j]))["rel_l2"].cpu().numpy()
                starts = np.arange(0, len(values), bin_tokens)
                frames.append(pd.DataFrame({
                    "layer": layer, "attention": layer_attention(spec, layer), "comparison": comparison, "kv": kv,
                    "position": starts, "value": np.add.reduceat(values, starts) / np.diff([*starts, len(values)])}))
    return pd.concat(frames, ignore_index=True)


def position_error_figure(table: pd.DataFrame, comparison: str, kv: str, n_tokens: int,
                          sliding_window: int | None = None, evidence: tuple[int, int] | None = None) -> go.Figure:
    """One line per window layer along the document (global layers solid, sliding ones dotted), the evidence shaded
    and, for a sliding-window target, the first position the question still reads directly in a sliding layer."""
    part = table[(table["comparison"] == comparison) & (table["kv"] == kv)]
    fig = go.Figure()
    for (layer, attention), rows in part.groupby(["layer", "attention"], sort=True):
        fig.add_trace(go.Scatter(x=rows["position"], y=rows["value"], mode="lines+markers",
                                 name=f"layer {layer} ({attention})",
                                 line={"dash": "solid" if attention == "global" else "dot"},
                                 hovertemplate="positions from %{x}: %{y:.3f}<extra>%{fullData.name}</extra>"))
    if evidence is not None:
        fig.add_vrect(x0=evidence[0], x1=evidence[1], fillcolor="seagreen", opacity=0.15, line_width=0,
                      annotation_text="evidence", annotation_position="top left")
    if sliding_window and n_tokens > sliding_window:
        fig.add_vline(x=n_tokens - sliding_window, line_dash="dash", line_color="grey",
                      annotation_text=f"sliding layers: the question reads only the last {sliding_window} positions",
                      annotation_position="top right")
    fig.update_layout(xaxis_title="context position (bins)", yaxis_title=f"relative L2 error of {kv} ({comparison})",
                      legend_title="window layer", margin={"t": 40})
    return fig


def retention_curve_figure(summary: pd.DataFrame, live: dict[str, float] | None = None, budget: int | None = None
                           ) -> go.Figure:
    """Retention (score ÷ native) against the document's length, with paired bootstrap intervals, per condition;
    `live`: this page's own document (condition -> retention) marked at `budget`."""
    fig = go.Figure()
    for condition, label in CURVE_CONDITIONS.items():
        rows = summary[summary["condition"] == condition].sort_values("budget")
        if rows.empty:
            continue
        fig.add_trace(go.Scatter(
            x=rows["budget"], y=rows["retention"], mode="lines+markers", name=label,
            error_y={"type": "data", "symmetric": False, "array": rows["retention_ci_high"] - rows["retention"],
                     "arrayminus": rows["retention"] - rows["retention_ci_low"]},
            customdata=rows[["n"]], hovertemplate="%{x} tokens: %{y:.1%} (n=%{customdata[0]})<extra>" + label + "</extra>"))
        if live and condition in live and budget is not None and np.isfinite(live[condition]):
            fig.add_trace(go.Scatter(x=[budget], y=[live[condition]], mode="markers", name=f"{label}: this document",
                                     marker={"symbol": "star", "size": 14}))
    fig.add_hline(y=1.0, line_dash="dash", line_color="grey", annotation_text=REFERENCE)
    fig.update_layout(xaxis_title="document length (target tokens)", xaxis_type="log", yaxis_tickformat=".0%",
                      yaxis_title="retention (score ÷ native)", margin={"t": 30})
    return fig


def first_token_table(timings: dict[str, float], first_token: dict[str, float]) -> pd.DataFrame:
    """Seconds to the first answer token from the translated cache, stage by stage, beside the target's own prefill;
    the source prefill on its own row (in the use case the source holds its cache already)."""
    rows = [("translated cache", "alignment", timings.get("alignment", np.nan)),
            ("translated cache", "translator", timings.get("translator", np.nan)),
            ("translated cache", "replay", timings.get("replay", np.nan)),
            ("translated cache", "first answer token", first_token.get(TRANSLATED, np.nan)),
            ("target reads the text", "native prefill", timings.get("native_prefill", np.nan)),
            ("target reads the text", "first answer token", first_token.get(REFERENCE, np.nan)),
            ("source (already held)", "source prefill", timings.get("source_prefill", np.nan))]
    return pd.DataFrame(rows, columns=["path", "stage", "seconds"])


def first_token_figure(table: pd.DataFrame) -> go.Figure:
    """The first_token_table as stacked bars, one per path."""
    fig = go.Figure()
    for stage, rows in table.groupby("stage", sort=False):
        fig.add_trace(go.Bar(y=rows["path"], x=rows["seconds"], name=stage, orientation="h",
                             hovertemplate="%{x:.2f} s<extra>" + stage + "</extra>"))
    fig.update_layout(barmode="stack", xaxis_title="seconds to the first answer token", margin={"t": 30},
                      yaxis={"autorange": "reversed"})
    return fig
