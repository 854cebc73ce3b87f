"""The fidelity work (method.md §12–§13): ridge fit, pre-RoPE key space, the cached bank, linear init, metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import TINY_RECIPE, tiny_model
from mot_viz.engine import hf
from mot_viz.engine.channels import Channels
from mot_viz.engine.checkpoint import load_checkpoint, save_checkpoint
from mot_viz.engine.layout import window_blocks
from mot_viz.engine.mot import (MoT, ReplayConfig, native_cache, prepare_source, target_context_ids, translator_inputs,
                                translator_targets)
from mot_viz.engine.translator import previous_features
from mot_viz.errors import CheckpointError, ConfigError
from mot_viz.train.window_fidelity import attention_output_cosine, context_fidelity, vector_fidelity
from mot_viz.train import train as train_mod
from mot_viz.train.bank import Bank, BankConfig, build_bank, context_blocks
from mot_viz.train.fit import bank_loss, bank_stage, fit_linear
from mot_viz.train.ridge import fit_ridge
from mot_viz.train.train import TrainConfig, train
from tolerance import close

ROPE_FAMILIES = ("qwen2", "llama", "gemma3_text")
SMALL_BANK = BankConfig(num_tokens=240, min_tokens=16, max_tokens=40, shard_contexts=3)


def _pair():
    return tiny_model("gpt2", vocab_size=280, layers=4, seed=1), tiny_model("llama", layers=4)


def test_ridge_recovers_a_known_linear_map():
    g = torch.Generator().manual_seed(0)
    true_w, true_b = torch.randn(12, 5, generator=g), torch.randn(5, generator=g)
    x, x_val = torch.randn(400, 12, generator=g), torch.randn(100, 12, generator=g)
    fit = fit_ridge(x, x @ true_w + true_b, x_val, x_val @ true_w + true_b)
    assert fit.lam == min(fit.val_mse)  # noise-free data: the smallest penalty wins
    assert torch.allclose(fit.weight, true_w, atol=1e-3) and torch.allclose(fit.bias, true_b, atol=1e-3)
    noisy = fit_ridge(x, x @ true_w + true_b + 3 * torch.randn(400, 5, generator=g), x_val, x_val @ true_w + true_b)
    assert (noisy.weight - true_w).abs().max() < 0.6  # still close under heavy noise


def test_reduced_rank_ridge_recovers_a_low_rank_map_and_keeps_the_directions_that_matter():
    """Targets that vary in 3 directions only: a rank-3 fit recovers the map (as two factors, orthonormal `up`); a
    rank-1 fit keeps the direction with the most fitted variance, and rank >= outputs is the full fit."""
    g = torch.Generator().manual_seed(0)
    x, x_val = torch.randn(500, 12, generator=g), torch.randn(100, 12, generator=g)
    scales = torch.tensor([10.0, 3.0, 1.0])
    true_w = (torch.randn(12, 3, generator=g) * scales) @ torch.linalg.qr(torch.randn(8, 3, generator=g))[0].T
    true_b = torch.randn(8, generator=g)
    fit = fit_ridge(x, x @ true_w + true_b, x_val, x_val @ true_w + true_b, rank=3)
    assert fit.weight.shape == (12, 3) and fit.up.shape == (3, 8)
    assert torch.allclose(fit.up @ fit.up.T, torch.eye(3), atol=1e-5)
    assert torch.allclose(fit.full_weight, true_w, atol=1e-3) and torch.allclose(fit.bias, true_b, atol=1e-3)
    one = fit_ridge(x, x @ true_w + true_b, x_val, x_val @ true_w + true_b, rank=1)
    explained = lambda f: 1 - float(((x_val @ f.full_weight + f.bias - x_val @ true_w - true_b) ** 2).sum()
                                    / ((x_val @ true_w - (x_val @ true_w).mean(0)) ** 2).sum())
    assert explained(one) > 0.8  # the strongest of three directions (scales 10, 3, 1) carries most of the variance
    full = fit_ridge(x, x @ true_w + true_b, x_val, x_val @ true_w + true_b)
    assert fit_ridge(x, x @ true_w, x_val, x_val @ true_w, rank=8).up is None and full.up is None


def test_weighed_outputs_choose_which_directions_a_reduced_rank_fit_keeps():
    """Two independent outputs of variance 100 and 1: rank 1 keeps the large one, unless the outputs are weighed."""
    from mot_viz.train.ridge import NormalEquations

    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 4, generator=g)
    y = torch.stack([10 * x[:, 0], x[:, 1]], 1)
    normal = NormalEquations(x)
    projected, y_mean = normal.project(y)
    for out_weight, kept in ((None, 0), (torch.tensor([1.0, 100.0]), 1)):
        weight, bias, up = normal.solve(projected, y_mean, 1e-6, rank=1, out_weight=out_weight)
        pred = x.double() @ weight @ up + bias
        rel_err = ((pred - y).pow(2).mean(0) / (y - y.mean(0)).pow(2).mean(0)).sqrt()
        assert rel_err[kept] < 1e-3 and rel_err[1 - kept] > 0.95  # one output predicted, the other not at all


def _two_layer_source(source):
    """(generator, context lengths, random aligned source K and V [n, 2, H_S] of a 2-layer window, their features)."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([30, 45, 25, 40, 35, 50, 30, 45, 40, 35])
    n = int(lengths.sum())
    keys, values = (torch.randn(n, 2, source.spec.kv_hidden, generator=g) for _ in range(2))
    return g, lengths, keys, values, torch.cat([keys.flatten(1), values.flatten(1)], 1)


