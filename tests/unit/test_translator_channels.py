"""Channels (method.md §3), translators and router (§4–§5)."""

from __future__ import annotations

import pytest
import torch

from mot_viz.engine.channels import (Channels, depth_candidates, depth_ratio_candidates, injection_channels,
                                     sparse_source_layer, terminal_channels, window_size_range)
from mot_viz.engine.layout import from_block, to_block
from mot_viz.engine.translator import (CrossLayerWindowTranslator, GateOverride, KVTranslator, MixtureOfTranslators,
                                       TranslatorConfig, gate_balance)
from mot_viz.errors import ConfigError
from tolerance import assert_close, close


def test_injection_channels_align_by_depth_from_the_top():
    assert injection_channels(30, 18, start=13, window=5).pairs() == [(25, 13), (26, 14), (27, 15), (28, 16), (29, 17)]
    assert injection_channels(12, 12, 3, 6).pairs() == [(i, i) for i in range(3, 9)]  # identical models: identity
    with pytest.raises(ConfigError, match="valid starts are 0..12"):
        injection_channels(12, 18, 13, 6)
    with pytest.raises(ConfigError, match="outside the source"):
        injection_channels(6, 18, 0, 3)  # maps to source layer -12


def test_terminal_and_depth_ratio():
    assert terminal_channels(30, 18, 0.3).pairs() == [(25, 13), (26, 14), (27, 15), (28, 16), (29, 17)]
    assert terminal_channels(4, 4, 0.01).window == 1  # clamped to at least one layer
    assert depth_candidates(18, 18) == list(range(18))  # the smaller model gets the identity list
    big = depth_candidates(30, 18)
    assert big[0] == 0 and big[-1] == 29 and all(b > a for a, b in zip(big, big[1:]))
    assert depth_candidates(30, 1) == [29]
    assert len(depth_ratio_candidates(30, 18)) == 18
    assert window_size_range(30, 18, 0.3, 0.3) == (5, 5)  # round(5.4) = 5
    assert window_size_range(30, 10, 0.25, 0.25) == (2, 2)  # half-to-even: round(2.5) = 2


def test_channels_validation_and_sparse_source_layer():
    with pytest.raises(ConfigError):
        Channels((1, 1), (2, 3))
    ch = Channels((10, 20), (2, 4))
    assert sparse_source_layer(ch, 3, 30) == 15  # interpolation
    assert sparse_source_layer(ch, 0, 30) == 0  # extrapolation below, clamped
    assert sparse_source_layer(ch, 8, 30) == 29  # extrapolation above, clamped
    assert sparse_source_layer(Channels((7,), (3,)), 12, 30) == 7


def test_block_layout_round_trip_head_major():
    k = torch.randn(2, 3, 5, 4)  # (B, n_kv, N, d)
    block = to_block([k, k + 1])
    assert block.shape == (2, 5, 2, 12)
    assert torch.equal(block[1, 2, 0, 4:8], k[1, 1, 2])  # head index outer, head_dim inner
    back = from_block(block, 3)
    assert torch.equal(back[0], k) and torch.equal(back[1], k + 1)


def _cfg(**kw):
    base = dict(source_kv_hidden=12, target_kv_hidden=8, window=3, dim=16, heads=4, depth=2)
    return TranslatorConfig(**{**base, **kw})


def test_window_translator_shapes_and_reference_gelu_floor():
    x = torch.randn(2, 7, 3, 12) * 10
    y = CrossLayerWindowTranslator(_cfg())(x)
    assert y.shape == (2, 7, 3, 8)
    assert y.min() >= -0.1701  # the reference's final GELU bounds outputs below (method.md §4)
    y_none = CrossLayerWindowTranslator(_cfg(output_activation="none"))(x)
    assert y_none.min() < -0.5


def test_translator_is_non_causal_over_tokens():
    torch.manual_seed(0)
    t = CrossLayerWindowTranslator(_cfg(output_activation="none"))
    x = torch.randn(1, 6, 3, 12)
    x2 = x.clone()
    x2[:, -1] = torch.randn(1, 3, 12)  # change only the last token (a constant shift would vanish in LayerNorm)
    assert (t(x)[:, 0] - t(x2)[:, 0]).abs().max() > 1e-5  # the first token's output sees it


