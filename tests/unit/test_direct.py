"""A full-depth map without replay (method.md §15): every target layer's K/V translated, used as the cache as it is."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from conftest import FAMILIES, tiny_model
from mot_viz.engine import hf
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.mot import MoT, target_context_ids, translate
from mot_viz.engine.replay_config import replay_mode
from mot_viz.engine.prompts import QAExample
from mot_viz.engine.testing import load_test_model
from mot_viz.errors import ConfigError
from mot_viz.eval import evaluate
from mot_viz.sharing import caches
from mot_viz.train.bank import Bank, context_blocks
from mot_viz.train.fit import fit_linear
from mot_viz.train import direct, quickfit
from mot_viz.train.direct import Moments, affine, layer_block, top_k_fit
from mot_viz.train.quickfit import QuickFitConfig, fit_pair, quickfit_channels
from tolerance import assert_close

DIRECT = QuickFitConfig(tokens=256, min_context_tokens=16, max_context_tokens=48, direct=True, top_k=2)
TEXT = "the cat sat on the mat and looked at the dog, who was asleep by the door of the old house"


def _relative_error(ours: torch.Tensor, native: torch.Tensor) -> float:
    """‖ours − native‖ / ‖native‖ over the context positions (1 is what writing zeros gives)."""
    return float((ours - native).double().norm() / native.double().norm())


def _context_errors(translation) -> list[float]:
    """Per target layer, the larger of the K and V relative errors of the direct cache against the native one."""
    p = translation.prefix_len
    return [max(_relative_error(d[:, :, p:], n[:, :, p:]) for d, n in zip(direct, native))
            for direct, native in zip(translation.mixed_kv, translation.native_kv, strict=True)]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_direct_cache_has_every_layer_with_its_native_shape_and_positions(private_cache, family):
    # the same model on both sides: each layer's map is the identity, so any slip in a layer's position encoding
    # (keys un-rotated at the source's positions, rotated again at the target's) or in its place shows as an error
    model = tiny_model(family, layers=4, bos=family == "gemma3_text")
    # a negligible penalty: on a tiny model's small K/V over 256 tokens the recipe's absolute λ = 0.01 shrinks by ~2%
    mot, config = load_checkpoint(fit_pair(model, model, replace(DIRECT, direct_lambda=1e-6)), model, model)
    assert config["replay"]["direct"] and mot.channels.target_layers == (0, 1, 2, 3)
    translation = translate(mot, model, model, TEXT)
    for (dk, dv), (nk, nv) in zip(translation.mixed_kv, translation.native_kv, strict=True):
        assert dk.shape == nk.shape and dv.shape == nv.shape
    p = translation.prefix_len
    assert p == (1 if family == "gemma3_text" else 0)
    for (dk, dv), (nk, nv) in zip(translation.mixed_kv, translation.native_kv):  # the target's own BOS K/V
        assert torch.equal(dk[:, :, :p], nk[:, :, :p]) and torch.equal(dv[:, :, :p], nv[:, :, :p])
    assert max(_context_errors(translation)) < 1e-2  # fp16 weights of an identity map


@pytest.mark.parametrize("pair, bound", [
    ("same", 1e-2),  # the target as its own source: the per-layer identity, found from this context alone
    ("cross", 0.5),  # llama (another tokenizer, 6 layers) -> gemma3: a random pair, in-sample, far below zeros' 1
])
def test_a_direct_map_fitted_on_one_context_reproduces_its_native_cache(pair, bound):
    target = tiny_model("gemma3_text", layers=4, bos=True)
    source = target if pair == "same" else tiny_model("llama", vocab_size=280, layers=6, seed=1)
    channels = quickfit_channels(source, target, QuickFitConfig(direct=True))
    assert channels.target_layers == (0, 1, 2, 3) and len(set(channels.source_layers)) == 4
    mot = MoT.build(source.spec, target.spec, channels, variant="linear", key_space="pre_rope", linear_per_layer=True)
    mot.replay = replay_mode(mot.replay, "none")
    ids = target_context_ids(target, TEXT)
    blocks = context_blocks(mot, source, target, ids)
    n = ids.shape[1]
    twice = {k: torch.cat([v, v]) for k, v in blocks.items()}  # the context is its own held-out copy
    bank = Bank(**twice, target_ids=torch.cat([ids[0], ids[0]]), lengths=torch.tensor([n, n]))
    report = fit_linear(mot, bank)
    assert report["per_layer"] and len(report["lambda_k"]) == 4
    errors = _context_errors(translate(mot, source, target, TEXT))
    assert max(errors) < bound, errors


def test_no_target_forward_runs_over_the_context(private_cache, monkeypatch):
    source, target = tiny_model("qwen2", layers=6, seed=2), tiny_model("gemma3_text", layers=4, bos=True)
    mot = load_checkpoint(fit_pair(source, target, DIRECT), source, target)[0]
    lengths = []
    real_run = hf.run

    def counting_run(model, ids, *args, **kwargs):
        if model is target.model:
            lengths.append(ids.shape[1])
        return real_run(model, ids, *args, **kwargs)

    monkeypatch.setattr(hf, "run", counting_run)
    translation = translate(mot, source, target, TEXT, with_native=False)
    assert lengths == [len(target.prefix_ids)]  # the target read its BOS, never the context
    assert translation.native_kv is None and "replay" not in translation.timings
    assert set(translation.timings) == {"alignment", "source_prefill", "translator", "assemble"}
    assert translation.mixed_kv[0][0].shape[2] == len(target.prefix_ids) + translation.target_ids.shape[1]


def test_replay_none_needs_a_full_depth_window(checkpoints):
    source, target = tiny_model("llama", layers=4), tiny_model("gemma3_text", layers=6)
    with pytest.raises(ConfigError, match="source has 4"):
        quickfit_channels(source, target, QuickFitConfig(direct=True))
    src, tgt = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot = load_checkpoint(checkpoints["smollm2-to-gemma3-linear"], src, tgt)[0]
    mot.replay = replay_mode(mot.replay, "none")
    with pytest.raises(ConfigError, match="full-depth map"):
        translate(mot, src, tgt, TEXT)


def test_the_direct_condition_answers_from_the_direct_map(private_cache):
    source, target = tiny_model("qwen2", layers=6, seed=2), tiny_model("gemma3_text", layers=4, bos=True)
    direct = load_checkpoint(fit_pair(source, target, DIRECT), source, target)[0]
    window = load_checkpoint(fit_pair(source, target, QuickFitConfig(tokens=256, min_context_tokens=16,
                                                                     max_context_tokens=48)), source, target)[0]
    example = QAExample(id="0", dataset="free", context=TEXT, question="who slept?", answers=("the dog",))
    built = caches.condition_caches(window, source, target, example, conditions=("native", "mot", "direct"),
                                     artifacts={"direct": direct})
    native = built.kv["native"]
    assert [k.shape for k, _ in built.kv["direct"]] == [k.shape for k, _ in native] and built.seconds["direct"] > 0
    with pytest.raises(ConfigError, match="--direct"):
        caches.condition_caches(window, source, target, example, conditions=("native", "direct"))


@pytest.mark.parametrize("flags, message", [
    (["--conditions", "native", "direct"], "the 'direct' condition needs --direct CHECKPOINT"),
    (["--direct", "DIRECT"], "add direct to --conditions"),
    (["--conditions", "direct", "--direct", "WINDOW"], "needs a full-depth map without replay"),
    (["--replay", "none"], "--replay none uses the translated K/V as the whole cache"),
])
def test_the_direct_condition_is_refused_in_one_line_before_any_model_loads(checkpoints, tmp_path, capsys, monkeypatch,
                                                                             flags, message):
    monkeypatch.setattr(evaluate, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    named = {"DIRECT": str(checkpoints["smollm2-to-gemma3"]), "WINDOW": str(checkpoints["smollm2-to-gemma3-linear"])}
    argv = ["--checkpoint", str(checkpoints["smollm2-to-gemma3"]), "--datasets", "squad", "--n", "1",
            "--out", str(tmp_path / "out"), *[named.get(f, f) for f in flags]]
    assert evaluate.main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def _moments(x: torch.Tensor, y: torch.Tensor, held_out: int) -> tuple[Moments, Moments]:
    """Train and held-out moments of rows x [n, F], y [n, O]: the last `held_out` rows held out."""
    train, val = (Moments.zeros(x[:64].mean(0), y[:64].mean(0)) for _ in range(2))
    train.add(x[:-held_out], y[:-held_out])
    val.add(x[-held_out:], y[-held_out:])
    return train, val


def test_the_top_k_source_layers_are_those_of_highest_held_out_r2_not_the_depth_matched_one():
    # four source layers of width 3 feeding one target layer of width 2: layer 3 predicts it best, layer 1 next, the
    # depth-matched layer 0 and layer 2 carry nothing but noise
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 4, 3, generator=gen) * torch.tensor([1.0, 2.0, 5.0, 0.5])[:, None] + 3.0
    mix = torch.randn(3, 2, generator=gen)
    y = 4 * x[:, 3] @ mix + 0.5 * x[:, 1] @ mix + 0.3 * torch.randn(2000, 2, generator=gen) - 7.0
    train, val = _moments(x.flatten(1), y, held_out=400)
    fit = top_k_fit(train, val, num_inputs=4, in_width=3, out_layer=0, out_width=2, k=2, lam=0.01)
    assert fit.sources == (3, 1)
    assert fit.single_r2[3] > fit.single_r2[1] > max(fit.single_r2[0], fit.single_r2[2])
    assert top_k_fit(train, val, 4, 3, 0, 2, k=1, lam=0.01).sources == (3,)
    relative = top_k_fit(train, val, 4, 3, 0, 2, k=2, lam=0.01, relative=True)  # the other reading of λ
    assert relative.sources == (3, 1) and relative.r2 == pytest.approx(fit.other_r2, rel=1e-9)
    # the moments' held-out R² is the R² of the map's own predictions on the held-out rows
    weight, bias = affine(train, layer_block(fit.sources, 3), layer_block([0], 2), fit.weight, fit.x_mean, fit.y_mean)
    rows = x[-400:][:, list(fit.sources)].flatten(1)
    residual = y[-400:] - (rows @ weight + bias)
    explicit = 1 - float(residual.double().pow(2).sum() / (y[-400:] - y[-400:].mean(0)).double().pow(2).sum())
    assert_close(fit.r2, explicit, rtol=1e-4, what="held-out R²")
    assert fit.r2 > fit.single_r2[3] > 0.5


def test_the_top_k_map_of_an_identical_tiny_pair_reproduces_its_native_cache(private_cache):
    model = tiny_model("gemma3_text", layers=4, bos=True)
    # the recipe's absolute λ = 0.01 against a tiny model's small K/V: 1,024 tokens keep its shrinkage near 1%
    mot, config = load_checkpoint(fit_pair(model, model, replace(DIRECT, tokens=1024)), model, model)
    fit = config["metrics"]["direct_fit"]
    assert (fit["k"], fit["lambda"], fit["lambda_kind"]) == (2, 0.01, "absolute")
    assert config["training"]["top_k"] == 2 and "held out" in config["training"]["data"]
    for row in fit["layers"]:  # each layer's own source layer is its best (R² 1) and first
        assert row["key_sources"][0] == row["value_sources"][0] == row["layer"]
        assert row["key_r2"] > 0.999 and row["attn_out_cos"] > 0.999
    translation = translate(mot, model, model, TEXT)
    p = translation.prefix_len
    for (dk, dv), (nk, nv) in zip(translation.mixed_kv, translation.native_kv, strict=True):
        assert_close(dk[:, :, p:], nk[:, :, p:], rtol=3e-2, what="K")  # fp16 weights
        assert_close(dv[:, :, p:], nv[:, :, p:], rtol=3e-2, what="V")


def test_the_depth_matched_recipe_stays_a_named_variant(private_cache):
    source, target = tiny_model("qwen2", layers=6, seed=2), tiny_model("gemma3_text", layers=4, bos=True)
    config = load_checkpoint(fit_pair(source, target, replace(DIRECT, direct_recipe="depth_matched")), source,
                             target)[1]
    assert config["translator"]["linear_key_sources"] == [] and config["metrics"]["linear_fit"]["per_layer"]
    top_k = load_checkpoint(fit_pair(source, target, DIRECT), source, target)[1]["translator"]
    assert len(top_k["linear_key_sources"]) == 4 and all(len(s) == 2 for s in top_k["linear_value_sources"])


@pytest.mark.parametrize("flags, message", [
    (["--k", "7"], "--k 7 asks for more source layers than the source has (6): pass --k 6 or less."),
    (["--k", "2", "--tokens", "1024"], "a top-2 direct map has 1,024 features per target layer (2 source layers × "
                                       "512), more than the 922 calibration tokens it fits on: pass --tokens 1138"),
    (["--k", "1", "--tokens", "1024"], None),  # 512 features: the fit goes on to load the models
])
def test_a_top_k_fit_is_refused_in_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch, flags, message):
    folder = tmp_path / "tiny-source"
    source = tiny_model("qwen2", layers=6, seed=2)
    source.model.save_pretrained(folder)
    source.tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())  # 6 layers, K/V 4 heads × 128 = 512 wide (the
    config |= {"hidden_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4}  # config alone is read)
    (folder / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    monkeypatch.setattr(quickfit, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    if message is None:
        with pytest.raises(pytest.fail.Exception, match="a model was loaded"):
            quickfit.main(["--source", str(folder), "--target", "gemma3-270m", "--direct", *flags])
        return
    assert quickfit.main(["--source", str(folder), "--target", "gemma3-270m", "--direct", *flags]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_a_second_top_k_fit_of_a_bank_reads_its_cached_moments(private_cache, monkeypatch):
    source, target = tiny_model("qwen2", layers=6, seed=2), tiny_model("gemma3_text", layers=4, bos=True)
    first = load_checkpoint(fit_pair(source, target, DIRECT), source, target)[1]
    (folder,) = (private_cache / "banks").iterdir()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["complete"] and list(folder.glob("moments-*.safetensors"))
    summed = direct.bank_moments(direct.bank_shards(folder, manifest), manifest["num_contexts"], 0.1)
    monkeypatch.setattr(direct, "bank_moments", lambda *a: pytest.fail("the bank was summed again"))
    cached = direct.cached_moments(folder, manifest, 0.1)
    for name in ("k", "v"):
        for ours, theirs in zip(cached[name], summed[name]):
            assert ours.n == theirs.n and torch.equal(ours.sxx, theirs.sxx) and torch.equal(ours.sxy, theirs.sxy)
    second = load_checkpoint(fit_pair(source, target, replace(DIRECT, top_k=1)), source, target)[1]
    assert [len(s) for s in second["translator"]["linear_key_sources"]] == [1] * 4
    best = [row["key_sources"][0] for row in first["metrics"]["direct_fit"]["layers"]]
    assert [s[0] for s in second["translator"]["linear_key_sources"]] == best  # the same ranking, cut at 1
