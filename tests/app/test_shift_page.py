"""The Shift analysis page driven by AppTest on the tiny test pair (MOT_VIZ_TEST_MODELS=1), like tests/app/test_app_pages.py.

What the page plots is checked against mot_viz.analysis.shift computed directly; the shipped sweep is a tiny one
written to a temporary results folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app_helpers import default_example, open_app
from mot_viz.analysis import shift
from mot_viz.data.eval_data import load_dataset
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.mot import translate
from mot_viz.engine.prompts import build_prompt
from mot_viz.engine.testing import load_test_model
from plotly_figures import figures

PAGE = "views/7_shift_analysis.py"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    """A tiny saved sweep for the test pair's names, as scripts/shift_sweep.py writes it."""
    target = load_test_model("gemma3-270m")
    example = load_dataset("squad", n=50, seed=0)[1]
    cfg = shift.SweepConfig(window=2, task_metric=False)
    meta = {"source": "smollm2-135m", "target": "gemma3-270m", "dataset": "squad", "split": "validation", "n": 1,
            "data_seed": 0, "command": "test"}
    result = shift.sweep(target, [shift.case_from_example(target, example)], cfg, meta=meta)
    root = tmp_path_factory.mktemp("shift")
    result.save(root / "tiny-perturbation")
    return root


@pytest.fixture(autouse=True)
def test_env(monkeypatch, pages_env, shipped):
    monkeypatch.setenv("MOT_VIZ_SHIFT_RESULTS", str(shipped))


def test_page_traces_the_checkpoint_window_and_shows_the_shipped_sweep(pretrained, shipped):
    at = open_app(PAGE)
    assert [h.value for h in at.header][:3] == ["This checkpoint's window on this context",
                                                "Sweep the window start on this context (training-free)",
                                                "Shipped sweep (results/shift)"]
    # the same analysis computed directly
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(pretrained["smollm2-to-gemma3"])
    example = default_example()
    prompt = build_prompt(example)
    case = shift.case_from_text(target, prompt.context_text, prompt.suffix_text, example)
    ws, run = shift.analyse_translation(mot, source, target, case, translate(mot, source, target, prompt.context_text),
                                        answer_likelihood=False)  # as the page asks it
    assert case.answer_ids == shift.answer_token_ids(target.tokenizer, example)  # the gold answer is teacher-forced
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Initial shift ‖s‖ (MoT)"] == f"{ws.summary('full_mix').initial_shift:.4g}"
    assert metrics["KL(native ‖ MoT) next token"] == f"{run.kl['native||full_mix']:.4g}"
    figs = figures(at)
    rho = figs[0]["data"][0]  # MoT median ρ_k of answer token 0
    traj = ws.trajectories()
    want = traj[(traj.condition == "full_mix") & (traj.token_index == 0)].sort_values("k")
    assert list(rho["x"]) == want["k"].tolist() and np.allclose(rho["y"], want["median_rho"])
    # the test checkpoint injects into the top layers: nothing above the window, and the page says so
    assert ws.num_upper_layers == 0 and any("no layer is left above the window" in i.value for i in at.info)
    # the shipped sweep: one point per start, as saved
    saved = shift.SweepResult.load(shipped / "tiny-perturbation")
    vs_start = next(f for f in figs if any("last-state shift" in (t.get("name") or "") for t in f["data"]))
    assert list(vs_start["data"][0]["x"]) == saved.summary["start"].tolist()
    labels = [b.label for b in at.get("download_button")]
    assert "Download the data (CSV): tiny-perturbation_shift_vs_start.csv" in labels


def test_live_sweep_runs_on_click_and_covers_every_valid_start():
    at = open_app(PAGE)
    n_before = len(at.get("plotly_chart"))
    at.number_input(key="pg.shift.window").set_value(2).run()
    next(b for b in at.button if b.label == "Run the sweep").click().run()
    assert not at.exception, at.exception
    figs = figures(at)
    assert len(figs) == n_before + 2
    live = next(f for f in figs if any("last-state shift" in (t.get("name") or "") for t in f["data"]))
    # tiny source 4 layers, target 6, W = 2: starts whose source window fits (method.md §3)
    assert list(live["data"][0]["x"]) == shift.valid_starts(6, 2, num_source_layers=4)
    # a changed setting waits for the button
    at.number_input(key="pg.shift.size").set_value(1.0).run()
    assert any("Press **Run the sweep**" in i.value for i in at.info)


def test_free_text_without_question_asks_for_one():
    at = open_app()
    at.radio(key="sb.mode").set_value("Free text").run()
    at.text_input(key="sb.question").input("")
    next(b for b in at.button if b.label == "Translate").click().run()
    at.switch_page(PAGE).run()
    assert not at.exception, at.exception
    assert any("has no answer to trace" in i.value for i in at.info)


def test_page_runs_on_a_linear_checkpoint():
    at = open_app()
    at.selectbox(key="sb.checkpoint").set_value("smollm2-to-gemma3-linear")
    next(b for b in at.button if b.label == "Translate").click().run()
    at.switch_page(PAGE).run()
    assert not at.exception, at.exception
    assert not at.error and len(figures(at)) > 0


def test_after_the_answers_page_the_shift_and_per_layer_pages_reuse_its_question_states(pretrained):
    """Answers first: its batch's prompt step (the question over the native, MoT and random caches) feeds the Shift
    page's trace and the Per-layer page's first-token KL, and both still show the numbers computed on their own."""
    from mot_viz.analysis.shift.metrics import kl_divergence
    from mot_viz.app import loaders
    from mot_viz.eval.answers import first_answer_logprobs

    at = open_app("views/1_answers.py")
    sel = at.session_state["applied"]
    assert set(loaders._prompted(loaders.translation_key(sel), sel.suffix)) == {"native", "mot", "random"}
    at.switch_page(PAGE).run()
    assert not at.exception, at.exception
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(pretrained["smollm2-to-gemma3"])
    example = default_example()
    prompt = build_prompt(example)
    translation = translate(mot, source, target, prompt.context_text)
    case = shift.case_from_text(target, prompt.context_text, prompt.suffix_text, example)
    ws, run = shift.analyse_translation(mot, source, target, case, translation, answer_likelihood=False)
    # up to float rounding: the Answers batch ran the question with its padded no-context row beside (relative 1e-5
    # on the default pair, where the page's digits agree; the tiny random models' KL is ~1e-5 itself)
    metrics = {m.label: float(m.value) for m in at.metric if m.label in ("Initial shift ‖s‖ (MoT)",
                                                                         "KL(native ‖ MoT) next token")}
    assert metrics["Initial shift ‖s‖ (MoT)"] == pytest.approx(ws.summary("full_mix").initial_shift, rel=5e-3)
    assert metrics["KL(native ‖ MoT) next token"] == pytest.approx(run.kl["native||full_mix"], rel=5e-3)
    at.switch_page("views/2_cache_error.py").run()
    assert not at.exception, at.exception
    kl = kl_divergence(*first_answer_logprobs(target, [translation.native_kv, translation.mixed_kv], sel.suffix))
    assert any(c.value.startswith(f"First answer token: KL(native ‖ translated) = {kl:.4f} nats") for c in at.caption)
    key = loaders.translation_key(sel)
    shared = loaders._prompted(key, sel.suffix)
    page_kl = loaders._cached_first_token_kl(key, sel.suffix)  # what the page showed, from the Answers batch
    assert page_kl == kl_divergence(shared["native"].first_logprobs, shared["mot"].first_logprobs)
    assert page_kl == pytest.approx(kl, rel=5e-3)
