"""What the app's first screen opens on and says: the mid-depth checkpoint for the default pair, and a control that
gives the MoT's answer named as a tie."""

from __future__ import annotations

from pathlib import Path

from mot_viz.app.loaders import default_checkpoint
from mot_viz.app.settings import DEFAULT_CHECKPOINT
from mot_viz.eval.answers import ties_with_mot

PRETRAINED = Path(__file__).resolve().parents[2] / "pretrained"


def test_the_default_pair_opens_on_the_mid_depth_checkpoint():
    shipped = {p.name: str(p) for p in sorted(PRETRAINED.iterdir()) if (p / "config.json").is_file()}
    assert DEFAULT_CHECKPOINT == "smollm2-to-gemma3-mid" and DEFAULT_CHECKPOINT in shipped
    assert default_checkpoint("smollm2-135m", "gemma3-270m", shipped) == "smollm2-to-gemma3-mid"
    # another pair opens on a checkpoint made for it
    assert default_checkpoint("gemma3-270m", "smollm2-135m", shipped).startswith("gemma3-to-smollm2")


def test_a_control_that_gives_the_mots_answer_is_a_tie():
    answers = {"native": "Gustave Eiffel", "no_context": "a tower", "mot": "Gustave Eiffel.", "random": "the Eiffel",
               "mean": "gustave eiffel"}
    assert ties_with_mot(answers) == ["mean"]  # compared as SQuAD compares answers: case and punctuation aside
    assert ties_with_mot({**answers, "random": "Gustave  Eiffel", "no_context": "Gustave Eiffel"}) == \
        ["random", "mean", "no_context"]
    assert ties_with_mot({**answers, "mean": "Eiffel"}) == []
    assert ties_with_mot({"native": "x", "random": "x"}) == []  # no MoT answer, no tie
