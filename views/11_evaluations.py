"""Evaluations: a results folder example by example — which answers a translation lost, a slice's summary, the
app's view of one example, and two runs of the same examples side by side."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from mot_viz import app
from mot_viz.analysis import eval_run_links, eval_runs, layer_separation, run_figures
from mot_viz.analysis import patching as patching_analysis
from mot_viz.app.patching import shipped_patching
from mot_viz.app import live_run
from mot_viz.app.permalink import example_link
from mot_viz.app.settings import DATASET_LABELS
from mot_viz.errors import MotVizError
from mot_viz.eval.answers import CONDITION_LABELS
from mot_viz.eval.patching import PATCHING_FILE
from mot_viz.sharing import registry
from mot_viz.sharing.registry import REFERENCE

OTHER = "other folder (type its path below)"
NONE = "(none)"
DEFAULT_RUN = "results/eval/smollm2-to-gemma3-mid-squad300"
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
    _open_live_folder()
    run, table = _pick_run("pg.evals.folder", "pg.evals.path", "Results folder")
    if run is None:
        _live_run()
        st.stop()
    _settings(run)
    table, shown = _examples(run, table)
    _slice(run, shown)
    _layers(run, shown)
    _patching(run, shown)
    _two_runs(run, table, shown)
    _live_run()


# ----- the folder --------------------------------------------------------------------------------------------------


def _shipped() -> list[str]:
    return [str(p.relative_to(app.REPO_ROOT)) for p in eval_runs.shipped_runs(app.REPO_ROOT / "results")]


@st.cache_resource(max_entries=16, show_spinner="Reading the results folder …")
def _opened(folder: str, stamp: tuple) -> tuple[eval_runs.EvalRun, pd.DataFrame]:
    """A results folder read and its wide table, kept while its files are unchanged (`stamp`); never mutated."""
    run = eval_runs.open_run(folder)
    return run, eval_runs.wide_table(run)


def _stamp(folder: Path) -> tuple:
    try:
        return tuple((p.stat().st_mtime_ns, p.stat().st_size) if p.is_file() else None
                     for p in (folder / "examples.csv", folder / "summary.json"))
    except (OSError, ValueError):  # a path the system cannot name (too long, a NUL): open_run says so
        return ()


def _resolve(typed: str) -> Path:
    """A typed folder: as given (from the working folder), else from the repository."""
    path = Path(typed.strip()).expanduser()
    try:
        return path if path.is_absolute() or path.exists() else app.REPO_ROOT / path
    except (OSError, ValueError):  # a path the system cannot name: open_run says so
        return path


def _pick_run(key: str, path_key: str, label: str, optional: bool = False):
    """A folder chosen among the shipped results (or typed), read: (run, wide table), or (None, None)."""
    shipped = _shipped()
    options = ([NONE] if optional else []) + shipped + [OTHER]
    app.widget_default(key, NONE if optional else (DEFAULT_RUN if DEFAULT_RUN in shipped else options[0]), options)
    choice = st.selectbox(label, options, key=key)
    app.widget_default(path_key, "")
    typed = st.text_input("Folder path", key=path_key, disabled=choice != OTHER,
                          placeholder="e.g. /home/me/runs/mid-squad (a folder an evaluation's --out wrote)")
    if choice == NONE or (choice == OTHER and not typed.strip()):
        if choice == OTHER:
            st.info("Type the path of a results folder.")
        return None, None
    folder = _resolve(typed) if choice == OTHER else app.REPO_ROOT / choice
    try:
        return _opened(str(folder), _stamp(folder))
    except MotVizError as exc:
        app.show_error(exc)
        return None, None


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


# ----- the layers --------------------------------------------------------------------------------------------------


@st.cache_resource(max_entries=16, show_spinner="Reading the per-layer errors …")
def _layer_errors(folder: str, stamp: tuple, _run: eval_runs.EvalRun) -> pd.DataFrame | None:
    """The run's layer_error.csv with example names, kept while the folder's files are unchanged; never mutated."""
    return layer_separation.run_layer_errors(_run)


def _layers(run: eval_runs.EvalRun, shown: pd.DataFrame) -> None:
    st.subheader("Which layers separate lost answers from kept ones")
    if run.kind.name not in ("evaluate", "long_context") or not {REFERENCE, run.translated} <= set(run.conditions):
        st.caption("Per-layer cache errors are recorded for the folders of `evaluate` and `long_context` that hold "
                   "native and MoT answers.")
        return
    stamp = _stamp(run.folder) + tuple((p.stat().st_mtime_ns, p.stat().st_size) if p.is_file() else None
                                       for p in [run.folder / "layer_error.csv"])
    errors = _layer_errors(str(run.folder), stamp, run)
    if errors is None:
        st.caption(f"This folder has no layer_error.csv. Record it (no answer is regenerated) with "
                   f"`{layer_separation.command(run)}`, or run the evaluation with `--layer_error`.")
        return
    cols = st.columns([2, 1])
    metrics = list(layer_separation.METRIC_TITLES)
    app.widget_default("pg.evals.layer_metric", metrics[0], metrics)
    metric = cols[0].radio("Error", metrics, format_func=layer_separation.METRIC_TITLES.get,
                           key="pg.evals.layer_metric", horizontal=True)
    groups = list(dict.fromkeys(errors["group"]))
    app.widget_default("pg.evals.layer_group", groups[0], groups)
    group = cols[1].selectbox("Group", groups, key="pg.evals.layer_group", disabled=len(groups) == 1)
    part = layer_separation.layer_separation(errors[errors["group"] == group], shown, run.translated, metric,
                                             run.settings.get("bootstrap", 1000), run.settings.get("seed", 0))
    st.markdown(f"**{app.escape_markdown(group)}, over the slice:** "
                + layer_separation.separation_text(part, metric))
    if part["n_lost"].max() and part["n_kept"].max():
        app.show_figure(layer_separation.separation_figure(part, metric), part, "evaluation_layer_separation")
    st.caption("Each example's error is one number per layer (over its context tokens); the bands are 95% "
               "bootstrap intervals of the group means, lost − kept resamples both groups. The shaded layers are the "
               "translated window; a layer below it differs from native only through the replay's sparse attention.")


# ----- layer patching ----------------------------------------------------------------------------------------------


def _patching(run: eval_runs.EvalRun, shown: pd.DataFrame) -> None:
    st.subheader("Which layers' restoration wins lost answers back")
    path = run.folder / PATCHING_FILE
    long = run.kind.name == "long_context"
    if run.kind.name not in ("evaluate", "long_context") or not path.is_file():
        st.caption("This folder has no patching.csv. Record it (no answer is regenerated) with `python -m "
                   f"mot_viz.eval.patching {app.escape_markdown(run.folder)} "
                   + ("--budget 1024 --n 24" if long else "--n 100")
                   + " --methods mot direct --direct <a full-depth map>` (folders of `evaluate` and of "
                   "`long_context`, one budget each).")
        return
    frame = shipped_patching(str(run.folder), path.stat().st_mtime_ns)
    if long:  # a long-context folder's scan is of one budget's documents: the slice's at that length
        budgets = patching_analysis.scanned_groups(frame, run.rows)
        if not budgets:
            st.caption("This folder's patching.csv scans none of its documents: record it again.")
            return
        app.widget_default("pg.evals.patch_budget", budgets[0], budgets)
        budget = st.radio("Documents scanned", budgets, key="pg.evals.patch_budget", horizontal=True)
        shown = shown[shown["group"] == budget]
    methods = list(dict.fromkeys(frame["method"]))
    app.widget_default("pg.evals.patch_method", methods[0], methods)
    cols = st.columns(2)
    method = cols[0].radio("Method", methods, key="pg.evals.patch_method", horizontal=True,
                           format_func=lambda m: CONDITION_LABELS.get(m, m))
    app.widget_default("pg.evals.patch_over", "lost", ["lost", "all"])
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
    window = sorted({int(l) for l in frame.loc[frame["target"] == "window", "layers"].iloc[0].split()})
    what = "lost answers" if over == "lost" else "examples"
    of = f"{len(scanned)} scanned" + (f" ({budget})" if long else "")
    app.show_figure(patching_analysis.shares_figure(
        shares, window, f"{method}: {len(ids)} {what} of {of} (mean gap {shares['gap'].iloc[0]:.2f} nats)"),
        shares, f"evaluation_patching_{method}")
    groups = shares[~shares["target"].str.startswith("layer ")]
    st.dataframe(groups.round(3), hide_index=True, width="stretch")
    rho = patching_analysis.error_cost_correlation(frame, method, ids)
    st.caption(f"Share: Σ over the {what} of the log-probability won back ÷ Σ of their gaps (native − "
               f"{method}), with 95% bootstrap bands over examples; groups patch their layers together. Spearman ρ "
               "between a layer's mean relative error and its mean cost, over the target layers: "
               + "; ".join(f"{r.direction} vs {r.error.split('_')[0]} {r.spearman:+.2f}" for r in rho.itertuples())
               + ". The Layer patching page scans one context with the same code.")


# ----- two runs ----------------------------------------------------------------------------------------------------


def _two_runs(run: eval_runs.EvalRun, table: pd.DataFrame, shown: pd.DataFrame) -> None:
    st.subheader("Two runs side by side")
    other, _ = _pick_run("pg.evals.second", "pg.evals.second_path", "Second results folder (the same examples)",
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


# ----- a live run --------------------------------------------------------------------------------------------------


LIVE = "evals.live"  # this session's live run (mot_viz.app.live_run.LiveRun); no page option, so never in a link
LIVE_OPEN = "evals.live_open"  # a live run's folder to open in the explorer above at the next page run
LIVE_ENDED = "evals.live_ended"  # the live run whose end the page has handled (its folder opened once)
UPLOAD = "upload"


def _open_live_folder() -> None:
    """Before the explorer's widgets are drawn: choose the folder a live run just wrote."""
    folder = st.session_state.pop(LIVE_OPEN, None)
    if folder is not None:
        st.session_state.update({"pg.evals.folder": OTHER, "pg.evals.path": folder})


