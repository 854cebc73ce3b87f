"""Answers from every condition and the evaluator's summary, on a tiny pair."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import CORPUS, tiny_model
from mot_viz.engine.channels import Channels
from mot_viz.engine.mot import MoT
from mot_viz.engine.prompts import QAExample
from mot_viz.errors import ConfigError
from mot_viz.eval.answers import answer_all
from mot_viz.sharing.caches import condition_caches
from mot_viz.engine.cache_errors import kv_cosine
from mot_viz.eval.evaluate import evaluate_examples
from mot_viz.eval.qa_settings import EvalSettings, load_evaluated, truncate_context
from mot_viz.eval.report import summarize
from mot_viz.eval.answers import CONDITIONS

EXTRACTIVE = QAExample(id="e1", dataset="toy", context=CORPUS[0] + " " + CORPUS[1], question="Who built it?",
                       answers=("Gustave Eiffel",))
CLOSED = QAExample(id="c1", dataset="toy-closed", context=CORPUS[0], question="Is it in Paris?", choices=("yes", "no"),
                   label=0)


@pytest.fixture(scope="module")
def setup():
    source = tiny_model("llama", vocab_size=280, seed=1)
    target = tiny_model("gemma3_text", bos=True)
    torch.manual_seed(0)
    mot = MoT.build(source.spec, target.spec, Channels((2, 3), (2, 3)), dim=16, heads=2)
    return mot, source, target


def test_every_condition_answers_both_kinds(setup):
    for example in (EXTRACTIVE, CLOSED):
        answers = answer_all(*setup, example, max_new_tokens=4)
        assert set(answers) == {"native", "no_context", "mot", "random"}
        for a in answers.values():
            assert 0.0 <= a.score <= 1.0 and a.seconds >= 0
            if example.kind == "closed":
                assert a.text in ("yes", "no") and len(a.choice_logprobs) == 2 and a.exact_match is None
                assert a.score == float(a.text == "yes")
            else:
                assert a.exact_match in (0.0, 1.0) and a.choice_logprobs is None
    # no context and native differ in what the target attends to, so their label scores differ
    answers = answer_all(*setup, CLOSED)
    assert answers["native"].choice_logprobs != answers["no_context"].choice_logprobs


def test_evaluator_rows_and_summary(setup):
    mot, source, target = setup
    settings = EvalSettings("ck", None, ("toy",), 2, 0, 4, 64, 200)
    df = evaluate_examples(mot, source, target, [EXTRACTIVE, CLOSED], settings, progress=False)
    assert len(df) == 8 and set(df["condition"]) == {"native", "no_context", "mot", "random"}
    native = df[df["condition"] == "native"]
    assert np.allclose(native["kv_cosine"], 1.0)  # the native cache compared with itself
    assert df[df["condition"] == "no_context"]["kv_cosine"].isna().all()
    assert (df[df["condition"] == "mot"]["kv_cosine"] < 1.0).all()
    summary = summarize(df, n_boot=200)
    row = summary[(summary["dataset"] == "toy-closed") & (summary["condition"] == "native")].iloc[0]
    assert row["metric"] == "accuracy"
    assert row["retained"] == pytest.approx(1.0) if row["mean"] > 0 else np.isnan(row["retained"])
    ext = summary[summary["dataset"] == "toy"]
    assert set(ext["metric"]) == {"F1"} and (ext["ci_low"] <= ext["mean"]).all() and (ext["mean"] <= ext["ci_high"]).all()


def test_condition_subset_gives_the_same_scores(setup):
    mot, source, target = setup
    full = evaluate_examples(mot, source, target, [EXTRACTIVE, CLOSED],
                             EvalSettings("ck", None, ("toy",), 2, 0, 4, 64, 200), progress=False)
    part = evaluate_examples(mot, source, target, [EXTRACTIVE, CLOSED],
                             EvalSettings("ck", None, ("toy",), 2, 0, 4, 64, 200, ("native", "mot")), progress=False)
    assert sorted(set(part["condition"])) == ["mot", "native"] and len(part) == 4
    key = ["id", "condition"]
    merged = part.merge(full, on=key, suffixes=("_part", "_full"))
    assert len(merged) == 4 and (merged["score_part"] == merged["score_full"]).all()
    assert (merged["answer_part"] == merged["answer_full"]).all()
    with pytest.raises(ConfigError, match="unknown conditions"):
        condition_caches(*setup, EXTRACTIVE, conditions=("native", "bogus"))


def test_kv_cosine_and_truncation(setup):
    _, _, target = setup
    a = [(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))]
    b = [(torch.ones(1, 1, 3, 2), -torch.ones(1, 1, 3, 2))]
    assert kv_cosine(a, a) == pytest.approx(1.0) and kv_cosine(a, b) == pytest.approx(0.0)
    long = QAExample(id="l", dataset="toy", context=" ".join(CORPUS * 5), question="?", answers=("x",))
    short = truncate_context(target, long, budget=150)
    from mot_viz.engine.alignment import encode
    from mot_viz.engine.prompts import build_prompt

    assert len(encode(target.tokenizer, build_prompt(short).context_text)) <= 152  # decode/re-encode may shift by a token
    assert short.context and long.context.startswith(short.context[:20])
    assert truncate_context(target, EXTRACTIVE, budget=10_000) is EXTRACTIVE


def test_lm_losses_per_condition(setup):
    from mot_viz.engine.alignment import encode
    from mot_viz.eval.lm_check import lm_losses

    mot, source, target = setup
    ids = encode(target.tokenizer, " ".join(CORPUS))[:40]
    df = lm_losses(mot, source, target, torch.tensor([ids]), prefix_tokens=20, progress=False)
    assert set(df["condition"]) == {"native", "no_context", "mot", "random"}
    assert df["ce"].notna().all() and (df["ce"] > 0).all()
    assert df.loc[df["condition"] == "native", "kv_cosine"].isna().all()
    assert (df.loc[df["condition"] == "mot", "kv_cosine"] < 1).all()


def test_paired_differences_on_known_scores():
    import pandas as pd

    from mot_viz.eval.report import paired_differences, paired_markdown

    rows = [("d", str(i), c, s) for i, (m, r) in enumerate([(1, 0), (1, 0), (0, 0), (0, 1)])
            for c, s in (("mot", m), ("random", r), ("native", 1))]
    rows.append(("d", "x", "skipped", np.nan))
    df = pd.DataFrame(rows, columns=["dataset", "id", "condition", "score"])
    paired = paired_differences(df, n_boot=500)
    assert list(zip(paired["a"], paired["b"])) == [("mot", "random"), ("mot", "native")]  # absent pairs left out
    row = paired.iloc[0]
    assert row["n"] == 4 and row["diff"] == pytest.approx(0.25) and (row["a_better"], row["b_better"]) == (2, 1)
    assert row["ci_low"] <= 0.25 <= row["ci_high"]
    assert paired.iloc[1]["diff"] == pytest.approx(-0.5) and paired.iloc[1]["b_better"] == 2
    assert "mot − random | 4 | +0.250" in paired_markdown(paired)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3_text"])
def test_batched_answers_equal_one_by_one(family):
    """Every condition's cache (native, MoT, random, and the shorter no-context one left-padded) decoded as one batch
    gives exactly the answers decoded alone."""
    from mot_viz.engine.channels import Channels
    from mot_viz.engine.mot import MoT
    from mot_viz.eval.answers import answer_from_cache, answers_from_caches
    from mot_viz.sharing.method import translated_seconds

    source, target = tiny_model("llama", vocab_size=280, layers=4, seed=1), tiny_model(family, layers=4)
    torch.manual_seed(0)
    mot = MoT.build(source.spec, target.spec, Channels((2, 3), (2, 3)), dim=16, heads=2, num_experts=2, top_k=1)
    example = QAExample(dataset="t", id="0", context="The cat sat on the mat near the door of the house.",
                        question="Where did the cat sit?", answers=("on the mat",))
    built = condition_caches(mot, source, target, example, conditions=CONDITIONS)
    caches = built.kv
    # one owner of the build times: the MoT cache costs the translation, the random control that plus its replay
    assert built.seconds["mot"] == pytest.approx(translated_seconds(built.translation))
    assert built.seconds["random"] > built.seconds["mot"] > 0
    assert built.seconds["native"] == built.translation.timings["native_prefill"]
    g = torch.Generator().manual_seed(1)  # a very different cache of the same length: rows a mix-up would show
    caches["noise"] = [(k + 5 * torch.randn(k.shape, generator=g), v + 5 * torch.randn(v.shape, generator=g))
                       for k, v in caches["native"]]
    together = answers_from_caches(target, caches, example, max_new_tokens=8)
    assert list(together) == list(caches)
    assert len({a.text for a in together.values()}) > 1
    for condition, kv in caches.items():
        alone = answer_from_cache(target, kv, example, condition, 8)
        assert (together[condition].text, together[condition].score) == (alone.text, alone.score), condition


def test_replay_mode_overrides_the_checkpoints_replay_and_is_in_the_command(setup, tmp_path):
    from mot_viz.engine.checkpoint import save_checkpoint
    from mot_viz.engine.replay_config import ReplayConfig, replay_mode
    from mot_viz.train.export import export_run

    mot, source, target = setup
    assert replay_mode(ReplayConfig(topk_sparse_attn=8), "checkpoint") == ReplayConfig(topk_sparse_attn=8)
    assert replay_mode(ReplayConfig(topk_sparse_attn=8), "dense").topk_sparse_attn is None
    assert replay_mode(ReplayConfig(topk_sparse_attn=None), "sparse") == ReplayConfig()  # the method's top-32
    with pytest.raises(ConfigError, match="replay mode"):
        replay_mode(ReplayConfig(), "fast")
    assert mot.replay.topk_sparse_attn is not None
    save_checkpoint(mot, tmp_path / "sparse")
    export_run(tmp_path / "sparse", tmp_path / "dense", replay="dense")  # the per-pair decision, made at export
    settings = lambda replay: EvalSettings(str(tmp_path / "dense"), None, ("toy",), 2, 0, 4, 64, 200,  # noqa: E731
                                           replay=replay)
    load = lambda name, replay: load_evaluated(str(tmp_path / name), settings(replay), source, target)  # noqa: E731
    assert load("dense", "checkpoint").replay.topk_sparse_attn is None
    assert load("sparse", "checkpoint").replay.topk_sparse_attn == mot.replay.topk_sparse_attn
    assert load("dense", "sparse").replay == load("sparse", "sparse").replay == ReplayConfig()
    assert load("sparse", "dense").replay.topk_sparse_attn is None
    assert "--replay sparse" in settings("sparse").command()
    assert "--replay" not in settings("checkpoint").command()


def test_results_are_recorded_only_for_the_weights_they_measured(setup, tmp_path):
    """summary.json names the digest of each evaluated checkpoint's weights; a config.json takes a folder's results
    only if the digest is its weights' (retrained weights do not inherit them), or, for a folder from before digests,
    if the config already cites it."""
    from mot_viz.engine.checkpoint import save_checkpoint
    from mot_viz.eval.evaluate import evaluated_weights
    from mot_viz.eval.report import measured_these_weights

    import copy

    mot = copy.deepcopy(setup[0])  # the fixture's stays untouched
    folder = save_checkpoint(mot, tmp_path / "ck")
    settings = EvalSettings(str(folder), None, ("toy",), 2, 0, 4, 64, 200)
    meta = {"weights_sha256": evaluated_weights(settings)}
    config = folder / "config.json"
    assert set(meta["weights_sha256"]) == {str(folder)}
    assert measured_these_weights("results/eval/a", meta, str(folder), config)
    with torch.no_grad():
        next(mot.parameters()).add_(1.0)
    save_checkpoint(mot, folder)  # retrained in place
    assert not measured_these_weights("results/eval/a", meta, str(folder), config)
    assert not measured_these_weights("results/eval/old", {}, str(folder), config)  # no digest, not cited
    cfg = json.loads(config.read_text())
    cfg.setdefault("metrics", {})["evaluation"] = {"toy": {"results": "results/eval/old"}}
    config.write_text(json.dumps(cfg))
    assert measured_these_weights("results/eval/old", {}, str(folder), config)


@pytest.mark.parametrize("example", [EXTRACTIVE, CLOSED], ids=["extractive", "closed"])
def test_each_examples_prompt_is_built_and_its_question_encoded_once(setup, example, monkeypatch):
    from mot_viz.eval import answers, evaluate
    from mot_viz.sharing import caches

    mot, source, target = setup
    built, encoded = [], []
    real_build, real_encode = answers.build_prompt, answers.encode
    for module in (answers, caches):  # the prompt is built where the caches are, the question encoded where it is asked
        monkeypatch.setattr(module, "build_prompt", lambda *a, **k: built.append(a[0].id) or real_build(*a, **k))
    monkeypatch.setattr(answers, "encode", lambda tok, text: encoded.append(text) or real_encode(tok, text))
    settings = EvalSettings("ck", None, ("toy",), 1, 0, 4, 64, 20)
    rows = evaluate.example_rows(mot, source, target, example, settings)
    assert len(rows) == 4 and built == [example.id]  # four conditions, one prompt
    suffix = real_build(example, target.chat_frame).suffix_text
    assert encoded.count(suffix) == 1 and len(encoded) == 1 + len(example.choices) * (example.kind == "closed")
