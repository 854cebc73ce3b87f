"""The Multi-agent page driven by AppTest on the tiny test pair (MOT_VIZ_TEST_MODELS=1): what it shows is checked
against mot_viz.eval.conversation computed directly; the shipped results are a tiny summary in a temporary folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app_helpers import APP, TIMEOUT, errors, open_app, shown
from mot_viz import app
from mot_viz.app.multi_agent import story_tokens
from mot_viz.app.permalink import FINGERPRINT, MAX_TEXT_IN_LINK, text_digest
from mot_viz.app.openings import DEFAULT_CONVERSATION
from mot_viz.data.coqa import coqa_conversations
from mot_viz.data.user_documents import document_label, user_conversation
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.testing import load_test_model
from mot_viz.eval.conversation import ConversationSettings, conversation_rows
from plotly_figures import figures

PAGE = "views/10_multi_agent.py"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("conversation")
    (root / "smollm2-to-gemma3-coqa").mkdir()
    pd.DataFrame([{"turn": t, "condition": c, "n": 30, "mean": m, "ci_low": m - 0.1, "ci_high": m + 0.1}
                  for t in (1, 2) for c, m in (("native", 0.5), ("mot", 0.4), ("no_context", 0.1))]
                 ).to_csv(root / "smollm2-to-gemma3-coqa" / "summary.csv", index=False)
    return root


@pytest.fixture(autouse=True)
def test_env(monkeypatch, pages_env, shipped, tmp_path):
    monkeypatch.setenv("MOT_VIZ_CONVERSATION_RESULTS", str(shipped))


def test_the_page_answers_a_conversation_as_the_library_does(pretrained):
    at = open_app(PAGE)
    at.selectbox(key="pg.agents.turns").set_value(2).run()
    assert not at.exception and not at.error
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(pretrained["smollm2-to-gemma3"], source, target)
    conversation = coqa_conversations(target.tokenizer, DEFAULT_CONVERSATION + 1, 2, 0,
                                      story_tokens())[DEFAULT_CONVERSATION]  # the page's first story
    rows = pd.DataFrame(conversation_rows(mot, source, target, conversation,
                                          ConversationSettings(str(pretrained["smollm2-to-gemma3"]), 1, 2,
                                                               max_story_tokens=story_tokens())))
    table = next(d.value for d in at.dataframe if "question" in d.value.columns)
    assert table["question"].tolist() == [t.question for t in conversation.turns]
    expected = rows.pivot_table(index="turn", columns="condition", values="answer", aggfunc="first")
    for condition in ("native", "mot", "no_context"):
        assert table[condition].tolist() == expected[condition].tolist()
    fig = figures(at)[0]
    f1 = next(t for t in fig["data"] if t["name"] == "mot" and t["xaxis"] == "x")
    scores = rows[rows.condition == "mot"].sort_values("turn").score
    assert np.allclose(list(f1["y"]), scores.to_numpy())
    assert any(t["name"] == "mot (shipped)" for t in fig["data"])  # the shipped curve is drawn beside
    retain = next(t for t in fig["data"] if t["name"] == "mot (retain)")
    free = next(t for t in fig["data"] if t["name"] == "mot (free)")
    assert all(r > f for r, f in zip(retain["y"], free["y"]))  # retain also holds the source's cache
    assert at.query_params.get("agents.turns") == "2"


def test_several_readers_compose_shards_as_the_library_does(pretrained):
    from mot_viz.app.multi_agent import SHARD_BUDGET
    from mot_viz.data.long_context import long_examples
    from mot_viz.eval.shard_caches import shard_spans
    from mot_viz.eval.shards import ShardSettings, evaluate_document

    at = open_app(PAGE)
    at.selectbox(key="pg.agents.turns").set_value(1).run()
    assert not at.exception
    before = len(figures(at))
    at.toggle(key="pg.agents.sharded").set_value(True).run()
    assert not at.exception and not at.error
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(pretrained["smollm2-to-gemma3"], source, target)
    doc = long_examples("stacks", target.tokenizer, SHARD_BUDGET, 1, seed=0)[0]
    result = evaluate_document(mot, source, target, doc, ShardSettings(str(pretrained["smollm2-to-gemma3"]),
                                                                       SHARD_BUDGET, (2,), 1))
    table = next(d.value for d in at.dataframe if "setting" in d.value.columns)
    rows = pd.DataFrame(result.rows)
    assert table["setting"].tolist() == rows["condition"].tolist()
    assert table["answer"].tolist() == rows["answer"].tolist()
    spans = shard_spans(target, doc, 2)
    assert len(spans) == 2 and sum("(evidence)" in label for label in spans) == 1
    fig = figures(at)[before]
    assert {t["name"].split(":")[0] for t in fig["data"]} == set(spans)
    assert at.query_params.get("agents.sharded") == "true"


# ----- the user's own story ----------------------------------------------------------------------------------------

STORY = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris. It is named after the "
         "engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.\n")
QUESTIONS = "Who designed the tower? | Gustave Eiffel | Eiffel\nWhere is it? | Paris"


def your_story(at: AppTest, story: str, questions: str) -> AppTest:
    at.selectbox(key="pg.agents.story").set_value("yours").run()
    at.text_area(key="pg.agents.text").input(story)
    at.text_area(key="pg.agents.questions").input(questions)
    return at.run()


def test_a_pasted_story_and_its_questions_are_answered_turn_by_turn_as_the_library_does(pretrained):
    at = your_story(open_app(PAGE), STORY, QUESTIONS)
    assert not at.exception and not at.error, errors(at)
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(pretrained["smollm2-to-gemma3"], source, target)
    readers = app.long_context.readers(source, target, 0, 10_000)
    conversation = user_conversation(STORY, QUESTIONS, readers)
    rows = pd.DataFrame(conversation_rows(mot, source, target, conversation,
                                          ConversationSettings(str(pretrained["smollm2-to-gemma3"]), 1, 2)))
    table = next(d.value for d in at.dataframe if "question" in d.value.columns)
    assert table["question"].tolist() == ["Who designed the tower?", "Where is it?"]
    assert table["references"].tolist() == ["Gustave Eiffel | Eiffel", "Paris"]
    expected = rows.pivot_table(index="turn", columns="condition", values="answer", aggfunc="first")
    for condition in ("native", "mot", "no_context"):
        assert table[condition].tolist() == expected[condition].tolist()
    caption = next(shown(c.value) for c in at.caption if "checkpoint" in c.value)
    assert caption.endswith(f"document: {document_label(STORY)}") and "SQuAD" not in caption  # not the sidebar's
    assert at.query_params.get("agents.story") == "yours" and at.query_params.get("agents.text") == STORY


def test_the_coqa_caption_names_the_story_not_the_sidebars_passage():
    at = open_app(PAGE)
    at.selectbox(key="pg.agents.turns").set_value(1).run()
    caption = next(shown(c.value) for c in at.caption if "checkpoint" in c.value)
    assert caption.endswith(f"document: CoQA story #{DEFAULT_CONVERSATION}, its first 1 turns") and "SQuAD" not in caption


def test_an_empty_too_long_or_binary_story_is_one_message_and_no_computation():
    at = open_app(PAGE)
    at = your_story(at, "", QUESTIONS)
    assert errors(at) == ["**Context problem.** The story is empty. Paste a text, or upload a .txt or .jsonl file."]
    assert not at.dataframe and not at.get("plotly_chart")
    at = your_story(at, STORY * 300, QUESTIONS)
    assert not at.exception and len(at.error) == 1 and not at.dataframe, errors(at)
    assert "tokens long for the target model" in errors(at)[0] and "Shorten the story" in errors(at)[0]
    at = your_story(at, STORY, "Who designed the tower?")
    assert errors(at) == ["**Context problem.** Question 1 ('Who designed the tower?') has no reference answer: write "
                          "it after a '|'. Each turn's question and reference answer are added to every cache as the "
                          "history the next question reads, as CoQA's conversations carry it."]
    at.file_uploader(key="agents.upload").set_value(("story.txt", b"\xff\xfe\x00b\x00i\x00n", "text/plain")).run()
    assert not at.exception and len(at.error) == 1 and not at.dataframe
    assert "'story.txt' is not a text file (it holds a NUL byte at byte 2)" in errors(at)[0]


def test_an_uploaded_jsonl_fills_the_story_and_its_questions_in_order():
    at = open_app(PAGE)
    at.selectbox(key="pg.agents.story").set_value("yours").run()
    data = b"\n".join(json.dumps({"context": STORY, "question": q, "answers": a}).encode()
                      for q, a in (("Who designed the tower?", ["Gustave Eiffel"]), ("Where is it?", ["Paris"])))
    at.file_uploader(key="agents.upload").set_value(("tower.jsonl", data, "application/json")).run()
    assert not at.exception and not at.error, errors(at)
    assert at.text_area(key="pg.agents.text").value == STORY
    assert at.text_area(key="pg.agents.questions").value == "Who designed the tower? | Gustave Eiffel\nWhere is it? | Paris"
    table = next(d.value for d in at.dataframe if "question" in d.value.columns)
    assert table["question"].tolist() == ["Who designed the tower?", "Where is it?"]


def test_a_link_holding_a_long_storys_fingerprint_restores_it():
    story = (STORY * 12)[: MAX_TEXT_IN_LINK + 40]
    at = your_story(open_app(PAGE), story, QUESTIONS)
    assert not at.error, errors(at)
    params = dict(at.query_params)
    assert params["agents.text"] == FINGERPRINT + text_digest(story) and params["agents.questions"] == QUESTIONS
    fresh = AppTest.from_file(APP, default_timeout=TIMEOUT)  # a new browser tab opened on the page's link
    fresh.query_params.update(params)
    fresh.switch_page(PAGE).run()
    assert not fresh.exception and not fresh.error and not fresh.warning, errors(fresh)
    assert fresh.text_area(key="pg.agents.text").value == story
    table = next(d.value for d in fresh.dataframe if "question" in d.value.columns)
    assert table["mot"].tolist() == next(d.value for d in at.dataframe if "question" in d.value.columns)["mot"].tolist()