def _live_run() -> None:
    st.subheader("Run an evaluation here")
    live = st.session_state.get(LIVE)
    if live is not None and live.running():
        _live_progress()
        return
    if live is not None and st.session_state.get(LIVE_ENDED) is not live:  # just ended: open its folder above
        st.session_state[LIVE_ENDED] = live
        if (live.folder / "examples.csv").is_file():
            st.session_state[LIVE_OPEN] = str(live.folder)
            st.rerun()
    if live is not None:
        _live_outcome(live)
    checkpoint = app.applied_selection().checkpoint
    st.caption(f"`python -m mot_viz.eval.evaluate` on up to {live_run.MAX_EXAMPLES} examples, with the sidebar's "
               f"checkpoint ({app.escape_markdown(Path(checkpoint).name) or 'none'}), as a process of its own: "
               f"its results folder goes under {app.escape_markdown(str(live_run.runs_dir()))} and opens above "
               "when it ends. **Stop** ends it as Ctrl-C would: the folder keeps the examples done, and **Resume** "
               "(`--resume`) computes the rest.")
    cols = st.columns([1, 1, 2])
    datasets = [*live_run.DATASETS, UPLOAD]
    app.widget_default("pg.evals.live_dataset", "squad", datasets)
    dataset = cols[0].selectbox("Dataset", datasets, key="pg.evals.live_dataset",
                                format_func=lambda d: "your .jsonl file" if d == UPLOAD else DATASET_LABELS.get(d, d))
    app.widget_default("pg.evals.live_n", 10)
    # no bounds on the widget, which would silently clamp a value past them: Run refuses it in one line
    n = cols[1].number_input("Examples", step=1, key="pg.evals.live_n",
                             help=f"1 to {live_run.MAX_EXAMPLES}: the first of the dataset's seed-0 sample, as the "
                                  "command draws them.")
    # the command's default conditions but those every run answers under (a list: kept where offered)
    app.widget_default("pg.evals.live_conditions", [c for c in registry.DEFAULTS["evaluate"]
                                                    if c not in registry.ALWAYS["evaluate"]])
    st.session_state["pg.evals.live_conditions"] = [c for c in st.session_state["pg.evals.live_conditions"]
                                                    if c in live_run.LIVE_CONDITIONS]
    conditions = cols[2].multiselect("Conditions (native always)", list(live_run.LIVE_CONDITIONS),
                                     key="pg.evals.live_conditions",
                                     help="The command's --conditions: " + "; ".join(
                                         f"{c}: {CONDITION_LABELS[c]}" for c in live_run.LIVE_CONDITIONS))
    upload = None
    if dataset == UPLOAD:
        upload = st.file_uploader("Examples in the evaluation format (.jsonl): one JSON object per line, "
                                  '{"context", "question", "answers": [...]} or {"context", "question", '
                                  '"choices": [...], "label": int}', type=["jsonl"], key="evals.live_upload")
    if not st.button("Run", key="evals.live_run", type="primary", disabled=dataset == UPLOAD and upload is None):
        return
    try:
        data = str(live_run.check_upload(upload.name, upload.getvalue())) if dataset == UPLOAD else dataset
        settings = live_run.settings_for(checkpoint, data, int(n), conditions)
        st.session_state[LIVE] = live_run.start(settings, live_run.new_folder(checkpoint, data, int(n)))
    except MotVizError as exc:
        app.show_error(exc)
        return
    st.rerun()


