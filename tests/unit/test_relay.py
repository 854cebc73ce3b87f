"""The text relay (relay, relay_q): the source writes the message, the target reads it and only it; relay_q's source
sees the question; the evaluator refuses a message length no relay can write and keeps relay rows across --resume."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import CORPUS, FAMILIES, tiny_model
from mot_viz.engine import hf
from mot_viz.engine.alignment import encode
from mot_viz.engine.checkpoint import load_checkpoint, read_config
from mot_viz.engine.prompts import ChatFrame, QAExample, build_prompt
from mot_viz.engine.testing import load_test_model
from mot_viz.eval import evaluate
from mot_viz.eval.answers import answer_from_cache
from mot_viz.eval.costs import main
from mot_viz.sharing.caches import condition_caches
from mot_viz.sharing.relay import (BACKGROUND_INSTRUCTION, LOOP_TOKENS, SUMMARY_INSTRUCTION, read_message, relay,
                                   repeats_itself, source_prompt, write_message)

EXAMPLE = QAExample("q0", "toy/jsonl", CORPUS[0] + " " + CORPUS[1], "Who designed the tower?", ("Gustave Eiffel",))
OTHER_CONTEXT = CORPUS[3] + " " + CORPUS[4]


def scale_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual − expected| relative to the reference's largest magnitude."""
    return float((actual - expected).abs().max() / expected.abs().max())


def greedy_without_cache(lm, ids: list[int], max_tokens: int) -> list[int]:
    """Greedy decoding that runs the whole sequence at every step (no cache): a second computation of the message."""
    stop, out = hf.eos_ids(lm.model, lm.tokenizer), []
    with torch.no_grad():
        for _ in range(max_tokens):
            token = int(lm.model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax())
            if token in stop:
                break
            out.append(token)
    return out


@pytest.mark.parametrize("source_family", FAMILIES)
def test_the_source_writes_the_message_and_the_target_reads_only_it(source_family):
    target_family = FAMILIES[(FAMILIES.index(source_family) + 1) % len(FAMILIES)]
    source = tiny_model(source_family, 300, seed=3)
    target = tiny_model(target_family, 400, seed=4, bos=target_family == "gemma3_text")
    sent = relay(source, target, EXAMPLE, "relay", max_tokens=6)

    # the message is the source's own greedy continuation of its prompt, at most max_tokens tokens
    prompt_ids = source.prefix_ids + encode(source.tokenizer, source_prompt(source, EXAMPLE, "relay"))
    tokens = greedy_without_cache(source, prompt_ids, 6)
    assert sent.tokens == len(tokens) <= 6
    assert sent.message == source.tokenizer.decode(tokens, skip_special_tokens=True).strip()
    assert sent.bytes == len(sent.message.encode("utf-8"))
    assert sent.generate_seconds > 0 and sent.prefill_seconds > 0

    # the target's cache is its own prefill of the native prompt with the message in the passage's place
    read = build_prompt(replace(EXAMPLE, context=sent.message), target.chat_frame).context_text
    ids = torch.tensor([target.prefix_ids + encode(target.tokenizer, read)])
    with torch.no_grad():
        expected = hf.run(target.model, ids, logits_to_keep=None).kv
    assert len(sent.kv) == len(expected)
    for (k, v), (k_ref, v_ref) in zip(sent.kv, expected):
        assert k.shape == k_ref.shape and v.shape == v_ref.shape  # the message's positions, not the context's
        assert scale_error(k, k_ref) < 1e-5 and scale_error(v, v_ref) < 1e-5

    # another context with the same message: the target reads the same cache and gives the same answer
    other = replace(EXAMPLE, context=OTHER_CONTEXT)
    kv_other, _ = read_message(target, other, sent.message)
    for (k, v), (k2, v2) in zip(sent.kv, kv_other):
        assert torch.equal(k, k2) and torch.equal(v, v2)
    assert answer_from_cache(target, kv_other, other, "relay", 4).text == \
        answer_from_cache(target, sent.kv, EXAMPLE, "relay", 4).text


def test_a_loop_is_a_run_of_the_messages_own_tokens_said_again():
    fresh = list(range(100, 140))
    assert not repeats_itself(fresh)
    assert repeats_itself(fresh + fresh[:LOOP_TOKENS])  # a sentence said twice: found when its run is complete
    assert not repeats_itself(fresh + fresh[:LOOP_TOKENS - 1])
    assert not repeats_itself(fresh[:10] + [1] * (LOOP_TOKENS - 1) + fresh[10:])  # one token many times: one run
    period = [7, 8, 9] * 20  # "208/208/208...": found once a run of the cycle stands a second time
    assert not repeats_itself(period[:LOOP_TOKENS + 2]) and repeats_itself(period[:LOOP_TOKENS + 3])


