"""What the app and its pages open on, and why: each default is a context where the page's figure shows the page's
point on the bundled pair, chosen from the shipped results of the checkpoint the app opens on, and a page says why
it opened there while the reader is on that pair, checkpoint and context (anything else is the reader's own choice).

The numbers quoted are the shipped results' (tests/unit/test_openings.py reads them back from the files).
"""

from __future__ import annotations

from pathlib import Path

from ..engine.models import DEFAULT_SOURCE, DEFAULT_TARGET
from ..sharing.direct import DIRECT
from ..sharing.registry import TRANSLATED
from .settings import DEFAULT_CHECKPOINT, test_mode
from .state import Selection

# the sidebar's first context: SQuAD #12 (on SQuAD #0 no cache gives the gold answer)
DEFAULT_DATASET, DEFAULT_EXAMPLE = "squad", 12
WHY_DEFAULT_EXAMPLE = (
    "The app opens on SQuAD #12 because one example there shows the method's point: on this pair and checkpoint the "
    "target answers “Kromme Rijn” from its own cache and from the MoT's, and “The Rhine” with no context and from "
    "the random control (the native window plus random noise as large as the translation's error). One example "
    "proves nothing: over 300 SQuAD examples the MoT's F1 is 0.360 against the target's own 0.357 and no context's "
    "0.077 (results/eval/smollm2-to-gemma3-mid-squad300).")
# the Long context page's first document: SQuAD #12's passage among distractors
DEFAULT_LONG_DOCUMENT = 12
WHY_DEFAULT_LONG_DOCUMENT = (
    "Opens on stack #12 (SQuAD #12's passage among distractor passages): at 512, 1,024 and 2,048 tokens the MoT "
    "answers “Kromme Rijn”, while no context and the mean-vector window answer with the Rhine "
    "(results/long/smollm2-to-gemma3-mid-stacks). Over the 51 stacks of each length the MoT keeps 72–91% of the "
    "target's own F1 from 512 to 4,096 tokens; at 4,096 it misses this one too.")
# the Multi-agent page's first conversation
DEFAULT_CONVERSATION = 1
WHY_DEFAULT_CONVERSATION = (
    "Opens on CoQA story #1: over its first 5 turns the hub answers from the MoT's cache as well as from its own "
    "reading (mean F1 1.00 both) and far better than with no story (0.28) (results/conversation/smollm2-to-gemma3-"
    "mid-coqa). Over all 30 stories the MoT keeps 95% [87%, 105%] of the target's own F1.")
# the Layer patching page (and the lesson's patching step) scans a cache whose error costs the answer visibly
WHY_OPENS_ON_DIRECT = (
    "Opens on the direct map: its error costs the answer far more than the MoT's, so its shares say where the cost "
    "sits — over 100 SQuAD examples, restoring Gemma's three global layers wins back 92% [86%, 97%] of its gap "
    "(docs/results/lost-answers.md). The MoT's gap is often too small to place (0.063 nats on average there): "
    "choose it above.")


def opens_on(methods: list[str]) -> str:
    """The method a patching scan shows first: the full-depth direct map where offered, else the MoT."""
    return DIRECT.name if DIRECT.name in methods else TRANSLATED


def on_measured_checkpoint(sel: Selection) -> bool:
    """Whether the selection is on the pair and checkpoint the reasons above were measured with (real models)."""
    return (not test_mode() and sel.source == DEFAULT_SOURCE and sel.target == DEFAULT_TARGET
            and Path(sel.checkpoint).name == DEFAULT_CHECKPOINT)


def why_default_context(sel: Selection) -> str | None:
    """Why the app opened on this context, while the reader is on it (else None)."""
    return WHY_DEFAULT_EXAMPLE if on_measured_checkpoint(sel) and sel.label == f"SQuAD #{DEFAULT_EXAMPLE}" else None
