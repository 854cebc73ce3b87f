"""Evaluations: a results folder example by example — which answers a translation lost, a slice's summary, the
app's view of one example, and two runs of the same examples side by side."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from mot_viz import app
from mot_viz.analysis import eval_run_links, eval_runs, run_figures
from mot_viz.app import live_panel, run_layers
from mot_viz.app.permalink import example_link
from mot_viz.app.results_folders import pick_run
from mot_viz.errors import MotVizError
from mot_viz.sharing.registry import REFERENCE

ORDER = "the run's order"
LINK = st.column_config.LinkColumn("open", display_text="Open in the app", width="medium")


def main() -> None:
    st.title("Evaluations")
    app.explain(
        "An evaluation's results folder, example by example: which answers the translated cache lost, what they "
        "have in common, and the app's view of any one of them. It opens every folder that "
        "`python -m mot_viz.eval.evaluate`, `long_context`, `conversation` or `shards` writes with `--out` — the "
        "shipped ones under results/, or a folder of your own (choose *other folder* and type its path).\n\n"
        "- **Settings and summary** — as the folder's summary.json states them.\n"
        "- **Examples** — one row per example (a conversation: per turn): each condition's answer and score and "
        f"*MoT − native*. Filter by a score range, by the answers native got right and MoT wrong (a score of at "
        f"least {eval_runs.RIGHT} is right), or by a word of the question; click a column's header to sort by it.\n"
        "- **The slice** — each condition's mean with its 95% bootstrap interval and retention (÷ native, with its "
        "paired interval), recomputed for the examples the filters keep by the evaluation's own summary code: with "
        "no filter it is the folder's own summary.\n"
        "- **Which layers separate lost answers from kept ones** — per target layer, the MoT cache's error against "
        "the native cache (the Per-layer cache error page's metrics, recorded per example in the folder's "
        "layer_error.csv) averaged over the slice's lost answers (native right, MoT wrong) and its kept ones (both "
        "right), each with its 95% bootstrap interval, and lost − kept with its interval.\n"
        "- **Which layers' restoration wins lost answers back** — from the folder's patching.csv (`python -m "
        "mot_viz.eval.patching`; of a long-context folder, one budget's documents): per target layer, the share "
        "of the lost answers' gold-answer log-probability gap (native − the method's) that putting the native K/V "
        "back at that layer alone wins back, with its 95% bootstrap band, beside the rank correlation of each "
        "layer's error with that cost.\n"
        "- **Two runs side by side** — a second folder of the same examples (another checkpoint, the linear map, "
        "another window): the paired difference over the slice, as `scripts/paired_runs.py` computes it."
    )
    run, table = pick_run("pg.evals.folder", "pg.evals.path", "Results folder", typed=live_panel.folder_to_open())
    if run is None:
        live_panel.panel()
        st.stop()
    _settings(run)
    table, shown = _examples(run, table)
    _slice(run, shown)
    run_layers.separation(run, shown)
    run_layers.patching(run, shown)
    _two_runs(run, table, shown)
    live_panel.panel()


def _settings(run: eval_runs.EvalRun) -> None:
    st.subheader("Settings and summary")
    meta = run.meta
    skipped = len(run.skipped)
    st.markdown(f"**{app.escape_markdown(run.name)}** — written by `{run.kind.command}` on {meta.get('date', '?')}; "
                f"{run.rows['example'].nunique()} examples, {skipped} skipped.")
    st.code(run.command, language="bash", wrap_lines=True)
    with st.expander("Settings (summary.json)"):
        st.json(run.settings)
    st.dataframe(run.summary, hide_index=True)
    if skipped:
        with st.expander(f"Skipped ({skipped})"):
            st.dataframe(run.skipped, hide_index=True)


# ----- the examples ------------------------------------------------------------------------------------------------


def _examples(run: eval_runs.EvalRun, table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The filters and the table of examples: (every example with its app link, those the filters keep)."""
    st.subheader("Examples")
    conditions = run.conditions
    cols = st.columns(4)
    app.widget_default("pg.evals.condition", run.translated if run.translated in conditions else conditions[0],
                       conditions)
    condition = cols[0].selectbox("Score of", conditions, key="pg.evals.condition")
    app.widget_default("pg.evals.low", 0.0)
    low = cols[1].number_input("from", 0.0, 1.0, step=0.05, key="pg.evals.low")
    app.widget_default("pg.evals.high", 1.0)
    high = cols[2].number_input("to", 0.0, 1.0, step=0.05, key="pg.evals.high")
    app.widget_default("pg.evals.lost", False)
    can_lose = REFERENCE in conditions and run.translated in conditions
    lost = cols[3].checkbox(f"native right, {run.translated} wrong", key="pg.evals.lost", disabled=not can_lose,
                            help=f"native scored at least {eval_runs.RIGHT}, {run.translated} less")
    cols = st.columns([2, 1, 1])
    app.widget_default("pg.evals.search", "")
    search = cols[0].text_input("Question contains", key="pg.evals.search")
    delta = eval_runs.delta_column(run)
    sorts = [ORDER, *([delta] if delta in table else []), "context_tokens", *(f"{c} score" for c in conditions)]
    app.widget_default("pg.evals.sort", ORDER, sorts)
    sort = cols[1].selectbox("Sort by", sorts, key="pg.evals.sort")
    app.widget_default("pg.evals.descending", False)
    descending = cols[2].checkbox("descending", key="pg.evals.descending")

    views = app.eval_run_views(run, table)
    table = table.assign(app=[example_link(v) for v in views])
    shown = eval_runs.select(table, condition, low, high, lost and can_lose, search, run.translated)
    if sort != ORDER:
        shown = shown.sort_values(sort, ascending=not descending, kind="stable")
    if table["question"].isna().all():
        st.caption("The questions are not shown: the data this run sampled is not installed here.")
    st.caption(f"{len(shown)} of {len(table)} examples.")
    scores = {c: st.column_config.NumberColumn(format="%.3f") for c in shown.columns if c.endswith(" score")}
    st.dataframe(shown, hide_index=True, column_order=["app", *[c for c in shown if c != "app"]],
                 column_config={"app": LINK,
                                delta: st.column_config.NumberColumn(format="%+.3f"), **scores})
    _open_one(shown)
    _not_linkable(views)
    return table, shown


