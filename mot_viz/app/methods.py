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
from ..engine.checkpoint import read_config
from ..engine.mot import MoT
from ..errors import MotVizError
from ..sharing.caches import run_artifacts
from ..sharing.direct import DIRECT, DIRECT_OPTION
from ..sharing.kvcomm import KVCOMM, check_kvcomm_pair
from ..sharing.linear import LINEAR, LINEAR_OPTION
from ..sharing import registry
from ..sharing.relay import RELAY_TOKENS
from ..sharing.trained import TrainedWay, trained_in
from ..train.rival_checkpoint import is_trained_folder, load_trained
from .loaders import (available_checkpoints, checkpoint_stamp, get_checkpoint, get_model, get_translation,
                      linear_baseline_for)
from .settings import REPO_ROOT, pretrained_dir, test_mode
from .state import Run, Selection


class MethodsOffer(NamedTuple):
    """Which ways of sharing the applied pair and checkpoint offer beside those every run has, under which options,
    and why not where one is missing."""

    options: dict  # the options the offered methods read, by Option.name (the maps found for this pair)
    missing: dict[str, str]  # method -> one line saying why it is not offered

    def offers(self, name: str) -> bool:
        return name not in self.missing


def direct_map_for(mot: MoT) -> str | None:
    """A checkpoint on offer (pretrained/ or fitted here) that is a full-depth map without replay for the MoT's
    pair (its source and target fingerprints), if any."""
    for path in available_checkpoints().values():
        try:
            cfg = read_config(path)
        except MotVizError:
            continue
        if (cfg.get("replay", {}).get("direct") and cfg["source"].get("fingerprint") == mot.source.fingerprint
                and cfg["target"].get("fingerprint") == mot.target.fingerprint):
            return path
    return None


def trained_for(way: TrainedWay, mot: MoT) -> str | None:
    """The network of `way` shipped in pretrained/ for the MoT's pair (its source and target fingerprints), if any."""
    found = trained_in(pretrained_dir(), way.name, {"source": mot.source.to_json(), "target": mot.target.to_json()})
    return None if found is None else str(found)


def _loads(path: str | None, what: str, run: Run) -> tuple[str | None, str | None]:
    """(path, None) when the checkpoint on offer at path loads for the run's pair, else (None, the note saying why it
    is left out): a broken one leaves out that method only, never the page (the user never chose it)."""
    if path is None:
        return None, None
    try:
        if is_trained_folder(path):
            load_trained(path, run.source.spec, run.target.spec)
        else:
            get_checkpoint(path, run.source, run.target)
    except MotVizError as exc:
        return None, (f"the {what} {Path(path).name} does not load ({type(exc).__name__}: {str(exc)[:300]}). Fix or "
                      "remove that folder; the other methods are shown.")
    return path, None


def methods_offer(run: Run) -> MethodsOffer:
    """The optional methods for the run's pair and checkpoint, and the options they read (the maps found for it)."""
    missing = {}
    linear = None
    if run.mot.translator.config.variant == "linear":
        missing[LINEAR.name] = "the checkpoint itself is a linear map: its row is MoT's."
    else:
        linear = linear_baseline_for(run.selection.checkpoint, run.mot)
        if linear is None:
            missing[LINEAR.name] = ("no linear checkpoint (a `-linear` folder) for this pair and window: the sidebar's "
                                 "“Fit a linear translator” makes one.")
        linear, broken = _loads(linear, "linear map", run)
        if broken:
            missing[LINEAR.name] = broken
    direct = direct_map_for(run.mot)
    if direct is None:
        missing[DIRECT.name] = ("no full-depth map without replay for this pair (e.g. pretrained/smollm2-to-gemma3-"
                             "direct; python -m mot_viz.train.quickfit --direct fits one).")
    direct, broken = _loads(direct, "full-depth map", run)
    if broken:
        missing[DIRECT.name] = broken
    try:
        check_kvcomm_pair(run.source.spec, run.target.spec)
    except MotVizError as exc:
        # the check's message less its command-line advice
        missing[KVCOMM.name] = (str(exc).split(" Use it with")[0] + " It is offered for a pair of one architecture "
                             "(e.g. smollm2-135m → smollm2-135m).")
    options = {LINEAR_OPTION.name: linear, DIRECT_OPTION.name: direct}
    for way in registry.REGISTRY.values():
        if isinstance(way, TrainedWay):
            path, broken = _loads(trained_for(way, run.mot), f"{way.name} network", run)
            options[way.option.name] = path
            if path is None:
                missing[way.name] = broken or (f"no {way.name} network for this pair in pretrained/ (python -m "
                                               f"mot_viz.train.rival --method {way.name} trains one).")
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
