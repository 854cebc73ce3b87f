"""Shared fixtures. Tiny randomly initialised models of every supported family come from mot_viz.engine.testing
(the app's tests use the same builders); the real bundled pair is loaded once per session."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mot_viz.app.openings import DEFAULT_DATASET, DEFAULT_EXAMPLE
from mot_viz.app.settings import MAX_CONTEXT_TOKENS
from mot_viz.data.eval_data import load_dataset
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.models import LoadedModel, load_model
from mot_viz.engine.mot import translate
from mot_viz.engine.prompts import build_prompt
from mot_viz.engine.testing import (CORPUS, FAMILIES, load_test_model, tiny_config,  # noqa: F401  (re-exported)
                                    tiny_model, tiny_tokenizer, write_test_checkpoints)


# What the training tests were written for, beside TrainConfig's defaults (the shipped recipe, whose three-genre bank,
# map fit and 800 bank steps would turn every tiny run into a fit): random init, post-RoPE keys, the replay stage only.
TINY_RECIPE = dict(init="random", key_space="post_rope", output_activation="gelu", translation_weight=0.0,
                   balance_weight=0.0, bank_corpus="lambada", bank_tokens=16384, bank_steps=0, bank_learning_rate=1e-3,
                   bank_layer_weighting="none", linear_previous=0, linear_previous_dims=0)


@pytest.fixture(scope="session")
def real_source() -> LoadedModel:
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def real_target() -> LoadedModel:
    return load_model("gemma3-270m")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """The tiny pair's randomly initialised test checkpoints (mot_viz.engine.testing.write_test_checkpoints), written
    once per module."""
    return write_test_checkpoints(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="session")
def app_cache(tmp_path_factory):
    """A user cache folder (MOT_VIZ_CACHE) of the app tests' own: what they fit or save never reaches ~/.cache."""
    return tmp_path_factory.mktemp("mot_viz_cache")


@pytest.fixture(scope="module")
def pretrained(checkpoints) -> dict[str, Path]:
    """The app's pretrained/ folder in the app tests: the tiny pair's test checkpoints, which are alone in their
    folder."""
    return checkpoints


@pytest.fixture
def pretrained_copy(pretrained, tmp_path) -> dict[str, Path]:
    """`pretrained` copied into the test's own folder, alone there (a pretrained/ of its own): checkpoints a test may
    change or damage without touching the module's."""
    folder = tmp_path / "pretrained"
    return {name: Path(shutil.copytree(path, folder / name)) for name, path in pretrained.items()}


@pytest.fixture(scope="module")
def default_context(pretrained):
    """What the app opens on in the app tests, computed by the library: the tiny pair, the test MoT and its linear map,
    the sidebar's first example, its prompt and its translation (source, target, mot, linear, example, prompt, translation)."""
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(pretrained["smollm2-to-gemma3"], source, target)
    linear, _ = load_checkpoint(pretrained["smollm2-to-gemma3-linear"], source, target)
    example = load_dataset(DEFAULT_DATASET, n=DEFAULT_EXAMPLE + 1, seed=0)[DEFAULT_EXAMPLE]
    prompt = build_prompt(example, target.chat_frame)
    translation = translate(mot, source, target, prompt.context_text,
                            max_tokens=min(MAX_CONTEXT_TOKENS, target.spec.max_positions))
    return source, target, mot, linear, example, prompt, translation


@pytest.fixture
def pages_env(monkeypatch, app_cache, pretrained) -> None:
    """What the app tests run the pages with: the tiny test models, their own cache, `pretrained` as pretrained/."""
    monkeypatch.setenv("MOT_VIZ_TEST_MODELS", "1")
    monkeypatch.setenv("MOT_VIZ_CACHE", str(app_cache))  # fits made in a test stay in it
    monkeypatch.setenv("MOT_VIZ_PRETRAINED", str(next(iter(pretrained.values())).parent))


@pytest.fixture
def shipped_env(monkeypatch, app_cache) -> None:
    """What the pages that read the shipped results run with: the tiny test models, their own cache, and the
    repository's own pretrained/ (the checkpoints the results name)."""
    monkeypatch.setenv("MOT_VIZ_TEST_MODELS", "1")
    monkeypatch.setenv("MOT_VIZ_CACHE", str(app_cache))
    monkeypatch.delenv("MOT_VIZ_PRETRAINED", raising=False)


# A toy multiple-choice dataset over CORPUS, as the evaluator's tests write it (`data`).
TOY_ROWS = [{"id": f"q{i}", "context": CORPUS[i % 3], "question": "Is it so?", "choices": ["yes", "no"],
             "label": i % 2} for i in range(4)]


def write_jsonl(path: Path, rows) -> Path:
    """`rows` (dicts) as a JSONL file at `path`, one JSON object a line."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def toy_jsonl(tmp_path):
    """A writer of toy JSONL datasets in the test's own folder: toy_jsonl(rows, name="toy.jsonl") -> the file."""
    return lambda rows, name="toy.jsonl": write_jsonl(tmp_path / name, rows)


@pytest.fixture
def data(toy_jsonl) -> Path:
    """TOY_ROWS as a JSONL file (--datasets)."""
    return toy_jsonl(TOY_ROWS)


def pytest_collection_modifyitems(items):
    """Each test carries its tier's marker, named by its folder (unit, integration, app, browser): `-m "unit or app"`
    selects the quick loop."""
    for item in items:
        item.add_marker(Path(item.fspath).parent.name)


@pytest.fixture
def private_cache(tmp_path, monkeypatch) -> Path:
    """A model cache of the test's own (MOT_VIZ_CACHE), so the user's is never written."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MOT_VIZ_CACHE", str(cache))
    return cache


@pytest.fixture(scope="module")
def local_pair_checkpoint(tmp_path_factory) -> Path:
    """A random checkpoint of a tiny pair saved as local model folders, which its config.json names: what a command
    run in a subprocess (python -m mot_viz.eval.evaluate --checkpoint …) loads without the real models. Its folder is
    alone in its parent (a pretrained/ of one checkpoint for the app)."""
    import torch

    from mot_viz.engine.channels import terminal_channels
    from mot_viz.engine.checkpoint import save_checkpoint
    from mot_viz.engine.mot import MoT

    root = tmp_path_factory.mktemp("local_pair")
    loaded = {}
    for role, (family, vocab, seed, bos) in {"source": ("llama", 280, 1, False),
                                             "target": ("gemma3_text", 300, 0, True)}.items():
        tiny = tiny_model(family, vocab_size=vocab, seed=seed, bos=bos)
        tiny.model.save_pretrained(root / "models" / role)
        tiny.tokenizer.save_pretrained(root / "models" / role)
        loaded[role] = load_model(str(root / "models" / role))
    source, target = loaded["source"], loaded["target"]
    torch.manual_seed(0)
    mot = MoT.build(source.spec, target.spec, terminal_channels(source.spec.num_layers, target.spec.num_layers, 0.5),
                    dim=16, heads=2)
    return save_checkpoint(mot, root / "pretrained" / "tiny-pair",
                           metrics={"note": "randomly initialised test checkpoint"})