@pytest.mark.parametrize("source_family", [f for f in FAMILIES if f != "gemma3_text"])
def test_a_source_that_loops_is_stopped_before_its_repeat(source_family):
    """A tiny random source falls into a cycle (the tiny Gemma 3 of this seed does not: it reads the message); its
    message is its greedy writing up to where a run of LOOP_TOKENS of its own tokens begins again (computed here
    without a cache), not the cap."""
    source = tiny_model(source_family, 300, seed=3, max_positions=512)
    target = tiny_model("gemma3_text", 400, seed=4, max_positions=512, bos=True)
    cap = 160
    prompt_ids = source.prefix_ids + encode(source.tokenizer, source_prompt(source, EXAMPLE, "relay"))
    full = greedy_without_cache(source, prompt_ids, cap)
    ends = [i for i in range(len(full) + 1) if repeats_itself(full[:i])]
    assert ends, "the tiny source was expected to loop within the cap; pick another seed"
    kept = full[:ends[0] - LOOP_TOKENS]
    sent = relay(source, target, EXAMPLE, "relay", max_tokens=cap)
    assert sent.looped and not sent.capped and sent.tokens == len(kept) < cap
    assert sent.message == source.tokenizer.decode(kept, skip_special_tokens=True).strip()
    assert not repeats_itself(kept)


def test_relay_q_carries_the_question_and_relay_does_not(checkpoints):
    source = tiny_model("llama", 300, seed=3)
    summary, background = source_prompt(source, EXAMPLE, "relay"), source_prompt(source, EXAMPLE, "relay_q")
    assert EXAMPLE.context in summary and EXAMPLE.context in background
    assert SUMMARY_INSTRUCTION in summary and EXAMPLE.question not in summary
    assert BACKGROUND_INSTRUCTION.format(question=EXAMPLE.question) in background
    # a chat-tuned source writes inside its chat turns (its template's head, then the assistant's turn)
    source.__dict__["chat_frame"] = ChatFrame("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")
    framed = source_prompt(source, EXAMPLE, "relay_q")
    # the instruction stands before the passage (KVComm's order), inside the user's turn
    instruction = BACKGROUND_INSTRUCTION.format(question=EXAMPLE.question)
    assert framed.startswith(f"<|im_start|>user\n{instruction}\n\nPassage: {EXAMPLE.context}")
    assert framed.endswith("<|im_start|>assistant\n")
    assert summary.index(SUMMARY_INSTRUCTION) < summary.index(EXAMPLE.context)
    # the evaluator's caches: each relay message written by the source about this example, its cost recorded
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot = load_checkpoint(checkpoints["smollm2-to-gemma3"], source, target)[0]
    built = condition_caches(mot, source, target, EXAMPLE, conditions=("native", "relay", "relay_q"),
                             options={"relay_tokens": 5})
    for condition in ("relay", "relay_q"):
        written = write_message(source, EXAMPLE, condition, 5)
        sent = built.built[condition].held
        assert (sent.message, sent.tokens) == (written.text, written.tokens) and built.kv[condition] is sent.kv
        assert sent.capped == (written.tokens == 5)
        assert built.seconds[condition] == pytest.approx(sent.generate_seconds + sent.prefill_seconds, rel=1e-9)
    # relay's writing needs no question: done ahead; relay_q writes for the question: after it
    sent = built.built["relay"].held
    assert built.ahead["relay"] == sent.generate_seconds and built.ahead["relay_q"] == 0.0
    assert built.after_question("relay") == pytest.approx(sent.prefill_seconds, rel=1e-9)
    assert built.after_question("relay_q") == pytest.approx(built.seconds["relay_q"], rel=1e-9)


@pytest.fixture()
def data(toy_jsonl):
    return toy_jsonl([{"id": f"q{i}", "context": CORPUS[i % 4], "question": "Where is it?", "answers": ["in Paris"]}
                      for i in range(3)])


def argv(checkpoints, data, out, n, *extra) -> list[str]:
    return ["--checkpoint", str(checkpoints["smollm2-to-gemma3"]), "--datasets", str(data), "--n", str(n),
            "--max_new_tokens", "2", "--bootstrap", "20", "--out", str(out), *extra]