def _open_one(shown: pd.DataFrame) -> None:
    """One example of the table opened in the app by a button (the table's own links open from its cells)."""
    linked = shown.dropna(subset=["app"])
    if linked.empty:
        return
    links = dict(zip(linked["example"], linked["app"]))
    questions = dict(zip(linked["example"], linked["question"].fillna("")))
    cols = st.columns([3, 1], vertical_alignment="bottom")
    app.widget_default("pg.evals.open", next(iter(links)), list(links))
    chosen = cols[0].selectbox("Example to open", list(links), key="pg.evals.open",
                               format_func=lambda e: f"{e} — {questions[e][:80]}" if questions[e] else e)
    cols[1].link_button("Open in the app", links[chosen], width="stretch")


def _not_linkable(views: list[eval_run_links.AppView]) -> None:
    reasons = pd.Series([v.reason for v in views if v.page is None], dtype=object)
    linked = len(views) - len(reasons)
    text = f"**Open in the app** sets the sidebar (pair, checkpoint, dataset example) and the page's options to " \
           f"that example: {linked} of {len(views)} examples open this way."
    if len(reasons):
        text += " Not linkable yet: " + "; ".join(f"{n} because {app.escape_markdown(r)}"
                                                  for r, n in reasons.value_counts().items()) + "."
    notes = pd.Series([v.note for v in views if v.page is not None and v.note], dtype=object)
    for note, n in notes.value_counts().items():
        text += f" {n} of them: {app.escape_markdown(note)}."
    st.caption(text + f" The app cuts a context at {app.MAX_CONTEXT_TOKENS:,} target tokens, an evaluation at its "
                      "--max_context_tokens: a passage longer than the smaller limit reads differently there.")


