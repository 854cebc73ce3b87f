"""Checkpoints (save/load, refusal of wrong or unsafe files) and model loading errors."""

from __future__ import annotations

import copy
import os
import time
import json
import pickle

import pytest
import torch

from conftest import FAMILIES, tiny_model
from mot_viz.engine import hf
from mot_viz.engine.channels import Channels
from mot_viz.engine.checkpoint import WEIGHTS_FILE, load_checkpoint, read_config, save_checkpoint
from mot_viz.engine.model_files import SUPPORTED_MODEL_TYPES
from mot_viz.engine.models import load_model
from mot_viz.engine.mot import MoT
from mot_viz.errors import CheckpointError, ModelLoadError
from tolerance import close


@pytest.fixture(scope="module")
def pair():
    return tiny_model("llama", vocab_size=280, seed=1), tiny_model("gemma3_text")


def _mot(pair, **kw):
    source, target = pair
    torch.manual_seed(0)
    return MoT.build(source.spec, target.spec, Channels((2, 3), (2, 3)), dim=16, heads=2, **kw)


@pytest.mark.parametrize("variant", ["mot", "single"])
def test_round_trip_is_exact(pair, tmp_path, variant):
    mot = _mot(pair, variant=variant)
    save_checkpoint(mot, tmp_path / "ck", training={"steps": 3}, metrics={"squad_f1": 0.5})
    loaded, config = load_checkpoint(tmp_path / "ck", *pair)
    assert config["training"] == {"steps": 3} and config["metrics"] == {"squad_f1": 0.5}
    assert loaded.channels == mot.channels and loaded.translator.config == mot.translator.config
    for (n1, p1), (n2, p2) in zip(mot.translator.state_dict().items(), loaded.translator.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    assert not loaded.training


def test_fp16_storage_round_trips_to_the_rounded_weights(pair, tmp_path):
    mot = _mot(pair)
    save_checkpoint(mot, tmp_path / "ck", dtype=torch.float16)
    loaded, _ = load_checkpoint(tmp_path / "ck")
    for p1, p2 in zip(mot.translator.state_dict().values(), loaded.translator.state_dict().values()):
        assert torch.equal(p1.half().float(), p2)


def test_checkpoint_for_another_pair_is_refused(pair, tmp_path):
    save_checkpoint(_mot(pair), tmp_path / "ck")
    other = tiny_model("qwen2")
    with pytest.raises(CheckpointError, match="made for target model 'tiny-gemma3_text-300-4'"):
        load_checkpoint(tmp_path / "ck", pair[0], other)


def test_corrupt_truncated_incomplete_and_pickled_checkpoints_are_refused(pair, tmp_path):
    ck = save_checkpoint(_mot(pair), tmp_path / "ck")
    weights = ck / WEIGHTS_FILE
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(ck)
    weights.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(ck)
    # a missing tensor: rewrite the file without one key
    from safetensors.torch import save_file

    state = {k: v for k, v in _mot(pair).translator.state_dict().items() if "router" not in k}
    save_file(state, str(weights))
    with pytest.raises(CheckpointError, match="missing"):
        load_checkpoint(ck)
    # a folder with only a pickle
    pk = tmp_path / "pickled"
    pk.mkdir()
    (pk / "translator.pt").write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(CheckpointError, match="never loads pickles"):
        load_checkpoint(pk)
    # a config that is not ours
    (ck / "config.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(CheckpointError, match="lacks"):
        read_config(ck)


def test_unknown_names_and_offline_hub_ids_raise_one_clear_error(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # as on a machine without the Hub
    for name in ("no-such-model-anywhere", "gpt2", "./missing/folder", "/tmp/nothing.gguf"):
        with pytest.raises(ModelLoadError) as err:
            load_model(name)
        message = str(err.value)
        assert "Bundled models that work offline" in message and "smollm2-135m" in message, name
        assert all(f in message for f in SUPPORTED_MODEL_TYPES)


def test_unsupported_architecture_is_refused(tmp_path):
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="'bert' model, which MoT Viz does not support"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_loads_from_a_local_folder_with_its_geometry(family, tmp_path):
    tiny = tiny_model(family)
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    spec = loaded.spec
    assert spec.model_type == family and spec.num_layers == 4
    geometry = {k: v for k, v in spec.to_json().items() if k not in ("name", "fingerprint")}
    assert geometry == {k: v for k, v in tiny.spec.to_json().items() if k not in ("name", "fingerprint")}
    assert spec.fingerprint == load_model(str(tmp_path)).spec.fingerprint  # stable across loads
    k = hf.run(loaded.model, torch.tensor([[3, 4, 5]])).kv[0][0]  # (1, n_kv, 3, d_h) as the model computes it
    assert (k.shape[1], k.shape[3]) == (spec.num_kv_heads, spec.head_dim)
    assert loaded.model.config._attn_implementation == "mot_viz"
    assert not any(p.requires_grad for p in loaded.model.parameters())
    if family == "gemma3_text":
        assert spec.sliding_window == 8 and spec.sliding_layers == (0, 1, 3)
    ids = torch.tensor([[3, 4, 5]])
    assert close(loaded.model(ids).logits, tiny.model(ids).logits, rtol=1e-5)


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("name, tuned", [("tiny-qwen-instruct", True), ("org/Model-2b-it", True),
                                         ("tiny-base", False), ("gemma3-270m", False), ("smollm2-135m", True)])
def test_chat_frame_comes_from_the_tokenizer_template_of_chat_tuned_models_only(name, tuned):
    lm = tiny_model("llama", name=name)
    assert lm.chat_frame is None  # no chat template: plain prompts whatever the name says
    lm = tiny_model("llama", name=name)
    lm.tokenizer = copy.deepcopy(lm.tokenizer)  # tiny tokenizers are shared: never change one in place
    lm.tokenizer.chat_template = CHATML
    if not tuned:  # a base model keeps the method's plain prompts even when its tokenizer has a template
        assert lm.chat_frame is None
        return
    head, foot = lm.chat_frame
    assert head == "<|im_start|>user\n" and foot == "<|im_end|>\n<|im_start|>assistant\n"


def _mixture_on_linear(pair, tmp_path, dtype=torch.float32):
    """A linear checkpoint, and a linear-initialised mixture whose fixed linear path equals its weights."""
    linear = _mot(pair, variant="linear")
    with torch.no_grad():
        for p in linear.translator.parameters():
            p.normal_()
    save_checkpoint(linear, tmp_path / "lin", dtype=dtype)
    mix = _mot(pair, linear_residual=True)
    shared = {k: v for k, v in linear.translator.state_dict().items() if k.startswith("linear.")}
    assert shared and set(shared) < set(mix.translator.state_dict())
    mix.translator.load_state_dict(shared, strict=False)
    return mix


def test_a_shared_linear_path_is_stored_once_and_loads_exactly(pair, tmp_path):
    import io
    import zipfile

    from mot_viz.engine.checkpoint import checkpoint_zip

    mix = _mixture_on_linear(pair, tmp_path)
    save_checkpoint(mix, tmp_path / "full")
    save_checkpoint(mix, tmp_path / "mix", shared_linear=tmp_path / "lin")
    config = read_config(tmp_path / "mix")
    assert config["shared_linear"]["checkpoint"] == "../lin"
    full_bytes, own_bytes = ((tmp_path / n / WEIGHTS_FILE).stat().st_size for n in ("full", "mix"))
    assert own_bytes < full_bytes - (tmp_path / "lin" / WEIGHTS_FILE).stat().st_size * 0.9
    loaded, _ = load_checkpoint(tmp_path / "mix", *pair)
    expected = mix.translator.state_dict()
    assert all(torch.equal(expected[k], v) for k, v in loaded.translator.state_dict().items())
    # the downloadable zip is self-contained: it loads without the linear checkpoint beside it
    zipfile.ZipFile(io.BytesIO(checkpoint_zip(tmp_path / "mix"))).extractall(tmp_path / "download")
    alone, zipped_config = load_checkpoint(tmp_path / "download" / "mix", *pair)
    assert "shared_linear" not in zipped_config
    assert all(torch.equal(expected[k], v) for k, v in alone.translator.state_dict().items())


def test_a_missing_changed_or_different_shared_linear_path_is_refused(pair, tmp_path):
    from mot_viz.train.export import export_run

    mix = _mixture_on_linear(pair, tmp_path, dtype=torch.float16)
    with pytest.raises(CheckpointError, match="not the one stored"):  # float32 weights vs the fp16 linear file
        save_checkpoint(mix, tmp_path / "mix", shared_linear=tmp_path / "lin")
    assert not (tmp_path / "mix").exists() and not list(tmp_path.glob("mix.tmp-*"))
    with torch.no_grad():  # one fp16 ulp off (a repeated fit's rounding) is still the same map; two are not
        weight = mix.translator.linear.key_proj.weight
        original = weight.clone()
        half = weight.half()
        weight.copy_(half.nextafter(torch.full_like(half, float("inf"))).float())
        one_ulp = torch.finfo(torch.float16).eps * weight.abs()
        save_checkpoint(mix, tmp_path / "near", dtype=torch.float16, shared_linear=tmp_path / "lin")
        assert 0 < read_config(tmp_path / "near")["shared_linear"]["max_abs_difference"]
        weight.add_(3 * one_ulp)
        with pytest.raises(CheckpointError, match="not the one stored"):
            save_checkpoint(mix, tmp_path / "far", dtype=torch.float16, shared_linear=tmp_path / "lin")
        weight.copy_(original)
    save_checkpoint(mix, tmp_path / "mix")
    (tmp_path / "mix" / "log.jsonl").write_text('{"step": 1}\n')
    export_run(tmp_path / "mix", tmp_path / "mix", shared_linear=tmp_path / "lin")  # re-saved in place, fp16, shared
    assert (tmp_path / "mix" / "log.jsonl").read_text() == '{"step": 1}\n'
    load_checkpoint(tmp_path / "mix", *pair)
    weights = tmp_path / "lin" / WEIGHTS_FILE
    original = weights.read_bytes()
    weights.write_bytes(original[:-2] + bytes(2))  # the same size, other values
    with pytest.raises(CheckpointError, match="changed since"):
        load_checkpoint(tmp_path / "mix")
    weights.write_bytes(original)
    (tmp_path / "lin").rename(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match="missing. Keep the two folders side by side"):
        load_checkpoint(tmp_path / "mix")


def _point_shared_linear(folder, at):
    """Edit folder's config.json so its shared linear path names the checkpoint `at` (with at's true SHA-256), as a
    hand edit or a copy between machines can."""
    from mot_viz.engine.checkpoint import weights_sha256

    config = read_config(folder)
    config["shared_linear"] = {"checkpoint": os.path.relpath(at, folder), "sha256": weights_sha256(at)}
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("case", ["itself", "each other", "chain"])
def test_a_shared_linear_path_that_loops_or_chains_is_refused_at_once(pair, tmp_path, case):
    mix = _mixture_on_linear(pair, tmp_path)
    a = save_checkpoint(mix, tmp_path / "a", shared_linear=tmp_path / "lin")
    b = save_checkpoint(mix, tmp_path / "b", shared_linear=tmp_path / "lin")
    if case == "itself":
        _point_shared_linear(a, a)
    elif case == "each other":
        _point_shared_linear(a, b)
        _point_shared_linear(b, a)
    else:  # a -> b -> lin: b is loadable, but a's linear path is not stored where a names it
        _point_shared_linear(a, b)
    started = time.perf_counter()
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(a, *pair)
    assert time.perf_counter() - started < 5  # not a RecursionError after following the loop for ~20 s
    message = str(err.value)
    expected = {"itself": "itself: a cycle", "each other": "names it back: a cycle", "chain": "a chain"}[case]
    assert expected in message and "must be stored in full" in message
    assert "linear checkpoint it was initialised from" in message
    if case == "chain":
        load_checkpoint(b, *pair)  # the checkpoint it names is sound on its own
    with pytest.raises(CheckpointError, match="cannot store its linear path in itself"):  # never written either
        save_checkpoint(mix, tmp_path / "lin", shared_linear=tmp_path / "lin")
    load_checkpoint(tmp_path / "lin")  # the refused save left the linear checkpoint whole