def test_a_reduced_rank_map_fits_saves_and_loads_as_two_factors(tmp_path):
    """linear_rank: the map's K and V each go through `rank` directions (key_down, then key_proj); on a bank whose
    targets span that many directions it fits them as well as the full map, and the checkpoint is smaller."""
    source, target = _pair()
    channels = Channels((2, 3), (2, 3))
    g, lengths, keys, values, x = _two_layer_source(source)
    n, h_t = len(x), target.spec.kv_hidden
    a, b = (torch.randn(x.shape[1], 4, generator=g) @ torch.randn(4, 2 * h_t, generator=g) for _ in range(2))
    bank = Bank(keys, values, (x @ a).view(n, 2, h_t), (x @ b).view(n, 2, h_t), torch.zeros(n, dtype=torch.long),
                lengths)
    full = MoT.build(source.spec, target.spec, channels, variant="linear")
    low = MoT.build(source.spec, target.spec, channels, variant="linear", linear_rank=4)
    best = lambda report: min(report["val_mse_k"].values()) + min(report["val_mse_v"].values())
    full_mse, report = best(fit_linear(full, bank)), fit_linear(low, bank)
    assert report["rank"] == 4 and best(report) < 1e-3 * float(bank.target_keys.var())
    linear = low.translator.linear
    assert linear.key_down.weight.shape == (4, x.shape[1]) and linear.key_proj.weight.shape == (2 * h_t, 4)
    too_low = MoT.build(source.spec, target.spec, channels, variant="linear", linear_rank=2)
    assert best(fit_linear(too_low, bank)) > 100 * max(best(report), full_mse)  # 2 of 4 directions: not enough
    sizes = {name: (save_checkpoint(m, tmp_path / name) / "translator.safetensors").stat().st_size
             for name, m in (("full", full), ("low", low))}
    assert sizes["low"] < sizes["full"]
    loaded, _ = load_checkpoint(tmp_path / "low")
    sk, sv, tk, tv = bank.context(bank.num_contexts - 1)
    with torch.no_grad():
        out = loaded.translator(sk, sv)
        assert close(out.keys, low.translator(sk, sv).keys)
        assert float(((out.values - tv) ** 2).mean()) < 1e-3 * float(tv.var())
    with pytest.raises(ConfigError, match="linear_rank"):
        MoT.build(source.spec, target.spec, channels, variant="linear", linear_rank=-1)


def test_a_balanced_reduced_rank_fit_keeps_a_small_window_layer():
    """Layer 0's target is 100× smaller than layer 1's: at rank 2 the plain fit spends both directions on layer 1 and
    predicts nothing of layer 0; weighed per layer (linear_rank_balanced) it keeps layer 0's one direction."""
    source, target = _pair()
    channels = Channels((2, 3), (2, 3))
    g, lengths, keys, values, x = _two_layer_source(source)
    n, h_t = len(x), target.spec.kv_hidden
    small = 0.01 * x @ torch.randn(x.shape[1], 1, generator=g) @ torch.randn(1, h_t, generator=g)
    large = x @ torch.randn(x.shape[1], 2, generator=g) @ torch.randn(2, h_t, generator=g)
    y = torch.stack([small, large], 1)
    bank = Bank(keys, values, y, y.clone(), torch.zeros(n, dtype=torch.long), lengths)
    rel_err = {}
    for balanced in (False, True):
        mot = MoT.build(source.spec, target.spec, channels, variant="linear", linear_rank=2)
        report = fit_linear(mot, bank, balanced=balanced)
        assert report["rank_balanced"] == balanced
        with torch.no_grad():
            pred = mot.translator.linear(keys[None], values[None])[0][0]
        rel_err[balanced] = float((pred[:, 0] - y[:, 0]).pow(2).mean() / y[:, 0].pow(2).mean())
    assert rel_err[False] > 0.9 and rel_err[True] < 1e-3


@pytest.mark.parametrize("rank", [0, 2])
def test_cross_fitted_predictions_are_each_folds_fit_of_the_others(rank):
    """Each fold's rows are predicted by the ridge fit (same λ, same rank) of the other folds' rows alone."""
    from mot_viz.train.ridge import cross_fitted

    g = torch.Generator().manual_seed(0)
    x = torch.randn(90, 6, generator=g) + 3.0  # uncentred features: the fold sums must centre them
    ys = {"k": x @ torch.randn(6, 4, generator=g) + torch.randn(90, 4, generator=g),
          "v": x @ torch.randn(6, 3, generator=g) + 1.0}
    folds = [torch.arange(f, 90, 3) for f in range(3)]
    out = cross_fitted(x, ys, folds, {"k": 0.1, "v": 1e-4}, rank)
    for rows in folds:
        rest = torch.tensor([i for i in range(90) if i not in set(rows.tolist())])
        for name, lam in (("k", 0.1), ("v", 1e-4)):
            fit = fit_ridge(x[rest], ys[name][rest], x[rows], ys[name][rows], lambdas=(lam,), refit_all=False,
                            rank=rank)
            assert close(out[name][rows], x[rows] @ fit.full_weight + fit.bias)


