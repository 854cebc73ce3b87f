"""Layer patching read for people: one scan as bars per target layer, and a results folder's patching.csv
summarised over examples (which layers' restoration wins lost answers back, with bootstrap bands; how well per-layer
error predicts the cost). Pure: DataFrames in, DataFrames or plotly figures out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..sharing.registry import TRANSLATED
from . import layer_separation
from .eval_runs import RIGHT, EvalRun
from .figures import shade_window

MEASURES = {"share": "share of the native − translated gap", "nats": "log-probability moved (nats)"}
DIRECTION_LABELS = {"restore": "restoring (native K/V put back)", "break": "breaking (translated K/V put in)"}
COLORS = {"restore": "#4c78a8", "break": "#e45756"}


def moved(frame: pd.DataFrame) -> pd.Series:
    """Per reading, the log-probability it moves in its direction (nats): restoring, patched − translated (what
    comes back); breaking, native − patched (what is lost). Both are the gap when every layer is patched."""
    return np.where(frame["direction"] == "restore", frame["logprob"] - frame["translated"],
                    frame["native"] - frame["logprob"])


def layer_rows(frame: pd.DataFrame, bucket: str = "all") -> pd.DataFrame:
    """The per-layer readings of one bucket, with their layer as a number and the moved log-probability."""
    rows = frame[frame["target"].str.startswith("layer ") & (frame["bucket"] == bucket)].copy()
    rows["layer"] = rows["target"].str.split().str[1].astype(int)
    rows["nats"] = moved(rows)
    return rows


def scan_figure(frame: pd.DataFrame, window: Sequence[int], global_layers: Sequence[int] = (),
                measure: str = "share", bucket: str = "all") -> go.Figure:
    """Bars per target layer of restoring and breaking (one scan's frame: mot_viz.engine.patching.PatchingScan.frame,
    with or without the error columns), the injection window shaded; global layers marked on the axis."""
    rows = layer_rows(frame, bucket)
    fig = go.Figure()
    for direction in ("restore", "break"):
        part = rows[rows["direction"] == direction].sort_values("layer")
        fig.add_bar(x=part["layer"], y=part[measure], name=DIRECTION_LABELS[direction], marker_color=COLORS[direction],
                    customdata=np.stack([part["logprob"], part["nats"]], axis=-1),
                    hovertemplate="layer %{x}<br>" + MEASURES[measure] + " %{y:.3f}<br>patched log p %{customdata[0]:.3f}"
                                  "<br>moved %{customdata[1]:+.3f} nats<extra>" + direction + "</extra>")
    layers = sorted(rows["layer"].unique())
    ticks = [f"{l}<br>global" if l in set(global_layers) else str(l) for l in layers]
    fig.update_xaxes(title_text="target layer patched (alone)", tickvals=layers, ticktext=ticks)
    fig.update_yaxes(title_text=MEASURES[measure], zeroline=True)
    if measure == "share":
        fig.add_hline(y=1, line_dash="dot", line_color="gray", annotation_text="the whole gap")
    if len(window):
        shade_window(fig, window)
    fig.update_layout(barmode="group", height=420, legend=dict(orientation="h", y=1.12),
                      title=f"Which layer's translation costs the answer ({'all positions' if bucket == 'all' else bucket})")
    return fig


def group_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The group readings (and every bucket's), restoring and breaking side by side."""
    rows = frame[~frame["target"].str.startswith("layer ")].copy()
    rows["nats"] = moved(rows)
    wide = rows.pivot_table(index=["target", "layers", "bucket"], columns="direction", values=["share", "nats"],
                            sort=False)
    wide.columns = [f"{direction} {value}" for value, direction in wide.columns]
    return wide.reset_index()[["target", "layers", "bucket", "restore share", "restore nats", "break share",
                               "break nats"]]


# ----- across a results folder ------------------------------------------------------------------------------------

SCAN_EXAMPLES = 100  # the examples the suggested scan of an evaluation's folder covers
SCAN_DOCUMENTS = 24  # the documents of one budget the suggested scan of a long-context folder covers
SCAN_BUDGET = 1024  # the budget that scan covers (the shipped scan's), or the folder's first where it has none such


def command(run: EvalRun) -> str | None:
    """The command that records a folder's patching.csv (the MoT and a full-depth direct map, over its first examples,
    or over its first documents of one budget); None for a folder of a kind the patching command does not scan."""
    if not run.kind.patching:
        return None
    scope = f"--n {SCAN_EXAMPLES}"
    if run.kind.patching_per_budget:
        budgets = sorted(int(b) for b in run.rows["budget"].unique())
        scope = f"--budget {SCAN_BUDGET if SCAN_BUDGET in budgets else budgets[0]} --n {SCAN_DOCUMENTS}"
    return (f"python -m mot_viz.eval.patching {run.folder} {scope} --methods {TRANSLATED} direct "
            "--direct <a full-depth map>")


