"""Any pair in seconds (mot_viz.train.quickfit): a linear translator fitted on a small bank, saved once, reused."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path

import pytest
import torch

from conftest import tiny_model
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.mot import translate
from mot_viz.errors import ConfigError, ContextError
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


def test_two_tabs_fitting_the_same_pair_at_once_fit_it_once_and_both_get_it(cache, monkeypatch):
    source, target = _pair()
    builds, results, errors = [], [], []
    build_bank = quickfit.build_bank
    monkeypatch.setattr(quickfit, "build_bank", lambda *a, **k: builds.append(1) or build_bank(*a, **k))
    start = threading.Barrier(2)

    def tab():
        start.wait()
        try:
            results.append(fit_pair(source, target, SMALL))
        except Exception as exc:  # what a tab would show raw
            errors.append(exc)

    threads = [threading.Thread(target=tab) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == [] and len(results) == 2 and results[0] == results[1]
    assert len(builds) == 1  # the second waited for the first's checkpoint instead of fitting into the same folder
    load_checkpoint(results[0], source, target)
    assert not list((cache / "fits").glob("*.tmp-*"))


def _save(lm, folder):
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return str(folder)


def test_a_short_context_model_is_told_the_flag_quickfit_has(cache, tmp_path, capsys):
    short = _save(tiny_model("gpt2", vocab_size=280, layers=4, seed=1, max_positions=40), tmp_path / "short-gpt2")
    target = _save(tiny_model("llama", layers=6), tmp_path / "llama")
    argv = ["--source", short, "--target", target, "--tokens", "256"]
    capsys.readouterr()
    assert quickfit.main(argv) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after transformers' loading bars
    assert err.startswith("error: ContextError: The quick fit's bank holds contexts of up to 256 target tokens, but "
                          f"the model '{short}' reads at most 40. Pass a smaller --max_context_tokens to "
                          "python -m mot_viz.train.quickfit (at most 40")
    assert "mot_viz.eval.evaluate" not in err and not (cache / "fits").exists()
    assert quickfit.main(argv + ["--max_context_tokens", "24"]) == 0  # the fix named works
    fitted = Path(capsys.readouterr().out.strip())
    assert json.loads((fitted / "config.json").read_text())["training"]["max_context_tokens"] == 24


def test_a_bank_context_too_long_in_source_tokens_names_the_quickfit_flag(cache):
    # the source reads 40 tokens, the bank's contexts are 36-40 target tokens: the source's finer tokenizer
    # (a smaller vocabulary) makes some of them longer than 40 source tokens
    source = tiny_model("gpt2", vocab_size=260, layers=4, seed=1, max_positions=40, name="short-gpt2")
    target = tiny_model("llama", vocab_size=400, layers=6)
    cfg = QuickFitConfig(tokens=256, min_context_tokens=36, max_context_tokens=40, window_ratio=0.5)
    with pytest.raises(ContextError) as err:
        fit_pair(source, target, cfg)
    message = str(err.value)
    assert "longer in source tokens than the source model 'short-gpt2' reads (40)" in message
    assert "Pass a smaller --max_context_tokens to python -m mot_viz.train.quickfit" in message
    assert "mot_viz.eval.evaluate" not in message


def _unwritable_place(tmp_path: Path) -> Path:
    """A folder this process cannot write into: a read-only one, or for root (who writes into those) /sys."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        return locked
    try:
        tempfile.TemporaryFile(dir="/sys").close()
    except OSError:
        return Path("/sys")
    pytest.skip("no folder this process cannot write into")


@pytest.mark.parametrize("place", ["inside a file", "unwritable"])
def test_an_out_it_cannot_write_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch, place):
    monkeypatch.setattr(quickfit, "load_model", lambda name: pytest.fail(f"{name} was loaded: --out was not checked"))
    if place == "inside a file":
        (tmp_path / "notes.txt").write_text("mine")
        out, words = tmp_path / "notes.txt" / "fit", f"lies inside the file {tmp_path / 'notes.txt'}"
    else:
        out, words = _unwritable_place(tmp_path) / "fit", "Cannot write into --out"
    assert quickfit.main(["--source", "smollm2-135m", "--target", "gemma3-270m", "--direct", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ConfigError: ") and words in err and "Pass a" in err
