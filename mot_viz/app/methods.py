"""The Methods page's loaders: which ways of sharing a context this pair and checkpoint offer, each method's answer,
stages, bytes and K/V error on the applied context (mot_viz.analysis.methods; cached per context, the text relay
apart since it costs the most), and the shipped results as quality against time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import streamlit as st

from ..analysis.method_figures import shipped_points
from ..analysis.methods import MethodsResult, cache_methods, methods, relay_methods
from ..errors import MotVizError
from ..sharing import registry
from ..sharing.caches import run_artifacts
from ..sharing.method import Loading, Method, Option
from ..sharing.relay import RELAY_TOKENS
from .loaders import app_offering, checkpoint_stamp, get_checkpoint, get_model, get_translation
from .settings import REPO_ROOT, test_mode
from .state import Run, Selection


class MethodsOffer(NamedTuple):
    """Which ways of sharing the applied pair and checkpoint offer beside those every run has, under which options,
    and why not where one is missing."""

    options: dict  # the options the offered methods read, by Option.name (the maps found for this pair)
    missing: dict[str, str]  # method -> one line saying why it is not offered

    def offers(self, name: str) -> bool:
        return name not in self.missing


def _loads(way: Method, option: Option, path: str | None, run: Run) -> tuple[str | None, str | None]:
    """(path, None) when what the option found at path loads for the run's pair (the method's own load), else (None,
    the note saying why it is left out): a broken one leaves out that method only, never the page (the user never
    chose it)."""
    if path is None:
        return None, None
    sel = run.selection
    failure = _load_failure(way.name, option.name, path, _stamp(path), sel.source, sel.target, test_mode())
    if failure is None:
        return path, None
    return None, (f"the {option.what} {Path(path).name} does not load ({failure}). Fix or remove it; the other methods "
                  "are shown.")


def _stamp(path: str) -> int:
    """The newest modification time of the file at path or of the files in its folder (a rewritten one is read
    again)."""
    found = Path(path)
    files = [found] if found.is_file() else [f for f in found.iterdir() if f.is_file()] if found.is_dir() else []
    return max((f.stat().st_mtime_ns for f in files), default=0)


@st.cache_data(show_spinner=False, max_entries=32)
def _load_failure(method: str, option: str, path: str, stamp: int, source: str, target: str, test: bool) -> str | None:
    """Why the method's load of what its option names at path fails for the pair, in one line; None when it loads."""
    try:
        registry.method(method).load(Loading(get_model(source), get_model(target), None, {option: path}))
    except MotVizError as exc:
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return None


def methods_offer(run: Run) -> MethodsOffer:
    """The ways of sharing the run's pair and checkpoint offer, and the options they read: each method says whether
    it fits the pair (Method.not_offered) and finds what its options name among the checkpoints on offer
    (Option.find), which must load."""
    offering = app_offering(run.selection.checkpoint, run.mot)
    options, missing = {}, {}
    for way in registry.REGISTRY.values():
        why = way.not_offered(offering)
        for option in way.options:
            if option.find is None:
                continue
            path, broken = (None, None) if why else _loads(way, option, option.find(offering), run)
            options[option.name] = path
            if why is None and path is None:
                why = broken or option.missing
        if why is not None:
            missing[way.name] = why
    return MethodsOffer(options, missing)


def option_stamps(options: dict) -> tuple:
    """The options as a cache key: each value, and where it names a checkpoint folder, its stamp (a refitted map
    is another key)."""
    return tuple((name, value, checkpoint_stamp(value) if isinstance(value, str) and Path(value).is_dir() else 0)
                 for name, value in sorted(options.items()))


def cached_methods(run: Run, offer: MethodsOffer, max_new_tokens: int) -> MethodsResult:
    """Every method but the text relay on the applied context (mot_viz.analysis.methods.cache_methods); computed
    once per context, pair, checkpoint and offer."""
    sel = run.selection
    return _cached_cache_methods(sel, checkpoint_stamp(sel.checkpoint), test_mode(), option_stamps(offer.options),
                                 tuple(offer.missing), max_new_tokens)


def cached_relays(run: Run, max_new_tokens: int, relay_tokens: int = RELAY_TOKENS) -> MethodsResult:
    """The text relays on the applied context (mot_viz.analysis.methods.relay_methods); computed once per context."""
    sel = run.selection
    return _cached_relays(sel, checkpoint_stamp(sel.checkpoint), test_mode(), relay_tokens, max_new_tokens)


@st.cache_data(show_spinner=False, max_entries=8)
def _cached_cache_methods(sel: Selection, stamp: int, test: bool, options: tuple, missing: tuple[str, ...],
                          max_new_tokens: int) -> MethodsResult:
    src, tgt = get_model(sel.source), get_model(sel.target)
    mot = get_checkpoint(sel.checkpoint, src, tgt)[0]
    opts = {name: value for name, value, _ in options}
    # what each offered method loads (Method.load); a calibrated one (KVComm's layer choice) on a set of size 1, its
    # default: here, this context and question
    offered = tuple(m for m in methods() if m not in missing)  # cache_methods leaves out the relays
    artifacts = run_artifacts(offered, opts, src, tgt, mot, [sel.example] if sel.example is not None else [])
    return cache_methods(mot, src, tgt, sel.example, get_translation(sel), sel.suffix, artifacts, opts,
                         max_new_tokens=max_new_tokens)


@st.cache_data(show_spinner=False, max_entries=8)
def _cached_relays(sel: Selection, stamp: int, test: bool, relay_tokens: int, max_new_tokens: int) -> MethodsResult:
    src, tgt = get_model(sel.source), get_model(sel.target)
    mot = get_checkpoint(sel.checkpoint, src, tgt)[0]
    return relay_methods(mot, src, tgt, sel.example, get_translation(sel), relay_tokens, max_new_tokens)


def results_root() -> Path:
    """Where the shipped results live (``$MOT_VIZ_RESULTS``, default <repo>/results; tests point it elsewhere)."""
    return Path(os.environ.get("MOT_VIZ_RESULTS", REPO_ROOT / "results"))


@st.cache_data(show_spinner=False, max_entries=4)
def shipped_method_points(root: str) -> pd.DataFrame:
    """mot_viz.analysis.method_figures.shipped_points of the results under `root`, read once."""
    return shipped_points(root)