@st.fragment(run_every=1.0)
def _live_progress() -> None:
    """The running command's progress, read each second from what it writes; its Stop button."""
    live = st.session_state[LIVE]
    if not live.running():  # ended: the whole page shows the outcome and opens the folder
        st.rerun(scope="app")
    progress = live.progress()
    text = ("Stopping: writing the examples done …" if live.stopped else
            "Loading the models …" if progress.phase == "starting" else
            f"{progress.done} of {progress.total} examples")
    st.progress(progress.fraction, text=text)
    st.code(live.command, language="bash", wrap_lines=True)
    if st.button("Stop", key="evals.live_stop", disabled=live.stopped):
        live.stop()


def _live_outcome(live: live_run.LiveRun) -> None:
    """How the session's last run ended, the command that reproduces it, and Resume for a stopped one."""
    progress = live.progress()
    if progress.phase == "finished":
        st.success(f"Evaluated {progress.total} examples: the folder is open above.")
    elif progress.phase == "stopped":
        st.warning(f"Stopped after {progress.done} of {progress.total} examples"
                   + (": the folder is open above." if progress.done else ", before the first was done."))
    else:
        st.error(f"The run failed: {app.escape_markdown(progress.message)} (its output: {live.log})")
    st.code(live.command + (" --resume" if progress.phase != "finished" else ""), language="bash", wrap_lines=True)
    if progress.phase != "finished" and st.button("Resume", key="evals.live_resume"):
        st.session_state[LIVE] = live_run.start(live.settings, live.folder, resume=True)
        st.rerun()


app.run_page(main)
