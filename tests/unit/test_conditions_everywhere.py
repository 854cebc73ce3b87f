"""The other ways of sharing a context (relay, relay_q, direct, kvcomm) in the long-context, conversation and shard
evaluations: each runs, the relay's target reads only the message, each survives --resume, and bad input is one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from mot_viz.data.coqa import Conversation, Turn
from mot_viz.engine import hf
from mot_viz.engine.alignment import encode
from mot_viz.engine.channels import terminal_channels
from mot_viz.engine.checkpoint import load_checkpoint, save_checkpoint
from mot_viz.engine.models import kv_cache_bytes
from mot_viz.engine.mot import MoT, translate
from mot_viz.data.long_context import distractor_stacks
from mot_viz.engine.prompts import build_prompt
from mot_viz.engine.replay_config import replay_mode
from mot_viz.engine.shards import translate_shards_direct
from mot_viz.engine.testing import CORPUS, load_test_model, tiny_model
from mot_viz.errors import ConfigError
from mot_viz.fsutil import write_csv_atomic
from mot_viz.eval import conversation, long_context
from mot_viz.eval import shards as shard_eval
from mot_viz.eval.answers import answer_from_cache
from mot_viz.sharing.linear import linear_cache
from mot_viz.sharing.mean import mean_vector_cache
from mot_viz.eval.conversation import ConversationSettings, history_text, turn_example
from mot_viz.eval.long_settings import LongSettings
from mot_viz.train.mean_vector import reference_means
from mot_viz.sharing.relay import read_message
from mot_viz.eval.shards import ShardSettings
from test_shards import SHARDS, cache_at_offset, identity_mot
from run_settings import settings_of
from rival_networks import trained_networks
from tolerance import assert_close
from mot_viz.train.quickfit import QuickFitConfig, fit_pair

DIRECT = QuickFitConfig(tokens=256, min_context_tokens=16, max_context_tokens=48, direct=True, top_k=2)


def load(name: str):
    """The models of the test pair: a 6-layer tiny Llama source (a direct map needs a source layer per target layer)
    and the tiny Gemma 3 target."""
    return tiny_model("llama", 300, 6, 0, max_positions=4096, name=name) if name == "source6" \
        else load_test_model(name)


def random_checkpoint(source, target, path: Path, **kwargs) -> Path:
    torch.manual_seed(7)
    mot = MoT.build(source.spec, target.spec, terminal_channels(source.spec.num_layers, target.spec.num_layers, 0.5),
                    dim=32, heads=4, output_activation="none", **kwargs)
    return save_checkpoint(mot, path, metrics={"note": "randomly initialised test checkpoint"})


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A MoT of the test pair, its direct map and its linear window, the networks of the ways of sharing trained here,
    and a MoT between two copies of the source (kvcomm's pair)."""
    root = tmp_path_factory.mktemp("checkpoints")
    source, target = load("source6"), load("gemma3-270m")
    paths = {"mot": random_checkpoint(source, target, root / "mot", variant="mot", num_experts=4, top_k=2),
             "same": random_checkpoint(source, source, root / "same", variant="single"),
             "linear": random_checkpoint(source, target, root / "linear", variant="linear")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOT_VIZ_CACHE", str(root / "cache"))
        paths["direct"] = fit_pair(source, target, DIRECT)
    paths.update(trained_networks(source, target, root / "runs", root, "mot"))  # each found beside the MoT
    return paths


def long_settings(checkpoints, **kw) -> LongSettings:
    base = dict(checkpoint=str(checkpoints["mot"]), source="stacks", budgets=(300,), n=1,
                seed=0, max_new_tokens=3, bootstrap=20,
                conditions=("native", "no_context", "mot", "relay", "relay_q", "direct"), relay_tokens=5,
                direct=str(checkpoints["direct"]))
    return settings_of(LongSettings, **{**base, **kw})


def test_long_context_answers_under_every_way_of_sharing_and_resumes(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(long_context, "load_model", load)
    out = tmp_path / "long"
    summary = long_context.run(long_settings(checkpoints), out, progress=False)
    rows = pd.read_csv(out / "examples.csv", dtype={"message": str}, keep_default_na=False, na_values=[""])
    assert list(rows["condition"]) == ["native", "no_context", "mot", "relay", "relay_q", "direct"]
    row = rows.set_index("condition")
    target = load_test_model("gemma3-270m")
    n = int(row.loc["mot", "context_tokens"])
    for relay in ("relay", "relay_q"):  # the message's columns, as evaluate's rows hold them
        r = row.loc[relay]
        assert 0 < r["message_tokens"] <= 5 and r["message_bytes"] == len(str(r["message"]).encode())
        assert r["handed_bytes"] == r["message_bytes"] and r["target_work"] == "prefill"
        # relay's writing is done ahead of the question (it needs none); relay_q writes for the question
        writing = r["message_generate_seconds"] if relay == "relay_q" else 0.0
        assert r["target_side_seconds"] == pytest.approx(writing + r["message_prefill_seconds"], rel=1e-6)
        # the target computed over the message only: its prompt with the message in the document's place
        kv, _ = read_message(target, long_context.long_examples("stacks", target.tokenizer, 300, 1, 0)[0].example,
                             str(r["message"]))
        assert r["target_tokens"] == kv[0][0].shape[2] - len(target.prefix_ids) < n
    assert row.loc["native", "handed_bytes"] == kv_cache_bytes(target.spec, n)
    assert row.loc["mot", "target_work"] == "replay" and row.loc["mot", "target_tokens"] == n
    assert row.loc["direct", "target_work"] == "none" and row.loc["no_context", "handed_bytes"] == 0
    # direct hands over every layer's K and V, the MoT its window's
    assert row.loc["direct", "handed_bytes"] / row.loc["mot", "handed_bytes"] == pytest.approx(
        target.spec.num_layers / 3)
    assert pd.isna(row.loc["direct", "replay"]) and row.loc["direct", "translator"] > 0
    s = summary.set_index("condition")
    assert s.loc["relay", "first_token_seconds"] == pytest.approx(  # the reading counted, one document
        row.loc["relay", "target_side_seconds"] + row.loc["relay", "first_token_seconds"])
    stages = pd.read_csv(out / "stages.csv")
    assert {"relay: source writes (done ahead)", "relay: target reads", "relay_q: source writes",
            "direct: alignment + translator + assemble"} <= set(stages.columns)
    paired = pd.read_csv(out / "paired.csv").set_index(["a", "b"])
    assert {("mot", "relay"), ("mot", "relay_q"), ("mot", "direct")} <= set(paired.index)
    md = (out / "summary.md").read_text()
    assert "--direct" in md and "--relay_tokens 5" in md and "handed over" in md

    computed = []
    real = long_context.document_rows
    monkeypatch.setattr(long_context, "document_rows",
                        lambda *a, **k: computed.append(a[3].example.id) or real(*a, **k))
    long_context.run(long_settings(checkpoints, n=2), out, resume=True, progress=False)
    both = pd.read_csv(out / "examples.csv", dtype={"message": str}, keep_default_na=False, na_values=[""])
    assert len(computed) == 1 and both["id"].nunique() == 2
    pd.testing.assert_frame_equal(both[both["id"].isin(rows["id"])].reset_index(drop=True), rows)
    with pytest.raises(ConfigError, match="relay_tokens differ"):
        long_context.run(long_settings(checkpoints, n=2, relay_tokens=6), out, resume=True, progress=False)


def test_long_context_kvcomm_on_a_pair_of_one_architecture(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(long_context, "load_model", load)
    out = tmp_path / "kvcomm"
    long_context.run(long_settings(checkpoints, checkpoint=str(checkpoints["same"]), direct=None,
                                   conditions=("native", "mot", "kvcomm"), kvcomm_fraction=0.5), out, progress=False)
    rows = pd.read_csv(out / "examples.csv").set_index("condition")
    meta = json.loads((out / "summary.json").read_text())
    layers = meta["settings"]["kvcomm_layers"]
    source = load("source6").spec
    assert len(layers) == 3 and rows.loc["kvcomm", "target_work"] == "none"  # half of the source's 6 layers
    assert rows.loc["kvcomm", "handed_bytes"] == rows.loc["kvcomm", "context_tokens"] * 3 * 2 * source.kv_hidden * 2


@pytest.mark.parametrize("change, message", [
    (dict(relay_tokens=0), "--relay_tokens must be at least 1"),
    (dict(direct=None), "the 'direct' condition needs --direct CHECKPOINT"),
    (dict(conditions=("native", "kvcomm"), direct=None), "The kvcomm condition"),
    (dict(conditions=("native", "direct"), direct="LINEAR"), "needs a full-depth map without replay"),
])
def test_long_context_refuses_bad_sharing_input_in_one_line(checkpoints, tmp_path, capsys, monkeypatch, change,
                                                            message):
    monkeypatch.setattr(long_context, "load_model", lambda name: pytest.fail("a model was loaded"))
    s = long_settings(checkpoints, **change)
    argv = ["--checkpoint", s.checkpoint, "--budgets", "300", "--n", "1", "--conditions", *s.conditions,
            *s.option_args(s.conditions).replace("LINEAR", str(checkpoints["linear"])).split(),
            "--out", str(tmp_path / "out")]
    assert long_context.main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


# ----- conversation ------------------------------------------------------------------------------------------------

TINY = Conversation("tiny", "test", CORPUS[0] + " " + CORPUS[1],
                    (Turn("Where is the tower?", ("in Paris",)), Turn("Who built it?", ("Gustave Eiffel's company",))))


def conversation_settings(checkpoints, **kw) -> ConversationSettings:
    base = dict(checkpoint=str(checkpoints["mot"]), n=1, turns=2, seed=0, max_new_tokens=3, max_story_tokens=3000,
                bootstrap=20, conditions=("native", "mot", "no_context", "relay", "direct"), relay_tokens=5,
                direct=str(checkpoints["direct"]))
    return settings_of(ConversationSettings, **{**base, **kw})


def test_a_conversation_keeps_the_relay_message_as_its_context(checkpoints):
    source, target = load("source6"), load("gemma3-270m")
    mot = load_checkpoint(checkpoints["mot"], source, target)[0]
    artifacts = {"direct": load_checkpoint(checkpoints["direct"], source, target)[0]}
    rows = pd.DataFrame(conversation.conversation_rows(mot, source, target, TINY, conversation_settings(checkpoints),
                                                       artifacts))
    by = rows.set_index(["condition", "turn"])
    message = by.loc[("relay", 1), "message"]
    assert by.loc[("relay", 2), "message"] == message  # written once per story
    # the relay's cache is the target's own prefill of the message (in the passage's place), then the history
    first = turn_example(TINY, 0)
    ids = target.prefix_ids + encode(target.tokenizer, build_prompt(replace(first, context=message),
                                                                     target.chat_frame).context_text)
    history = encode(target.tokenizer, history_text(build_prompt(first, target.chat_frame).suffix_text,
                                                    TINY.turns[0].answers[0]))
    assert by.loc[("relay", 1), "target_tokens"] == len(ids) - len(target.prefix_ids)
    second_history = encode(target.tokenizer, history_text(build_prompt(turn_example(TINY, 1), target.chat_frame)
                                                           .suffix_text, TINY.turns[1].answers[0]))
    assert by.loc[("relay", 2), "cache_tokens"] == len(ids) + len(history) + len(second_history)
    kv = hf.run(target.model, target.ids_tensor(ids + history), logits_to_keep=None).kv
    second = turn_example(TINY, 1)
    own = answer_from_cache(target, kv, second, "relay", 3, build_prompt(second, target.chat_frame).suffix_text)
    assert by.loc[("relay", 2), "answer"] == own.text
    # the direct map's cache of the story, kept and extended like the others
    assert by.loc[("direct", 1), "cache_tokens"] == by.loc[("mot", 1), "cache_tokens"]
    assert by.loc[("direct", 1), "target_work"] == "none" and by.loc[("mot", 1), "target_work"] == "replay"


def test_the_conversation_runs_every_way_of_sharing_and_resumes(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(conversation, "load_model", load)
    out = tmp_path / "conv"
    conversation.run(conversation_settings(checkpoints), out, progress=False)
    first = pd.read_csv(out / "examples.csv", dtype={"message": str}, keep_default_na=False, na_values=[""])
    assert set(first["condition"]) == {"native", "mot", "no_context", "relay", "direct"} and len(first) == 2 * 5
    md = (out / "summary.md").read_text()
    assert "Ways of sharing the story" in md and "| relay |" in md and "| direct |" in md
    paired = pd.read_csv(out / "paired.csv").set_index("b")
    wide = first.pivot_table(index="id", columns="condition", values="score")
    assert paired.loc["relay", "diff"] == pytest.approx(float((wide["mot"] - wide["relay"]).iloc[0]))
    computed = []
    real = conversation.conversation_rows
    monkeypatch.setattr(conversation, "conversation_rows", lambda *a, **k: computed.append(a[3].id) or real(*a, **k))
    conversation.run(conversation_settings(checkpoints, n=2), out, resume=True, progress=False)
    both = pd.read_csv(out / "examples.csv", dtype={"message": str}, keep_default_na=False, na_values=[""])
    assert len(computed) == 1 and both["id"].nunique() == 2
    pd.testing.assert_frame_equal(both[both["id"].isin(first["id"])].reset_index(drop=True), first)


def test_a_kvcomm_conversation_keeps_the_senders_cache_of_the_story(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(conversation, "load_model", load)
    out = tmp_path / "kvcomm"
    conversation.run(conversation_settings(checkpoints, checkpoint=str(checkpoints["same"]), direct=None,
                                           conditions=("native", "mot", "no_context", "kvcomm"), kvcomm_fraction=0.5),
                     out, progress=False)
    rows = pd.read_csv(out / "examples.csv").set_index(["condition", "turn"])
    assert rows.loc[("kvcomm", 2), "cache_tokens"] == rows.loc[("native", 2), "cache_tokens"]
    assert len(json.loads((out / "summary.json").read_text())["settings"]["kvcomm_layers"]) == 3


@pytest.mark.parametrize("change, message", [
    (dict(conditions=("native", "mot", "no_context", "relay_q")), "relay_q writes the background for one question"),
    (dict(relay_tokens=0), "--relay_tokens must be at least 1"),
    (dict(direct=None), "the 'direct' condition needs --direct CHECKPOINT"),
    (dict(conditions=("native", "mot", "no_context", "kvcomm"), direct=None), "The kvcomm condition"),
    (dict(conditions=("native", "mot", "no_context", "linear"), direct=None),  # no "mot-linear" beside "mot"
     "the linear condition needs the pair's closed-form map"),
    (dict(conditions=("native", "mot", "no_context", "linear"), direct=None, linear="same"),
     "was made for another model pair"),
])
def test_the_conversation_refuses_bad_sharing_input_in_one_line(checkpoints, tmp_path, capsys, monkeypatch, change,
                                                                message):
    monkeypatch.setattr(conversation, "load_model", lambda name: pytest.fail("a model was loaded"))
    s = conversation_settings(checkpoints, **change)
    argv = ["--checkpoint", s.checkpoint, "--n", "1", "--turns", "2", "--max_story_tokens", "500", "--conditions",
            *s.conditions, *s.option_args(s.conditions).replace("--linear same", f"--linear {checkpoints['same']}")
            .split(), "--out", str(tmp_path / "out")]
    assert conversation.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_a_conversation_keeps_the_linear_maps_and_the_mean_windows_cache_of_the_story(checkpoints, monkeypatch):
    source, target = load("source6"), load("gemma3-270m")
    mot = load_checkpoint(checkpoints["mot"], source, target)[0]
    linear = load_checkpoint(checkpoints["linear"], source, target)[0]
    means = reference_means(target, mot.channels.target_layers)
    asked = []
    real = conversation.answers_from_caches
    monkeypatch.setattr(conversation, "answers_from_caches", lambda target, caches, *a, **k: asked.append(
        dict(caches)) or real(target, caches, *a, **k))
    settings = conversation_settings(checkpoints, conditions=("native", "mot", "no_context", "linear", "mean"),
                                     direct=None, linear=str(checkpoints["linear"]))
    rows = pd.DataFrame(conversation.conversation_rows(mot, source, target, TINY, settings,
                                                       {"linear": linear, "mean": means}))
    assert sorted(map(tuple, rows[["turn", "condition"]].to_numpy())) == sorted(
        (t, c) for t in (1, 2) for c in settings.conditions)
    # turn 1 reads each control's own cache of the story: the linear map's window of the MoT's source context, the
    # mean window, each replayed as the MoT's; neither is the MoT's own
    translation = translate(mot, source, target, build_prompt(turn_example(TINY, 0), target.chat_frame).context_text)
    for condition, own in (("linear", linear_cache(mot, linear, source, target, translation)),
                           ("mean", mean_vector_cache(mot, target, translation, means))):
        for (k, v), (k0, v0), (km, _) in zip(asked[0][condition], own, asked[0]["mot"], strict=True):
            assert_close(k, k0)
            assert_close(v, v0)
        assert any(not torch.allclose(k, km) for (k, _), (km, _) in zip(asked[0][condition], asked[0]["mot"]))
    by = rows.set_index(["condition", "turn"])
    for condition in ("linear", "mean"):  # kept and extended like the MoT's; costed as long_context costs them
        assert by.loc[(condition, 2), "cache_tokens"] == by.loc[("mot", 2), "cache_tokens"]
        assert by.loc[(condition, 1), "target_work"] == "replay"
        assert by.loc[(condition, 1), "handed_bytes"] == by.loc[("mot", 1), "handed_bytes"]
        assert pd.isna(by.loc[(condition, 1), "target_side_seconds"])


def test_a_conversation_run_answers_linear_and_mean_and_resumes_the_missing_story(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(conversation, "load_model", load)
    out = tmp_path / "controls"
    settings = lambda: conversation_settings(  # noqa: E731
        checkpoints, n=2, conditions=("native", "mot", "no_context", "linear", "mean"), direct=None,
        linear=str(checkpoints["linear"]))
    conversation.run(settings(), out, progress=False)
    first = pd.read_csv(out / "examples.csv", keep_default_na=False, na_values=[""])
    assert first["id"].nunique() == 2 and len(first) == 2 * 2 * 5
    assert first.groupby(["id", "turn"])["condition"].apply(set).map({"linear", "mean"}.issubset).all()
    summary = pd.read_csv(out / "summary.csv").set_index(["turn", "condition"])
    assert {(t, c) for t in (1, 2) for c in ("linear", "mean")} <= set(summary.index)
    paired = pd.read_csv(out / "paired.csv").set_index(["a", "b"])
    assert {("mot", "linear"), ("mot", "mean"), ("linear", "mean")} <= set(paired.index)
    wide = first.pivot_table(index="id", columns="condition", values="score")
    assert paired.loc[("linear", "mean"), "diff"] == pytest.approx((wide["linear"] - wide["mean"]).mean())
    meta = json.loads((out / "summary.json").read_text())["settings"]
    assert meta["linear"] == str(checkpoints["linear"])
    md = (out / "summary.md").read_text()
    assert f"--linear {checkpoints['linear']}" in md and "--conditions native mot no_context linear mean" in md
    assert "| linear |" in md and "| mean |" in md
    # an older summary.json, written before --linear, still reads
    older = {k: v for k, v in meta.items() if k != "linear"}
    assert ConversationSettings.from_json(older).options["linear"] is None
    last = first["id"].iloc[-1]
    write_csv_atomic(out / "examples.csv", first[first["id"] != last])
    computed = []
    real = conversation.conversation_rows
    monkeypatch.setattr(conversation, "conversation_rows", lambda *a, **k: computed.append(a[3].id) or real(*a, **k))
    conversation.run(settings(), out, resume=True, progress=False)
    again = pd.read_csv(out / "examples.csv", keep_default_na=False, na_values=[""])
    assert computed == [last]
    key = ["id", "turn", "condition"]
    pd.testing.assert_frame_equal(again.sort_values(key)[[*key, "score", "answer"]].reset_index(drop=True),
                                  first.sort_values(key)[[*key, "score", "answer"]].reset_index(drop=True))
    with pytest.raises(ConfigError, match="linear differ"):
        conversation.run(conversation_settings(checkpoints, n=2, conditions=settings().conditions, direct=None,
                                               linear=str(checkpoints["mot"])), out, resume=True, progress=False)


# ----- shards ------------------------------------------------------------------------------------------------------


def identity_direct(lm) -> MoT:
    """A full-depth map without replay from a model to itself that writes its input: every layer's K to K, V to V."""
    layers = tuple(range(lm.spec.num_layers))
    mot = identity_mot(lm, layers)
    mot.replay = replay_mode(mot.replay, "none")
    return mot


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])  # tiny Llama (no BOS), tiny Gemma 3 (BOS, sliding)
def test_each_directly_translated_shard_is_the_models_cache_of_that_shard_at_its_offset(name):
    lm = load_test_model(name)
    out = translate_shards_direct(identity_direct(lm), lm, lm, SHARDS[:3])
    p = len(lm.prefix_ids)
    lengths = [len(encode(lm.tokenizer, t)) for t in SHARDS[:3]]
    assert out.offsets == (0, lengths[0], lengths[0] + lengths[1])
    assert out.mixed_kv[0][0].shape[2] == p + sum(lengths) and len(out.mixed_kv) == lm.spec.num_layers
    for text, offset, n in zip(SHARDS[:3], out.offsets, lengths):
        own = cache_at_offset(lm, text, offset)
        for (k, v), (k0, v0) in zip(out.mixed_kv, own):
            assert_close(k[:, :, p + offset:p + offset + n], k0[:, :, p:])
            assert_close(v[:, :, p + offset:p + offset + n], v0[:, :, p:])
    assert set(out.timings) >= {"source_prefill", "source_prefill_max", "translator", "assemble"}


def shard_settings(checkpoints, **kw) -> ShardSettings:
    base = dict(checkpoint=str(checkpoints["mot"]), budget=400, shards=(2,), n=1, seed=0, max_new_tokens=3,
                bootstrap=20, sharing=("relay", "relay_q", "direct"), relay_tokens=5, direct=str(checkpoints["direct"]))
    return settings_of(ShardSettings, **{**base, **kw})


def test_shards_relay_and_direct_from_each_agent_and_resume(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(shard_eval, "load_model", load)
    out = tmp_path / "shards"
    shard_eval.run(shard_settings(checkpoints), out, progress=False)
    first = pd.read_csv(out / "examples.csv", dtype={"message": str}, keep_default_na=False, na_values=[""])
    assert first["condition"].tolist() == ["native", "whole", "shards_2", "evidence_2", "relay", "relay_2", "relay_q",
                                           "relay_q_2", "direct", "direct_2", "no_context"]
    rows = first.set_index("condition")
    target = load("gemma3-270m")
    doc = distractor_stacks(target.tokenizer, 400, 1, seed=0)[0]
    for c, agents in (("relay", 1), ("relay_2", 2), ("relay_q_2", 2)):  # the hub prefilled the messages only
        r = rows.loc[c]
        kv, _ = read_message(target, doc.example, str(r["message"]))
        assert r["hub_tokens"] == kv[0][0].shape[2] < rows.loc["native", "hub_tokens"] and r["shards"] == agents
        assert 0 < r["message_tokens"] <= 5 * agents and r["handed_bytes"] == r["message_bytes"]
        assert r["message_generate_max_seconds"] <= r["message_generate_seconds"]
    assert rows.loc["relay_2", "source_max_mb"] < rows.loc["relay_2", "source_mb"]  # each agent held its own shard
    # relay's agents write ahead of the question; relay_q's slowest agent writes after it
    assert rows.loc["relay_2", "target_side_seconds"] == pytest.approx(rows.loc["relay_2", "message_prefill_seconds"],
                                                                       rel=1e-6)
    assert rows.loc["relay_q_2", "target_side_seconds"] == pytest.approx(
        rows.loc["relay_q_2", "message_generate_max_seconds"] + rows.loc["relay_q_2", "message_prefill_seconds"],
        rel=1e-6)
    assert abs(rows.loc["direct_2", "hub_tokens"] - rows.loc["shards_2", "hub_tokens"]) == 0
    assert rows.loc["direct_2", "target_work"] == "none" and rows.loc["shards_2", "target_work"] == "replay"
    assert rows.loc["direct_2", "source_max_mb"] < rows.loc["direct", "source_mb"]
    paired = pd.read_csv(out / "paired.csv").set_index(["a", "b"])
    assert {("whole", "relay"), ("shards_2", "relay_2"), ("whole", "direct"), ("shards_2", "direct_2")} <= set(
        paired.index)
    md = (out / "summary.md").read_text()
    assert "--conditions relay relay_q direct" in md and "handed over" in md
    computed = []
    real = shard_eval.document_rows
    monkeypatch.setattr(shard_eval, "document_rows", lambda *a, **k: computed.append(a[3].example.id) or real(*a, **k))
    shard_eval.run(shard_settings(checkpoints, n=2), out, resume=True, progress=False)
    both = pd.read_csv(out / "examples.csv", dtype={"message": str}, keep_default_na=False, na_values=[""])
    assert len(computed) == 1 and both["id"].nunique() == 2
    pd.testing.assert_frame_equal(both[both["id"].isin(first["id"])].reset_index(drop=True), first)


@pytest.mark.parametrize("change, message", [
    (dict(relay_tokens=0), "--relay_tokens must be at least 1"),
    (dict(direct=None), "the 'direct' condition needs --direct CHECKPOINT"),
    (dict(sharing=("direct",), direct="LINEAR"), "needs a full-depth map without replay"),
])
def test_shards_refuse_bad_sharing_input_in_one_line(checkpoints, tmp_path, capsys, monkeypatch, change, message):
    monkeypatch.setattr(shard_eval, "load_model", lambda name: pytest.fail("a model was loaded"))
    s = shard_settings(checkpoints, **change)
    argv = ["--checkpoint", s.checkpoint, "--budget", "400", "--shards", "2", "--n", "1", "--conditions", *s.sharing,
            *s.option_args(s.sharing).replace("LINEAR", str(checkpoints["linear"])).split(),
            "--out", str(tmp_path / "out")]
    assert shard_eval.main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
