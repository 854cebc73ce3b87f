"""The Evaluations page's live run: the panel that starts ``python -m mot_viz.eval.evaluate`` on a few examples with
the sidebar's checkpoint (mot_viz.app.live_run runs it), shows its progress each second with a Stop button, and when
it ends hands its folder to the explorer above (:func:`folder_to_open`) and shows how it ended, with Resume."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from ..errors import MotVizError
from ..eval.answers import CONDITION_LABELS
from ..eval.policy import ALWAYS, DEFAULTS
from ..sharing import registry
from . import live_run
from .frame import applied_selection
from .page import escape_markdown, show_error, widget_default
from .settings import DATASET_LABELS

LIVE = "evals.live"  # this session's live run (live_run.LiveRun); no page option, so never in a link
LIVE_OPEN = "evals.live_open"  # a live run's folder to open in the explorer above at the next page run
LIVE_ENDED = "evals.live_ended"  # the live run whose end the page has handled (its folder opened once)
UPLOAD = "upload"


def folder_to_open() -> str | None:
    """The folder a live run just wrote, once: for the explorer to choose before its widgets are drawn."""
    return st.session_state.pop(LIVE_OPEN, None)


def panel() -> None:
    """The live run's section: its progress while it runs; else how the last one ended, and the form to start one."""
    st.subheader("Run an evaluation here")
    live = st.session_state.get(LIVE)
    if live is not None and live.running():
        _progress()
        return
    if live is not None and st.session_state.get(LIVE_ENDED) is not live:  # just ended: open its folder above
        st.session_state[LIVE_ENDED] = live
        if (live.folder / "examples.csv").is_file():
            st.session_state[LIVE_OPEN] = str(live.folder)
            st.rerun()
    if live is not None:
        _outcome(live)
    checkpoint = applied_selection().checkpoint
    st.caption(f"`python -m mot_viz.eval.evaluate` on up to {live_run.MAX_EXAMPLES} examples, with the sidebar's "
               f"checkpoint ({escape_markdown(Path(checkpoint).name) or 'none'}), as a process of its own: "
               f"its results folder goes under {escape_markdown(str(live_run.runs_dir()))} and opens above "
               "when it ends. **Stop** ends it as Ctrl-C would: the folder keeps the examples done, and **Resume** "
               "(`--resume`) computes the rest.")
    cols = st.columns([1, 1, 2])
    datasets = [*live_run.DATASETS, UPLOAD]
    widget_default("pg.evals.live_dataset", "squad", datasets)
    dataset = cols[0].selectbox("Dataset", datasets, key="pg.evals.live_dataset",
                                format_func=lambda d: "your .jsonl file" if d == UPLOAD else DATASET_LABELS.get(d, d))
    widget_default("pg.evals.live_n", 10)
    # no bounds on the widget, which would silently clamp a value past them: Run refuses it in one line
    n = cols[1].number_input("Examples", step=1, key="pg.evals.live_n",
                             help=f"1 to {live_run.MAX_EXAMPLES}: the first of the dataset's seed-0 sample, as the "
                                  "command draws them.")
    # the command's default conditions but those every run answers under (a list: kept where offered)
    widget_default("pg.evals.live_conditions", [c for c in DEFAULTS["evaluate"] if c not in ALWAYS["evaluate"]])
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
        show_error(exc)
        return
    st.rerun()


@st.fragment(run_every=1.0)
def _progress() -> None:
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


def _outcome(live: live_run.LiveRun) -> None:
    """How the session's last run ended, the command that reproduces it, and Resume for a stopped one."""
    progress = live.progress()
    if progress.phase == "finished":
        st.success(f"Evaluated {progress.total} examples: the folder is open above.")
    elif progress.phase == "stopped":
        st.warning(f"Stopped after {progress.done} of {progress.total} examples"
                   + (": the folder is open above." if progress.done else ", before the first was done."))
    else:
        st.error(f"The run failed: {escape_markdown(progress.message)} (its output: {live.log})")
    st.code(live.command + (" --resume" if progress.phase != "finished" else ""), language="bash", wrap_lines=True)
    if progress.phase != "finished" and st.button("Resume", key="evals.live_resume"):
        st.session_state[LIVE] = live_run.start(live.settings, live.folder, resume=True)
        st.rerun()
