"""Where models and translators run: the device choice, and a translator whose device or dtype differs from the
models' (a float32 checkpoint beside bfloat16 models, a CPU-fitted translator beside models elsewhere)."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from mot_viz.engine.channels import Channels
from mot_viz.engine.checkpoint import load_checkpoint, save_checkpoint
from mot_viz.engine.controls import random_control_window
from mot_viz.engine.models import DEVICE_VARIABLE, load_model, model_device
from mot_viz.engine.mot import MoT, ReplayConfig, translate
from mot_viz.errors import ModelLoadError

TEXT = "the quick brown fox jumps over the lazy dog and runs far away"


def test_the_device_comes_from_the_argument_then_the_environment(monkeypatch):
    monkeypatch.delenv(DEVICE_VARIABLE, raising=False)
    assert model_device() == torch.device("cpu")
    monkeypatch.setenv(DEVICE_VARIABLE, "cpu")
    assert model_device() == torch.device("cpu")
    monkeypatch.setenv(DEVICE_VARIABLE, "no-such-device")
    with pytest.raises(ModelLoadError, match=f"from {DEVICE_VARIABLE}.*cpu, cuda or cuda:N"):
        model_device()
    with pytest.raises(ModelLoadError, match=f"from {DEVICE_VARIABLE}"):  # checked before any model is read
        load_model("smollm2-135m")
    assert model_device("cpu") == torch.device("cpu")  # the argument wins over the environment
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="sees no CUDA device: leave it unset to run on the CPU"):
            model_device("cuda")


def test_a_float32_translator_translates_for_bfloat16_models(tmp_path):
    """The translator reads the models' K/V in its own dtype; the replay receives them in the models' dtype."""
    source, target = tiny_model("llama", layers=4, seed=1), tiny_model("gemma3_text", layers=4, bos=True)
    torch.manual_seed(0)
    mot = MoT.build(source.spec, target.spec, Channels((2, 3), (2, 3)), ReplayConfig(4, 1), variant="mot",
                    dim=16, heads=2, key_space="pre_rope")
    reference = translate(mot.eval(), source, target, TEXT)
    path = save_checkpoint(mot, tmp_path / "ckpt", training={})
    for lm in (source, target):
        lm.model.to(torch.bfloat16)
    loaded, _ = load_checkpoint(path, source, target)
    assert next(loaded.translator.parameters()).dtype == torch.float32
    tr = translate(loaded, source, target, TEXT)
    assert tr.mixed_kv[3][0].dtype == torch.bfloat16 and tr.translated.keys.dtype == torch.float32
    cos = torch.nn.functional.cosine_similarity(tr.translated.values.flatten(), reference.translated.values.flatten(),
                                                dim=0)
    assert cos > 0.99  # the same translation, from bfloat16 K/V
    k, v = random_control_window(*tr.native_window_blocks(loaded.channels), tr.translated.keys, tr.translated.values, 0)
    assert torch.isfinite(k.float()).all() and torch.isfinite(v.float()).all()
