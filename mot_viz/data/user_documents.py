"""A user's own document for the Long context and Multi-agent pages: a pasted text or an uploaded .txt / .jsonl file,
with the question(s) asked of it, checked as the sidebar's free text is: an empty text, text that is not valid
Unicode, a file that is not text or is too large, and a document too long for either model are each one error that
names the fix (ContextError / DataFormatError), never a traceback.

* A ``.txt`` upload is the document itself (UTF-8; a byte-order mark is dropped).
* A ``.jsonl`` upload is one document with its questions, in mot_viz.data.eval_data's format: every line
  ``{"context": …, "question": …, "answers": [...]}`` with the same context, the questions in the order asked (a
  conversation's turns).
* Typed questions, one per line for a conversation: ``question | reference answer | another reference``
  (:func:`parse_questions`; answers split as the sidebar's gold answers are, mot_viz.engine.prompts.gold_answers).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..engine.alignment import check_text, encode
from ..engine.prompts import free_text_selection, gold_answers
from ..errors import ContextError, DataFormatError
from .coqa import Conversation, Turn
from .eval_data import _parse_row
from .long_context import LongExample

UPLOAD_TYPES = ("txt", "jsonl")  # the file kinds the pages take
MAX_UPLOAD_BYTES = 1_000_000  # far more than the longest document a page reads (a few thousand tokens)
USER_ID = "your-text"  # the id of a user's document (example and conversation)
USER_SOURCE = "your text"  # its source, where a built-in document names its dataset
_JSONL_LINE = '{"context": "…", "question": "…", "answers": ["…"]}'


@dataclass(frozen=True)
class UserFile:
    """What an uploaded file holds: the document and, from a .jsonl, its questions in order."""

    name: str
    text: str
    questions: tuple[Turn, ...] = ()


def read_upload(name: str, data: bytes) -> UserFile:
    """An uploaded .txt or .jsonl file, read and checked; anything else (a binary file, one over MAX_UPLOAD_BYTES,
    a malformed line) is one DataFormatError (ContextError for text that is not valid Unicode)."""
    kind = Path(name).suffix.lower().lstrip(".")
    if kind not in UPLOAD_TYPES:
        raise DataFormatError(f"{name!r} is neither a .txt nor a .jsonl file. Upload the document as a .txt file, or "
                              f"the document with its questions as a .jsonl file (one {_JSONL_LINE} per line).")
    if len(data) > MAX_UPLOAD_BYTES:
        raise DataFormatError(f"{name!r} is {len(data) / 1e6:.1f} MB; a page reads files of at most "
                              f"{MAX_UPLOAD_BYTES / 1e6:.0f} MB (a document it can translate is a few thousand tokens "
                              "long). Upload a shorter text.")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise DataFormatError(f"{name!r} is not a text file (it holds a NUL byte at byte {nul:,}). Upload a UTF-8 "
                              ".txt or .jsonl file.")
    try:
        text = data.decode("utf-8-sig")  # a BOM (Windows editors) is not text
    except UnicodeDecodeError as exc:
        raise DataFormatError(f"{name!r} is not UTF-8 text (byte {exc.start:,} cannot be read). Re-save it as UTF-8 "
                              "text, or upload a .txt or .jsonl file.") from None
    if kind == "txt":
        return UserFile(name, text)
    return _read_jsonl(name, text)


def _read_jsonl(name: str, text: str) -> UserFile:
    context, turns = None, []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            example = _parse_row(json.loads(line), line_no, name)
            if example.choices:
                raise ValueError("it gives 'choices': these pages ask open questions, so give 'answers' instead")
            if context is not None and example.context != context:
                raise ValueError("its context differs from the first line's: a file holds one document, every line "
                                 "with the same context")
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{name!r}, line {line_no}: invalid JSON ({exc.msg}). Each line is {_JSONL_LINE}.") \
                from None
        except ValueError as exc:
            raise DataFormatError(f"{name!r}, line {line_no}: {exc}. Each line is {_JSONL_LINE}.") from None
        for part in (example.context, example.question, *example.answers):
            check_text(part)  # a JSON "\ud800" escape
        context = example.context
        turns.append(Turn(example.question.strip(), example.answers))
    if context is None:
        raise DataFormatError(f"{name!r} holds no line. Each line is {_JSONL_LINE}.")
    return UserFile(name, context, tuple(turns))


def parse_questions(text: str) -> tuple[Turn, ...]:
    """Typed questions, one per line, each followed by its reference answers: ``question | answer | answer``."""
    turns = []
    for line in text.splitlines():
        if line.strip():
            question, _, gold = line.partition("|")
            turns.append(Turn(question.strip(), gold_answers(gold)))
    return tuple(turns)


def questions_text(turns: Sequence[Turn]) -> str:
    """The typed form of `turns` (parse_questions reads it back)."""
    return "\n".join(" | ".join((t.question, *t.answers)) for t in turns)


# role -> (model name, its tokenizer, the most tokens of the document it may read here)
Readers = dict[str, tuple[str, Any, int]]


def check_document(text: str, readers: Readers, what: str = "document") -> dict[str, int]:
    """Each reader's token count of `text`; ContextError when it is empty, not valid Unicode, or longer than a
    reader may read."""
    if not text.strip():
        raise ContextError(f"The {what} is empty. Paste a text, or upload a .txt or .jsonl file.")
    counts = {}
    for role, (name, tokenizer, most) in readers.items():
        counts[role] = len(encode(tokenizer, text))  # checks the text (a lone surrogate is one ContextError)
        if counts[role] > most:
            raise ContextError(f"The {what} is {counts[role]:,} tokens long for the {role} model '{name}', which reads "
                               f"at most {most:,} here. Shorten the {what}.")
    return counts


def user_long_document(text: str, question: str, gold: str, readers: Readers) -> LongExample:
    """A pasted document and one question (gold answers optional, '|'-separated: without, nothing is scored) as a
    LongExample of its own length (readers must include "target": the length is counted in its tokens)."""
    tokens = check_document(text, readers)["target"]
    example = free_text_selection(text, question, gold)[1]
    if example is None:
        raise ContextError("Ask a question about the document: type it under Question.")
    check_text(example.question)
    example = replace(example, id=USER_ID, dataset=USER_SOURCE)
    found = next((a for a in example.answers if a in text), None)  # where the answer lies, if the text holds it
    evidence = (text.index(found), text.index(found) + len(found)) if found else None
    return LongExample(example, USER_SOURCE, tokens, tokens, "", evidence)


def user_conversation(story: str, questions: str, readers: Readers) -> Conversation:
    """A pasted story and its questions (one per line, each with its reference answer after '|': every turn's
    question and reference answer are the history the next turns read) as a Conversation."""
    check_document(story, readers, "story")
    turns = parse_questions(questions)
    if not turns:
        raise ContextError("Ask at least one question: one per line, each followed by its reference answer after "
                           "'|' (e.g. Who built it? | Gustave Eiffel).")
    for i, turn in enumerate(turns, start=1):
        check_text(turn.question)
        if not turn.question:
            raise ContextError(f"Question {i} is empty: write the question before the '|'.")
        if not turn.answers:
            raise ContextError(f"Question {i} ({turn.question!r}) has no reference answer: write it after a '|'. "
                               "Each turn's question and reference answer are added to every cache as the history "
                               "the next question reads, as CoQA's conversations carry it.")
        for answer in turn.answers:
            check_text(answer)
    return Conversation(USER_ID, USER_SOURCE, story, turns)


def document_label(text: str, limit: int = 40) -> str:
    """A user's document named for a caption: its first words and its length."""
    words = " ".join(text.split())
    head = words if len(words) <= limit else words[:limit].rstrip() + "…"
    return f"{USER_SOURCE} “{head}” ({len(text):,} characters)"
