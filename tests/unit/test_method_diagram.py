"""The method diagram (mot_viz.analysis.method_diagram) is drawn from the checkpoint: its stacks count the models'
layers, its channel lines are the checkpoint's channels, and a highlight brightens one part."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from mot_viz.analysis.method_diagram import DIM, HIGHLIGHTS, global_layers, method_diagram
from mot_viz.engine.channels import Channels, injection_channels
from mot_viz.engine.checkpoint import read_config, spec_from_json
from mot_viz.engine.replay_config import ReplayConfig
from mot_viz.engine.translator import TranslatorConfig

PRETRAINED = Path(__file__).resolve().parents[2] / "pretrained"


def parts(name: str):
    config = read_config(PRETRAINED / name)
    return (spec_from_json(config["source"]), spec_from_json(config["target"]), Channels.from_json(config["channels"]),
            TranslatorConfig(**config["translator"]), ReplayConfig(**config["replay"]))


def layers_drawn(fig, group: str) -> list[int]:
    return sorted(y for t in fig.data if t.legendgroup == group for y in t.y)


def channels_drawn(fig) -> list[tuple[int, int]]:
    return [tuple(t.meta) for t in fig.data if t.legendgroup == "channels"]


def trace(fig, name_start: str):
    return next(t for t in fig.data if t.name.startswith(name_start))


@pytest.mark.parametrize("name", ["smollm2-to-gemma3-mid", "gemma3-to-smollm2", "smollm2-to-gemma3-direct",
                                  "smollm2-to-gemma3-mid-single"])
def test_the_stacks_and_channels_are_the_checkpoints(name):
    source, target, channels, translator, replay = parts(name)
    fig = method_diagram(source, target, channels, translator, replay)
    assert layers_drawn(fig, "source") == list(range(source.num_layers))
    assert layers_drawn(fig, "target") == list(range(target.num_layers))
    assert channels_drawn(fig) == channels.pairs()
    assert list(trace(fig, "target: the window").y) == list(channels.target_layers)
    assert sorted(trace(fig, "source: layers sent").y) == list(channels.source_layers)
    if translator.variant == "mot":
        assert len(trace(fig, f"{translator.num_experts} experts").x) == translator.num_experts
        assert any(t.name == "router" for t in fig.data)
    else:
        assert not any(t.name == "router" for t in fig.data)
    assert any(t.legendgroup == "replay" for t in fig.data) is not replay.direct  # a direct map has no replay


def test_the_gemma_target_marks_its_global_layers():
    source, target, channels, translator, replay = parts("smollm2-to-gemma3-mid")
    assert global_layers(target) == (5, 11, 17) and global_layers(source) == ()
    assert list(trace(method_diagram(source, target, channels, translator, replay), "target: global").y) == [5, 11, 17]


def test_another_window_draws_another_picture():
    source, target, channels, translator, replay = parts("smollm2-to-gemma3-mid")
    early = injection_channels(source.num_layers, target.num_layers, start=2, window=3)
    fig = method_diagram(source, target, early, replace(translator, window=3), replay)
    assert channels_drawn(fig) == early.pairs() != channels.pairs()
    assert list(trace(fig, "target: below the window").y) == [0, 1]
    assert list(trace(fig, "target: above the window").y) == list(range(5, target.num_layers))
    assert layers_drawn(fig, "target") == list(range(target.num_layers))


def test_a_highlight_brightens_its_part_and_dims_the_rest():
    source, target, channels, translator, replay = parts("smollm2-to-gemma3-mid")
    plain = method_diagram(source, target, channels, translator, replay)
    assert all(t.opacity == 1.0 for t in plain.data)
    lit = {"window": "target: the window", "experts": "4 experts", "above": "target: above the window",
           "global": "target: global"}
    for highlight, name in lit.items():
        fig = method_diagram(source, target, channels, translator, replay, highlight)
        assert trace(fig, name).opacity == 1.0
        assert trace(fig, "source: its other layers").opacity == DIM
        others = [n for h, n in lit.items() if h != highlight]
        assert all(trace(fig, n).opacity == DIM for n in others), highlight
    assert set(lit) == set(HIGHLIGHTS)
    with pytest.raises(ValueError, match="highlight"):
        method_diagram(source, target, channels, translator, replay, "nonsense")