def test_a_bank_stage_on_cross_fitted_map_rows(tmp_path, monkeypatch):
    """bank_cross_fit: the experts train on the map's out-of-fold output (larger error than in sample), the run
    records both errors, and the setting is refused where there is no fixed map to refit."""
    monkeypatch.setenv("MOT_VIZ_CACHE", str(tmp_path / "cache"))
    source, target = _pair()
    run = train(_cfg(tmp_path, bank_cross_fit=3, max_steps=1, bank_layer_weighting="map_residual"), source=source,
                target=target, bank=torch.zeros(2, 24, dtype=torch.long), progress=False)
    report = json.loads((run / "bank_stage.json").read_text())["cross_fit"]
    assert report["folds"] == 3
    assert report["out_of_fold_mse_k"] > report["in_sample_mse_k"] and report["out_of_fold_mse_v"] > report[
        "in_sample_mse_v"]
    for bad, match in ((dict(bank_cross_fit=1), "0 \\(off\\) or 2 to 64"),
                       (dict(bank_cross_fit=3, variant="linear"), "fixed linear map"),
                       (dict(bank_cross_fit=3, train_linear_path=True), "fixed linear map"),
                       (dict(linear_rank_balanced=True), "set linear_rank too")):
        with pytest.raises(ConfigError, match=match):
            _cfg(tmp_path, **bad)


