"""The Long context page driven by AppTest on the tiny test pair (MOT_VIZ_TEST_MODELS=1), like
tests/app/test_app_pages.py: what it shows is checked against mot_viz.eval.long_context and
mot_viz.analysis.long_context computed directly; the shipped results are a tiny summary in a temporary folder."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app_helpers import APP, TIMEOUT, errors, open_app, shown
from mot_viz.app.openings import DEFAULT_LONG_DOCUMENT
from mot_viz import app
from mot_viz.analysis.long_context import position_error_table
from mot_viz.app.permalink import FINGERPRINT, MAX_TEXT_IN_LINK, text_digest
from mot_viz.data.long_context import distractor_stacks
from mot_viz.data.user_documents import document_label, user_long_document
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.testing import load_test_model
from mot_viz.eval.long_context import evaluate_document
from mot_viz.eval.long_settings import LongSettings
from mot_viz.train.mean_vector import reference_means
from plotly_figures import figures

PAGE = "views/8_long_context.py"
BUDGET = 512  # the page's default length


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
def test_env(monkeypatch, pages_env, shipped):
    monkeypatch.setenv("MOT_VIZ_LONG_RESULTS", str(shipped))


def open_page(budget: int | None = None) -> AppTest:
    at = open_app(PAGE)
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
    doc = distractor_stacks(target.tokenizer, BUDGET, DEFAULT_LONG_DOCUMENT + 1, seed=0)[DEFAULT_LONG_DOCUMENT]
    settings = LongSettings(str(pretrained["smollm2-to-gemma3"]), "stacks", (BUDGET,), 1, 0,
                            options={"linear": str(pretrained["smollm2-to-gemma3-linear"])})
    means = reference_means(target, mot.channels.target_layers, 16)  # the app's MEAN_VECTOR_PASSAGES
    result = evaluate_document(mot, source, target, doc, settings, {"linear": linear, "mean": means})
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
    assert "long.budget" not in at.query_params and at.query_params.get("long.kv") == "V"  # a default stays out
    texts = {t.value for t in at.text}
    at.number_input(key="pg.long.doc").set_value(1).run()
    assert not at.exception and not at.error
    target = load_test_model("gemma3-270m")
    stacks = distractor_stacks(target.tokenizer, BUDGET, DEFAULT_LONG_DOCUMENT + 1, seed=0)
    first, second = stacks[DEFAULT_LONG_DOCUMENT], stacks[1]  # the page's first document, then #1
    assert first.example.question in texts and second.example.question in {t.value for t in at.text}
    assert second.depth == "middle" and at.query_params.get("long.doc") == "1"


# ----- the user's own document -------------------------------------------------------------------------------------

STORY = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris. It is named after the "
         "engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.\n")


def your_text(at: AppTest, text: str, question: str = "", gold: str = "") -> AppTest:
    """Choose "your text" and type the document, question and gold answers."""
    at.selectbox(key="pg.long.source").set_value("yours").run()
    at.text_area(key="pg.long.text").input(text)
    at.text_input(key="pg.long.question").input(question)
    at.text_input(key="pg.long.gold").input(gold)
    return at.run()


def test_a_pasted_document_with_a_question_is_answered_as_the_library_answers_it(pretrained):
    at = your_text(open_page(), STORY, "Who designed the tower?", "Gustave Eiffel | Eiffel")
    assert not at.exception and not at.error, errors(at)
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(pretrained["smollm2-to-gemma3"], source, target)
    linear, _ = load_checkpoint(pretrained["smollm2-to-gemma3-linear"], source, target)
    readers = app.long_context.readers(source, target, 0, 10_000)
    doc = user_long_document(STORY, "Who designed the tower?", "Gustave Eiffel | Eiffel", readers)
    settings = LongSettings(str(pretrained["smollm2-to-gemma3"]), doc.source, (doc.budget,), 1, 0,
                            options={"linear": str(pretrained["smollm2-to-gemma3-linear"])})
    means = reference_means(target, mot.channels.target_layers, 16)
    expected = pd.DataFrame(evaluate_document(mot, source, target, doc, settings, {"linear": linear, "mean": means})
                            .rows)
    shown_table = at.dataframe[0].value
    assert shown_table["answer"].tolist() == expected["answer"].tolist()
    assert shown_table["F1"].tolist() == pytest.approx(expected["score"].tolist())
    assert "Who designed the tower?" in [t.value for t in at.text]
    caption = next(shown(c.value) for c in at.caption if "checkpoint" in c.value)
    assert caption.endswith(f"document: {document_label(STORY)}") and "SQuAD" not in caption  # not the sidebar's
    assert document_label(STORY).startswith("your text “The Eiffel Tower is a")
    assert at.query_params.get("long.text") == STORY and at.query_params.get("long.source") == "yours"


def test_an_empty_too_long_or_binary_document_is_one_message_and_no_computation():
    at = open_page()
    at.selectbox(key="pg.long.source").set_value("yours").run()
    assert errors(at) == ["**Context problem.** The document is empty. Paste a text, or upload a .txt or .jsonl file."]
    assert not at.dataframe and not at.get("plotly_chart")
    long = STORY * 300
    tokens = len(load_test_model("gemma3-270m").tokenizer(long, add_special_tokens=False)["input_ids"])
    at = your_text(at, long, "Who?")
    assert not at.exception and len(at.error) == 1, errors(at)
    assert f"The document is {tokens:,} tokens long for the target model" in errors(at)[0]
    assert "Shorten the document" in errors(at)[0] and not at.dataframe
    at = your_text(at, STORY, "")
    assert errors(at) == ["**Context problem.** Ask a question about the document: type it under Question."]
    at.file_uploader(key="long.upload").set_value(("model.txt", b"PK\x03\x04\x00\x00binary", "text/plain")).run()
    assert not at.exception and len(at.error) == 1 and not at.dataframe
    assert "'model.txt' is not a text file (it holds a NUL byte at byte 4)" in errors(at)[0]


def test_an_uploaded_jsonl_fills_the_document_and_its_first_question():
    at = open_page()
    at.selectbox(key="pg.long.source").set_value("yours").run()
    rows = [{"context": STORY, "question": "Who designed the tower?", "answers": ["Gustave Eiffel"]},
            {"context": STORY, "question": "Where is it?", "answers": ["Paris"]}]
    data = "\n".join(json.dumps(r) for r in rows).encode()
    at.file_uploader(key="long.upload").set_value(("tower.jsonl", data, "application/json")).run()
    assert not at.exception and not at.error, errors(at)
    assert at.text_area(key="pg.long.text").value == STORY
    assert at.text_input(key="pg.long.question").value == "Who designed the tower?"
    assert at.text_input(key="pg.long.gold").value == "Gustave Eiffel"
    assert at.dataframe[0].value["gold"].tolist() == ["Gustave Eiffel"] * 5


def test_a_link_holding_a_long_documents_fingerprint_restores_it_where_the_app_saw_it(monkeypatch):
    text = (STORY * 12)[: MAX_TEXT_IN_LINK + 40]
    at = your_text(open_page(), text, "Who designed the tower?")
    assert not at.error, errors(at)
    params = dict(at.query_params)
    assert params["long.text"] == FINGERPRINT + text_digest(text)

    def reopen() -> AppTest:  # a new browser tab opened on the page's link
        fresh = AppTest.from_file(APP, default_timeout=TIMEOUT)
        fresh.query_params.update(params)
        fresh.switch_page(PAGE).run()
        assert not fresh.exception, fresh.exception
        return fresh

    fresh = reopen()
    assert not fresh.error and not fresh.warning, errors(fresh)
    assert fresh.text_area(key="pg.long.text").value == text
    assert fresh.dataframe[0].value["answer"].tolist() == at.dataframe[0].value["answer"].tolist()
    monkeypatch.setattr(app.links, "_LONG_TEXTS", type(app.links._LONG_TEXTS)())  # e.g. after a restart
    lost = reopen()
    notes = [shown(w.value) for w in lost.warning if w.value.startswith("This link holds values")]
    assert len(notes) == 1 and params["long.text"] in notes[0] and "paste the text again" in notes[0]
    assert errors(lost) == ["**Context problem.** The document is empty. Paste a text, or upload a .txt or .jsonl file."]
