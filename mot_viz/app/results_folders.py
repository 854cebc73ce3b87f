"""The Evaluations page's results folders: the shipped ones on offer or one typed, read once while their files are
unchanged (mot_viz.analysis.eval_runs.open_run and its wide table; a folder's layer_error.csv likewise), and the
picker that chooses one. Cached objects are never mutated."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from ..analysis import eval_runs, layer_separation
from ..errors import MotVizError
from ..eval.layer_error_file import LAYER_ERROR_FILE
from ..eval.results_folder import RESULTS_TABLE, SETTINGS_FILE
from .page import show_error, widget_default
from .settings import REPO_ROOT

OTHER = "other folder (type its path below)"
NONE = "(none)"
DEFAULT_RUN = "results/eval/smollm2-to-gemma3-mid-squad300"


def shipped() -> list[str]:
    """The shipped results folders, relative to the repository."""
    return [str(p.relative_to(REPO_ROOT)) for p in eval_runs.shipped_runs(REPO_ROOT / "results")]


def stamp(folder: Path, names: tuple[str, ...] = (RESULTS_TABLE, SETTINGS_FILE)) -> tuple:
    """The modification time and size of each of a folder's files named (None for one missing): a cache key that
    changes when any of them is rewritten."""
    try:
        return tuple((p.stat().st_mtime_ns, p.stat().st_size) if p.is_file() else None
                     for p in (folder / name for name in names))
    except (OSError, ValueError):  # a path the system cannot name (too long, a NUL): open_run says so
        return ()


@st.cache_resource(max_entries=16, show_spinner="Reading the results folder …")
def _opened(folder: str, stamp: tuple) -> tuple[eval_runs.EvalRun, pd.DataFrame]:
    """A results folder read and its wide table, kept while its files are unchanged (`stamp`)."""
    run = eval_runs.open_run(folder)
    return run, eval_runs.wide_table(run)


def resolve(typed: str) -> Path:
    """A typed folder: as given (from the working folder), else from the repository."""
    path = Path(typed.strip()).expanduser()
    try:
        return path if path.is_absolute() or path.exists() else REPO_ROOT / path
    except (OSError, ValueError):  # a path the system cannot name: open_run says so
        return path


def pick_run(key: str, path_key: str, label: str, optional: bool = False, typed: str | None = None):
    """A folder chosen among the shipped results (or typed: `typed` chooses that folder before the widgets are drawn),
    read: (run, wide table), or (None, None) when none is chosen or it cannot be read (the error shown)."""
    if typed is not None:
        st.session_state.update({key: OTHER, path_key: typed})
    folders = shipped()
    options = ([NONE] if optional else []) + folders + [OTHER]
    widget_default(key, NONE if optional else (DEFAULT_RUN if DEFAULT_RUN in folders else options[0]), options)
    choice = st.selectbox(label, options, key=key)
    widget_default(path_key, "")
    typed = st.text_input("Folder path", key=path_key, disabled=choice != OTHER,
                          placeholder="e.g. /home/me/runs/mid-squad (a folder an evaluation's --out wrote)")
    if choice == NONE or (choice == OTHER and not typed.strip()):
        if choice == OTHER:
            st.info("Type the path of a results folder.")
        return None, None
    folder = resolve(typed) if choice == OTHER else REPO_ROOT / choice
    try:
        return _opened(str(folder), stamp(folder))
    except MotVizError as exc:
        show_error(exc)
        return None, None


@st.cache_resource(max_entries=16, show_spinner="Reading the per-layer errors …")
def _layer_errors(folder: str, stamp: tuple, _run: eval_runs.EvalRun) -> pd.DataFrame | None:
    return layer_separation.run_layer_errors(_run)


def layer_errors(run: eval_runs.EvalRun) -> pd.DataFrame | None:
    """The run's layer_error.csv with example names (layer_separation.run_layer_errors), kept while the folder's
    files are unchanged; None where it has none."""
    return _layer_errors(str(run.folder), stamp(run.folder, (RESULTS_TABLE, SETTINGS_FILE, LAYER_ERROR_FILE)), run)
