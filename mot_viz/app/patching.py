"""The Layer patching page's loaders: one method's patching scan of the applied context and gold answer (the caches
the Methods page builds, patched against the translation's native cache by mot_viz.engine.patching), cached per
context, method and groups; the Long context page's document as the scan's context; and the shipped patching.csv
files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import streamlit as st

from ..data.long_context import BUDGETS
from ..data.user_documents import user_long_document
from ..engine.alignment import encode
from ..engine.patching import answer_sentence_buckets, answer_token_ids, patching_scan
from ..engine.prompts import build_prompt
from ..errors import ConfigError
from ..eval.answers import MAX_NEW_TOKENS
from ..eval.long_settings import QUESTION_ROOM, check_budget
from ..sharing.caches import run_artifacts
from ..sharing.registry import REGISTRY, method as way_of
from ..eval.patching import PATCHING_FILE, layer_error_columns, method_cache, read_patching, scan_rows
from .loaders import checkpoint_stamp, get_checkpoint, get_model, get_translation
from .long_context import LONG_DOCUMENTS, USER_MAX_TOKENS, cached_document, readers
from .methods import MethodsOffer, option_stamps
from .openings import DEFAULT_LONG_DOCUMENT
from .page import widget_default
from .settings import test_mode
from .state import Run, Selection


# the Long context page's document options (its pg.long.* widgets) and their first values there
LONG_SOURCES = ("stacks", "qasper", "yours")
LONG_DEFAULTS = {"pg.long.source": "stacks", "pg.long.budget": BUDGETS[0], "pg.long.doc": DEFAULT_LONG_DOCUMENT,
                 "pg.long.text": "", "pg.long.question": "", "pg.long.gold": ""}


def long_selection(run: Run) -> Selection:
    """The run's selection (pair, checkpoint) with the Long context page's document as its context, prompted as that
    page prompts it: the document kind, length and number it holds (pg.long.*, its first values if it was never
    opened; offered here too, so this page's link carries them), or the user's own text with its question and gold
    answer. ConfigError (one line) for a text of the user's without a gold answer: a scan reads the gold answer."""
    for key, default in LONG_DEFAULTS.items():
        widget_default(key, default, {"pg.long.source": list(LONG_SOURCES), "pg.long.budget": list(BUDGETS),
                                      "pg.long.doc": range(LONG_DOCUMENTS)}.get(key))
    state, sel = st.session_state, run.selection
    if state["pg.long.source"] == "yours":
        if not state["pg.long.gold"].strip():
            raise ConfigError("layer patching reads the gold answer's likelihood: give your document's gold answer on "
                              "the Long context page (Gold answer(s)), or scan one of its distractor stacks")
        doc = user_long_document(state["pg.long.text"], state["pg.long.question"], state["pg.long.gold"],
                                 readers(run.source, run.target, QUESTION_ROOM + MAX_NEW_TOKENS, USER_MAX_TOKENS))
        label = "your document (Long context page)"
    else:
        source, budget, index = state["pg.long.source"], int(state["pg.long.budget"]), int(state["pg.long.doc"])
        check_budget(budget, {role: (lm.spec.name, lm.spec.max_positions)
                              for role, lm in (("source", run.source), ("target", run.target))})
        doc = cached_document(sel.target, test_mode(), source, budget, index)
        label = f"{source} #{index} at {budget} target tokens (Long context page)"
    prompt = build_prompt(doc.example, run.target.chat_frame)
    return replace(sel, text=prompt.context_text, example=doc.example, suffix=prompt.suffix_text, label=label)


def method_options(method: str, offer: MethodsOffer) -> dict:
    """The offer's options that `method` reads (Method.options: the map it needs, ...)."""
    return {o.name: offer.options.get(o.name) for o in way_of(method).options}


def offered_methods(offer: MethodsOffer) -> list[str]:
    """The methods a scan can patch on this pair and checkpoint: always the MoT, the others where offered."""
    return [name for name, way in REGISTRY.items() if way.patchable and offer.offers(name)]


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
    return _cached_scan(run.selection, checkpoint_stamp(run.selection.checkpoint), test_mode(), method,
                        option_stamps(method_options(method, offer)), tuple(groups.items()), buckets)


@st.cache_data(show_spinner=False, max_entries=16)
def _cached_scan(sel: Selection, stamp: int, test: bool, method: str, options: tuple,
                 groups: tuple[tuple[str, tuple[int, ...]], ...], buckets: bool) -> pd.DataFrame:
    src, tgt = get_model(sel.source), get_model(sel.target)
    mot = get_checkpoint(sel.checkpoint, src, tgt)[0]
    translation = get_translation(sel)
    opts = {name: value for name, value, _ in options}
    # what the method loads (Method.load); KVComm calibrates its layer choice on a set of size 1 (its default): here,
    # this context and question
    artifact = run_artifacts((method,), opts, src, tgt, mot, [sel.example])[method]
    cache = method_cache(method, mot, src, tgt, translation, artifact, opts)
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
