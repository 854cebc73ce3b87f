"""Hostile local paths and a damaged model cache: every failure is one ModelLoadError that names the fix,
and nothing unsafe (pickles, remote code, the current folder) is ever loaded."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch

import mot_viz.engine.model_files as model_files
import mot_viz.engine.models as models
from conftest import tiny_model
from mot_viz.engine.model_cache import MARKER, cache_dir, models_root
from mot_viz.errors import ModelLoadError


pytestmark = pytest.mark.usefixtures("private_cache")  # every test gets its own model cache


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama")
    tiny = tiny_model("llama")
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    return folder


def _refused(name: str, *fixes: str) -> ModelLoadError:
    with pytest.raises(ModelLoadError) as err:
        models.load_model(name)
    for fix in fixes:
        assert fix in str(err.value), (fix, str(err.value))
    return err.value


def _llama_config(folder: Path, **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1, **extra}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _no_converted_folders(cache: Path) -> bool:
    models_dir = cache / "models"
    return not models_dir.exists() or not [p for p in models_dir.iterdir() if p.is_dir()]


# --- names and paths ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["", "   ", "\t\n"])
def test_an_empty_name_never_loads_the_current_folder(name, tiny_folder, monkeypatch):
    monkeypatch.chdir(tiny_folder)  # a loadable model sits right here, and must not be picked up
    error = _refused(name, "No model name given", "current folder", "bundled name")
    assert error.__cause__ is None


def test_a_folder_without_config_json_says_what_a_model_folder_holds(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    _refused(str(tmp_path), "has no config.json", "save_pretrained", "safetensors")


def test_a_config_that_is_not_json_is_reported_as_such_not_as_a_hub_miss(tiny_folder, tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    for f in tiny_folder.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "config.json").write_text('{"model_type": "llama", ')  # truncated
    error = _refused(str(folder), "is not valid JSON", "config.json", "save")
    assert "Hub" not in str(error)


def test_a_config_that_is_json_but_not_an_object_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('["llama"]')
    _refused(str(tmp_path), "JSON list", "config.json")


def test_a_fake_gguf_is_refused_before_any_conversion(tmp_path, private_cache):
    fake = tmp_path / "model.gguf"
    fake.write_text("<html>404 Not Found</html>")
    _refused(str(fake), "not a GGUF file", "download it again")
    assert _no_converted_folders(private_cache)


def test_a_truncated_gguf_becomes_one_error_and_leaves_nothing_behind(tmp_path, private_cache):
    truncated = tmp_path / "cut.gguf"
    # a GGUF v3 header promising 5 tensors and 9 metadata entries, then the file ends
    truncated.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 5, 9) + b"\x07\x00")
    error = _refused(str(truncated), f"Cannot convert the GGUF model '{truncated}'", "truncated", "download it again")
    assert error.__cause__ is not None  # the parser's own exception is kept for debugging
    assert _no_converted_folders(private_cache)  # no converted, tmp or work folder
    assert not list((private_cache / "models").glob("*.tmp-*"))


def test_a_pickle_only_folder_is_refused_before_transformers_sees_it(tmp_path, monkeypatch):
    folder = _llama_config(tmp_path / "pickled")
    torch.save({"w": torch.zeros(2)}, folder / "pytorch_model.bin")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("a pickle was unpickled"))
    error = _refused(str(folder), "pickled weights only", "pytorch_model.bin", "safetensors",
                     "save_pretrained(folder, safe_serialization=True)")
    assert "weights_only" not in str(error)


@pytest.mark.parametrize("pickle_name", ["model.pt", "weights.pkl"])
def test_a_pickle_file_given_directly_is_refused(pickle_name, tmp_path, monkeypatch):
    path = tmp_path / pickle_name
    torch.save({"w": torch.zeros(2)}, path)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("a pickle was unpickled"))
    error = _refused(str(path), "pickled weights only", "safetensors")
    assert "weights_only" not in str(error)


def test_a_folder_asking_for_remote_code_is_refused_and_its_code_never_runs(tmp_path):
    folder = _llama_config(tmp_path / "remote", auto_map={"AutoConfig": "evil.EvilConfig"})
    sentinel = tmp_path / "ran"
    (folder / "evil.py").write_text(f"open({str(sentinel)!r}, 'w').write('x')\n")
    _refused(str(folder), "remote code", "auto_map", "trust_remote_code")
    assert not sentinel.exists()


@pytest.mark.parametrize("which", ["text file", "/etc/passwd"])
def test_an_existing_regular_file_is_not_called_missing(which, tmp_path):
    path = tmp_path / "README.txt" if which == "text file" else Path(which)
    if which == "text file":
        path.write_text("hello")
    elif not path.is_file():
        pytest.skip("no /etc/passwd here")
    error = _refused(str(path), "exists but is a file", "config.json", ".gguf")
    assert "does not exist" not in str(error)


def test_an_unsupported_model_type_is_refused_from_its_config(tmp_path):
    folder = tmp_path / "mamba"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    _refused(str(folder), "'mamba' model, which MoT Viz does not support", "Supported families")


def test_a_folder_with_config_but_no_weights_names_safetensors(tmp_path):
    _refused(str(_llama_config(tmp_path / "empty")), "no *.safetensors weights", "safe_serialization=True")


def test_a_transformers_failure_becomes_a_model_load_error_naming_the_path(tiny_folder, tmp_path):
    folder = tmp_path / "corrupt"
    folder.mkdir()
    for f in tiny_folder.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!")
    error = _refused(str(folder), f"from '{folder}'", "save_pretrained")
    assert error.__cause__ is not None and not isinstance(error.__cause__, ModelLoadError)


def test_a_good_folder_still_loads_under_its_own_name(tiny_folder):
    loaded = models.load_model(str(tiny_folder))
    assert loaded.spec.name == str(tiny_folder) and loaded.spec.model_type == "llama"


# --- the model cache ---------------------------------------------------------------------------------------------

def test_a_cache_variable_pointing_at_a_file_is_refused(tmp_path, monkeypatch):
    not_a_folder = tmp_path / "cache-file"
    not_a_folder.write_text("")
    monkeypatch.setenv("MOT_VIZ_CACHE", str(not_a_folder))
    for call in (cache_dir, lambda: model_files.bundled_model_dir("smollm2-135m"), lambda: models.load_model("gemma3-270m")):
        with pytest.raises(ModelLoadError, match="MOT_VIZ_CACHE points to .* is a file, not a folder") as err:
            call()
        assert "writable folder" in str(err.value) and "export MOT_VIZ_CACHE=" in str(err.value)
    assert not_a_folder.read_text() == ""


def test_an_unwritable_cache_folder_is_refused(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    monkeypatch.setenv("MOT_VIZ_CACHE", str(locked))
    if os.geteuid() == 0:  # root writes anywhere; act as the user this protects
        monkeypatch.setattr(os, "access", lambda path, mode: False)
    try:
        with pytest.raises(ModelLoadError, match="MOT_VIZ_CACHE points to .* is not writable") as err:
            model_files.bundled_model_dir("smollm2-135m")
        assert "set MOT_VIZ_CACHE to a folder you can write to" in str(err.value)
    finally:
        locked.chmod(0o755)
    assert not (locked / "models").exists()


class FakeConversion:
    """A stand-in for the GGUF conversion: writes a small folder atomically and counts its calls."""

    def __init__(self, monkeypatch):
        self.calls = 0
        monkeypatch.setattr(model_files, "convert_gguf", self)
        monkeypatch.setattr(model_files, "_bundled_gguf", lambda name, work: work / "fake.gguf")

    def __call__(self, gguf_path: Path, out_dir: Path) -> None:
        self.calls += 1
        tmp = out_dir.with_name(out_dir.name + f".tmp-{os.getpid()}")
        tmp.mkdir()
        (tmp / "model.safetensors").write_bytes(b"w" * 1000)
        (tmp / "config.json").write_text("{}")
        (tmp / MARKER).write_text(json.dumps({"source": gguf_path.name, "version": 1}))
        os.replace(tmp, out_dir)


def test_a_converted_folder_records_its_files_and_is_reconverted_when_damaged(monkeypatch):
    convert = FakeConversion(monkeypatch)
    messages: list[str] = []
    folder = model_files.bundled_model_dir("smollm2-135m", progress=messages.append)
    record = json.loads((folder / MARKER).read_text())["files"]
    assert record["model.safetensors"]["size"] == 1000 and len(record["model.safetensors"]["sha256"]) == 64
    assert record["config.json"] == {"size": 2} and convert.calls == 1
    assert any("converting smollm2-135m" in m for m in messages)

    assert model_files.bundled_model_dir("smollm2-135m") == folder and convert.calls == 1  # intact: reused
    (folder / "model.safetensors").write_bytes(b"w" * 10)  # truncated, e.g. by a full disk
    messages.clear()
    assert model_files.bundled_model_dir("smollm2-135m", progress=messages.append) == folder
    assert convert.calls == 2 and (folder / "model.safetensors").stat().st_size == 1000
    assert any("damaged (model.safetensors); converting it again" in m for m in messages)

    (folder / "config.json").unlink()  # a recorded file gone
    model_files.bundled_model_dir("smollm2-135m", progress=messages.append)
    assert convert.calls == 3 and (folder / "config.json").exists()


def test_a_folder_converted_before_sizes_were_recorded_is_upgraded_not_reconverted(monkeypatch):
    convert = FakeConversion(monkeypatch)
    folder = models_root() / "smollm2-135m-v1"
    convert(Path("fake.gguf"), folder)  # as an older version left it: a marker without "files"
    assert "files" not in json.loads((folder / MARKER).read_text())
    assert model_files.bundled_model_dir("smollm2-135m") == folder and convert.calls == 1
    assert json.loads((folder / MARKER).read_text())["files"]["model.safetensors"]["size"] == 1000


def test_stale_temporaries_of_dead_processes_are_removed_when_converting(monkeypatch):
    FakeConversion(monkeypatch)
    root = models_root()
    dead_dir, dead_file = root / "x.tmp-999999999", root / "y.work-999999998"
    ours = root / f"z.tmp-{os.getpid()}"
    dead_dir.mkdir()
    (dead_dir / "model.safetensors").write_bytes(b"half")
    dead_file.write_text("half")
    ours.mkdir()
    model_files.bundled_model_dir("smollm2-135m")
    assert not dead_dir.exists() and not dead_file.exists()
    assert ours.exists()  # this process is alive: its temporary may be in use


def _gguf(path: Path, architecture: str) -> Path:
    """A small, well-formed GGUF file of `architecture`: its header and one tensor (gguf's own writer)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_of_an_unsupported_architecture_is_refused_from_its_header_before_any_conversion(tmp_path,
                                                                                                private_cache,
                                                                                                monkeypatch):
    from mot_viz.engine.model_cache import gguf_architecture

    mamba = _gguf(tmp_path / "mamba.gguf", "mamba")
    monkeypatch.setattr(model_files, "convert_gguf", lambda *a: pytest.fail("an unsupported GGUF was converted"))
    _refused(str(mamba), "GGUF model of the 'mamba' architecture", "does not support", "nothing was converted",
             "GGUF architectures it loads: gpt2, qwen2, llama, gemma3", "Supported families")
    assert not private_cache.exists()  # not even hashed: nothing in the cache
    assert gguf_architecture(_gguf(tmp_path / "llama.gguf", "llama")) == "llama"  # a supported one passes the header


def test_a_supported_folder_with_auto_map_is_told_to_delete_it_and_then_loads(tiny_folder, tmp_path):
    folder = tmp_path / "remote-llama"
    folder.mkdir()
    for f in tiny_folder.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    sentinel = tmp_path / "ran"
    (folder / "evil.py").write_text(f"open({str(sentinel)!r}, 'w').write('x')\n")
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoConfig": "evil.EvilConfig"}}))
    error = _refused(str(folder), "auto_map", "never enables trust_remote_code", "family 'llama'",
                     "delete the 'auto_map' entry from config.json", "transformers' own class is then used")
    assert "use a model of a family" not in str(error).lower()
    (folder / "config.json").write_text(json.dumps(config))  # the fix the message names
    assert models.load_model(str(folder)).spec.model_type == "llama"
    assert not sentinel.exists()


def test_an_unsupported_folder_with_auto_map_is_told_to_use_a_supported_family(tmp_path):
    folder = tmp_path / "remote-mamba"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "mamba", "auto_map": {"AutoConfig": "m.C"}}))
    error = _refused(str(folder), "never enables trust_remote_code", "Use a model of a family transformers implements "
                     "itself", "Supported families")
    assert "delete the 'auto_map' entry" not in str(error)
