"""What every part of the app passes around: the Selection (the inputs of one translation, which keys every
cache) and the Run (everything a page shows for the applied selection)."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.models import LoadedModel
from ..engine.mot import MoT, Translation
from ..engine.prompts import QAExample


@dataclass(frozen=True)
class Selection:
    """The inputs of one translation; hashable, so it keys every cache."""

    source: str  # model name as typed or chosen
    target: str
    checkpoint: str  # checkpoint folder path ("" when none was found)
    text: str  # the context that is translated
    example: QAExample | None  # the question and gold answers; None for free text without a question
    suffix: str | None  # the target's native suffix after the context (the question part of the prompt)
    label: str  # where the context came from, for captions



@dataclass
class Run:
    """Everything a page shows for the applied selection (all cached; never mutate)."""

    selection: Selection
    source: LoadedModel
    target: LoadedModel
    mot: MoT
    config: dict
    translation: Translation
    target_tokens: list[str]  # each target token decoded on its own, whitespace visible
    source_tokens: list[str]
