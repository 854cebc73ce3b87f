"""The Multi-agent page's loaders: one CoQA conversation, or the user's own story and questions, answered turn by turn
from the native, MoT and no-story caches with the sidebar's pair and checkpoint (cached on hashable keys), and the
shipped conversation results."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import streamlit as st

from ..analysis.cache_metrics import span_error_table
from ..data.coqa import Conversation, coqa_conversations
from ..data.long_context import LongExample
from ..data.user_documents import parse_questions, user_conversation
from ..engine.testing import TEST_MAX_POSITIONS
from ..eval.answers import MAX_NEW_TOKENS
from ..eval.conversation import (HISTORY_ROOM, ConversationSettings, cache_mb, conversation_rows, summarize,
                                 translator_mb)
from ..eval.shard_caches import shard_spans
from ..eval.shards import ShardSettings, evaluate_document
from .long_context import cached_document, readers
from .loaders import checkpoint_stamp, get_checkpoint, get_model
from .settings import REPO_ROOT, test_mode
from .state import Run

STORY_TOKENS = 512  # the longest story offered, in target tokens (the evaluation's default)
USER_STORY_TOKENS = 2048  # the longest story of the user's own, in target tokens (CPU time grows with it)
SHARD_BUDGET = 1024  # the sharded documents' length in target tokens (the shipped shard evaluation's)
CONVERSATIONS = 30  # conversations offered (the evaluation's sample, seed 0)
SHARD_DOCUMENTS = 50  # sharded documents offered (the first of the shard evaluation's seed-0 draw)


class ConversationView(NamedTuple):
    """Everything the Multi-agent page shows of one conversation."""

    conversation: Conversation
    rows: pd.DataFrame  # one row per turn and condition (mot_viz.eval.conversation.ROW_COLUMNS but "error")
    summary: pd.DataFrame  # mot_viz.eval.conversation.summarize of this one conversation
    translator_mb: float


def story_tokens() -> int:
    """The longest story offered: tiny test tokenizers spend several tokens on a word."""
    return TEST_MAX_POSITIONS // 2 if test_mode() else STORY_TOKENS


def conversation_view(run: Run, index: int, turns: int,
                      progress: Callable[[str], None] | None = None) -> ConversationView:
    """Conversation `index` of the sample cut to `turns` turns, under the run's pair and checkpoint; computed once
    per input. progress: told each step as it starts."""
    say = progress or (lambda message: None)
    sel = run.selection
    conversation = _cached_conversation(sel.target, test_mode(), index, turns)
    say(f"The source reads the story ({len(conversation.story)} characters) once; its window is translated and "
        f"replayed; the target also reads it itself; then {turns} turns are answered from each cache …")
    return _cached_view(sel.source, sel.target, sel.checkpoint, checkpoint_stamp(sel.checkpoint), test_mode(),
                        conversation)


def your_conversation_view(run: Run, story: str, questions: str,
                           progress: Callable[[str], None] | None = None) -> ConversationView:
    """The user's story (pasted or uploaded) and questions (one per line, each with its reference answer after '|')
    answered turn by turn under the run's pair and checkpoint; checked first (mot_viz.data.user_documents: empty, not
    valid Unicode, no question or reference, a story longer than either model reads beside every turn: one
    ContextError)."""
    sel = run.selection
    turns = max(1, len(parse_questions(questions)))
    room = turns * (HISTORY_ROOM + MAX_NEW_TOKENS) + 64  # every turn's question, answer and history (check_settings)
    most = TEST_MAX_POSITIONS // 2 if test_mode() else USER_STORY_TOKENS
    conversation = user_conversation(story, questions, readers(run.source, run.target, room, most))
    (progress or (lambda message: None))(
        f"The source reads your story ({len(story):,} characters) once; its window is translated and replayed; the "
        f"target also reads it itself; then {len(conversation.turns)} turns are answered from each cache …")
    return _cached_view(sel.source, sel.target, sel.checkpoint, checkpoint_stamp(sel.checkpoint), test_mode(),
                        conversation)


@st.cache_data(show_spinner=False, max_entries=32)
def _cached_conversation(target_model: str, test: bool, index: int, turns: int) -> Conversation:
    return coqa_conversations(get_model(target_model).tokenizer, index + 1, turns, 0, story_tokens())[index]


@st.cache_data(show_spinner=False, max_entries=8)
def _cached_view(source_model: str, target_model: str, checkpoint: str, stamp: int, test: bool,
                 conversation: Conversation) -> ConversationView:
    src, tgt = get_model(source_model), get_model(target_model)
    mot = get_checkpoint(checkpoint, src, tgt)[0]
    settings = ConversationSettings(checkpoint, 1, len(conversation.turns), max_story_tokens=story_tokens())
    rows = pd.DataFrame(conversation_rows(mot, src, tgt, conversation, settings))
    size = translator_mb(mot)
    summary = summarize(rows, cache_mb(tgt, 1), cache_mb(src, 1), size, n_boot=1)
    return ConversationView(conversation, rows, summary, size)


def shipped_conversation_results(checkpoint: str) -> pd.DataFrame | None:
    """The conversation summary measured for this checkpoint (by its folder name), if there is one:
    <results>/<checkpoint name>-coqa/summary.csv as python -m mot_viz.eval.conversation writes it, under
    results/conversation ($MOT_VIZ_CONVERSATION_RESULTS points elsewhere: tests)."""
    root = Path(os.environ.get("MOT_VIZ_CONVERSATION_RESULTS", REPO_ROOT / "results" / "conversation"))
    path = root / f"{Path(checkpoint).name}-coqa" / "summary.csv"
    return pd.read_csv(path) if path.is_file() else None


class ShardView(NamedTuple):
    """Everything the Multi-agent page shows of one sharded document."""

    document: LongExample
    rows: pd.DataFrame  # one row per setting (mot_viz.eval.shards.ROW_COLUMNS but "error")
    spans: dict[str, tuple[int, int]]  # shard label -> its positions in the hub's cache
    errors: pd.DataFrame  # per setting ("shards_k", "whole"), shard, layer and K/V: relative error to native


def shard_view(run: Run, index: int, shards: int, progress: Callable[[str], None] | None = None) -> ShardView:
    """Distractor stack `index` of SHARD_BUDGET target tokens split into `shards`, every setting of
    mot_viz.eval.shards under the run's pair and checkpoint; computed once per input."""
    say = progress or (lambda message: None)
    sel = run.selection
    doc = cached_document(sel.target, test_mode(), "stacks", SHARD_BUDGET, index)
    say(f"{shards} source agents each read one shard of {doc.tokens} target tokens; one reads it all; the hub reads "
        "it too; then every setting's cache answers …")
    return _cached_shard_view(sel.source, sel.target, sel.checkpoint, checkpoint_stamp(sel.checkpoint), test_mode(),
                              doc, shards)


@st.cache_data(show_spinner=False, max_entries=8)
def _cached_shard_view(source_model: str, target_model: str, checkpoint: str, stamp: int, test: bool,
                       doc: LongExample, shards: int) -> ShardView:
    src, tgt = get_model(source_model), get_model(target_model)
    mot = get_checkpoint(checkpoint, src, tgt)[0]
    result = evaluate_document(mot, src, tgt, doc, ShardSettings(checkpoint, doc.budget, (shards,), 1))
    spans = shard_spans(tgt, doc, shards)
    native = result.caches["native"].kv
    errors = pd.concat([span_error_table(result.caches[setting].kv, native, spans).assign(setting=setting)
                        for setting in (f"shards_{shards}", "whole")], ignore_index=True)
    return ShardView(doc, pd.DataFrame(result.rows), spans, errors)
