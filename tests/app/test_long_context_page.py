"""The Long context page driven by AppTest on the tiny test pair (MOT_VIZ_TEST_MODELS=1), like
tests/app/test_app_pages.py: what it shows is checked against mot_viz.eval.long_context and
mot_viz.analysis.long_context computed directly; the shipped results are a tiny summary in a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from mot_viz.analysis.long_context import position_error_table
from mot_viz.data.long_context import distractor_stacks
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.testing import load_test_model, write_test_checkpoints
from mot_viz.eval.long_context import LongSettings, evaluate_document
from mot_viz.eval.mean_vector import reference_means
from plotly_figures import figures

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TIMEOUT = 300
PAGE = "views/8_long_context.py"
BUDGET = 512  # the page's default length


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> dict[str, Path]:
    return write_test_checkpoints(tmp_path_factory.mktemp("pretrained"))


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("long")
    (root / "smollm2-to-gemma3-stacks").mkdir()
    pd.DataFrame([{"source": "stacks", "budget": b, "condition": c, "n": 12, "mean": 0.3, "retention": r,
                   "retention_ci_low": r - 0.1, "retention_ci_high": r + 0.1}
                  for b, r in ((512, 0.95), (1024, 0.9), (2048, 0.8)) for c in ("native", "mot", "linear", "mean")]
                 ).to_csv(root / "smollm2-to-gemma3-stacks" / "summary.csv", index=False)
    return root


@pytest.fixture(autouse=True)
def test_env(monkeypatch, app_cache, pretrained, shipped):
    monkeypatch.setenv("MOT_VIZ_TEST_MODELS", "1")
    monkeypatch.setenv("MOT_VIZ_CACHE", str(app_cache))
    monkeypatch.setenv("MOT_VIZ_PRETRAINED", str(next(iter(pretrained.values())).parent))
    monkeypatch.setenv("MOT_VIZ_LONG_RESULTS", str(shipped))


def open_page(budget: int | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.switch_page(PAGE).run()
    assert not at.exception, at.exception
    if budget is not None:
        at.selectbox(key="pg.long.budget").set_value(budget).run()
        assert not at.exception, at.exception
    return at


def test_a_length_the_models_cannot_hold_is_one_message_before_any_model_runs():
    at = open_page(4096)  # the tiny models allow 4,096 positions: no room for the question
    assert len(at.error) == 1 and "Choose a length of at most" in at.error[0].value
    assert not at.get("plotly_chart") and not at.dataframe


def test_the_page_shows_the_librarys_answers_positions_and_shipped_curve(pretrained):
    at = open_page(BUDGET)
    assert not at.error, [e.value for e in at.error]
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(pretrained["smollm2-to-gemma3"], source, target)
    linear, _ = load_checkpoint(pretrained["smollm2-to-gemma3-linear"], source, target)
    doc = distractor_stacks(target.tokenizer, BUDGET, 1, seed=0)[0]
    settings = LongSettings(str(pretrained["smollm2-to-gemma3"]), str(pretrained["smollm2-to-gemma3-linear"]),
                            "stacks", (BUDGET,), 1, 0)
    means = reference_means(target, mot.channels.target_layers, 16)  # the app's MEAN_VECTOR_PASSAGES
    result = evaluate_document(mot, linear, source, target, doc, settings, means)
    expected = pd.DataFrame(result.rows)
    shown = at.dataframe[0].value
    assert shown["condition"].tolist() == expected["condition"].tolist() == ["native", "no_context", "mot", "linear",
                                                                             "mean"]
    assert shown["answer"].tolist() == expected["answer"].tolist()
    assert shown[shown.columns[-1]].tolist() == pytest.approx(expected["score"].tolist())
    assert doc.example.question in [t.value for t in at.text]  # plain text, as typed
    figs = figures(at)
    title = lambda f, axis: f["layout"].get(axis, {}).get("title", {}).get("text", "")  # noqa: E731
    curve = next(f for f in figs if title(f, "xaxis").startswith("document length"))
    mot_line = next(t for t in curve["data"] if t["name"] == "MoT")
    assert list(mot_line["x"]) == [512, 1024, 2048] and list(mot_line["y"]) == pytest.approx([0.95, 0.9, 0.8])
    positions = position_error_table(result.translation, mot.channels, target.spec, bin_tokens=max(16, BUDGET // 32))
    line = next(f for f in figs if title(f, "yaxis").startswith("relative L2 error of K (replayed)"))
    layer = mot.channels.target_layers[0]
    trace = next(t for t in line["data"] if t["name"].startswith(f"layer {layer} "))
    want = positions[(positions["layer"] == layer) & (positions["comparison"] == "replayed") & (positions["kv"] == "K")]
    assert list(trace["y"]) == pytest.approx(want["value"].tolist(), rel=1e-4)
    assert any(t["name"] == "stage" or t.get("orientation") == "h" for f in figs for t in f["data"])  # the cost bars


def test_the_view_lives_in_the_url_and_another_document_is_another_computation():
    at = open_page(BUDGET)
    at.radio(key="pg.long.kv").set_value("V").run()
    assert at.query_params.get("long.budget") == str(BUDGET) and at.query_params.get("long.kv") == "V"
    texts = {t.value for t in at.text}
    at.number_input(key="pg.long.doc").set_value(1).run()
    assert not at.exception and not at.error
    target = load_test_model("gemma3-270m")
    first, second = distractor_stacks(target.tokenizer, BUDGET, 2, seed=0)
    assert first.example.question in texts and second.example.question in {t.value for t in at.text}
    assert second.depth == "middle" and at.query_params.get("long.doc") == "1"