def _pre_rope_keys(lm, layer: int, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pre-RoPE keys [1, n_kv, N, d] captured from the layer's own k_proj / k_norm, cached post-RoPE keys)."""
    attn = hf.decoder_layers(lm.model)[layer].self_attn
    captured = {}
    module = getattr(attn, "k_norm", None) or attn.k_proj
    handle = module.register_forward_hook(lambda m, i, o: captured.setdefault("k", o))
    try:
        cached = hf.run(lm.model, ids).kv[layer][0]
    finally:
        handle.remove()
    k = captured["k"]
    k = k.view(1, ids.shape[1], lm.spec.num_kv_heads, lm.spec.head_dim).transpose(1, 2)
    return k, cached


@pytest.mark.parametrize("family", ROPE_FAMILIES)
def test_rotating_native_pre_rope_keys_reproduces_the_cached_keys(family):
    lm = tiny_model(family, layers=3)
    ids = torch.arange(5, 45).view(1, -1)
    positions = torch.arange(ids.shape[1])
    for layer in range(3):  # Gemma: sliding layers 0-1 and the global layer 2 have their own rotary bases
        pre, cached = _pre_rope_keys(lm, layer, ids)
        assert (hf.rotate_keys(lm.model, layer, pre, positions) - cached).abs().max() <= 1e-5
        assert (hf.rotate_keys(lm.model, layer, cached, positions, inverse=True) - pre).abs().max() <= 1e-5
    assert hf.has_rope(lm.model)


def test_models_without_rope_keep_their_keys():
    lm = tiny_model("gpt2")
    keys = torch.randn(1, 4, 7, 8)
    assert not hf.has_rope(lm.model) and torch.equal(hf.rotate_keys(lm.model, 0, keys, torch.arange(7)), keys)


def test_pre_rope_translation_of_native_keys_lands_on_the_cached_keys():
    target = tiny_model("gemma3_text", layers=4, bos=True)
    channels = Channels((1, 2, 3), (1, 2, 3))
    mot = MoT.build(target.spec, target.spec, channels, variant="linear", key_space="pre_rope")
    ids = target_context_ids(target, "the quick brown fox jumps over the lazy dog " * 3)
    p = len(target.prefix_ids)
    native = native_cache(target, ids)
    pre_k, _ = translator_targets(mot, target, native, p)
    from mot_viz.engine.mot import rotate_block

    post_k, _ = window_blocks(native, channels.target_layers, p)
    assert (rotate_block(target, channels.target_layers, pre_k, p, inverse=False) - post_k).abs().max() <= 1e-5
    assert (pre_k - post_k).abs().max() > 1e-2  # the two spaces differ: the test is not vacuous


def test_bank_reuse_gives_bit_identical_losses_and_resumes_after_a_kill(tmp_path):
    source, target = _pair()
    torch.manual_seed(0)
    mot = MoT.build(source.spec, target.spec, Channels((2, 3), (2, 3)), dim=16, heads=2, num_experts=2, top_k=1)
    bank = build_bank(mot, source, target, SMALL_BANK, root=tmp_path, progress=False)
    assert bank.num_contexts >= 3 and int(bank.lengths.sum()) >= SMALL_BANK.num_tokens
    assert SMALL_BANK.min_tokens <= int(bank.lengths.min()) and int(bank.lengths.max()) <= SMALL_BANK.max_tokens
    for i in (0, bank.num_contexts - 1):
        a, b = bank.offsets[i], bank.offsets[i + 1]
        fresh = context_blocks(mot, source, target, bank.target_ids[a:b][None])
        from_bank = bank_loss(mot, *bank.context(i))[0]
        on_the_fly = bank_loss(mot, *(fresh[k][None] for k in ("source_keys", "source_values", "target_keys",
                                                                "target_values")))[0]
        assert torch.equal(from_bank, on_the_fly)
    # the bank's blocks are exactly what the replay path's translator sees and must write
    ids = bank.target_ids[: bank.offsets[1]][None]
    sk, _ = translator_inputs(mot, prepare_source(mot, source, target, ids), source)
    assert torch.equal(sk, bank.context(0)[0])
    # a kill after some shards: the manifest lists only finished shards; the rebuild completes identically
    manifest_path = bank.folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    shard_mtime = (bank.folder / manifest["shards"][0]["file"]).stat().st_mtime_ns
    (bank.folder / manifest["shards"][-1]["file"]).unlink()
    manifest["shards"] = manifest["shards"][:-1]
    manifest["complete"] = False
    manifest_path.write_text(json.dumps(manifest))
    again = build_bank(mot, source, target, SMALL_BANK, root=tmp_path, progress=False)
    assert (bank.folder / manifest["shards"][0]["file"]).stat().st_mtime_ns == shard_mtime  # reused, not rebuilt
    assert all(torch.equal(getattr(bank, f), getattr(again, f)) for f in ("source_keys", "target_values", "lengths"))
    other = MoT.build(source.spec, target.spec, Channels((1, 3), (1, 3)), dim=16, heads=2)
    assert build_bank(other, source, target, SMALL_BANK, root=tmp_path, progress=False).folder != bank.folder


def test_linear_fit_beats_the_mean_and_an_untrained_mot_from_it_reproduces_it(tmp_path):
    source, target = _pair()
    channels = Channels((2, 3), (2, 3))
    linear = MoT.build(source.spec, target.spec, channels, variant="linear")
    bank = build_bank(linear, source, target, SMALL_BANK, root=tmp_path, progress=False)
    report = fit_linear(linear, bank)
    _, val = bank.split()
    for kv, field in (("k", bank.target_keys), ("v", bank.target_values)):
        rows = bank.rows(val)
        mean_mse = float(((field[rows] - field[bank.rows(bank.split()[0])].mean(0)) ** 2).mean())
        assert min(report[f"val_mse_{kv}"].values()) < mean_mse  # better than predicting the mean vector
    torch.manual_seed(3)
    mixture = MoT.build(source.spec, target.spec, channels, dim=16, heads=2, num_experts=2, top_k=1,
                        linear_residual=True)
    mixture.translator.linear.load_state_dict(linear.translator.linear.state_dict())
    sk, sv, _, _ = bank.context(0)
    before = mixture.translator(sk, sv).keys
    mixture.translator.silence_experts()
    a, b = mixture.translator(sk, sv), linear.translator(sk, sv)
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert not torch.allclose(before, b.keys)  # the experts did contribute before they were silenced
    rows = bank_stage(mixture, bank, steps=30, lr=3e-3, batch=2, crop=16, warmup=2, log_every=30, progress=False)
    assert rows[-1]["val_mse_k"] + rows[-1]["val_mse_v"] < 1.5 * sum(
        min(report[f"val_mse_{kv}"].values()) for kv in "kv")  # refining did not wreck the fitted map


def test_map_residual_layer_weighting(tmp_path):
    """Weights = mean over layers of the map's per-layer MSE ÷ each layer's own; unit weights are the plain loss;
    a stage trained with the weights logs the ones it used."""
    from mot_viz.train.fit import map_residual_weights

    source, target = _pair()
    channels = Channels((1, 2, 3), (1, 2, 3))
    mixture = MoT.build(source.spec, target.spec, channels, dim=16, heads=2, num_experts=2, top_k=1,
                        variant="mot", linear_residual=True)
    bank = build_bank(mixture, source, target, SMALL_BANK, root=tmp_path, progress=False)
    fit_linear(mixture, bank)
    mixture.translator.silence_experts()  # the translator is exactly its map
    train, _ = bank.split()
    wk, wv = map_residual_weights(mixture, bank, train[:5])
    per_layer = torch.zeros(3)
    for i in train[:5]:
        sk, sv, tk, tv = bank.context(i)
        per_layer += ((mixture.translator(sk, sv).keys - tk) ** 2).mean(dim=(0, 1, 3)).detach()
    assert torch.allclose(wk, per_layer.mean() / per_layer, rtol=1e-5) and wk.shape == wv.shape == (3,)
    assert wk.max() / wk.min() > 1.05  # the layers' residuals differ, so the weights do
    sk, sv, tk, tv = bank.context(0)
    plain, parts = bank_loss(mixture, sk, sv, tk, tv)
    unit, unit_parts = bank_loss(mixture, sk, sv, tk, tv, layer_weights=(torch.ones(3), torch.ones(3)))
    weighted, weighted_parts = bank_loss(mixture, sk, sv, tk, tv, layer_weights=(wk, wv))
    assert torch.allclose(plain, unit) and parts == unit_parts == weighted_parts  # logged parts stay the plain MSE
    assert not torch.allclose(plain, weighted)
    before = map_residual_weights(mixture, bank, train[:40])  # what the stage weighs by: taken before it trains
    rows = bank_stage(mixture, bank, steps=6, lr=3e-3, batch=2, crop=16, warmup=1, log_every=6, progress=False,
                      layer_weighting="map_residual")
    assert rows[-1]["layer_weights_k"] == [round(float(w), 4) for w in before[0]]
    assert rows[-1]["layer_weights_v"] == [round(float(w), 4) for w in before[1]]
    with pytest.raises(ValueError):
        bank_stage(mixture, bank, steps=1, lr=1e-3, progress=False, layer_weighting="per_token")


def _cfg(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "run"), max_steps=4, batch_size=2, grad_accum_steps=1, total_tokens=24,
                prefix_tokens=12, learning_rate=1e-2, warmup_steps=1, translator_dim=16, translator_heads=2,
                mot_num_translators=2, mot_top_k=1, layer_alignment="terminal", max_window_size_ratio=0.5,
                topk_sparse_attn=4, num_bottom_full_attn=1, log_every=1, save_every=1, init="linear",
                bank_steps=6, bank_batch=2, bank_crop=16, bank_tokens=240, bank_min_tokens=16, bank_max_tokens=40,
                translation_weight=0.5, balance_weight=0.01)
    return TrainConfig(**{**TINY_RECIPE, **base, **kw})


