"""The Layer patching page's loaders: one method's patching scan of the applied context and gold answer (the caches
the Methods page builds, patched against the translation's native cache by mot_viz.engine.patching), cached per
context, method and groups; and the shipped patching.csv files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from ..engine.alignment import encode
from ..engine.patching import answer_sentence_buckets, answer_token_ids, patching_scan
from ..errors import ConfigError
from ..sharing.kvcomm import kvcomm_selection
from ..eval.patching import PATCHING_FILE, layer_error_columns, method_cache, read_patching, scan_rows
from .loaders import checkpoint_stamp, get_checkpoint, get_model, get_translation
from .methods import MethodsOffer
from .settings import test_mode
from .state import Run, Selection


def method_path(method: str, offer: MethodsOffer) -> str | None:
    """The checkpoint a method's cache needs besides the run's own (linear, direct), or None."""
    return {"linear": offer.linear, "direct": offer.direct}.get(method)


def offered_methods(offer: MethodsOffer) -> list[str]:
    """The methods a scan can patch on this pair and checkpoint: always the MoT, the others where offered."""
    return ["mot"] + [m for m, ok in (("linear", offer.linear), ("direct", offer.direct), ("kvcomm", offer.kvcomm))
                      if ok]


def gold_answer_text(sel: Selection) -> str:
    """The gold answer the scan reads (the first non-empty one); ConfigError without one."""
    example = sel.example
    if example is None or not (example.kind == "closed" or any(a.strip() for a in example.answers)):
        raise ConfigError("layer patching reads the gold answer's likelihood: pick a dataset example, or type a "
                          "question with its answer in the sidebar")
    return next(a for a in example.answers if a.strip()) if example.kind == "extractive" else ""


def scan(run: Run, offer: MethodsOffer, method: str, groups: dict[str, tuple[int, ...]],
         buckets: bool) -> pd.DataFrame:
    """The run's scan for `method` (rows of mot_viz.eval.patching.scan_rows), computed once per input."""
    gold_answer_text(run.selection)
    path = method_path(method, offer)
    return _cached_scan(run.selection, checkpoint_stamp(run.selection.checkpoint), test_mode(), method, path,
                        checkpoint_stamp(path) if path else 0, tuple(groups.items()), buckets)


@st.cache_data(show_spinner=False, max_entries=16)
def _cached_scan(sel: Selection, stamp: int, test: bool, method: str, path: str | None, path_stamp: int,
                 groups: tuple[tuple[str, tuple[int, ...]], ...], buckets: bool) -> pd.DataFrame:
    src, tgt = get_model(sel.source), get_model(sel.target)
    mot = get_checkpoint(sel.checkpoint, src, tgt)[0]
    translation = get_translation(sel)
    models = {"linear": get_checkpoint(path, src, tgt)[0] if method == "linear" else None,
              "direct": get_checkpoint(path, src, tgt)[0] if method == "direct" else None,
              # KVComm calibrates its layer choice on a set of size 1 (its default): here, this context and question
              "kvcomm": kvcomm_selection(src, tgt, [sel.example]) if method == "kvcomm" else None}
    cache = method_cache(method, mot, src, tgt, translation, **models)
    question = tgt.ids_tensor(encode(tgt.tokenizer, sel.suffix))
    answer = answer_token_ids(tgt.tokenizer, sel.example, None)
    positions = None
    if buckets:
        positions = answer_sentence_buckets(tgt.tokenizer, sel.text, gold_answer_text(sel), translation.prefix_len,
                                            first=max(sel.text.find("Passage:"), 0))
    result = patching_scan(tgt.model, translation.native_kv, cache.kv, question, answer, dict(groups), positions,
                           hidden=cache.hidden)
    rows = scan_rows(result, layer_error_columns(translation.native_kv, cache.kv, translation.prefix_len))
    return pd.DataFrame(rows)


@st.cache_data(show_spinner=False, max_entries=8)
def shipped_patching(folder: str, stamp: float) -> pd.DataFrame:
    """A results folder's patching.csv (stamp: its modification time, so a rewritten file is read again)."""
    return read_patching(Path(folder) / PATCHING_FILE)
