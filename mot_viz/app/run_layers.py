"""The Evaluations page's two per-layer sections over a slice of a results folder: which target layers separate the
answers a translation lost from those it kept (the folder's layer_error.csv: mot_viz.analysis.layer_separation), and
which layers' restoration wins lost answers back (its patching.csv: mot_viz.analysis.patching). What a folder can
show is its run kind's to say (eval_runs.RunKind.layer_errors, .patching)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ..analysis import eval_runs, layer_separation
from ..analysis import patching as patching_analysis
from ..eval.answers import CONDITION_LABELS
from ..eval.patching import PATCHING_FILE
from ..sharing.registry import REFERENCE
from .page import escape_markdown, show_figure, widget_default
from .patching import shipped_patching
from .results_folders import layer_errors


def separation(run: eval_runs.EvalRun, shown: pd.DataFrame) -> None:
    """Per target layer, the MoT cache's error over the slice's lost answers against its kept ones."""
    st.subheader("Which layers separate lost answers from kept ones")
    if not run.kind.layer_errors or not {REFERENCE, run.translated} <= set(run.conditions):
        st.caption(f"Per-layer cache errors are recorded for the folders of "
                   f"{eval_runs.kinds_text(lambda k: k.layer_errors)} that hold native and MoT answers.")
        return
    errors = layer_errors(run)
    if errors is None:
        st.caption(f"This folder has no layer_error.csv. Record it (no answer is regenerated) with "
                   f"`{layer_separation.command(run)}`, or run the evaluation with `--layer_error`.")
        return
    cols = st.columns([2, 1])
    metrics = list(layer_separation.METRIC_TITLES)
    widget_default("pg.evals.layer_metric", metrics[0], metrics)
    metric = cols[0].radio("Error", metrics, format_func=layer_separation.METRIC_TITLES.get,
                           key="pg.evals.layer_metric", horizontal=True)
    groups = list(dict.fromkeys(errors["group"]))
    widget_default("pg.evals.layer_group", groups[0], groups)
    group = cols[1].selectbox("Group", groups, key="pg.evals.layer_group", disabled=len(groups) == 1)
    part = layer_separation.layer_separation(errors[errors["group"] == group], shown, run.translated, metric,
                                             run.settings.get("bootstrap", 1000), run.settings.get("seed", 0))
    st.markdown(f"**{escape_markdown(group)}, over the slice:** " + layer_separation.separation_text(part, metric))
    if part["n_lost"].max() and part["n_kept"].max():
        show_figure(layer_separation.separation_figure(part, metric), part, "evaluation_layer_separation")
    st.caption("Each example's error is one number per layer (over its context tokens); the bands are 95% "
               "bootstrap intervals of the group means, lost − kept resamples both groups. The shaded layers are the "
               "translated window; a layer below it differs from native only through the replay's sparse attention.")


def patching(run: eval_runs.EvalRun, shown: pd.DataFrame) -> None:
    """Per target layer, the share of the slice's gold-answer log-probability gap that restoring it wins back."""
    st.subheader("Which layers' restoration wins lost answers back")
    path = run.folder / PATCHING_FILE
    command = patching_analysis.command(run)
    if command is None:
        st.caption(f"`python -m mot_viz.eval.patching` scans the folders of "
                   f"{eval_runs.kinds_text(lambda k: k.patching)} (of a long-context folder, one budget's documents); "
                   f"this one is of `{run.kind.name}`.")
        return
    if not path.is_file():
        st.caption(f"This folder has no patching.csv. Record it (no answer is regenerated) with `{command}`.")
        return
    frame = shipped_patching(str(run.folder), path.stat().st_mtime_ns)
    budget = None
    if run.kind.patching_per_budget:  # a scan is of one budget's documents: the slice's at that length
        budgets = patching_analysis.scanned_groups(frame, run.rows)
        if not budgets:
            st.caption("This folder's patching.csv scans none of its documents: record it again.")
            return
        widget_default("pg.evals.patch_budget", budgets[0], budgets)
        budget = st.radio("Documents scanned", budgets, key="pg.evals.patch_budget", horizontal=True)
        shown = shown[shown["group"] == budget]
    methods = list(dict.fromkeys(frame["method"]))
    widget_default("pg.evals.patch_method", methods[0], methods)
    cols = st.columns(2)
    method = cols[0].radio("Method", methods, key="pg.evals.patch_method", horizontal=True,
                           format_func=lambda m: CONDITION_LABELS.get(m, m))
    widget_default("pg.evals.patch_over", "lost", ["lost", "all"])
    over = cols[1].radio("Examples", ["lost", "all"], key="pg.evals.patch_over", horizontal=True,
                         format_func=lambda o: "lost answers" if o == "lost" else "every scanned example of the slice")
    scanned = set(frame.loc[frame["method"] == method, "id"]) & set(shown["id"].astype(str))
    ids = patching_analysis.lost_examples(frame, shown, method) if over == "lost" else sorted(scanned)
    if not ids:
        st.caption(f"None of the slice's {len(scanned)} scanned examples was lost by {method}: choose every "
                   "scanned example.")
        return
    shares = patching_analysis.gap_shares(frame, method, ids, n_boot=run.settings.get("bootstrap", 1000),
                                          seed=run.settings.get("seed", 0))
    what = "lost answers" if over == "lost" else "examples"
    of = f"{len(scanned)} scanned" + (f" ({budget})" if budget is not None else "")
    show_figure(patching_analysis.shares_figure(
        shares, patching_analysis.window_layers(frame),
        f"{method}: {len(ids)} {what} of {of} (mean gap {shares['gap'].iloc[0]:.2f} nats)"),
        shares, f"evaluation_patching_{method}")
    groups = shares[~shares["target"].str.startswith("layer ")]
    st.dataframe(groups.round(3), hide_index=True, width="stretch")
    rho = patching_analysis.error_cost_correlation(frame, method, ids)
    st.caption(f"Share: Σ over the {what} of the log-probability won back ÷ Σ of their gaps (native − "
               f"{method}), with 95% bootstrap bands over examples; groups patch their layers together. Spearman ρ "
               "between a layer's mean relative error and its mean cost, over the target layers: "
               + "; ".join(f"{r.direction} vs {r.error.split('_')[0]} {r.spearman:+.2f}" for r in rho.itertuples())
               + ". The Layer patching page scans one context with the same code.")
