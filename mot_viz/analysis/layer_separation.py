"""Which layers separate the answers a translation lost from those it kept: per target layer, the mean error of the
MoT cache against the native one (a results folder's layer_error.csv, mot_viz.eval.layer_error) over the lost
examples (native right, the translated condition wrong: eval_runs.select's lost filter) and over the kept ones (both
right), each with its 95% bootstrap interval (qa_metrics.bootstrap_ci), and lost − kept with the interval of two
independent resamplings. Pure functions and a Plotly figure: no Streamlit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..eval.layer_error_file import LAYER_ERROR_FILE, METRICS, UNITS, read_layer_errors
from ..eval.qa_metrics import bootstrap_ci
from .eval_runs import RIGHT, EvalRun, select

METRIC_TITLES = {"K_rel_l2": "K relative L2 error", "V_rel_l2": "V relative L2 error", "K_cosine": "K cosine",
                 "V_cosine": "V cosine"}
COLUMNS = ("group", "layer", "in_window", "n_lost", "n_kept", "lost_mean", "lost_low", "lost_high", "kept_mean",
           "kept_low", "kept_high", "diff", "diff_low", "diff_high", "separates")


def command(run: EvalRun) -> str:
    """The command that records a folder's layer_error.csv."""
    return f"python -m mot_viz.eval.layer_error {run.folder}"


def run_layer_errors(run: EvalRun) -> pd.DataFrame | None:
    """The run's layer_error.csv, each row with its example's name and group (as run.rows names them; rows of
    examples the run did not score are dropped); None when the folder has none, or is of a kind that writes none."""
    path = run.folder / LAYER_ERROR_FILE
    if run.kind.name not in UNITS or not path.is_file():
        return None
    unit = list(UNITS[run.kind.name])
    errors = read_layer_errors(path, UNITS[run.kind.name])
    names = run.rows[[*unit, "example", "group"]].drop_duplicates()
    if "budget" in unit:
        names = names.astype({"budget": int})
    return errors.merge(names, on=unit)


def lost_and_kept(table: pd.DataFrame, translated: str) -> tuple[list[str], list[str]]:
    """The examples of a wide table (eval_runs.wide_table, or a slice of it) the translation lost (native right,
    `translated` wrong: the page's filter, eval_runs.select) and those it kept (both right)."""
    lost = select(table, "native", lost=True, translated=translated)["example"]
    right = table[(table["native score"] >= RIGHT) & (table[f"{translated} score"] >= RIGHT)]["example"]
    return lost.tolist(), right.tolist()


def difference_interval(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int) -> tuple[float, float]:
    """95% interval of mean(a) − mean(b), each group resampled on its own (as bootstrap_ci resamples one)."""
    rng = np.random.default_rng(seed)
    boots = (a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(1)
             - b[rng.integers(0, b.size, size=(n_boot, b.size))].mean(1))
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return float(lo), float(hi)


