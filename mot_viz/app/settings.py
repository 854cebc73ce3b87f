"""The app's settings: where the checkpoints live, test mode, limits and defaults, and the sidebar's choices.

Test mode: with ``MOT_VIZ_TEST_MODELS=1`` the bundled model names load tiny random stand-ins
(mot_viz.engine.testing), and ``MOT_VIZ_PRETRAINED`` may point the checkpoint list at another folder.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from ..eval.answers import MAX_NEW_TOKENS

REPO_ROOT = Path(__file__).resolve().parents[2]
# the mid-depth window: where the translation measurably matters (at the terminal window a window with no context in
# it answers as well as the MoT: docs/results/single-passages.md)
DEFAULT_CHECKPOINT = "smollm2-to-gemma3-mid"
MEAN_VECTOR_PASSAGES = 16  # LAMBADA passages behind the pages' mean-vector baseline (fewer than the CLIs' 40: start-up)
MAX_CONTEXT_TOKENS = 1024  # the app's cap on target tokens: CPU time grows with the context
# examples offered per dataset: the first of load_dataset(name, n, seed=0), the order every evaluation samples in
# (its --n examples are the first n): every built-in SQuAD example, more than any shipped evaluation reads
EXAMPLES_PER_DATASET = 1000
DEFAULT_MAX_NEW_TOKENS = MAX_NEW_TOKENS  # the evaluator's generation length, so the app's answers match its numbers
DATASET_LABELS = {"squad": "SQuAD", "boolq": "BoolQ", "arc-easy": "ARC-Easy", "arc-challenge": "ARC-Challenge",
                  "openbookqa": "OpenBookQA", "mmlu": "MMLU"}
OTHER = "other (type below)"
DATASET_MODE, FREE_TEXT_MODE = "Dataset example", "Free text"
DEFAULT_FREE_TEXT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after "
    "the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.\n"
)


def test_mode() -> bool:
    """Whether the loaders serve tiny test models (``MOT_VIZ_TEST_MODELS=1``)."""
    return os.environ.get("MOT_VIZ_TEST_MODELS") == "1"


@functools.cache  # the app watches no files: its pages are those it started with
def page_option_groups() -> frozenset[str]:
    """The option groups the page files use: a page's widget keys are "pg.<group>.<name>" (in a link
    <group>.<name>). Read from views/*.py, so a page added there has its options linked like the others."""
    return frozenset(group for path in (REPO_ROOT / "views").glob("*.py")
                     for group in re.findall(r"[\"']pg\.([A-Za-z0-9_]+)\.", path.read_text(encoding="utf-8")))


def pretrained_dir() -> Path:
    """Where the shipped checkpoints live (``$MOT_VIZ_PRETRAINED``, default ``<repo>/pretrained``)."""
    return Path(os.environ.get("MOT_VIZ_PRETRAINED", REPO_ROOT / "pretrained"))
