"""The Long context page's loaders: one long document of a source kind and budget, or the user's own document, evaluated
under every condition with the sidebar's pair and checkpoint (cached on hashable keys: the pair, the checkpoint's
stamp, the document), and the shipped long-context results of a checkpoint; a page's upload into its text widgets."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import streamlit as st

from ..analysis.long_context import evidence_token_range, position_error_table
from ..data.long_context import BUDGETS, LongExample, long_examples
from ..data.user_documents import Readers, UserFile, read_upload, user_long_document
from ..engine.models import LoadedModel, kv_cache_bytes
from ..eval.answers import MAX_NEW_TOKENS
from ..eval.long_context import evaluate_document
from ..eval.long_settings import CONDITIONS, QUESTION_ROOM, LongSettings, check_budget
from ..sharing.linear import LINEAR, LINEAR_OPTION
from ..sharing.mean import MEAN
from ..sharing.registry import REFERENCE, REGISTRY
from .loaders import cached_mean_vectors, checkpoint_stamp, get_checkpoint, get_model, linear_baseline_for
from .settings import REPO_ROOT, test_mode
from .state import Run

USER_MAX_TOKENS = max(BUDGETS)  # the longest document of the user's own that the page reads, in target tokens
# documents offered per source and budget (the first of the evaluation's seed-0 draw; more than a shipped run reads)
LONG_DOCUMENTS = 64


class LongView(NamedTuple):
    """Everything the Long context page shows of one document (small: no cache is kept)."""

    document: LongExample
    rows: pd.DataFrame  # one row per condition (mot_viz.eval.long_context.ROW_COLUMNS)
    metric: str  # "F1" or "accuracy"
    native_score: float
    retention: dict[str, float]  # condition -> score ÷ native (NaN when native is 0)
    timings: dict[str, float]  # the translation's stages (source prefill, alignment, translator, replay, native)
    first_token: dict[str, float]  # condition -> seconds to the first answer token over its cache
    sizes: pd.DataFrame  # the text's bytes beside both models' caches of it
    positions: pd.DataFrame  # mot_viz.analysis.long_context.position_error_table
    evidence_tokens: tuple[int, int] | None


def long_document(run: Run, source: str, budget: int, index: int,
                  progress: Callable[[str], None] | None = None) -> LongView:
    """Document `index` of `source` ("stacks" / "qasper") at `budget` target tokens, under the run's pair and
    checkpoint; computed once per input. progress: told each step as it starts (on a first computation)."""
    say = progress or (lambda message: None)
    sel = run.selection
    check_budget(budget, {role: (lm.spec.name, lm.spec.max_positions)
                          for role, lm in (("source", run.source), ("target", run.target))})
    say(f"Building document {index} of {source} at {budget} target tokens …")
    doc = cached_document(sel.target, test_mode(), source, budget, index)
    return _evaluate(run, doc, say)


def your_long_document(run: Run, text: str, question: str, gold: str,
                       progress: Callable[[str], None] | None = None) -> LongView:
    """The user's document (pasted or uploaded) with its question (gold answers optional, '|'-separated), read at its
    own length under the run's pair and checkpoint; checked first (mot_viz.data.user_documents: empty, not valid
    Unicode, longer than either model reads beside the question and its answer: one ContextError)."""
    room = QUESTION_ROOM + MAX_NEW_TOKENS
    doc = user_long_document(text, question, gold, readers(run.source, run.target, room, USER_MAX_TOKENS))
    return _evaluate(run, doc, progress or (lambda message: None))


def readers(source: LoadedModel, target: LoadedModel, room: int, most: int) -> Readers:
    """Both models as readers of a user's document: each reads at most its positions less `room` (and the prompt's
    first tokens), the target at most `most` tokens (the page's cap: CPU time grows with the length)."""
    def limit(lm: LoadedModel) -> int:
        return lm.spec.max_positions - len(lm.prefix_ids) - room
    return {"target": (target.spec.name, target.tokenizer, min(most, limit(target))),
            "source": (source.spec.name, source.tokenizer, limit(source))}


def take_upload(upload, fill: Callable[[UserFile], dict[str, str]], seen: str) -> None:
    """A file just uploaded (st.file_uploader's value) into the page's text widgets, before they are drawn: `fill`
    maps it to widget key -> value. Once per file (`seen`: the state key of the last file taken), so later edits
    stay; a file that cannot be read raises its MotVizError on every run while it is there."""
    if upload is None or st.session_state.get(seen) == upload.file_id:
        return
    st.session_state.update(fill(read_upload(upload.name, upload.getvalue())))
    st.session_state[seen] = upload.file_id


def _evaluate(run: Run, doc: LongExample, say: Callable[[str], None]) -> LongView:
    sel = run.selection
    say(f"{doc.tokens} target tokens: the source reads them; its window is translated and replayed; the target reads "
        "them too; then every condition's cache answers …")
    return _cached_long_document(sel.source, sel.target, sel.checkpoint, checkpoint_stamp(sel.checkpoint), test_mode(),
                                 doc)


@st.cache_data(show_spinner=False, max_entries=32)
def cached_document(target_model: str, test: bool, kind: str, budget: int, index: int) -> LongExample:
    """Document `index` of `kind` at `budget` target tokens (seed 0, as the shipped evaluations sample them)."""
    return long_examples(kind, get_model(target_model).tokenizer, budget, index + 1, seed=0)[index]


@st.cache_data(show_spinner=False, max_entries=8)
def _cached_long_document(source_model: str, target_model: str, checkpoint: str, stamp: int, test: bool,
                          doc: LongExample) -> LongView:
    src, tgt = get_model(source_model), get_model(target_model)
    mot = get_checkpoint(checkpoint, src, tgt)[0]
    # the methods' artifacts as the app caches them: the pair's closed-form map (when there is one), the mean window
    linear_path = linear_baseline_for(checkpoint, mot)
    artifacts = {LINEAR.name: get_checkpoint(linear_path, src, tgt)[0] if linear_path else None,
                 MEAN.name: cached_mean_vectors(target_model, tuple(mot.channels.target_layers), test)}
    conditions = tuple(c for c in CONDITIONS if REGISTRY[c].has(artifacts.get(c)))
    settings = LongSettings(checkpoint, doc.source, (doc.budget,), 1, 0, conditions=conditions,
                            options={LINEAR_OPTION.name: linear_path})
    result = evaluate_document(mot, src, tgt, doc, settings, artifacts)
    rows = pd.DataFrame(result.rows)
    scores = pd.to_numeric(rows.set_index("condition")["score"])  # NaN: a user's question without a gold answer
    native = float(scores[REFERENCE])
    translation = result.translation
    n_source = int(translation.source.source_ids.shape[1])
    n_target = int(translation.target_ids.shape[1])
    sizes = pd.DataFrame([
        {"what": "the document's text (UTF-8)", "tokens": n_target, "MB": len(doc.example.context.encode()) / 1e6},
        {"what": f"source KV cache ({src.spec.name})", "tokens": n_source,
         "MB": kv_cache_bytes(src.spec, n_source) / 1e6},
        {"what": f"target KV cache ({tgt.spec.name}): native or translated", "tokens": n_target,
         "MB": kv_cache_bytes(tgt.spec, n_target) / 1e6}])
    first = dict(zip(rows["condition"], rows["first_token_seconds"]))
    return LongView(doc, rows, "F1" if doc.example.kind == "extractive" else "accuracy", native,
                    {c: float(v) / native if native else np.nan for c, v in scores.items()},
                    dict(translation.timings), first, sizes,
                    position_error_table(translation, mot.channels, tgt.spec, bin_tokens=max(16, doc.budget // 32)),
                    evidence_token_range(translation, doc.example.context, doc.evidence))


def shipped_long_results(checkpoint: str, source: str) -> pd.DataFrame | None:
    """The long-context summary measured for this checkpoint (by its folder name) and source kind, if there is one:
    <results>/<checkpoint name>-<source>/summary.csv as python -m mot_viz.eval.long_context writes it, under
    results/long ($MOT_VIZ_LONG_RESULTS points elsewhere: tests)."""
    root = Path(os.environ.get("MOT_VIZ_LONG_RESULTS", REPO_ROOT / "results" / "long"))
    path = root / f"{Path(checkpoint).name}-{source}" / "summary.csv"
    return pd.read_csv(path) if path.is_file() else None