def layer_separation(errors: pd.DataFrame, table: pd.DataFrame, translated: str, metric: str,
                     n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per group and target layer (COLUMNS): the mean `metric` (one of METRICS) of the lost and of the kept examples
    of `table` (lost_and_kept) that have a recorded error, each with its 95% bootstrap interval, lost − kept with its
    interval, and whether that interval excludes 0 ("separates"). A group without a lost or a kept example has NaN
    where that side is needed."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    lost, kept = (set(names) for names in lost_and_kept(table, translated))
    rows = []
    for (group, layer), part in errors.groupby(["group", "layer"], sort=True):
        a = part.loc[part["example"].isin(lost), metric].to_numpy(float)
        b = part.loc[part["example"].isin(kept), metric].to_numpy(float)
        ci_a, ci_b = bootstrap_ci(a, n_boot, seed), bootstrap_ci(b, n_boot, seed)
        lo, hi = difference_interval(a, b, n_boot, seed) if a.size and b.size else (np.nan, np.nan)
        rows.append({"group": group, "layer": int(layer), "in_window": bool(part["in_window"].iloc[0]),
                     "n_lost": a.size, "n_kept": b.size, "lost_mean": ci_a.mean, "lost_low": ci_a.lo,
                     "lost_high": ci_a.hi, "kept_mean": ci_b.mean, "kept_low": ci_b.lo, "kept_high": ci_b.hi,
                     "diff": ci_a.mean - ci_b.mean, "diff_low": lo, "diff_high": hi,
                     "separates": bool(lo > 0 or hi < 0)})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def separation_text(part: pd.DataFrame, metric: str) -> str:
    """One group's result in a sentence: how many lost and kept examples, and the layers whose interval of
    lost − kept excludes 0 (with the difference and its interval), or that none does."""
    n_lost, n_kept = int(part["n_lost"].max()), int(part["n_kept"].max())
    head = f"{n_lost} lost (native right, MoT wrong) and {n_kept} kept (both right) examples with a recorded error."
    if not n_lost or not n_kept:
        return head + " Both groups are needed to compare them: widen the slice."
    found = part[part["separates"]]
    if found.empty:
        return head + f" No layer's 95% interval of lost − kept ({METRIC_TITLES[metric]}) excludes 0."
    listed = "; ".join(f"layer {r.layer} {r.diff:+.4f} [{r.diff_low:+.4f}, {r.diff_high:+.4f}]"
                       for r in found.itertuples())
    return (head + f" The 95% interval of lost − kept ({METRIC_TITLES[metric]}) excludes 0 at {len(found)} of "
            f"{len(part)} layers (one interval per layer, no correction for testing {len(part)}): {listed}.")


def _band(fig: go.Figure, x, low, high, colour: str, row: int) -> None:
    fig.add_trace(go.Scatter(x=list(x) + list(x)[::-1], y=list(high) + list(low)[::-1], fill="toself",
                             fillcolor=colour, line={"width": 0}, hoverinfo="skip", showlegend=False), row=row, col=1)


def separation_figure(part: pd.DataFrame, metric: str) -> go.Figure:
    """One group's per-layer `metric`: lost and kept with their 95% bands (top), lost − kept with its band and 0
    (bottom); the translated window shaded."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.6, 0.4])
    x = part["layer"]
    for side, colour, band in (("lost", "#d62728", "rgba(214,39,40,0.18)"), ("kept", "#1f77b4", "rgba(31,119,180,0.18)")):
        _band(fig, x, part[f"{side}_low"], part[f"{side}_high"], band, 1)
        fig.add_trace(go.Scatter(x=x, y=part[f"{side}_mean"], mode="lines+markers", line={"color": colour},
                                 name=f"{side} (n={int(part[f'n_{side}'].max())})",
                                 hovertemplate=f"layer %{{x}}<br>{side} mean %{{y:.4f}}<extra></extra>"), row=1, col=1)
    _band(fig, x, part["diff_low"], part["diff_high"], "rgba(90,90,90,0.2)", 2)
    fig.add_trace(go.Scatter(x=x, y=part["diff"], mode="lines+markers", line={"color": "#444"}, name="lost − kept",
                             marker={"symbol": ["diamond" if s else "circle" for s in part["separates"]],
                                     "size": [11 if s else 6 for s in part["separates"]]},
                             hovertemplate="layer %{x}<br>lost − kept %{y:+.4f}<extra></extra>"), row=2, col=1)
    fig.add_hline(y=0, line={"dash": "dot", "color": "#888"}, row=2, col=1)
    window = part.loc[part["in_window"], "layer"]
    if len(window):
        fig.add_vrect(x0=window.min() - 0.5, x1=window.max() + 0.5, fillcolor="rgba(255,200,0,0.12)", line_width=0,
                      annotation_text="translated window", annotation_position="top left", row="all", col=1)
    fig.update_yaxes(title_text=METRIC_TITLES[metric], row=1, col=1)
    fig.update_yaxes(title_text="lost − kept", row=2, col=1)
    fig.update_xaxes(title_text="target layer", dtick=1, row=2, col=1)
    fig.update_layout(height=560, margin={"t": 40, "b": 40}, legend={"orientation": "h", "y": 1.06})
    return fig
