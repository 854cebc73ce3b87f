"""Synthetic models (mot_viz.engine.synthetic): the shipped architectures at their published sizes, built at reduced
depth here; the shared id stream and its identity alignment; a translator of a recipe's shape; one-line refusals."""

from __future__ import annotations

import json
import re

import pytest
import torch

from mot_viz.engine import synthetic
from mot_viz.engine.alignment import decode, encode
from mot_viz.engine.checkpoint import load_checkpoint, save_checkpoint
from mot_viz.engine.models import load_model, model_geometry, model_spec
from mot_viz.engine.mot import translate
from mot_viz.train.synthetic_checkpoint import main as write_synthetic_checkpoint
from mot_viz.engine.testing import load_test_model, synthetic_mot
from mot_viz.errors import CheckpointError, ModelLoadError
from mot_viz.train.config import parse_args

# Parameters of the published models (their model cards: 1.24B, 1.54B, 8.03B, 7.62B), tied embeddings counted once.
PUBLISHED_PARAMETERS = {"llama3.2-1b": 1_235_814_400, "qwen2.5-1.5b": 1_543_714_304,
                        "llama3.1-8b": 8_030_261_248, "qwen2.5-7b": 7_615_616_512}
RECIPE = "configs/smollm2-to-gemma3.json"


@pytest.fixture(scope="module")
def bundled_pair():
    """The synthetic bundled pair at two layers each (every other number as the bundled models')."""
    return load_model("synthetic:smollm2-135m@2"), load_model("synthetic:gemma3-270m@2")


@pytest.mark.parametrize("arch", sorted(PUBLISHED_PARAMETERS))
def test_real_size_architectures_have_the_published_size_and_geometry(arch):
    name = synthetic.SYNTHETIC_PREFIX + arch
    assert synthetic.parameter_count(name) == PUBLISHED_PARAMETERS[arch]
    numbers = synthetic.architecture(arch)["config"]
    config = synthetic.hf_config(name + "@1")  # reduced depth: one layer, every other number as published
    spec = model_spec(name + "@1", config, synthetic.synthetic_tokenizer(config.vocab_size, None))
    heads, kv = numbers["num_attention_heads"], numbers["num_key_value_heads"]
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.hidden_size, spec.vocab_size) == (
        1, heads, kv, numbers["hidden_size"], numbers["vocab_size"])
    assert spec.head_dim == numbers.get("head_dim", numbers["hidden_size"] // heads)
    assert model_geometry(name) == (numbers["num_hidden_layers"], spec.kv_hidden)  # what a CLI checks before loading


def test_the_1b_pair_loads_at_reduced_depth_and_translates_with_an_identity_alignment():
    source, target = load_model("synthetic:llama3.2-1b@2"), load_model("synthetic:qwen2.5-1.5b@3")
    assert (source.spec.num_layers, target.spec.num_layers) == (2, 3)
    assert (source.spec.kv_hidden, target.spec.kv_hidden) == (8 * 64, 2 * 128)
    recipe = parse_args(["--config", RECIPE])[0]
    mot = synthetic_mot(source, target, recipe)
    assert mot.translator.config.variant == recipe.variant and mot.translator.config.dim == recipe.translator_dim
    text = synthetic.synthetic_text(24, synthetic.shared_vocab(source.spec.vocab_size, target.spec.vocab_size))
    tr = translate(mot, source, target, text)
    assert tr.source.alignment.identity
    assert tr.target_ids[0].tolist() == [int(w) for w in text.split()]
    assert all(torch.isfinite(t).all() for kv in tr.mixed_kv for t in kv)
    # the translated window is not the native one, and the layers below it replay exactly as the native prefill
    first = mot.channels.target_layers[0]
    assert first > 0 and torch.equal(tr.mixed_kv[first - 1][0], tr.native_kv[first - 1][0])
    assert not torch.allclose(tr.injected_kv[0][0], tr.native_kv[first][0][:, :, tr.prefix_len:])


def test_the_same_name_gives_the_same_weights_and_the_bundled_pair_keeps_its_geometry(bundled_pair):
    other, a = bundled_pair
    b = load_model("synthetic:gemma3-270m@2")
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    assert other.spec.fingerprint != a.spec.fingerprint
    # like Gemma, the synthetic Gemma's caches start with BOS; SmolLM2's do not
    assert a.prefix_ids == [2] and other.prefix_ids == []
    assert (a.spec.sliding_window, a.spec.num_kv_heads, a.spec.head_dim) == (512, 1, 256)
    # the family's own initialisation: RoPE's frequencies are the ones the class computes itself
    from transformers import AutoModelForCausalLM

    stock = AutoModelForCausalLM.from_config(synthetic.hf_config("synthetic:gemma3-270m@2"))
    for name, buffer in stock.named_buffers():
        assert torch.equal(dict(a.model.named_buffers())[name], buffer), name


def test_the_id_stream_reads_back_through_every_synthetic_tokenizer():
    text = synthetic.synthetic_text(2000, 49152, seed=3)
    ids = [int(w) for w in text.split()]
    assert min(ids) >= synthetic.STREAM_START and max(ids) < 49152
    assert text == synthetic.synthetic_text(2000, 49152, seed=3) != synthetic.synthetic_text(2000, 49152, seed=4)
    for vocab, bos in ((49152, None), (262144, 2)):
        tok = synthetic.synthetic_tokenizer(vocab, bos)
        assert encode(tok, text) == ids  # no id is split (special tokens are words, never numbers)
        assert decode(tok, ids) == text


def test_bad_synthetic_input_is_one_line_before_loading(monkeypatch, tmp_path):
    with pytest.raises(ModelLoadError) as unknown:
        load_model("synthetic:llama9-70b")
    assert "synthetic:llama3.2-1b" in str(unknown.value) and "\n" not in str(unknown.value)
    with pytest.raises(ModelLoadError, match="has 1 to 16"):
        load_model("synthetic:llama3.2-1b@40")
    # a pair too large for the device's free memory, said with the size it needs before anything is allocated
    monkeypatch.setattr(synthetic, "available_bytes", lambda device: 4 * 2**30)
    pair = ["synthetic:llama3.1-8b", "synthetic:qwen2.5-7b"]
    needed = sum(PUBLISHED_PARAMETERS[n.split(":")[1]] for n in pair) * 4 / 2**30
    with pytest.raises(ModelLoadError) as too_large:
        synthetic.check_fits(pair, torch.device("cpu"))
    message = str(too_large.value)
    assert f"{needed:.1f} GiB" in message and "4.0 GiB free" in message and "\n" not in message
    with pytest.raises(ModelLoadError, match="GiB free"):
        load_model("synthetic:llama3.1-8b")
    synthetic.check_fits(["smollm2-135m", "gpt2"], torch.device("cpu"))  # real models are not counted


def test_a_checkpoint_of_another_pair_is_refused_in_one_line(bundled_pair, tmp_path):
    source, target = bundled_pair
    mot = synthetic_mot(source, target, parse_args(["--config", RECIPE])[0])
    path = save_checkpoint(mot, tmp_path / "synthetic-pair")
    load_checkpoint(path, source, target)  # its own pair loads it
    real_source, real_target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path, real_source, real_target)
    assert "synthetic source model 'synthetic:smollm2-135m@2'" in str(refused.value)
    assert "\n" not in str(refused.value)
    deeper = load_model("synthetic:gemma3-270m@3")
    with pytest.raises(CheckpointError, match="fingerprint"):
        load_checkpoint(path, source, deeper)
    assert json.loads((path / "config.json").read_text())["target"]["name"] == "synthetic:gemma3-270m@2"


