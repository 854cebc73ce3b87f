"""The Methods page's figures, and the shipped results as quality against time, one point per method and setting.

Pure functions: tables in (mot_viz.analysis.methods, the results folders read by mot_viz.analysis.eval_runs),
plotly figures out; no Streamlit. scripts/doc_figures.py draws the same scatter for
docs/results/other-ways-of-sharing.md.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..engine.checkpoint import read_config
from ..errors import MotVizError
from ..sharing import registry
from ..sharing.linear import LINEAR
from ..sharing.registry import TRANSLATED
from .eval_runs import REPO_ROOT, open_run, shipped_runs, stated_summary
from .methods import STAGES, method_labels, methods

SHIPPED_FOLDERS = ("relay", "direct", "eval", "kvcomm", "long", "rivals")  # the results/ folders whose runs compare methods
FIRST_TOKEN, WHOLE_ANSWER = "first answer token", "whole answer"
POINT_COLUMNS = ("folder", "group", "method", "checkpoint", "source", "target", "n", "metric", "score", "seconds",
                 "timed_to")
_SYMBOLS = {FIRST_TOKEN: "circle", WHOLE_ANSWER: "square"}


def _checkpoint_models(checkpoint: str, repo: Path) -> tuple[str | None, str | None, str | None]:
    """(source name, target name, translator variant) of a run's checkpoint, from its config.json (a revision
    suffix ``@<commit>`` read as the folder); Nones when it is not here."""
    path = Path(checkpoint.split("@")[0])
    try:
        cfg = read_config(path if path.is_absolute() else repo / path)
    except (MotVizError, OSError, ValueError, KeyError):
        return None, None, None
    return cfg["source"].get("name"), cfg["target"].get("name"), cfg["translator"].get("variant")


def shipped_points(root: str | Path = REPO_ROOT / "results", folders: tuple[str, ...] = SHIPPED_FOLDERS
                   ) -> pd.DataFrame:
    """One row per results folder, group (dataset, or document kind and length) and method (POINT_COLUMNS): the
    mean score as the folder's own summary states it and the mean seconds per example.

    Seconds run from the question's arrival (after_question_seconds): the work that can be done before it (the
    source's prefill; relay's writing, whose message needs no question) is left out. The long-context runs (python -m
    mot_viz.eval.long_context) time the first answer token: the target side of building the cache plus the
    question's pass; the QA runs (python -m mot_viz.eval.evaluate) time the whole answer: building the cache plus
    the example's batch decoding shared evenly among its conditions (``timed_to`` says which). Within one folder the
    methods share everything but the cache they answer from. A run of a linear checkpoint counts its "mot" rows as the linear map; controls (random, mean,
    a second checkpoint) are left out. Folders under `root`/<one of `folders`>; unreadable ones are left out.
    """
    root = Path(root)
    rows = []
    for folder in shipped_runs(root):
        if folder.parent.name not in folders:
            continue
        try:
            run = open_run(folder)
        except MotVizError:
            continue
        if run.kind.name not in ("evaluate", "long_context"):  # a conversation or the shards: not one answer per text
            continue
        source, target, variant = _checkpoint_models(str(run.settings.get("checkpoint", "")), root.parent)
        long = run.kind.name == "long_context"
        for s in stated_summary(run).itertuples():
            method = LINEAR.name if s.condition == TRANSLATED and variant == "linear" else s.condition
            if method not in methods():
                continue
            part = run.rows[(run.rows["group"] == s.group) & (run.rows["condition"] == s.condition)]
            seconds = after_question_seconds(part, long)
            rows.append({"folder": f"{folder.parent.name}/{folder.name}", "group": s.group, "method": method,
                         "checkpoint": Path(str(run.settings.get("checkpoint", ""))).name, "source": source,
                         "target": target, "n": int(s.n),
                         "metric": "F1" if part["exact_match"].notna().any() else "accuracy",
                         "score": float(s.mean), "seconds": float(seconds.mean()),
                         "timed_to": FIRST_TOKEN if long else WHOLE_ANSWER})
    return pd.DataFrame(rows, columns=list(POINT_COLUMNS))


def after_question_seconds(rows: pd.DataFrame, long: bool, condition: str | None = None) -> pd.Series:
    """Each row's seconds from the question's arrival. A long-context row: its target side (sharing.target_side;
    relay: the target's prefill of the message, its writing done ahead, also in rows written when the target side
    still held it) plus the question's pass to the first answer token; the build where no target side was measured.
    A QA row: its seconds (from the question's arrival since the evaluator records ahead_seconds; in rows written
    before, relay's writing is taken out here, and the source's prefill stays in the cache methods' seconds).
    condition: every row's, when their "condition" column holds other labels (scripts/paired_runs.py)."""
    ahead = registry.names(lambda m: m.message and not m.for_question)  # relay: its message needs no question
    relay = rows["condition"].isin(ahead) if condition is None else pd.Series(condition in ahead, rows.index)
    if long:
        side = rows["target_side_seconds"] if "target_side_seconds" in rows else pd.Series(np.nan, rows.index)
        side = side.where(~relay, rows.get("message_prefill_seconds"))
        return side.fillna(rows["build_seconds"]) + rows["first_token_seconds"]
    if "ahead_seconds" in rows and rows["ahead_seconds"].notna().all():
        return rows["seconds"]
    if "message_generate_seconds" not in rows:  # results written before the relay conditions existed
        return rows["seconds"]
    return rows["seconds"] - rows["message_generate_seconds"].where(relay, 0.0).fillna(0.0)


def side_by_side(points: pd.DataFrame) -> pd.DataFrame:
    """The rows of shipped_points whose folder and group answered from another way of sharing the context (the direct
    map, KVComm or a text relay) and from the MoT, on the same examples: the comparisons the docs' figure draws. A
    folder and group that ran other ways without the MoT (a run of the methods that do not depend on the checkpoint)
    is drawn with the folders of the same checkpoint and group, timed alike, that ran the MoT."""
    other = set(registry.names(lambda m: not m.bound and not m.control and m.name != TRANSLATED))
    runs = points.groupby(["folder", "group"], sort=False)
    methods = runs["method"].agg(set)
    first = runs[["checkpoint", "timed_to"]].first()
    setting = {key: (first.loc[key, "checkpoint"], key[1], first.loc[key, "timed_to"]) for key in methods.index}
    sharing = {key for key, found in methods.items() if other & found}
    with_mot = {setting[key] for key, found in methods.items() if TRANSLATED in found}
    keys = {key for key in sharing if TRANSLATED in methods[key]}
    for key in sharing - keys:
        if setting[key] in with_mot:
            keys |= {key} | {k for k, found in methods.items() if TRANSLATED in found and setting[k] == setting[key]}
    return points[[key in keys for key in zip(points["folder"], points["group"])]]


def _label(method: str) -> str:
    return method_labels().get(method, method)


def quality_time_figure(points: pd.DataFrame, live: pd.DataFrame | None = None) -> go.Figure:
    """Mean score against mean seconds (log), one marker per shipped method and setting (circle: timed to the first
    answer token; square: to the whole answer), a colour per method; `live` (method, score, seconds): this context's
    methods as stars, timed to the first answer token."""
    fig = go.Figure()
    palette = ("#636efa", "#7f7f7f", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880",
               "#ff97ff", "#fecb52")
    colors = {m: palette[i % len(palette)] for i, m in enumerate(methods())}  # as many methods as registered
    for method in [m for m in methods() if m in set(points["method"])]:
        part = points[points["method"] == method]
        custom = np.stack([part["folder"].map(html.escape), part["group"].astype(str).map(html.escape), part["n"],
                           part["metric"], part["timed_to"], part["checkpoint"].map(html.escape)], axis=-1)
        fig.add_trace(go.Scatter(
            x=part["seconds"], y=part["score"], mode="markers", name=_label(method), legendgroup=method,
            marker={"color": colors[method], "size": 10, "symbol": part["timed_to"].map(_SYMBOLS).tolist(),
                    "line": {"width": 1, "color": "white"}},
            customdata=custom,
            hovertemplate="%{customdata[3]} %{y:.3f} · %{x:.2f} s to the %{customdata[4]}<br>%{customdata[1]}, "
                          "n=%{customdata[2]}<br>%{customdata[0]} (checkpoint %{customdata[5]})<extra>"
                          + _label(method) + "</extra>"))
    if live is not None:
        shown = live.dropna(subset=["score", "seconds"])
        for row in shown.itertuples():
            fig.add_trace(go.Scatter(
                x=[row.seconds], y=[row.score], mode="markers", name=f"{_label(row.method)}: this context",
                legendgroup=row.method, marker={"color": colors.get(row.method), "size": 16, "symbol": "star",
                                                "line": {"width": 1, "color": "black"}},
                hovertemplate="this context: %{y:.3f} · %{x:.2f} s to the first answer token<extra>"
                              + _label(row.method) + "</extra>"))
    fig.update_layout(xaxis_title="mean seconds from the question's arrival (circle, star: to the first answer token; "
                                  "square: to the whole answer)", xaxis_type="log", yaxis_title="mean score (F1 or accuracy)",
                      margin={"t": 30}, legend={"font": {"size": 11}})
    return fig


def stages_figure(stages: pd.DataFrame) -> go.Figure:
    """Seconds to the first answer token, stage by stage (STAGES), as one horizontal stacked bar per method."""
    fig = go.Figure()
    order = [m for m in methods() if m in set(stages["method"])]
    for stage in [s for s in STAGES if s in set(stages["stage"])]:
        part = stages[stages["stage"] == stage]  # only the methods with this stage: a NaN would unsettle the stack
        fig.add_trace(go.Bar(y=part["method"].map(_label), x=part["seconds"], name=stage, orientation="h",
                             hovertemplate="%{x:.3f} s<extra>" + stage + "</extra>"))
    fig.update_layout(barmode="stack", xaxis_title="seconds from the text to the first answer token",
                      yaxis={"categoryorder": "array", "categoryarray": [_label(m) for m in order],
                             "autorange": "reversed"}, legend={"traceorder": "normal"}, margin={"t": 30})
    return fig


def kv_error_figure(errors: pd.DataFrame, kv: str, metric: str) -> go.Figure:
    """Per target layer, each method's K (or V) `metric` against the native cache; filled markers where the layer
    holds what the source sent (the window, every layer, the shared layers)."""
    fig = go.Figure()
    part = errors[errors["kv"] == kv]
    for method in [m for m in methods() if m in set(part["method"])]:
        rows = part[part["method"] == method].sort_values("layer")
        fig.add_trace(go.Scatter(
            x=rows["layer"], y=rows[metric], mode="lines+markers", name=_label(method),
            marker={"symbol": ["circle" if c else "circle-open" for c in rows["carries"]], "size": 9},
            hovertemplate="layer %{x}: %{y:.4f}<extra>" + _label(method) + "</extra>"))
    fig.update_layout(xaxis_title="target layer", yaxis_title=f"{kv}: {metric} against native", margin={"t": 30})
    return fig