def test_resume_with_the_bank_stages_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    monkeypatch.setenv("MOT_VIZ_CACHE", str(tmp_path / "cache"))
    source, target = _pair()
    rows = torch.randint(2, 250, (12, 24), generator=torch.Generator().manual_seed(0))
    full = train(_cfg(tmp_path / "a"), source=source, target=target, bank=rows, progress=False)
    summary = json.loads((full / "bank_stage.json").read_text())
    assert summary["linear_fit"]["lambda_k"] > 0 and summary["bank_stage"]["bank_step"] == 6
    log = [json.loads(line) for line in (full / "log.jsonl").read_text().splitlines()]
    assert {"tr_mse", "balance"} <= set(log[0])
    calls = {"n": 0}
    real_row_loss = train_mod.row_loss

    def interrupted(*args, **kwargs):  # Ctrl-C in the middle of replay step 3
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return real_row_loss(*args, **kwargs)

    monkeypatch.setattr(train_mod, "row_loss", interrupted)
    cfg = _cfg(tmp_path / "b", save_every=100)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, source=source, target=target, bank=rows, progress=False)
    monkeypatch.setattr(train_mod, "row_loss", real_row_loss)
    train(cfg, resume=True, source=source, target=target, bank=rows, progress=False)
    a = load_file(str(full / "checkpoint" / "translator.safetensors"))
    b = load_file(str(Path(cfg.output_dir) / "checkpoint" / "translator.safetensors"))
    assert a.keys() == b.keys() and any(k.startswith("linear.") for k in a)
    assert all(torch.allclose(a[k], b[k], atol=1e-6, rtol=0) for k in a)


def test_previous_features_read_earlier_tokens_of_the_context():
    x = torch.arange(1.0, 5.0).view(1, 4, 1)  # tokens 1, 2, 3, 4
    assert previous_features(x, 1)[0].tolist() == [[1, 0], [2, 1], [3, 2], [4, 3]]  # x_t, x_{t-1}; zeros before it
    two = previous_features(x, 2, basis=torch.tensor([[10.0]]))
    assert two[0, 2].tolist() == [3, 20, 10] and torch.equal(previous_features(x, 0), x)