def test_the_command_writes_a_synthetic_pairs_translator_that_loads_by_its_names(bundled_pair, tmp_path, capsys):
    source, target = bundled_pair
    out = tmp_path / "synthetic-checkpoint"
    assert write_synthetic_checkpoint(["--source", source.spec.name, "--target", target.spec.name, "--recipe", RECIPE,
                                       "--seed", "3", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert "no quality" in config["metrics"]["note"] and "no quality" in capsys.readouterr().out
    loaded = load_checkpoint(out, load_model(config["source"]["name"]), target)[0]  # as the evaluator loads it
    expected = synthetic_mot(source, target, parse_args(["--config", RECIPE])[0], seed=3)
    assert all(torch.equal(a, b) for a, b in zip(loaded.translator.state_dict().values(),
                                                 expected.translator.state_dict().values()))
    assert write_synthetic_checkpoint(["--source", "smollm2-135m", "--target", target.spec.name,
                                       "--out", str(tmp_path / "refused")]) == 2
    assert "both be synthetic" in capsys.readouterr().err and not (tmp_path / "refused").exists()


@pytest.mark.parametrize("name, words", [
    ("synthetic:llama3.2-1b\n", r"control character '\n'"),  # never another model with other weights
    ("synthetic:llama3.2-1b@" + "9" * 5000, "characters long"),
    ("synthetic:llama3.2-1b@" + "9" * 40, "40-digit number of layers"),
    ("synthetic:" + "a" * 100_000, "100,010 characters long"),
    ("synthetic:" + "a" * 300, "Unknown synthetic model 'synthetic:aaaa"),
])
def test_a_name_no_model_has_is_refused_as_text_in_one_line(name, words, monkeypatch):
    monkeypatch.setattr(synthetic, "build", lambda *a: pytest.fail("a model was built"))
    for load in (load_model, model_geometry):
        with pytest.raises(ModelLoadError, match=re.escape(words)) as refused:
            load(name)
        assert "\n" not in str(refused.value) and len(str(refused.value)) < 400


def test_a_pair_that_cannot_fit_is_refused_before_either_is_built(monkeypatch, tmp_path, capsys):
    """The source alone fits, the two do not: refused before the source is built (not after minutes of it)."""
    built = []
    monkeypatch.setattr(synthetic, "build", lambda name, *a: built.append(name) or pytest.fail("a model was built"))
    source_bytes = synthetic.parameter_count("synthetic:llama3.2-1b") * 4
    monkeypatch.setattr(synthetic, "available_bytes", lambda device: source_bytes + 2**20)
    out = tmp_path / "pair"
    assert write_synthetic_checkpoint(["--source", "synthetic:llama3.2-1b", "--target", "synthetic:qwen2.5-1.5b",
                                       "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "synthetic:llama3.2-1b and synthetic:qwen2.5-1.5b need" in err
    assert not built and not out.exists()


def test_the_default_recipe_is_the_checkouts_and_a_bad_one_names_recipe(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no configs/ here: the default comes from the checkout, not the working folder
    out = tmp_path / "ck"
    names = ["--source", "synthetic:smollm2-135m@1", "--target", "synthetic:gemma3-270m@1"]
    assert write_synthetic_checkpoint([*names, "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["training"]["recipe"] == RECIPE
    assert write_synthetic_checkpoint([*names, "--out", str(out)]) == 0  # its own checkpoint: replaced
    assert write_synthetic_checkpoint([*names, "--recipe", "nowhere.json", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "--recipe 'nowhere.json' cannot be read" in err and "--config" not in err


def _limits(root, cgroup: str, files: dict[str, str], status: str = "") -> None:
    """A fake /proc and /sys/fs/cgroup under root: the process's cgroup line(s) and its limit files."""
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text("MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n")  # 32 GiB free
    (root / "proc" / "self" / "cgroup").write_text(cgroup)
    (root / "proc" / "self" / "status").write_text(status)
    for rel, text in files.items():
        (root / "cgroup" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "cgroup" / rel).write_text(text)


@pytest.mark.parametrize("cgroup, files, expected", [
    ("0::/job\n", {"job/memory.max": f"{4 * 2**30}\n", "job/memory.current": f"{2**30}\n"}, 3 * 2**30),  # v2
    ("0::/a/b\n", {"a/b/memory.max": "max\n", "a/memory.max": f"{2 * 2**30}\n", "a/memory.current": "0\n"},
     2 * 2**30),  # v2, a limit above its own cgroup
    ("4:memory:/ctr\n0::/\n", {"memory/memory.limit_in_bytes": f"{5 * 2**30}\n",
                               "memory/memory.usage_in_bytes": f"{2**30}\n"}, 4 * 2**30),  # v1, mounted at its root
    ("4:memory:/\n", {"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 32 * 2**30),  # v1 unlimited
])
def test_the_cpus_room_honours_cgroup_limits(tmp_path, monkeypatch, cgroup, files, expected):
    _limits(tmp_path, cgroup, files)
    monkeypatch.setattr(synthetic, "PROC", tmp_path / "proc")
    monkeypatch.setattr(synthetic, "CGROUP", tmp_path / "cgroup")
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert synthetic.available_bytes(torch.device("cpu")) == expected


def test_the_cpus_room_honours_the_address_space_and_data_rlimits(tmp_path, monkeypatch):
    _limits(tmp_path, "0::/\n", {}, status="VmSize:\t 2097152 kB\nVmData:\t 1048576 kB\n")  # 2 GiB, 1 GiB in use
    monkeypatch.setattr(synthetic, "PROC", tmp_path / "proc")
    monkeypatch.setattr(synthetic, "CGROUP", tmp_path / "cgroup")
    import resource

    limits = {resource.RLIMIT_AS: 8 * 2**30, resource.RLIMIT_DATA: resource.RLIM_INFINITY}
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limits[which], resource.RLIM_INFINITY))
    assert synthetic.available_bytes(torch.device("cpu")) == 6 * 2**30
    limits[resource.RLIMIT_DATA] = 3 * 2**30
    assert synthetic.available_bytes(torch.device("cpu")) == 2 * 2**30
    with pytest.raises(ModelLoadError, match="2.0 GiB free for this process"):
        synthetic.check_fits(["synthetic:llama3.2-1b"], torch.device("cpu"))
