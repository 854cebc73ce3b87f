"""A full-depth map without replay (method.md §15): every target layer's K/V translated, used as the cache as it is."""

from __future__ import annotations

import pytest
import torch

from conftest import FAMILIES, tiny_model
from mot_viz.engine import hf
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.mot import MoT, target_context_ids, translate
from mot_viz.engine.replay_config import replay_mode
from mot_viz.engine.prompts import QAExample
from mot_viz.engine.testing import load_test_model, write_test_checkpoints
from mot_viz.errors import ConfigError
from mot_viz.eval import answers, evaluate
from mot_viz.train.bank import Bank, context_blocks
from mot_viz.train.fit import fit_linear
from mot_viz.train.quickfit import QuickFitConfig, fit_pair, quickfit_channels

DIRECT = QuickFitConfig(tokens=256, min_context_tokens=16, max_context_tokens=48, direct=True)
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
    mot, config = load_checkpoint(fit_pair(model, model, DIRECT), model, model)
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


def test_replay_none_needs_a_full_depth_window(tmp_path):
    paths = write_test_checkpoints(tmp_path)
    source, target = tiny_model("llama", layers=4), tiny_model("gemma3_text", layers=6)
    with pytest.raises(ConfigError, match="source has 4"):
        quickfit_channels(source, target, QuickFitConfig(direct=True))
    src, tgt = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot = load_checkpoint(paths["smollm2-to-gemma3-linear"], src, tgt)[0]
    mot.replay = replay_mode(mot.replay, "none")
    with pytest.raises(ConfigError, match="full-depth map"):
        translate(mot, src, tgt, TEXT)


def test_the_direct_condition_answers_from_the_direct_map(private_cache):
    source, target = tiny_model("qwen2", layers=6, seed=2), tiny_model("gemma3_text", layers=4, bos=True)
    direct = load_checkpoint(fit_pair(source, target, DIRECT), source, target)[0]
    window = load_checkpoint(fit_pair(source, target, QuickFitConfig(tokens=256, min_context_tokens=16,
                                                                     max_context_tokens=48)), source, target)[0]
    example = QAExample(id="0", dataset="free", context=TEXT, question="who slept?", answers=("the dog",))
    built = answers.condition_caches(window, source, target, example, conditions=("native", "mot", "direct"),
                                     direct=direct)
    native = built.kv["native"]
    assert [k.shape for k, _ in built.kv["direct"]] == [k.shape for k, _ in native] and built.seconds["direct"] > 0
    with pytest.raises(ConfigError, match="--direct"):
        answers.condition_caches(window, source, target, example, conditions=("native", "direct"))


@pytest.mark.parametrize("flags, message", [
    (["--conditions", "native", "direct"], "the 'direct' condition needs --direct CHECKPOINT"),
    (["--direct", "DIRECT"], "add direct to --conditions"),
    (["--conditions", "direct", "--direct", "WINDOW"], "needs a full-depth map without replay"),
    (["--replay", "none"], "--replay none uses the translated K/V as the whole cache"),
])
def test_the_direct_condition_is_refused_in_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch, flags,
                                                                             message):
    paths = write_test_checkpoints(tmp_path)
    monkeypatch.setattr(evaluate, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    named = {"DIRECT": str(paths["smollm2-to-gemma3"]), "WINDOW": str(paths["smollm2-to-gemma3-linear"])}
    argv = ["--checkpoint", str(paths["smollm2-to-gemma3"]), "--datasets", "squad", "--n", "1",
            "--out", str(tmp_path / "out"), *[named.get(f, f) for f in flags]]
    assert evaluate.main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
