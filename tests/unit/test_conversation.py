"""Conversations over one read (mot_viz.data.coqa, mot_viz.eval.conversation): the CoQA sampler, the kept caches
(each is the target's own cache of the story and the history), the retain / free accounting, resume and the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from mot_viz.data.coqa import Conversation, Turn, coqa_conversations
from mot_viz.engine import hf
from mot_viz.engine.alignment import encode
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.prompts import build_prompt
from mot_viz.engine.testing import CORPUS, load_test_model, tiny_tokenizer
from mot_viz.errors import ConfigError, ContextError
from mot_viz.eval import conversation
from mot_viz.eval.answers import answer_from_cache
from mot_viz.eval.conversation import ConversationSettings, conversation_rows, history_text, summarize, turn_example

STORY = CORPUS[0] + " " + CORPUS[1]
TINY = Conversation("tiny", "test", STORY, (Turn("Where is the tower?", ("in Paris", "Paris")),
                                          Turn("Who built it?", ("Gustave Eiffel's company",)),
                                          Turn("Is it made of wood?", ("no",))))


def settings_for(checkpoints, **kw) -> ConversationSettings:
    base = dict(checkpoint=str(checkpoints["smollm2-to-gemma3"]), n=2, turns=2, seed=0, max_new_tokens=4,
                max_story_tokens=3000, bootstrap=50)
    return ConversationSettings(**{**base, **kw})


def test_coqa_conversations_are_cut_to_their_turns_and_story_length():
    tok = tiny_tokenizer(400, bos=True)
    some = coqa_conversations(tok, 6, turns=5, seed=1, max_story_tokens=2500)
    assert len(some) == 6 and len({c.id for c in some}) == 6
    assert all(len(c.turns) == 5 and len(encode(tok, c.story)) <= 2500 for c in some)
    assert all(t.question and t.answers for c in some for t in c.turns)
    assert [c.id for c in coqa_conversations(tok, 3, turns=5, seed=1, max_story_tokens=2500)] == [c.id for c in some[:3]]
    with pytest.raises(ContextError, match="Ask for at most"):
        coqa_conversations(tok, 5, turns=5, max_story_tokens=10)
    with pytest.raises(ContextError, match="at least one turn"):
        coqa_conversations(tok, 1, turns=0)


def test_each_kept_cache_is_the_targets_own_cache_of_the_story_and_the_history(checkpoints):
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(checkpoints["smollm2-to-gemma3"], source, target)
    settings = settings_for(checkpoints, max_new_tokens=3)
    rows = pd.DataFrame(conversation_rows(mot, source, target, TINY, settings))
    assert len(rows) == 3 * 3 and set(rows.condition) == set(conversation.CONDITIONS)
    context = build_prompt(turn_example(TINY, 0), target.chat_frame).context_text
    context_ids = target.ids_tensor(target.prefix_ids + encode(target.tokenizer, context))
    histories = [encode(target.tokenizer, history_text(build_prompt(turn_example(TINY, t), target.chat_frame)
                                                       .suffix_text, TINY.turns[t].answers[0])) for t in range(3)]
    by = rows.set_index(["condition", "turn"])
    story = context_ids.shape[1]
    for turn in (1, 2, 3):
        grown = sum(len(h) for h in histories[:turn])
        assert by.loc[("native", turn), "cache_tokens"] == by.loc[("mot", turn), "cache_tokens"] == story + grown
        assert by.loc[("no_context", turn), "cache_tokens"] == len(target.prefix_ids) + grown
    # the native answer of turn 2 is what the target answers from its own prefill of the story and turn 1's history
    ids = torch.cat([context_ids, target.ids_tensor(histories[0])], dim=1)
    kv = hf.run(target.model, ids, logits_to_keep=None).kv
    second = turn_example(TINY, 1)
    own = answer_from_cache(target, kv, second, "native", 3, build_prompt(second, target.chat_frame).suffix_text)
    assert by.loc[("native", 2), "answer"] == own.text
    assert (rows.turn_seconds > 0).all() and (rows.source_prefill > 0).all()
    with pytest.raises(ContextError, match="no turns"):
        conversation_rows(mot, source, target, Conversation("empty", "test", STORY, ()), settings)


def test_summary_accounts_time_and_memory_for_retain_and_free():
    rows = []
    for cid, scores in (("a", (1.0, 0.5, 0.0)), ("b", (0.5, 0.5, 0.0))):
        for turn in (1, 2):
            for condition, score in zip(("native", "mot", "no_context"), scores):
                rows.append({"id": cid, "genre": "x", "turn": turn, "condition": condition, "score": score,
                             "turn_seconds": 1.0, "cache_tokens": 100 * turn + (0 if condition != "no_context" else -90),
                             "story_tokens": 90, "source_tokens": 80, "source_prefill": 9.0, "alignment": 0.5,
                             "translator": 0.5, "replay": 1.0, "native_prefill": 3.0})
    summary = summarize(pd.DataFrame(rows), target_spec_mb=0.01, source_spec_mb=0.02, translator=5.0, n_boot=20)
    s = summary.set_index(["turn", "condition"])
    assert s.loc[(2, "native"), "cumulative_seconds"] == pytest.approx(3.0 + 2.0)  # own prefill + two turns
    assert s.loc[(2, "mot"), "cumulative_seconds"] == pytest.approx(2.0 + 2.0)  # alignment+translator+replay + turns
    assert s.loc[(2, "no_context"), "cumulative_seconds"] == pytest.approx(2.0)
    assert s.loc[(1, "native"), "memory_mb"] == pytest.approx(1.0)  # 100 tokens × 0.01 MB
    assert s.loc[(1, "mot"), "memory_mb"] == pytest.approx(1.0 + 5.0)  # free: + translator
    assert s.loc[(1, "mot"), "memory_retain_mb"] == pytest.approx(1.0 + 5.0 + 80 * 0.02)  # retain: + source cache
    assert s.loc[(1, "mot"), "retention"] == pytest.approx(0.5 / 0.75)
    assert "MoT retention" in conversation.markdown(summary)
    total = conversation.overall(pd.DataFrame(rows), n_boot=20)
    assert total["n"] == 2 and total["mot"] == pytest.approx(0.5) and total["native"] == pytest.approx(0.75)
    assert total["retention"] == pytest.approx(0.5 / 0.75) and total["gap_closed"] == pytest.approx(0.5 / 0.75)
    # any condition's gap closed over all turns (the ways-of-sharing table's column): native's whole gap, no story's none
    assert conversation.overall(pd.DataFrame(rows), n_boot=20, condition="native")["gap_closed"] == pytest.approx(1.0)
    assert conversation.overall(pd.DataFrame(rows), n_boot=20, condition="no_context")["gap_closed"] == 0.0
    # each other way of sharing is paired with the MoT and with no story
    assert {("mot", "direct"), ("direct", "no_context"), ("relay", "no_context")} <= set(conversation.pairs())


@pytest.mark.parametrize("change, message", [
    (dict(turns=0), "at least 1"),
    (dict(max_story_tokens=4000, turns=4), "allows"),
])
def test_bad_settings_fail_before_a_model_loads(checkpoints, monkeypatch, change, message):
    monkeypatch.setattr(conversation, "load_model", lambda name: pytest.fail("a model was loaded"))
    with pytest.raises(ConfigError, match=message):
        conversation.run(settings_for(checkpoints, **change), Path("/nonexistent/out"))


def test_the_evaluation_resumes_only_the_missing_conversations(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(conversation, "load_model", load_test_model)
    out = tmp_path / "conv"
    conversation.run(settings_for(checkpoints, n=1), out, progress=False)
    first = pd.read_csv(out / "examples.csv", keep_default_na=False, na_values=[""])
    assert first["id"].nunique() == 1 and len(first) == 2 * 3
    with pytest.raises(ConfigError, match="--resume"):
        conversation.run(settings_for(checkpoints, n=2), out, progress=False)
    computed = []
    real = conversation.conversation_rows
    monkeypatch.setattr(conversation, "conversation_rows", lambda *a, **k: computed.append(a[3].id) or real(*a, **k))
    summary = conversation.run(settings_for(checkpoints, n=2), out, resume=True, progress=False)
    both = pd.read_csv(out / "examples.csv")
    assert len(computed) == 1 and both["id"].nunique() == 2 and (summary["n"] == 2).all()
    assert json.loads((out / "summary.json").read_text())["settings"]["turns"] == 2
    assert "MoT retention" in (out / "summary.md").read_text()
    with pytest.raises(ConfigError, match="other settings"):
        conversation.run(settings_for(checkpoints, seed=1), out, resume=True, progress=False)


def test_linear_and_mean_spread_over_two_processes_write_the_files_of_one(checkpoints, tmp_path, monkeypatch, capsys):
    from test_distributed_eval import argv, assert_same_results, one_process, spread

    extra = ("--conditions", "linear", "mean")  # no --linear: default_linear finds the "-linear" beside the MoT
    one_process("conversation", argv("conversation", checkpoints, None, tmp_path / "one", *extra), monkeypatch, capsys)
    run = spread(tmp_path, "conversation", argv("conversation", checkpoints, None, tmp_path / "two", *extra))
    assert run.returncode == 0, run.stderr[-3000:]
    assert_same_results(tmp_path / "two", tmp_path / "one")
    rows = pd.read_csv(tmp_path / "one" / "examples.csv")
    assert rows.groupby("condition").size().to_dict() == {c: 3 * 2 for c in (*conversation.CONDITIONS, "linear",
                                                                             "mean")}
    settings = json.loads((tmp_path / "one" / "summary.json").read_text())["settings"]
    assert settings["linear"] == str(checkpoints["smollm2-to-gemma3-linear"])