def _previous_token_bank(source, target, window: int, rank: int | None, seed: int = 0) -> Bank:
    """A bank whose target window is an affine map of each token's source features and of the token's before it."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([30, 45, 25, 40, 35, 50, 30, 45, 40, 35, 30, 40])
    n, h_s, h_t = int(lengths.sum()), source.spec.kv_hidden, target.spec.kv_hidden
    f = 2 * window * h_s
    z = torch.randn(n, rank or f, generator=g)
    x = z @ torch.randn(rank or f, f, generator=g) / (rank or f) ** 0.5 if rank else z
    prev = torch.cat([previous_features(c[None], 1)[0, :, f:] for c in torch.split(x, lengths.tolist())])
    out = {}
    for name in ("k", "v"):
        a, b = torch.randn(f, window * h_t, generator=g), torch.randn(f, window * h_t, generator=g)
        out[name] = (x @ a + prev @ b + torch.randn(window * h_t, generator=g)).view(n, window, h_t)
    keys, values = x[:, : f // 2].reshape(n, window, h_s), x[:, f // 2:].reshape(n, window, h_s)
    return Bank(keys, values, out["k"], out["v"], torch.zeros(n, dtype=torch.long), lengths)


@pytest.mark.parametrize("dims", [0, 6])
def test_a_linear_map_over_the_previous_token_recovers_a_map_of_it(dims, tmp_path):
    """The target depends on the token and on the one before it: the token-only map cannot fit it, the map that also
    reads the previous token does (unprojected, or projected on the principal axes of features of rank 6), and it
    saves and loads with its axes."""
    source, target = _pair()
    channels = Channels((2, 3), (2, 3))
    bank = _previous_token_bank(source, target, channels.window, rank=6 if dims else None)
    alone = MoT.build(source.spec, target.spec, channels, variant="linear")
    wide = MoT.build(source.spec, target.spec, channels, variant="linear", linear_previous=1,
                     linear_previous_dims=dims)
    best = lambda report: min(report["val_mse_k"].values()) + min(report["val_mse_v"].values())
    alone_mse, wide_mse = best(fit_linear(alone, bank)), best(fit_linear(wide, bank))
    assert wide_mse < 1e-3 * alone_mse
    folder = save_checkpoint(wide, tmp_path / "wide")
    loaded, _ = load_checkpoint(folder)
    sk, sv, tk, _ = bank.context(len(bank.lengths) - 1)  # a held-out context
    with torch.no_grad():
        assert close(loaded.translator(sk, sv).keys, wide.translator(sk, sv).keys)
        assert float(((wide.translator(sk, sv).keys - tk) ** 2).mean()) < 1e-3 * float(tk.var())


def test_a_linear_variant_trains_in_closed_form_only(tmp_path, monkeypatch):
    monkeypatch.setenv("MOT_VIZ_CACHE", str(tmp_path / "cache"))
    source, target = _pair()
    cfg = _cfg(tmp_path, variant="linear", max_steps=0, bank_steps=0)
    run = train(cfg, source=source, target=target, bank=torch.zeros(2, 24, dtype=torch.long), progress=False)
    from mot_viz.engine.checkpoint import load_checkpoint

    mot, config = load_checkpoint(run / "checkpoint", source, target)
    assert config["translator"]["variant"] == "linear" and "linear_fit" in config["metrics"]
    assert mot.translator.linear.key_proj.weight.abs().sum() > 0


def test_a_mixture_started_from_a_linear_checkpoint_shares_its_map_exactly(tmp_path, monkeypatch):
    from mot_viz.engine.checkpoint import load_checkpoint, read_config
    from mot_viz.train.export import export_run

    monkeypatch.setenv("MOT_VIZ_CACHE", str(tmp_path / "cache"))
    source, target = _pair()
    rows = torch.zeros(4, 24, dtype=torch.long)
    linear_run = train(_cfg(tmp_path / "lin", variant="linear", max_steps=0, bank_steps=0), source=source,
                       target=target, bank=rows, progress=False)
    export_run(linear_run, tmp_path / "shipped" / "lin")  # fp16, as in pretrained/
    cfg = _cfg(tmp_path / "mix", max_steps=2, bank_steps=2, linear_from=str(tmp_path / "shipped" / "lin"))
    mix_run = train(cfg, source=source, target=target, bank=rows, progress=False)
    assert json.loads((mix_run / "bank_stage.json").read_text())["linear_fit"]["from"] == cfg.linear_from
    out = export_run(mix_run, tmp_path / "shipped" / "mix", shared_linear=tmp_path / "shipped" / "lin")
    assert read_config(out)["shared_linear"]["max_abs_difference"] == 0.0  # the same map, bit for bit
    mix, _ = load_checkpoint(out, source, target)
    lin, _ = load_checkpoint(tmp_path / "shipped" / "lin", source, target)
    assert all(torch.equal(a, b) for a, b in zip(mix.translator.linear.state_dict().values(),
                                                 lin.translator.linear.state_dict().values()))
    with pytest.raises(ConfigError, match="linear_from"):
        _cfg(tmp_path, variant="linear", linear_from=cfg.linear_from)
    other_window = _cfg(tmp_path / "other", max_steps=1, bank_steps=1, linear_from=cfg.linear_from,
                        layer_alignment="injection", injection_layer_start_idx=0, injection_window_size=2)
    with pytest.raises(CheckpointError, match="another pair, window, key space or token context"):
        train(other_window, source=source, target=target, bank=rows, progress=False)


def test_fidelity_metrics_on_known_cases():
    g = torch.Generator().manual_seed(0)
    native = torch.randn(20, 8, generator=g) + 5.0  # a large shared mean, as keys have
    assert vector_fidelity(native, native) == pytest.approx({"raw_cos": 1.0, "centered_cos": 1.0, "rel_err": 0.0})
    constant = native.mean(0).expand(20, 8)
    scores = vector_fidelity(constant, native)
    assert scores["raw_cos"] > 0.9 and scores["centered_cos"] == pytest.approx(0.0, abs=1e-6)
    q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    assert attention_output_cosine(q, 0.35, None, k, v, k, v) == pytest.approx(1.0)
    assert attention_output_cosine(q, 0.35, None, k + 1.0, v, k, v) == pytest.approx(1.0)  # a shared key shift is free
    assert attention_output_cosine(q, 0.35, None, k, -v, k, v) == pytest.approx(-1.0)


def test_context_fidelity_scores_a_perfect_translator_as_perfect():
    target = tiny_model("gemma3_text", layers=4, bos=True)
    channels = Channels((1, 2), (1, 2))
    mot = MoT.build(target.spec, target.spec, channels, variant="linear", key_space="pre_rope")
    text = "the quick brown fox jumps over the lazy dog and runs away"
    # identity pair: the linear map from [K, V] to K (and to V) is a selection, exact in pre-RoPE space
    lin = mot.translator.linear
    w, h = channels.window, target.spec.kv_hidden
    with torch.no_grad():
        for proj, offset in ((lin.key_proj, 0), (lin.value_proj, w * h)):
            proj.weight.copy_(torch.eye(2 * w * h)[offset: offset + w * h])
    rows = context_fidelity(mot, target, target, text)
    for row in rows:
        assert row["centered_cos_k"] == pytest.approx(1.0, abs=1e-4) and row["rel_err_v"] == pytest.approx(0, abs=1e-4)
        assert row["attn_out_cos"] == pytest.approx(1.0, abs=1e-4)


def test_attention_output_cosine_on_the_replays_own_queries():
    """method.md §13: the attention-output cosine "on the same queries (the layer's own queries during the replay)";
    the project's default reads the native prefill's (docs/decisions.md). Both are kept per translation."""
    from mot_viz.engine.layout import from_block
    from mot_viz.engine.mot import translate
    from mot_viz.train.window_fidelity import translation_fidelity

    source, target = _pair()
    torch.manual_seed(0)
    mot = MoT.build(source.spec, target.spec, Channels((2, 3), (2, 3)), ReplayConfig(None), variant="single")
    tr = translate(mot, source, target, "the quick brown fox jumps over the lazy dog and runs away")
    assert set(tr.replay_queries) == set(tr.native_queries) == {2, 3}
    # a dense replay's first window layer sees native inputs; the second reads what the first's translated K/V did
    assert torch.equal(tr.replay_queries[2][0], tr.native_queries[2][0])
    assert not torch.allclose(tr.replay_queries[3][0], tr.native_queries[3][0])
    rows = {q: {r["layer"]: r["attn_out_cos"] for r in translation_fidelity(tr, target, mot.channels, queries=q)}
            for q in ("native", "replay")}
    assert rows["native"][2] == pytest.approx(rows["replay"][2], abs=1e-6)
    k3 = from_block(tr.translated.keys, target.spec.num_kv_heads)[1]
    v3 = from_block(tr.translated.values, target.spec.num_kv_heads)[1]
    query, scaling, sliding = tr.replay_queries[3]
    assert rows["replay"][3] == pytest.approx(attention_output_cosine(query, scaling, sliding, k3, v3, *tr.native_kv[3]))
    assert rows["replay"][3] != pytest.approx(rows["native"][3])
    with pytest.raises(ValueError, match="queries must be one of"):
        translation_fidelity(tr, target, mot.channels, queries="source")

def test_mean_vector_control_replays_one_shared_vector_per_layer():
    from mot_viz.engine.prompts import QAExample
    from mot_viz.sharing.caches import condition_caches
    from mot_viz.train.mean_vector import mean_vectors

    source, target = _pair()
    mot = MoT.build(source.spec, target.spec, Channels((2, 3), (2, 3)), ReplayConfig(4, 1), variant="linear")
    example = QAExample(id="0", dataset="t", context="the quick brown fox jumps over the lazy dog", question="who?",
                        answers=("fox",))
    with pytest.raises(ConfigError, match="mean native window"):
        condition_caches(mot, source, target, example, conditions=("native", "mean"))
    means = mean_vectors(target, (2, 3), ["a tale of two cities", "the lazy dog sleeps all day"], "test")
    assert means.tokens > 0 and means.keys.shape == (2, target.spec.kv_hidden)
    built = condition_caches(mot, source, target, example, conditions=("native", "mot", "mean"),
                             artifacts={"mean": means})
    translation, caches = built.translation, built.kv
    assert set(caches) == {"native", "mot", "mean"}
    # replaying the same window by hand gives the same cache
    from mot_viz.engine.mot import replay

    n = translation.target_ids.shape[1]
    by_hand = replay(target, translation.target_ids, (2, 3), means.keys.expand(1, n, -1, -1).contiguous(),
                     means.values.expand(1, n, -1, -1).contiguous(), translation.sparse_indices)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(caches["mean"], by_hand))
    assert not torch.equal(caches["mean"][3][0], caches["native"][3][0])



def test_the_linear_map_reads_extra_source_layers_and_the_experts_do_not(tmp_path):
    """linear_extra_layers: the translator's input holds the channel list's source layers, then the extra ones (the
    source's own aligned K/V of those layers); the experts and the router read the window only, the linear map all."""
    source, target = _pair()
    channels = Channels((2, 3), (2, 3))
    mot = MoT.build(source.spec, target.spec, channels, dim=16, heads=2, num_experts=2, top_k=1,
                    linear_residual=True, linear_extra_layers=(0,))
    plain = MoT.build(source.spec, target.spec, channels, dim=16, heads=2, num_experts=2, top_k=1, linear_residual=True)
    assert mot.input_layers == (2, 3, 0)
    ids = torch.randint(0, 200, (1, 20), generator=torch.Generator().manual_seed(0))
    src = prepare_source(mot, source, target, ids, with_attention=False)
    sk, sv = translator_inputs(mot, src, source)
    pk, pv = translator_inputs(plain, src, source)
    from mot_viz.engine.alignment import apply_alignment

    ek, ev = (apply_alignment(b, src.alignment) for b in window_blocks(src.source_kv, (0,)))
    assert sk.shape[2] == 3 and torch.equal(sk[:, :, :2], pk) and torch.equal(sv[:, :, :2], pv)
    assert torch.equal(sk[:, :, 2:], ek) and torch.equal(sv[:, :, 2:], ev)
    other = torch.randn_like(sk[:, :, 2:])
    moved = (torch.cat([sk[:, :, :2], other], 2), torch.cat([sv[:, :, :2], other], 2))
    with torch.no_grad():
        assert torch.equal(mot.translator(sk, sv).keys, mot.translator(*moved).keys)  # map still zero: experts only
        for proj in (mot.translator.linear.key_proj, mot.translator.linear.value_proj):
            proj.weight.normal_()
        assert not torch.allclose(mot.translator(sk, sv).keys, mot.translator(*moved).keys)  # the map reads them
    folder = save_checkpoint(mot, tmp_path / "extra")
    loaded, config = load_checkpoint(folder)
    assert config["translator"]["linear_extra_layers"] == [0] and loaded.input_layers == (2, 3, 0)
    with torch.no_grad():
        assert close(loaded.translator(sk, sv).values, mot.translator(sk, sv).values)
    for bad, match in (((2,), "outside the channel list"), ((9,), "outside the channel list"),
                       ((1, 1), "distinct")):
        with pytest.raises(ConfigError, match=match):
            MoT.build(source.spec, target.spec, channels, variant="linear", linear_extra_layers=bad)
    with pytest.raises(ConfigError, match="linear map only"):
        MoT.build(source.spec, target.spec, channels, linear_extra_layers=(0,))  # no linear path to read them


@pytest.mark.parametrize("dims", [0, 6])
def test_a_bank_with_extra_layers_has_its_own_key_and_a_map_of_them_is_recovered(dims, tmp_path):
    """The bank of a map with extra layers stores them (another key; a bank without keeps the key it always had),
    and a map that reads them recovers a target that depends on them, which the window alone cannot (the extra layers
    unprojected, or projected on the principal axes of extra features of rank 6); it saves and loads with its axes."""
    import hashlib
    from dataclasses import asdict

    from mot_viz.train.bank import BANK_VERSION, bank_key

    source, target = _pair()
    channels = Channels((2, 3), (2, 3))
    plain = MoT.build(source.spec, target.spec, channels, variant="linear")
    extra = MoT.build(source.spec, target.spec, channels, variant="linear", linear_extra_layers=(0, 1))
    ident = {"version": BANK_VERSION, "bank": asdict(SMALL_BANK), "source": source.spec.fingerprint,
             "target": target.spec.fingerprint, "channels": channels.to_json(), "key_space": "post_rope"}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    assert bank_key(plain, SMALL_BANK).endswith(digest) and bank_key(extra, SMALL_BANK) != bank_key(plain, SMALL_BANK)
    bank = build_bank(extra, source, target, SMALL_BANK, root=tmp_path, progress=False)
    assert bank.source_keys.shape[1] == 4 and bank.manifest["linear_extra_layers"] == [0, 1]

    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([30, 45, 25, 40, 35, 50, 30, 45, 40, 35])
    n, h_s, h_t = int(lengths.sum()), source.spec.kv_hidden, target.spec.kv_hidden
    keys, values = torch.randn(n, 4, h_s, generator=g), torch.randn(n, 4, h_s, generator=g)
    if dims:  # the extra layers' K and V span 6 directions
        low = torch.randn(n, dims, generator=g) @ torch.randn(dims, 2 * 2 * h_s, generator=g)
        keys[:, 2:], values[:, 2:] = low[:, : 2 * h_s].view(n, 2, h_s), low[:, 2 * h_s:].view(n, 2, h_s)
    a, b = torch.randn(2 * 4 * h_s, 2 * h_t, generator=g), torch.randn(2 * 4 * h_s, 2 * h_t, generator=g)
    x = torch.cat([keys.flatten(1), values.flatten(1)], 1)
    synthetic = Bank(keys, values, (x @ a).view(n, 2, h_t), (x @ b).view(n, 2, h_t), torch.zeros(n, dtype=torch.long),
                     lengths)
    window_only = Bank(keys[:, :2], values[:, :2], synthetic.target_keys, synthetic.target_values,
                       synthetic.target_ids, lengths)
    best = lambda report: min(report["val_mse_k"].values()) + min(report["val_mse_v"].values())
    mapped = MoT.build(source.spec, target.spec, channels, variant="linear", linear_extra_layers=(0, 1),
                       linear_extra_dims=dims, linear_previous=1, linear_previous_dims=4)
    assert best(fit_linear(mapped, synthetic)) < 1e-3 * best(fit_linear(plain, window_only))
    assert (mapped.translator.linear.extra_basis is not None) == bool(dims)
    loaded, _ = load_checkpoint(save_checkpoint(mapped, tmp_path / "mapped"))
    sk, sv, _, _ = synthetic.context(synthetic.num_contexts - 1)
    with torch.no_grad():
        assert close(loaded.translator(sk, sv).keys, mapped.translator(sk, sv).keys)
    with pytest.raises(ConfigError, match="give the layers too"):
        MoT.build(source.spec, target.spec, channels, variant="linear", linear_extra_dims=4)


def test_a_bank_stage_with_a_fixed_map_runs_the_map_once_per_context(tmp_path):
    """With the fitted map kept fixed (fit.trainable_parameters), the bank stage computes the linear path once over
    every whole context, and a crop's loss from those rows equals the loss of running the map on the crop (no earlier
    tokens read): the same value, not a step-by-step rerun of the map."""
    from mot_viz.train.fit import _crops, linear_path_rows, trainable_parameters

    source, target = _pair()
    channels = Channels((2, 3), (2, 3))
    mixture = MoT.build(source.spec, target.spec, channels, dim=16, heads=2, num_experts=2, top_k=1,
                        linear_residual=True, linear_extra_layers=(1,))
    bank = build_bank(mixture, source, target, SMALL_BANK, root=tmp_path, progress=False)
    fit_linear(mixture, bank)
    rows = linear_path_rows(mixture, bank)
    crop = _crops(bank, [0, 1], 8, torch.Generator().manual_seed(0), rows)
    assert len(crop) == 6 and crop[4].shape == crop[2].shape
    assert torch.equal(bank_loss(mixture, *crop)[0], bank_loss(mixture, *crop[:4])[0])  # per-token map: same rows
    calls = []
    mixture.translator.linear.register_forward_hook(lambda *args: calls.append(1))
    params = trainable_parameters(mixture)
    steps, val = 5, bank.split()[1]
    bank_stage(mixture, bank, steps=steps, lr=1e-3, batch=2, crop=8, warmup=1, log_every=steps, progress=False,
               params=params)
    assert len(calls) == bank.num_contexts + len(val)  # the precomputation, then one validation; no step reran it


def test_fidelity_verdicts_name_no_structure_the_mean_vector_and_the_linear_map():
    """The Per-layer page's warnings: no token structure, more error than the mean vector, behind the linear map."""
    import pandas as pd

    from mot_viz.train.window_fidelity import fidelity_verdicts

    def row(candidate, cent, rel):
        return {"candidate": candidate, "centered_cos_k": cent, "centered_cos_v": cent, "rel_err_k": rel,
                "rel_err_v": rel}

    good = pd.DataFrame([row("translator", 0.85, 0.3), row("mean vector", 0.0, 0.7), row("linear", 0.84, 0.31)])
    assert fidelity_verdicts(good) == []
    flat = pd.DataFrame([row("translator", 0.02, 0.9), row("mean vector", 0.0, 0.7)])
    messages = fidelity_verdicts(flat)
    assert sum("no token structure" in m for m in messages) == 2 and sum("mean vector" in m for m in messages) == 2
    behind = pd.DataFrame([row("translator", 0.849, 0.3), row("mean vector", 0.0, 0.7), row("linear", 0.85, 0.3)])
    assert fidelity_verdicts(behind) == [
        "On this context the closed-form linear map is closer to native than the translator (centered cosine, window "
        "mean: K 0.8490 vs 0.8500, V 0.8490 vs 0.8500): what the trained parts add does not help here."]
    assert fidelity_verdicts(behind.replace({"translator": "linear", "linear": "translator"}), "linear") == []