# ----- the slice ---------------------------------------------------------------------------------------------------


def _slice(run: eval_runs.EvalRun, shown: pd.DataFrame) -> None:
    st.subheader("The slice")
    summary = eval_runs.slice_summary(run, shown["example"])
    if summary.empty:
        st.info("No example passes the filters.")
        return
    st.caption(f"Over the {len(shown)} examples shown ({run.settings.get('bootstrap', 1000)} bootstrap resamples, "
               "seed as the run's): mean score with its 95% interval; retention = mean ÷ native's, with its paired "
               "interval.")
    st.dataframe(summary, hide_index=True,
                 column_config={c: st.column_config.NumberColumn(format="%.3f") for c in
                                ("mean", "ci_low", "ci_high", "retention", "retention_ci_low", "retention_ci_high")})
    delta = eval_runs.delta_column(run)
    if delta not in shown:
        return
    axes = [x for x in run_figures.X_AXES if x in shown and shown[x].notna().any()]
    app.widget_default("pg.evals.x", axes[0], axes)
    x = st.radio("Against", axes, format_func=run_figures.X_AXES.get, key="pg.evals.x", horizontal=True)
    data = shown[["example", "group", x, delta]]
    app.show_figure(run_figures.delta_figure(shown, delta, x), data, "evaluation_delta")


# ----- two runs ----------------------------------------------------------------------------------------------------


def _two_runs(run: eval_runs.EvalRun, table: pd.DataFrame, shown: pd.DataFrame) -> None:
    st.subheader("Two runs side by side")
    other, _ = pick_run("pg.evals.second", "pg.evals.second_path", "Second results folder (the same examples)",
                        optional=True)
    if other is None:
        return
    cols = st.columns(2)
    app.widget_default("pg.evals.condition_a", run.translated if run.translated in run.conditions
                       else run.conditions[0], run.conditions)
    condition_a = cols[0].selectbox(f"Condition of {run.name}", run.conditions, key="pg.evals.condition_a")
    app.widget_default("pg.evals.condition_b", other.translated if other.translated in other.conditions
                       else other.conditions[0], other.conditions)
    condition_b = cols[1].selectbox(f"Condition of {other.name}", other.conditions, key="pg.evals.condition_b")
    try:
        comparison = eval_runs.compare_runs(run, other, condition_a, condition_b)
    except MotVizError as exc:
        app.show_error(exc)
        return
    sliced = eval_runs.compare_runs(run, other, condition_a, condition_b, examples=shown["example"])
    a, b = sliced.labels
    st.caption(f"{len(comparison.pairs)} examples in both runs, {len(sliced.pairs)} of them in the slice. "
               f"The paired difference {a} − {b} per group over the slice, with its 95% bootstrap interval (1,000 "
               "resamples, seed 0) and the examples each side wins; over every example it is `scripts/paired_runs.py "
               f"{run.folder}:{condition_a}={a} {other.folder}:{condition_b}={b} --pairs {a}:{b}`.")
    if sliced.pairs.empty:
        st.info("No example of the slice is in both runs.")
        return
    signed = st.column_config.NumberColumn(format="%+.3f")
    st.dataframe(sliced.paired, hide_index=True,
                 column_config=dict.fromkeys(("diff", "ci_low", "ci_high"), signed))
    app.show_figure(run_figures.comparison_figure(sliced.pairs, sliced.labels), sliced.pairs, "evaluation_two_runs")
    links = table.set_index("example")
    for title, wins in ((f"{a} wins", sliced.a_wins), (f"{b} wins", sliced.b_wins)):
        with st.expander(f"{title} ({len(wins)})"):
            listed = wins.assign(question=wins["example"].map(links["question"]),
                                 app=wins["example"].map(links["app"])).rename(
                columns={"score_a": f"score in {a}", "score_b": f"score in {b}"})
            st.dataframe(listed, hide_index=True,
                         column_order=["app", *[c for c in listed if c != "app"]],
                         column_config={"app": LINK,
                                        "diff": st.column_config.NumberColumn(format="%+.3f")})


app.run_page(main)