@pytest.mark.parametrize("value", ["0", "-3", "5000"])
def test_a_message_length_no_relay_can_write_is_one_line_before_any_model_loads(capsys, checkpoints, data, tmp_path,
                                                                               monkeypatch, value):
    def load_model(name):
        raise AssertionError(f"a model ({name}) was loaded before the arguments were checked")

    monkeypatch.setattr(evaluate, "load_model", load_model)
    out = tmp_path / "out"
    assert evaluate.main(argv(checkpoints, data, out, 2, "--conditions", "relay", "--relay_tokens", value)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ConfigError: --relay_tokens ") and err.count("\n") == 1 and "Pass --relay_tokens" in err
    assert not out.exists()


def table(out) -> pd.DataFrame:
    """examples.csv exactly as written (every field a string), without the timings."""
    rows = pd.read_csv(out / "examples.csv", dtype=str, keep_default_na=False)
    return rows.drop(columns=[c for c in rows if c.endswith("seconds")])


def test_relay_rows_survive_resume_and_old_folders_still_resume(checkpoints, data, tmp_path, monkeypatch):
    monkeypatch.setattr(evaluate, "load_model", load_test_model)
    relay_argv = lambda out, n, *extra: argv(checkpoints, data, out, n, "--conditions", "no_context", "mot", "relay",  # noqa: E731
                                             "relay_q", "--relay_tokens", "4", *extra)
    assert evaluate.main(relay_argv(tmp_path / "whole", 3)) == 0
    whole = table(tmp_path / "whole")
    relayed = whole[whole["condition"].isin(["relay", "relay_q"])]
    assert len(relayed) == 6 and (relayed["message_tokens"].astype(float) <= 4).all()
    assert [len(m.encode("utf-8")) for m in relayed["message"]] == relayed["message_bytes"].astype(float).tolist()
    assert (whole.loc[~whole["condition"].isin(["relay", "relay_q"]), "message"] == "").all()
    seconds = pd.read_csv(tmp_path / "whole" / "examples.csv")
    assert (seconds.loc[seconds["condition"] == "relay", "message_generate_seconds"] > 0).all()
    # the time columns add up: relay's writing is done ahead, its seconds are the target's reading and its answer;
    # relay_q's seconds hold its writing too; both answer in one batch, so their answer shares are equal
    by = {c: seconds[seconds["condition"] == c].set_index("id") for c in ("mot", "relay", "relay_q")}
    relay_rows, relay_q_rows = by["relay"], by["relay_q"]
    assert np.allclose(relay_rows["ahead_seconds"], relay_rows["message_generate_seconds"], rtol=1e-9)
    assert (relay_q_rows["ahead_seconds"] == 0).all() and (by["mot"]["ahead_seconds"] > 0).all()
    relay_answer = relay_rows["seconds"] - relay_rows["message_prefill_seconds"]
    relay_q_answer = relay_q_rows["seconds"] - relay_q_rows["message_generate_seconds"] \
        - relay_q_rows["message_prefill_seconds"]
    assert (relay_answer > 0).all() and np.allclose(relay_answer, relay_q_answer, rtol=1e-6)
    # the summary: the share of messages at the cap, and gap closed with its floor (no context 0, native 1)
    summary = pd.read_csv(tmp_path / "whole" / "summary.csv").set_index("condition")
    for condition in ("relay", "relay_q"):
        rows = relay_rows if condition == "relay" else relay_q_rows
        assert summary.loc[condition, "messages_at_cap"] == pytest.approx((rows["message_tokens"] >= 4).mean(),
                                                                          rel=1e-9)
        assert rows["message_looped"].isin([0, 1]).all()
        assert summary.loc[condition, "messages_looped"] == pytest.approx(rows["message_looped"].mean(), rel=1e-9)
    assert pd.isna(summary.loc["mot", "messages_at_cap"]) and pd.isna(summary.loc["mot", "messages_looped"])
    if summary.loc["native", "mean"] != summary.loc["no_context", "mean"]:
        assert summary.loc["native", "gap_closed"] == pytest.approx(1.0, rel=1e-9)
        assert summary.loc["no_context", "gap_closed"] == 0.0
    assert "| gap closed [95% CI] |" in (tmp_path / "whole" / "summary.md").read_text()
    # what each condition is handed and costs, read back from the rows
    assert main([str(tmp_path / "whole")]) == 0
    costs = pd.read_csv(tmp_path / "whole" / "costs.csv").set_index("condition")
    config = read_config(checkpoints["smollm2-to-gemma3"])
    # what each way hands over: the rows' own cost columns (the methods' cost functions), averaged
    assert costs.loc["relay", "handed_bytes"] == pytest.approx(relayed[relayed["condition"] == "relay"][
        "message_bytes"].astype(float).mean(), rel=1e-9)
    per_token = len(config["channels"]) * 2 * config["target"]["num_kv_heads"] * config["target"]["head_dim"] * 2
    assert costs.loc["mot", "handed_bytes"] == pytest.approx(costs.loc["mot", "context_tokens"] * per_token, rel=1e-9)
    assert costs.loc["native", "handed_bytes"] > costs.loc["mot", "handed_bytes"] > costs.loc["no_context",
                                                                                             "handed_bytes"] == 0
    assert costs.loc["mot", "target_work"] == "replay" and costs.loc["relay", "target_work"] == "prefill"
    assert costs["handed_bytes"].notna().all()  # every way of sharing's bytes are a number
    relay_costs = costs.loc["relay"]
    assert relay_costs["build_seconds"] == pytest.approx(relay_costs["write_seconds"] + relay_costs["read_seconds"],
                                                         rel=1e-6)
    assert (costs["answer_seconds"] > 0).all() and costs.loc["mot", "answer_seconds"] == relay_costs["answer_seconds"]
    assert np.allclose(costs["ahead_seconds"] + costs["after_question_seconds"], costs["seconds"], rtol=1e-9)
    assert np.allclose(costs["build_seconds"] + costs["answer_seconds"], costs["seconds"], rtol=1e-9)
    assert relay_costs["ahead_seconds"] == pytest.approx(relay_costs["write_seconds"], rel=1e-9)
    # a shorter run resumed to the same rows: the relay rows kept as they were written
    assert evaluate.main(relay_argv(tmp_path / "part", 2)) == 0
    before = table(tmp_path / "part")
    assert evaluate.main(relay_argv(tmp_path / "part", 3, "--resume")) == 0
    pd.testing.assert_frame_equal(table(tmp_path / "part").iloc[: len(before)], before)
    pd.testing.assert_frame_equal(table(tmp_path / "part"), whole)
    # another message length is another run
    assert evaluate.main(argv(checkpoints, data, tmp_path / "part", 3, "--conditions", "mot", "relay", "relay_q",
                              "--relay_tokens", "5", "--resume")) == 2
    # a folder written before the message columns existed resumes, and gains them
    old = tmp_path / "old"
    assert evaluate.main(argv(checkpoints, data, old, 2)) == 0
    rows = pd.read_csv(old / "examples.csv", dtype=str, keep_default_na=False)
    rows[list(evaluate.EARLIER_ROW_COLUMNS[1])].to_csv(old / "examples.csv", index=False)
    settings = json.loads((old / "summary.json").read_text())
    del settings["settings"]["relay_tokens"]
    (old / "summary.json").write_text(json.dumps(settings))
    kept = table(old)
    assert evaluate.main(argv(checkpoints, data, old, 3, "--resume")) == 0
    resumed = table(old)
    assert list(resumed.columns) == [c for c in evaluate.ROW_COLUMNS if not c.endswith("seconds")]
    pd.testing.assert_frame_equal(resumed[list(kept.columns)].iloc[: len(kept)], kept)


@pytest.mark.parametrize("target_family", FAMILIES)
def test_a_relay_whose_message_is_the_passage_itself_is_native(target_family):
    """The relay's ceiling: were the source's message the passage itself, the target would read exactly its native
    prompt, so its cache and its answer are native's (a weak relay is its messages, not its reading)."""
    target = tiny_model(target_family, 400, seed=4, bos=target_family == "gemma3_text")
    kv, _ = read_message(target, EXAMPLE, EXAMPLE.context)
    ids = torch.tensor([target.prefix_ids + encode(target.tokenizer,
                                                   build_prompt(EXAMPLE, target.chat_frame).context_text)])
    with torch.no_grad():
        native = hf.run(target.model, ids, logits_to_keep=None).kv
    assert len(kv) == len(native)
    for (k, v), (k_ref, v_ref) in zip(kv, native):
        assert k.shape == k_ref.shape and scale_error(k, k_ref) < 1e-6 and scale_error(v, v_ref) < 1e-6
    assert answer_from_cache(target, kv, EXAMPLE, "relay", 4).text == \
        answer_from_cache(target, native, EXAMPLE, "native", 4).text
