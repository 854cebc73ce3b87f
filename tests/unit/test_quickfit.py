"""Any pair in seconds (mot_viz.train.quickfit): a linear translator fitted on a small bank, saved once, reused."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.mot import translate
from mot_viz.errors import ConfigError
from mot_viz.train import quickfit
from mot_viz.train.quickfit import QuickFitConfig, fit_pair, quickfit_channels

SMALL = QuickFitConfig(tokens=256, min_context_tokens=16, max_context_tokens=48, window_ratio=0.5)
TEXT = "the cat sat on the mat and looked at the dog, who was asleep by the door of the old house"


def _pair():
    return tiny_model("gpt2", vocab_size=280, layers=4, seed=1), tiny_model("llama", layers=6)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MOT_VIZ_CACHE", str(tmp_path))
    return tmp_path


def test_fit_pair_saves_a_checkpoint_that_translates_better_than_nothing_and_is_reused(cache, monkeypatch):
    source, target = _pair()
    stages = []
    path = fit_pair(source, target, SMALL, on_progress=lambda message, fraction: stages.append(fraction))
    assert path.parent == cache / "fits" and stages[0] == 0.0 and stages[-1] == 1.0 and stages == sorted(stages)
    mot, config = load_checkpoint(path, source, target)
    assert config["translator"]["variant"] == "linear" and mot.channels.target_layers == (4, 5)  # the top round(0.5 · 4) layers
    assert config["metrics"]["linear_fit"]["train_tokens"] > 0
    translation = translate(mot, source, target, TEXT)
    native = torch.cat([translation.native_kv[l][0].flatten() for l in mot.channels.target_layers])
    ours = torch.cat([translation.injected_kv[i][0].flatten() for i in range(mot.channels.window)])
    assert (ours - native).pow(2).mean() < native.pow(2).mean()  # closer to native K than writing zeros

    monkeypatch.setattr(quickfit, "build_bank", lambda *a, **k: pytest.fail("fitted twice"))
    assert fit_pair(source, target, SMALL) == path  # the same (pair, window, bank): loaded, not refitted


def test_another_window_or_bank_is_another_fit(cache):
    source, target = _pair()
    a = quickfit.quickfit_dir(source, target, SMALL)
    b = quickfit.quickfit_dir(source, target, QuickFitConfig(**{**SMALL.__dict__, "window_start": 1, "window_size": 2}))
    c = quickfit.quickfit_dir(source, target, QuickFitConfig(**{**SMALL.__dict__, "tokens": 512}))
    assert len({a, b, c}) == 3


def test_a_chosen_window_pairs_depth_matched_source_layers():
    source, target = _pair()  # 4 source layers, 6 target layers
    channels = quickfit_channels(source, target, QuickFitConfig(window_start=1, window_size=3))
    assert channels.target_layers == (1, 2, 3)
    assert len(set(channels.source_layers)) == 3 and list(channels.source_layers) == sorted(channels.source_layers)
    assert all(0 <= s < 4 for s in channels.source_layers)
    with pytest.raises(ConfigError, match="choose a start from 0 to 3"):
        quickfit_channels(source, target, QuickFitConfig(window_start=4, window_size=3))
    with pytest.raises(ConfigError, match="at least 256"):
        QuickFitConfig(tokens=10)


def test_the_cli_reports_a_bad_request_in_one_line(capsys):
    assert quickfit.main(["--source", "", "--target", "gemma3-270m"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
