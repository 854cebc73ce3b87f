"""The ways of sharing one context side by side (mot_viz.analysis.methods) on tiny models: each method's cache and
answer are the evaluator's, its bytes are its cache's (or message's) own size, its K/V error is the cache error
page's, and the shipped results' points are their folders' own numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from mot_viz.analysis.cache_metrics import cache_error_table
from mot_viz.analysis.eval_runs import open_run
from mot_viz.analysis.method_figures import FIRST_TOKEN as FIGURE_FIRST_TOKEN
from mot_viz.analysis.method_figures import (WHOLE_ANSWER, quality_time_figure, shipped_points, side_by_side,
                                             stages_figure)
from mot_viz.analysis.methods import (FIRST_TOKEN, methods, cache_methods, combine, kv_error_rows, relay_methods,
                                      summary_table)
from mot_viz.engine.channels import terminal_channels
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.models import kv_cache_bytes
from mot_viz.engine.mot import MoT, translate
from mot_viz.engine.prompts import QAExample, build_prompt
from conftest import tiny_model
from mot_viz.engine.testing import load_test_model, write_test_checkpoints
from mot_viz.eval.answers import answers_from_caches
from mot_viz.sharing.caches import condition_caches
from mot_viz.sharing.kvcomm import kvcomm_selection
from mot_viz.sharing.linear import linear_cache
from mot_viz.sharing.method import translated_seconds
from mot_viz.sharing.relay import relay
from mot_viz.train.quickfit import QuickFitConfig, fit_pair
from tolerance import assert_close
from mot_viz.eval.answers import CONDITIONS

EXAMPLE = QAExample("1", "squad/validation", "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It "
                    "was designed by the company of Gustave Eiffel.", "Who designed the tower?", ("Gustave Eiffel",))
DIRECT = QuickFitConfig(tokens=256, min_context_tokens=16, max_context_tokens=48, direct=True, top_k=2)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    paths = write_test_checkpoints(tmp_path_factory.mktemp("pretrained"))
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(paths["smollm2-to-gemma3"], source, target)
    linear, _ = load_checkpoint(paths["smollm2-to-gemma3-linear"], source, target)
    translation = translate(mot, source, target, build_prompt(EXAMPLE, target.chat_frame).context_text)
    return source, target, mot, linear, translation


def test_each_cache_method_answers_as_the_evaluator_and_hands_over_its_own_size(pair):
    source, target, mot, linear, translation = pair
    result = cache_methods(mot, source, target, EXAMPLE, translation, artifacts={"linear": linear})
    assert list(result.answers["method"]) == ["native", "no_context", "mot", "linear"]

    # the answers: the evaluator's caches, answered by its batch
    built = condition_caches(mot, source, target, EXAMPLE, translation, conditions=CONDITIONS)
    caches = {c: built.kv[c] for c in ("native", "no_context", "mot")}
    caches["linear"] = linear_cache(mot, linear, source, target, translation)
    expected = answers_from_caches(target, caches, EXAMPLE)
    answers = result.answers.set_index("method")
    for method, answer in expected.items():
        assert answers.loc[method, "answer"] == answer.text
        assert answers.loc[method, "score"] == answer.score

    # the bytes: N_t context positions × the layers handed over × K and V × the KV width × 2 bytes (fp16)
    n, width = int(translation.target_ids.shape[1]), target.spec.kv_hidden
    handed = result.handed_over.set_index("method")["bytes"]
    assert handed["mot"] == n * mot.channels.window * 2 * width * 2
    assert handed["linear"] == n * linear.channels.window * 2 * width * 2
    assert handed["no_context"] == 0
    assert handed["native"] == kv_cache_bytes(target.spec, n) == result.handed_over["full_cache_bytes"].iloc[0]

    # the stages: MoT's are its translation's (the native prefill apart), then the first answer token
    stages = result.stages
    for method in answers.index:
        rows = stages[stages["method"] == method]
        assert rows["stage"].iloc[-1] == FIRST_TOKEN and (rows["seconds"] > 0).all()
    mot_rows = stages[(stages["method"] == "mot") & (stages["stage"] != FIRST_TOKEN)]
    assert_close(mot_rows["seconds"].sum(), translated_seconds(translation))

    # the K/V error: MoT's is the Per-layer page's replayed cache error; the linear map's is its replayed cache's
    errors = result.kv_error
    page = cache_error_table(translation, mot.channels)
    page = page[page["comparison"] == "replayed"].set_index(["layer", "kv"])
    ours = errors[errors["method"] == "mot"].set_index(["layer", "kv"])
    assert len(ours) == len(page) == 2 * target.spec.num_layers
    np.testing.assert_allclose(ours["rel_l2"], page.loc[ours.index, "rel_l2"], rtol=1e-6)
    assert list(ours["carries"]) == list(page.loc[ours.index, "in_window"])
    theirs = pd.DataFrame(kv_error_rows("linear", caches["linear"], translation.native_kv, translation.prefix_len,
                                        linear.channels.target_layers))
    np.testing.assert_allclose(errors[errors["method"] == "linear"]["rel_l2"], theirs["rel_l2"], rtol=1e-6)

    table = summary_table(result, "F1")
    assert list(table["method"]) == [m for m in methods() if m in set(answers.index)]
    assert list(table["F1"]) == [expected[m].score for m in table["method"]]
    assert stages_figure(stages).data  # one stacked bar per stage


def test_a_direct_map_hands_over_every_layer_and_answers_from_it_as_the_evaluator(private_cache):
    # a direct map feeds each target layer from its own source layer: a source with more layers than the target
    source = tiny_model("llama", vocab_size=280, layers=6, seed=1)
    target = tiny_model("gemma3_text", layers=4, bos=True)
    direct = load_checkpoint(fit_pair(source, target, DIRECT), source, target)[0]
    torch.manual_seed(0)
    mot = MoT.build(source.spec, target.spec, terminal_channels(6, 4, 0.5), dim=32, heads=4,
                    output_activation="none", variant="single")
    translation = translate(mot, source, target, build_prompt(EXAMPLE, target.chat_frame).context_text)
    result = cache_methods(mot, source, target, EXAMPLE, translation, artifacts={"direct": direct})
    built = condition_caches(mot, source, target, EXAMPLE, translation, conditions=("native", "no_context", "mot",
                                                                                  "direct"), artifacts={"direct": direct})
    expected = answers_from_caches(target, built.kv, EXAMPLE)
    answers = result.answers.set_index("method")["answer"]
    assert {m: answers[m] for m in expected} == {m: a.text for m, a in expected.items()}
    n = int(translation.target_ids.shape[1])
    assert result.handed_over.set_index("method")["bytes"]["direct"] == n * 4 * 2 * target.spec.kv_hidden * 2
    assert list(result.stages.loc[result.stages["method"] == "direct", "stage"]) == [
        "source prefill", "alignment", "translation", "cache assembly", FIRST_TOKEN]
    errors = result.kv_error[result.kv_error["method"] == "direct"]
    assert list(errors["layer"].unique()) == [0, 1, 2, 3] and errors["carries"].all()
    # the direct cache's own error: its context positions against native's, from the evaluator's cache
    theirs = pd.DataFrame(kv_error_rows("direct", built.kv["direct"], translation.native_kv, translation.prefix_len,
                                        (0, 1, 2, 3)))
    np.testing.assert_allclose(errors["rel_l2"], theirs["rel_l2"], rtol=1e-6)


def test_sharing_every_layer_of_the_same_model_is_the_native_cache():
    model = load_test_model("smollm2-135m")
    torch.manual_seed(0)
    mot = MoT.build(model.spec, model.spec, terminal_channels(model.spec.num_layers, model.spec.num_layers, 0.5),
                    dim=32, heads=4, output_activation="none", variant="single")
    translation = translate(mot, model, model, build_prompt(EXAMPLE, model.chat_frame).context_text)
    selection = kvcomm_selection(model, model, [EXAMPLE], fraction=1.0)
    result = cache_methods(mot, model, model, EXAMPLE, translation, artifacts={"kvcomm": selection})
    answers = result.answers.set_index("method")["answer"]
    assert answers["kvcomm"] == answers["native"]
    errors = result.kv_error[result.kv_error["method"] == "kvcomm"]
    assert sorted(set(errors["layer"])) == list(range(model.spec.num_layers)) == list(result.recorded["kvcomm_layers"])
    assert (errors["rel_l2"] == 0).all()
    n = int(translation.target_ids.shape[1])  # the source's K/V of the context at the shared layers
    assert result.handed_over.set_index("method")["bytes"]["kvcomm"] == \
        model.spec.num_layers * n * 2 * model.spec.kv_hidden * 2


def test_the_relay_hands_over_its_message_and_no_cache_of_the_context(pair):
    source, target, mot, _, translation = pair
    result = relay_methods(mot, source, target, EXAMPLE, translation, relay_tokens=6, conditions=("relay",))
    sent = relay(source, target, EXAMPLE, "relay", max_tokens=6)  # greedy: the same message again
    assert result.messages == {"relay": sent.message}
    assert result.handed_over["bytes"].tolist() == [len(sent.message.encode("utf-8"))]
    assert result.kv_error.empty
    expected = answers_from_caches(target, {"relay": sent.kv}, EXAMPLE)["relay"]
    assert result.answers["answer"].tolist() == [expected.text]
    assert list(result.stages["stage"]) == ["message writing", "target prefill of the message", FIRST_TOKEN]
    both = combine(cache_methods(mot, source, target, EXAMPLE, translation), result)
    assert list(summary_table(both, "F1")["method"]) == ["native", "no_context", "mot", "relay"]
    assert both.messages == result.messages
    # from the question's arrival: relay's writing and the source's prefill are done ahead, the rest is not
    stage = both.stages.set_index(["method", "stage"])["seconds"]
    total, after = both.first_token_seconds(), both.after_question_seconds()
    assert after["relay"] == pytest.approx(total["relay"] - stage["relay", "message writing"], rel=1e-9)
    assert after["mot"] == pytest.approx(total["mot"] - stage["mot", "source prefill"], rel=1e-9)
    assert after["native"] == pytest.approx(total["native"], rel=1e-9) and after["native"] > 0
    assert summary_table(both, "F1").set_index("method")["seconds after the question"]["relay"] == after["relay"]


def test_the_shipped_points_are_their_folders_own_numbers():
    points = shipped_points()
    relay_folder = points[points["folder"] == "relay/smollm2-to-gemma3-mid-squad"].set_index("method")
    if relay_folder.empty:
        pytest.skip("this copy ships no results/relay")
    summary = pd.read_csv("results/relay/smollm2-to-gemma3-mid-squad/summary.csv").set_index("condition")
    rows = pd.read_csv("results/relay/smollm2-to-gemma3-mid-squad/examples.csv")
    for method in ("native", "mot", "relay", "relay_q"):
        assert relay_folder.loc[method, "score"] == pytest.approx(summary.loc[method, "mean"], rel=1e-12)
        assert relay_folder.loc[method, "n"] == summary.loc[method, "n"]
        # from the question's arrival: relay's writing is done ahead (these rows predate ahead_seconds)
        own = rows[rows["condition"] == method]
        ahead = own["message_generate_seconds"] if method == "relay" else 0.0
        assert relay_folder.loc[method, "seconds"] == pytest.approx((own["seconds"] - ahead).mean(), rel=1e-12)
        assert relay_folder.loc[method, "timed_to"] == WHOLE_ANSWER
    linear = points[points["folder"] == "eval/smollm2-to-gemma3-mid-linear-squad300"]
    assert set(linear["method"]) == {"native", "linear"}  # a linear checkpoint's "mot" rows are the linear map
    assert not set(points["method"]) - set(methods())  # no controls
    assert set(points["timed_to"]) <= {WHOLE_ANSWER, FIGURE_FIRST_TOKEN}
    live = pd.DataFrame({"method": ["mot"], "score": [0.5], "seconds": [1.0]})
    assert len(quality_time_figure(points, live).data) == points["method"].nunique() + 1
    # the docs' figure: the folders that answer from the MoT and another way of sharing, each with all its methods
    compared = side_by_side(points)
    assert "relay/smollm2-to-gemma3-mid-squad" in set(compared["folder"])
    assert "eval/smollm2-to-gemma3-mid-linear-squad300" not in set(compared["folder"])
    assert len(compared[compared["folder"] == "relay/smollm2-to-gemma3-mid-squad"]) == len(relay_folder)
    # a run of the other ways alone (the long stacks' relays and direct map) is drawn beside the MoT of its setting
    stacks = compared[compared["folder"].str.startswith("long/smollm2-to-gemma3-mid-stacks")]
    for group, part in stacks.groupby("group"):
        assert {"mot", "relay", "direct"} <= set(part["method"]), group
    assert "long/smollm2-to-gemma3-stacks" not in set(compared["folder"])  # the terminal run shared no other way
    # on documents, to the first answer token from the question's arrival: relay's target side is its reading alone
    # (its writing done ahead), relay_q's holds its writing
    relayed = points[points["folder"] == "long/smollm2-to-gemma3-mid-stacks-relay"]
    run = open_run("results/long/smollm2-to-gemma3-mid-stacks-relay")
    for method, own in (("relay", ["message_prefill_seconds"]),
                        ("relay_q", ["message_generate_seconds", "message_prefill_seconds"])):
        point = relayed[relayed["method"] == method].iloc[0]
        rows = run.rows[(run.rows["group"] == point["group"]) & (run.rows["condition"] == method)]
        expected = (rows[own].sum(axis=1) + rows["first_token_seconds"]).mean()
        assert point["seconds"] == pytest.approx(expected, rel=1e-6)