def test_router_top_k_and_mixture():
    torch.manual_seed(0)
    moe = MixtureOfTranslators(_cfg(num_experts=4, top_k=2))
    x = torch.randn(2, 5, 3, 12)
    y, routing = moe(x)
    assert y.shape == (2, 5, 3, 8)
    assert torch.allclose(routing.gates.sum(-1), torch.ones(2, 5))
    assert ((routing.gates > 0).sum(-1) == 2).all()  # exactly top-2 kept per token
    kept = routing.logits.topk(2, dim=-1).indices
    assert (routing.gates.gather(-1, kept) > 0).all()
    experts = torch.stack([t(x) for t in moe.translators], -1)
    assert close(y, (experts * routing.gates[:, :, None, None, :]).sum(-1))


def test_sparse_expert_dispatch_equals_dense_mixture_and_its_gradients():
    """Each expert computes only its routed tokens; outputs and gradients equal running every expert densely."""
    torch.manual_seed(1)
    moe = MixtureOfTranslators(_cfg(num_experts=4, top_k=2, output_activation="none"))
    x = torch.randn(2, 9, 3, 12)

    def dense(override):
        gates = moe.router(x, override).gates
        experts = torch.stack([t(x) for t in moe.translators], -1)
        return (experts * gates[:, :, None, None, :]).sum(-1)

    for override in (None, GateOverride("uniform"), GateOverride("force", 2), GateOverride("drop", 0)):
        sparse, _ = moe(x, override)
        reference = dense(override)
        assert close(sparse, reference), override
        weights = torch.randn_like(reference)
        grads = [torch.autograd.grad((y * weights).sum(), list(moe.parameters()), allow_unused=True)
                 for y in (sparse, reference)]
        for param, g_sparse, g_dense in zip(moe.parameters(), *grads):  # None: no path (an expert never routed to)
            g_sparse, g_dense = (torch.zeros_like(param) if g is None else g for g in (g_sparse, g_dense))
            assert_close(g_sparse, g_dense, what=str(override))
    forced = CrossLayerWindowTranslator(_cfg())
    subset = torch.tensor([4, 0, 7])
    assert close(forced(x, subset), forced(x)[:, subset], rtol=1e-5)  # a query's output ignores the others


def test_kv_translator_variants_and_validation():
    mot = KVTranslator(_cfg(num_experts=3, top_k=1))
    out = mot(torch.randn(1, 4, 3, 12), torch.randn(1, 4, 3, 12))
    assert out.keys.shape == out.values.shape == (1, 4, 3, 8)
    assert out.key_routing is not None and out.value_routing is not None
    assert out.key_routing.gates is not out.value_routing.gates  # separate K and V routers
    single = KVTranslator(_cfg(variant="single"))
    out = single(torch.randn(1, 4, 3, 12), torch.randn(1, 4, 3, 12))
    assert out.key_routing is None and not any("router" in n for n, _ in single.named_parameters())
    for bad in (dict(dim=10, heads=4), dict(top_k=5, num_experts=4), dict(variant="moe"), dict(output_activation="relu")):
        with pytest.raises(ConfigError):
            _cfg(**bad)


def test_gate_balance_metrics():
    uniform = torch.full((1, 8, 4), 0.25)
    m = gate_balance(uniform)
    assert m["gate_importance_cv2"] == pytest.approx(0.0, abs=1e-6)
    assert m["gate_importance_entropy"] == pytest.approx(torch.log(torch.tensor(4.0)).item(), rel=1e-5)
    one_hot = torch.zeros(1, 8, 4)
    one_hot[..., 0] = 1
    m = gate_balance(one_hot)
    assert m["gate_importance_cv2"] == pytest.approx(3.0, rel=1e-4)  # var([8,0,0,0]) / mean² = 12/4
    assert m["gate_importance_entropy"] < 1e-4


def test_the_linear_map_inputs_are_described_as_configured():
    from mot_viz.engine.translator import linear_inputs_text

    assert linear_inputs_text(_cfg()) == "each token's aligned source K and V"
    assert linear_inputs_text(_cfg(linear_previous=1, linear_previous_dims=256)) == (
        "each token's aligned source K and V and the previous token's, projected on 256 principal axes of the bank")
    assert "the 2 previous tokens'" in linear_inputs_text(_cfg(linear_previous=2))
    assert linear_inputs_text(_cfg(linear_rank=3)).endswith("(its K and its V output each of rank 3: reduced-rank "
                                                            "ridge)")
    with pytest.raises(ConfigError, match="linear_previous"):
        _cfg(linear_previous=-1)
