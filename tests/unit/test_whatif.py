"""Expert what-if (mot_viz.analysis.whatif, GateOverride): overridden gates do what they say, and the router's own
choice reproduces the shown translation."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from mot_viz.analysis.whatif import expert_error_table, what_if
from mot_viz.engine.channels import Channels
from mot_viz.engine.mot import MoT, translate
from mot_viz.engine.prompts import QAExample, build_prompt
from mot_viz.engine.translator import GateOverride, top_k_gates
from mot_viz.errors import ConfigError

TEXT = "the cat sat on the mat and looked at the dog, who was asleep by the door"


def test_overrides_give_the_gates_they_name():
    logits = torch.tensor([[[2.0, 1.0, 0.5, -1.0], [0.1, 0.3, 3.0, 0.2]]])  # [1, 2, 4]
    router = top_k_gates(logits, 2)
    assert torch.equal(GateOverride().gates(logits, 2), router)
    assert torch.equal(GateOverride("force", 3).gates(logits, 2), torch.tensor([[[0.0, 0, 0, 1], [0, 0, 0, 1]]]))
    assert torch.allclose(GateOverride("uniform").gates(logits, 2), torch.full((1, 2, 4), 0.25))
    dropped = GateOverride("drop", 0).gates(logits, 2)
    assert (dropped[..., 0] == 0).all() and torch.allclose(dropped.sum(-1), torch.ones(1, 2))
    assert torch.equal(dropped[0, 0] > 0, torch.tensor([False, True, True, False]))  # the next best two
    assert torch.equal(GateOverride("drop", 2).gates(logits, 1)[0, 1] > 0, torch.tensor([False, True, False, False]))
    with pytest.raises(ConfigError, match="experts 0–3"):
        GateOverride("force", 4).gates(logits, 2)
    with pytest.raises(ConfigError, match="need an expert index"):
        GateOverride("force")


def _setup():
    source, target = tiny_model("gpt2", vocab_size=280, layers=4, seed=1), tiny_model("llama", layers=4)
    torch.manual_seed(0)
    mot = MoT.build(source.spec, target.spec, Channels((2, 3), (2, 3)), dim=16, heads=2, num_experts=3, top_k=2)
    return source, target, mot


def test_what_if_the_router_chose_otherwise():
    source, target, mot = _setup()
    example = QAExample(dataset="t", id="0", context=TEXT, question="Where did the cat sit?", answers=("the mat",))
    prompt = build_prompt(example)
    base = translate(mot, source, target, prompt.context_text)
    own = what_if(mot, source, target, base, GateOverride(), example, prompt.suffix_text)
    assert own.translation is base and own.first_token_kl >= 0
    forced = what_if(mot, source, target, base, GateOverride("force", 1), example, prompt.suffix_text)
    gates = forced.translation.translated.key_routing.gates
    assert torch.equal(gates[..., 1], torch.ones_like(gates[..., 1]))
    assert forced.translation.native_kv is base.native_kv  # the same native reference
    assert not torch.allclose(forced.translation.translated.keys, base.translated.keys)
    direct = translate(mot, source, target, prompt.context_text, override=GateOverride("force", 1))
    assert torch.equal(direct.translated.keys, forced.translation.translated.keys)
    assert forced.errors.shape == own.errors.shape and forced.answer is not None


def test_expert_error_table_splits_the_context_by_top_expert():
    source, target, mot = _setup()
    base = translate(mot, source, target, TEXT)
    table = expert_error_table(base, mot)
    for kv in ("K", "V"):
        part = table[table.mixture == kv]
        assert part.tokens.sum() == base.target_ids.shape[1] and part.share.sum() == pytest.approx(1.0)
    forced = translate(mot, source, target, TEXT, override=GateOverride("force", 2))
    table = expert_error_table(forced, mot)
    assert table.set_index(["mixture", "expert"]).loc[("K", 2), "share"] == 1.0