def window_layers(patching: pd.DataFrame) -> list[int]:
    """The target layers of the injection window, as a patching.csv's "window" group names them."""
    return sorted({int(l) for l in patching.loc[patching["target"] == "window", "layers"].iloc[0].split()})


def lost_examples(patching: pd.DataFrame, table: pd.DataFrame, method: str) -> list[str]:
    """Ids of the examples of a results folder's wide table (eval_runs.wide_table, or a slice of it) that `method`
    lost and patching.csv holds: native right and the method wrong, the Evaluations page's filter, where the
    evaluation answered with the method; for a method it did not answer with (a direct map scanned afterwards), the
    examples native got right whose gold answer the method's cache makes less likely than native's."""
    ends = patching[patching["method"] == method].groupby("id")[["native", "translated"]].first()
    if f"{method} score" in table:
        lost = layer_separation.lost_and_kept(table, method)[0]
        ids = table.loc[table["example"].isin(lost), "id"]
    else:
        right = table.loc[table["native score"] >= RIGHT, "id"]
        ids = right[right.isin(ends.index[ends["native"] > ends["translated"]])]
    return [i for i in ids.astype(str) if i in ends.index]


def scanned_groups(patching: pd.DataFrame, rows: pd.DataFrame) -> list[str]:
    """The groups of a results folder's rows (EvalRun.rows: a long-context folder's "stacks 1024 tokens", one per
    budget) that patching.csv scans documents of, in the folder's order."""
    return list(dict.fromkeys(rows.loc[rows["id"].astype(str).isin(set(patching["id"])), "group"]))


def gap_shares(patching: pd.DataFrame, method: str, ids: Sequence[str] | None = None, direction: str = "restore",
               bucket: str = "all", n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per target (layer or group): the share of the examples' summed native − translated gap that patching it moves
    (Σ moved ÷ Σ gap over the examples: examples with a large gap weigh more, and one of almost no gap cannot blow up
    the mean), with a 95% percentile-bootstrap band over examples (the same resamples for every target)."""
    rows = patching[(patching["method"] == method) & (patching["direction"] == direction)
                    & (patching["bucket"] == bucket)].copy()
    if ids is not None:
        rows = rows[rows["id"].isin(set(ids))]
    rows["nats"] = moved(rows)
    rows["gap"] = rows["native"] - rows["translated"]
    moved_wide = rows.pivot_table(index="id", columns="target", values="nats", sort=False)
    gaps = rows.groupby("id")["gap"].first().reindex(moved_wide.index).to_numpy()
    n = len(gaps)
    if n == 0:
        return pd.DataFrame(columns=["target", "share", "low", "high", "n", "gap"])
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    values = moved_wide.to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        share = values.sum(0) / gaps.sum()
        boots = values[idx].sum(1) / gaps[idx].sum(1)[:, None]  # (n_boot, targets)
    low, high = np.nanquantile(boots, [0.025, 0.975], axis=0)
    return pd.DataFrame({"target": moved_wide.columns, "share": share, "low": low, "high": high, "n": n,
                         "gap": float(gaps.mean())})


def shares_figure(shares: pd.DataFrame, window: Sequence[int], title: str) -> go.Figure:
    """gap_shares' per-layer rows as bars with their bootstrap band, the window shaded."""
    rows = shares[shares["target"].str.startswith("layer ")].copy()
    rows["layer"] = rows["target"].str.split().str[1].astype(int)
    rows = rows.sort_values("layer")
    fig = go.Figure(go.Bar(x=rows["layer"], y=rows["share"], marker_color=COLORS["restore"],
                           error_y=dict(type="data", symmetric=False, array=rows["high"] - rows["share"],
                                        arrayminus=rows["share"] - rows["low"]),
                           hovertemplate="layer %{x}<br>share %{y:.3f}<extra></extra>"))
    fig.update_xaxes(title_text="target layer restored (alone)", dtick=1)
    fig.update_yaxes(title_text="share of the gap won back")
    if len(window):
        shade_window(fig, window)
    fig.update_layout(height=380, title=title)
    return fig


def error_cost_correlation(patching: pd.DataFrame, method: str, ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Spearman rank correlation, over target layers, between a layer's mean K (and V) relative error and its mean
    patching cost (restoring: nats won back; breaking: nats lost), over the examples given (all: None)."""
    rows = layer_rows(patching[patching["method"] == method])
    if ids is not None:
        rows = rows[rows["id"].isin(set(ids))]
    per_layer = rows.groupby(["direction", "layer"])[["nats", "K_rel_l2", "V_rel_l2"]].mean().reset_index()
    out = []
    for direction, part in per_layer.groupby("direction", sort=False):
        for error in ("K_rel_l2", "V_rel_l2"):
            rho = part[error].corr(part["nats"], method="spearman")
            out.append({"direction": direction, "error": error, "spearman": float(rho), "layers": len(part)})
    return pd.DataFrame(out)
