"""Every page of the app driven by Streamlit's AppTest, on tiny random models (MOT_VIZ_TEST_MODELS=1).

The bundled names map to a tiny Llama source and a tiny Gemma 3 target (mot_viz.engine.testing); the checkpoints
are randomly initialised and written to a temporary pretrained/ folder. The assertions check what a page
shows against the library computed directly, and the messages of the errors a user can cause.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from streamlit.testing.v1 import AppTest

from app_helpers import DEFAULT_LABEL, default_example, errors, goto, open_app, translate_button
from conftest import write_jsonl
from mot_viz.engine.alignment import encode
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.mot import translate
from mot_viz.engine.prompts import build_prompt
from mot_viz.engine.testing import load_test_model
from mot_viz.eval.answers import CONDITION_LABELS, TIE_LABELS, answer_from_cache, ties_with_mot
from mot_viz.train.window_fidelity import translation_fidelity
from plotly_figures import figures

FREE_TEXT = ("The Eiffel Tower is in Paris. It was built by Gustave Eiffel, whose company designed it; "
             "visitors climb 1,665 steps.\nQuestion time.\n")
LOG_ROWS = [
    {"step": 5, "lr": 0.0005, "ce": 5.25, "mse_k": 2.5, "mse_v": 3.5, "loss": 11.25, "gate_importance_cv2": 0.25,
     "gate_load_cv2": 0.125, "gate_importance_entropy": 1.25},
    {"step": 10, "lr": 0.001, "ce": 4.5, "mse_k": 1.5, "mse_v": 2.0, "loss": 8.0, "gate_importance_cv2": 0.5,
     "gate_load_cv2": 0.25, "gate_importance_entropy": 1.0},
]
EVALUATION = {"squad/validation": {"results": "results/eval/x", "command": "python -m mot_viz.eval.evaluate …",
                                   "date": "2026-11-30", "prompts": "plain", "conditions": {
    "native": {"n": 300, "F1": 0.357, "ci95": [0.31, 0.405], "retained": 1.0},
    "mot": {"n": 300, "F1": 0.378, "ci95": [0.331, 0.425], "retained": 1.0591}}}}


@pytest.fixture(scope="module")
def pretrained(pretrained) -> dict[str, Path]:
    """conftest's test checkpoints, the default one with a training log and a recorded evaluation."""
    paths = pretrained
    write_jsonl(paths["smollm2-to-gemma3"] / "log.jsonl", LOG_ROWS)
    config_file = paths["smollm2-to-gemma3"] / "config.json"
    config = json.loads(config_file.read_text())
    config["metrics"]["evaluation"] = EVALUATION
    config_file.write_text(json.dumps(config))
    return paths


pytestmark = pytest.mark.usefixtures("pages_env")  # every page runs on the tiny test pair


def use_free_text(at: AppTest, text: str, question: str = "", gold: str = "") -> AppTest:
    at.radio(key="sb.mode").set_value("Free text").run()
    at.text_area(key="sb.text").input(text)
    at.text_input(key="sb.question").input(question)
    at.text_input(key="sb.gold").input(gold)
    translate_button(at).click().run()
    return at


# ----- landing page and defaults ----------------------------------------------------------------------


def test_landing_page_translates_the_default_squad_example_without_a_click():
    at = open_app()
    assert not at.exception and not errors(at)
    metrics = {m.label: m.value for m in at.metric}
    target = load_test_model("gemma3-270m")
    n_target = len(encode(target.tokenizer, build_prompt(default_example()).context_text))
    assert metrics["Target tokens"] == str(n_target)
    assert metrics["Window (layers)"] == "2"  # terminal_channels(4, 6, 0.5)
    applied = at.session_state["applied"]
    assert applied.checkpoint.endswith("smollm2-to-gemma3") and applied.label == DEFAULT_LABEL
    assert applied.example == default_example()


# ----- answers ---------------------------------------------------------------------------------------


def test_answers_page_shows_every_condition_scored_against_the_gold_answer():
    at = open_app("1_answers")
    table = at.dataframe[0].value
    assert list(table["condition"]) == [CONDITION_LABELS[c] for c in ("native", "no_context", "mot", "random")]
    assert table["F1"].between(0, 1).all() and table["EM"].isin([0.0, 1.0]).all()
    assert (table["answering (s)"] > 0).all()
    assert len(at.get("plotly_chart")) == 1
    # the native answer is the library's answer from the target's own cache
    example = default_example()
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(at.session_state["applied"].checkpoint, source, target)
    translation = translate(mot, source, target, build_prompt(example).context_text)
    expected = answer_from_cache(target, translation.native_kv, example, "native")
    assert table["answer"][0] == expected.text
    # a control that gives the MoT's answer is said to tie it, beside the answers (and only then)
    tied = ties_with_mot(dict(zip(("native", "no_context", "mot", "random"), table["answer"])))
    said = [w.value for w in at.warning if "the MoT's answer" in w.value]
    assert len(said) == bool(tied) and all(TIE_LABELS[c] in said[0] for c in tied)


def test_answers_page_answers_from_the_mean_vector_window_on_request():
    """The control with no context in its window (method.md §13): one more row, decoded in the same batch, the
    library's answer from the same replay; off by default, and in the page's link when ticked."""
    from mot_viz.app.settings import MEAN_VECTOR_PASSAGES
    from mot_viz.sharing.mean import mean_vector_cache
    from mot_viz.train.mean_vector import reference_means

    at = open_app("1_answers")
    assert len(at.dataframe[0].value) == 4
    at.checkbox(key="pg.answers.mean").check().run()
    table = at.dataframe[0].value
    assert list(table["condition"]) == [CONDITION_LABELS[c] for c in ("native", "no_context", "mot", "random", "mean")]
    assert table["building the cache (s)"][4] > 0
    example = default_example()
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(at.session_state["applied"].checkpoint, source, target)
    translation = translate(mot, source, target, build_prompt(example).context_text)
    means = reference_means(target, tuple(mot.channels.target_layers), MEAN_VECTOR_PASSAGES)
    expected = answer_from_cache(target, mean_vector_cache(mot, target, translation, means), example, "mean")
    assert table["answer"][4] == expected.text
    assert at.query_params.get("answers.mean") in ("true", ["true"])


def test_answers_on_free_text_with_gold_and_a_second_checkpoint(pretrained):
    at = use_free_text(open_app(), FREE_TEXT, "Who built the tower?", "Gustave Eiffel")
    at = goto(at, "1_answers")
    assert len(at.dataframe[0].value) == 4
    at.selectbox(key="pg.answers.second").set_value("smollm2-to-gemma3-single").run()
    table = at.dataframe[0].value
    assert len(table) == 5 and "second checkpoint (smollm2-to-gemma3-single)" in table["condition"][4]
    assert 0 <= table["F1"][4] <= 1
    # a second checkpoint made for the reverse pair is refused with the reason, the others still shown
    at.selectbox(key="pg.answers.second").set_value("gemma3-to-smollm2").run()
    assert not at.exception
    assert any("made for source model" in e for e in errors(at))
    assert len(at.dataframe[0].value) == 4


def test_free_text_without_question_asks_for_one():
    at = goto(use_free_text(open_app(), FREE_TEXT), "1_answers")
    assert any("has no question" in i.value for i in at.info)
    assert len(at.dataframe) == 0


# ----- cache error ------------------------------------------------------------------------------------


def test_cache_error_page_matches_the_replay_structure():
    at = goto(use_free_text(open_app(), FREE_TEXT), "2_cache_error")
    per_layer, heatmap = figures(at)[:2]
    n_tokens = len(encode(load_test_model("gemma3-270m").tokenizer, FREE_TEXT))
    z = np.array(heatmap["data"][0]["z"], dtype=float)  # replayed vs native, relative L2, K
    assert z.shape == (6, n_tokens)
    # dense layers 0-1 (num_bottom_full_attn=2) leave the K of layers 0-2 exactly native; sparse layer 2 changes layer 3
    assert np.abs(z[:3]).max() < 1e-6 and z[3].max() > 1e-4
    # the window (target layers 4, 5) is marked on the heatmap
    assert any(s.get("y0") == 3.5 and s.get("y1") == 5.5 for s in heatmap["layout"]["shapes"])
    names = {t["name"] for t in per_layer["data"]}
    assert names == {"translated", "replayed"}
    translated_k = next(t for t in per_layer["data"] if t["name"] == "translated")
    assert list(translated_k["x"]) == [4, 5]
    # the window holds the target's last layer (5 of 0-5), whose translation reaches no cache entry
    assert any(i.value.startswith("Layer 5 is the target's last layer") for i in at.info)
    at.radio(key="pg.error.comparison").set_value("translated").run()
    at.radio(key="pg.error.metric").set_value("cosine").run()
    z = np.array(figures(at)[1]["data"][0]["z"], dtype=float)
    assert z.shape == (2, n_tokens) and (np.abs(z) <= 1 + 1e-6).all()


def test_cache_error_page_scores_the_window_against_its_baselines():
    at = goto(use_free_text(open_app(), FREE_TEXT), "2_cache_error")
    fidelity = figures(at)[2]
    panels = {t["legendgroup"] for t in fidelity["data"]}
    assert panels == {"translator", "linear", "mean vector"}  # the shipped linear map of the same window is found
    # the numbers are the library's, on the same translation
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    sel = at.session_state["applied"]
    mot, _ = load_checkpoint(sel.checkpoint, source, target)
    expected = pd.DataFrame(translation_fidelity(translate(mot, source, target, FREE_TEXT), target, mot.channels))
    shown = next(t for t in fidelity["data"] if t["name"] == "translator" and "centered" in t["hovertemplate"])
    assert np.allclose(list(shown["y"]), expected.sort_values("layer")["centered_cos_k"], atol=1e-5)
    # the linear map's window, read from this translation's source context, scores as its own full translation
    linear_mot, _ = load_checkpoint(str(Path(sel.checkpoint).with_name("smollm2-to-gemma3-linear")), source, target)
    linear_rows = pd.DataFrame(translation_fidelity(translate(linear_mot, source, target, FREE_TEXT), target,
                                                    mot.channels, candidate="linear"))
    shown = next(t for t in fidelity["data"] if t["name"] == "linear" and "centered" in t["hovertemplate"])
    assert np.allclose(list(shown["y"]), linear_rows.sort_values("layer")["centered_cos_k"], atol=1e-5)
    mean_k = next(t for t in fidelity["data"] if t["name"] == "mean vector" and "centered" in t["hovertemplate"])
    assert np.abs(np.array(mean_k["y"], dtype=float)).max() < 1e-5  # one shared vector: no token structure
    # a random translator carries no token structure, and the page says so
    assert any("carries no token structure" in w.value for w in at.warning)


# ----- routing ----------------------------------------------------------------------------------------


def test_routing_page_shows_top_k_gates_per_token():
    at = goto(use_free_text(open_app(), FREE_TEXT), "3_routing")
    charts = figures(at)
    assert len(charts) == 6  # K gates, V gates, entropy, expert usage, what-if per layer, the method drawn
    gates = np.array(charts[0]["data"][0]["z"], dtype=float)  # experts x tokens
    assert gates.shape[0] == 4
    np.testing.assert_allclose(gates.sum(0), 1.0, atol=1e-5)
    assert ((gates > 0).sum(0) == 2).all()  # top-2 kept per token
    balance = at.dataframe[0].value
    assert list(balance["mixture"]) == ["K", "V"] and "gate_load_cv2" in balance
    # the default checkpoint's linear path reads the previous token too (as shipped), and the page says so
    assert any("linear path" in m.value and "previous token's, projected on 8 principal axes" in m.value
               for m in at.markdown)
    assert not any("load-balancing" in m.value for m in at.markdown)  # trained without a balance term


def test_routing_page_says_when_a_balance_term_shaped_the_routers(pretrained_copy):
    """method.md §5 has no load-balancing loss; a checkpoint trained with one (as the shipped mixtures are) says so."""
    import json

    path = pretrained_copy["smollm2-to-gemma3"]
    config = json.loads((path / "config.json").read_text())
    config["training"]["balance_weight"] = 0.01
    (path / "config.json").write_text(json.dumps(config))
    at = goto(_choose_checkpoint(path), "3_routing")
    assert any("load-balancing term (`balance_weight` 0.01)" in m.value and "method.md §5" in m.value
               for m in at.markdown)


def test_routing_page_says_the_single_variant_has_no_router():
    at = open_app()
    at.selectbox(key="sb.checkpoint").set_value("smollm2-to-gemma3-single")
    at = goto(use_free_text(at, FREE_TEXT), "3_routing")
    assert any("no router" in i.value for i in at.info)
    assert len(at.get("plotly_chart")) == 0


# ----- alignment --------------------------------------------------------------------------------------


def test_alignment_page_labels_both_tokenizations():
    at = goto(use_free_text(open_app(), FREE_TEXT), "4_alignment")
    heatmap = figures(at)[0]["data"][0]
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    n_t, n_s = len(encode(target.tokenizer, FREE_TEXT)), len(encode(source.tokenizer, FREE_TEXT))
    z = np.array(heatmap["z"], dtype=float)
    assert z.shape == (n_t, n_s) and n_t != n_s  # two different tokenizations
    assert z.sum() >= len(FREE_TEXT.rstrip("\n"))  # every character is shared by some pair
    assert len(heatmap["y"]) == n_t and len(heatmap["x"]) == n_s
    assert any("␣" in label for label in heatmap["x"]) and any("↵" in label for label in heatmap["y"])
    at.radio(key="pg.align.view").set_value("weights").run()
    z = np.array(figures(at)[0]["data"][0]["z"], dtype=float)
    np.testing.assert_allclose(z.sum(1), 1.0, atol=1e-6)


# ----- cache space ------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["pca", "umap"])
def test_cache_space_page_projects_each_kind(method):
    at = goto(use_free_text(open_app(), FREE_TEXT), "5_cache_space")
    at.radio(key="pg.space.method").set_value(method).run()
    assert not at.exception
    traces = figures(at)[0]["data"]
    n_tokens = len(encode(load_test_model("gemma3-270m").tokenizer, FREE_TEXT))
    points = {t["name"]: t for t in traces if t["mode"] == "markers"}
    assert set(points) == {"native target", "translated", "source (aligned)"}
    assert all(len(t["x"]) == n_tokens for t in points.values())
    assert points["source (aligned)"]["xaxis"] == "x2"  # its own panel: another space
    lines = next(t for t in traces if t["name"] == "native → translated")
    assert len(lines["x"]) == 3 * n_tokens  # one segment per token, None-separated
    assert (lines["x"][0], lines["x"][1]) == (points["native target"]["x"][0], points["translated"]["x"][0])


def test_cache_space_page_paired_options_follow_the_library():
    from mot_viz.analysis.cache_metrics import window_vectors
    from mot_viz.engine.cache_errors import per_token_errors

    at = goto(use_free_text(open_app(), FREE_TEXT), "5_cache_space")
    at.multiselect(key="pg.space.kinds").set_value(["native target", "translated", "replayed target", "linear map"]).run()
    at.radio(key="pg.space.colour").set_value("rel_l2").run()
    assert not at.exception
    traces = figures(at)[0]["data"]
    names = {t["name"] for t in traces}
    assert {"native → translated", "native → replayed target", "native → linear map", "linear map"} <= names
    translated = next(t for t in traces if t["name"] == "translated")
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    sel = at.session_state["applied"]
    mot, _ = load_checkpoint(sel.checkpoint, source, target)
    vectors = window_vectors(translate(mot, source, target, sel.text), mot.channels, mot.channels.window - 1, "K")
    errors = per_token_errors(vectors["translated"], vectors["native target"])["rel_l2"].numpy()
    np.testing.assert_allclose(np.asarray(translated["marker"]["color"], dtype=float), errors, rtol=1e-4)
    at.radio(key="pg.space.colour").set_value("expert").run()
    experts = [t["name"] for t in figures(at)[0]["data"] if t["name"].startswith("translated, expert")]
    assert experts and all(0 <= int(n.rsplit(" ", 1)[1]) < 4 for n in experts)


# ----- training ---------------------------------------------------------------------------------------


def test_training_page_plots_the_log_and_shows_the_config():
    at = open_app("6_training")
    traces = {t["name"]: t for t in figures(at)[0]["data"]}
    assert set(traces) == {"loss", "ce", "mse_k", "mse_v", "lr", "gate_importance_cv2", "gate_load_cv2",
                           "gate_importance_entropy"}
    assert list(traces["ce"]["y"]) == [5.25, 4.5] and list(traces["lr"]["x"]) == [5, 10]
    tables = {tuple(d.value.columns)[0]: d.value for d in at.dataframe}
    settings = tables["setting"]
    assert dict(zip(settings["setting"], settings["value"]))["target"] == "gemma3-270m"
    # the recorded QA results: one row per dataset and condition, with n, interval and retained share
    quality = tables["dataset"]
    mot = quality[quality["condition"] == CONDITION_LABELS["mot"]].iloc[0]
    assert (mot["dataset"], mot["n"], mot["metric"], mot["mean"]) == ("squad/validation", 300, "F1", 0.378)
    assert mot["95% CI"] == "[0.331, 0.425]" and mot["retained"] == "105.9%"
    assert len(quality) == 2 and any(s.value == "Measured quality" for s in at.subheader)


def test_training_page_without_log_says_so():
    at = open_app()
    at.selectbox(key="sb.checkpoint").set_value("gemma3-to-smollm2")
    translate_button(at).click().run()
    at = goto(at, "6_training")
    assert any("no log.jsonl" in i.value for i in at.info)
    assert not any(s.value == "Measured quality" for s in at.subheader)  # nothing recorded, no table


# ----- errors a user can cause ------------------------------------------------------------------------


def test_empty_context_shows_an_error_and_keeps_the_inputs():
    at = use_free_text(open_app(), "   ", "Who?")
    assert not at.exception
    assert any("The context is empty" in e for e in errors(at))
    assert at.text_input(key="sb.question").value == "Who?"
    assert at.text_area(key="sb.text").value == "   "


def test_too_long_context_shows_the_limit():
    at = use_free_text(open_app(), "Paris " * 1100)
    assert not at.exception
    assert any("allows at most 1024" in e for e in errors(at))


def test_answers_page_shows_only_the_reason_when_no_condition_can_answer():
    # the context translates, but with this question it no longer fits the target: every condition fails alike
    at = goto(use_free_text(open_app(), FREE_TEXT, "Who " * 4100, "Eiffel"), "1_answers")
    assert not at.exception
    assert len(errors(at)) == 1 and errors(at)[0].startswith("**Context problem.** The context (")
    assert "allows at most 4096 tokens. Shorten the context or the question" in errors(at)[0]
    assert not at.dataframe and not at.get("plotly_chart") and not any(x.label == "Details" for x in at.expander)


def test_a_context_with_a_lone_surrogate_is_a_context_error_on_the_page(monkeypatch):
    # a data file's JSON "\ud800" escape is how such text arrives: a URL or a widget cannot carry it
    example = default_example()
    broken = dataclasses.replace(example, context=example.context[:40] + "\ud800" + example.context[40:])
    monkeypatch.setattr(sys.modules["mot_viz.app.sidebar"], "dataset_examples", lambda name: [broken])
    at = open_app()
    assert not at.exception
    assert errors(at) == [f"**Context problem.** The text holds a lone surrogate character (U+D800 at character "
                          f"{build_prompt(example).context_text.index(example.context) + 40}), which is not valid "
                          "Unicode, so no tokenizer can read it. Remove that character, or re-save the text as UTF-8."]
    assert not at.metric  # nothing was translated


def test_checkpoint_for_another_pair_is_refused_on_every_page():
    at = open_app()
    at.selectbox(key="sb.checkpoint").set_value("gemma3-to-smollm2")
    translate_button(at).click().run()
    assert any("made for source model" in e and "Choose a checkpoint trained for this pair" in e for e in errors(at))
    for page in ("2_cache_error", "3_routing", "5_cache_space"):
        at = goto(at, page)
        assert any("made for source model" in e for e in errors(at)) and not at.get("plotly_chart")


def test_swapping_the_pair_offers_the_checkpoint_made_for_it():
    at = open_app()
    at.selectbox(key="sb.source").set_value("gemma3-270m").run()
    at.selectbox(key="sb.target").set_value("smollm2-135m").run()
    assert at.selectbox(key="sb.checkpoint").value == "gemma3-to-smollm2"
    translate_button(at).click().run()
    assert not at.exception and not errors(at)
    assert {m.label: m.value for m in at.metric}["Window (layers)"] == "2"


def test_unknown_model_name_is_reported_and_kept():
    at = open_app()
    at.selectbox(key="sb.target").set_value("other (type below)").run()
    at.text_input(key="sb.target_other").input("no-such-model")
    translate_button(at).click().run()
    assert not at.exception
    assert any("Cannot load model 'no-such-model'" in e for e in errors(at))
    assert at.text_input(key="sb.target_other").value == "no-such-model"


def test_choosing_other_without_typing_asks_for_a_name():
    at = open_app()
    at.selectbox(key="sb.source").set_value("other (type below)").run()
    translate_button(at).click().run()
    assert any("No model name is given" in e for e in errors(at))
    at.selectbox(key="sb.source").set_value("smollm2-135m").run()
    at.selectbox(key="sb.checkpoint").set_value("other (type below)").run()
    translate_button(at).click().run()
    assert any("No MoT checkpoint is chosen" in e and "smollm2-to-gemma3" in e for e in errors(at))


def test_a_synthetic_model_is_offered_and_said_to_measure_no_quality():
    at = open_app()
    assert not any("no quality" in w.value for w in at.sidebar.warning)
    assert "synthetic:llama3.1-8b (random weights: cost, no quality)" in at.selectbox(key="sb.source").options
    at.selectbox(key="sb.source").set_value("synthetic:llama3.2-1b").run()
    warning = " ".join(w.value for w in at.sidebar.warning)
    assert "no quality" in warning and "identity on a shared id stream" in warning


def test_missing_checkpoint_folder_is_reported(tmp_path):
    at = open_app()
    at.selectbox(key="sb.checkpoint").set_value("other (type below)").run()
    at.text_input(key="sb.checkpoint_other").input(str(tmp_path / "nope"))
    translate_button(at).click().run()
    assert any("is not a MoT checkpoint folder" in e for e in errors(at))


# ----- state across pages and modes -------------------------------------------------------------------


def test_changes_wait_for_translate_and_typed_text_survives_navigation():
    at = open_app()
    at.number_input(key="sb.example").set_value(1).run()
    assert any("Press **Translate**" in i.value for i in at.sidebar.info)
    assert at.session_state["applied"].label == DEFAULT_LABEL  # not applied yet
    translate_button(at).click().run()
    assert at.session_state["applied"].label == "SQuAD #1"
    at.radio(key="sb.mode").set_value("Free text").run()
    at.text_area(key="sb.text").input("My own passage.").run()
    at.radio(key="sb.mode").set_value("Dataset example").run()  # the text area is not drawn now
    at = goto(at, "4_alignment")
    at.radio(key="sb.mode").set_value("Free text").run()
    assert at.text_area(key="sb.text").value == "My own passage."
    at.radio(key="sb.mode").set_value("Dataset example").run()
    assert at.number_input(key="sb.example").value == 1


def test_a_shorter_closed_question_is_scored_by_choice():
    at = open_app()
    at.selectbox(key="sb.dataset").set_value("arc-easy").run()
    translate_button(at).click().run()
    at = goto(at, "1_answers")
    table = at.dataframe[0].value
    assert table["correct"].isin([0.0, 1.0]).all()
    n_choices = len(at.session_state["applied"].example.choices)
    assert all(len(s.split(", ")) == n_choices for s in table["mean log p per choice"])
    assert torch.tensor([float(x) for x in table["mean log p per choice"][0].split(", ")]).le(0).all()


def test_every_page_works_on_a_linear_checkpoint():
    at = open_app()
    at.selectbox(key="sb.checkpoint").set_value("smollm2-to-gemma3-linear")
    at = use_free_text(at, FREE_TEXT)
    for page in ("1_answers", "2_cache_error", "3_routing", "4_alignment", "5_cache_space", "6_training"):
        at = goto(at, page)
        assert not errors(at), (page, errors(at))
    at = goto(at, "3_routing")
    assert any("closed-form linear map" in i.value for i in at.info)
    at = goto(at, "2_cache_error")
    assert {t["legendgroup"] for t in figures(at)[2]["data"]} == {"linear", "mean vector"}


def test_every_page_works_on_a_direct_map_and_draws_its_cache_once(app_cache):
    from mot_viz.train.quickfit import QuickFitConfig, fit_pair

    # the tiny source has fewer layers than the tiny target: the direct map goes the other way round
    folder = fit_pair(load_test_model("gemma3-270m"), load_test_model("smollm2-135m"),
                      QuickFitConfig(tokens=256, min_context_tokens=16, max_context_tokens=48, direct=True, top_k=2))
    at = open_app()
    at.selectbox(key="sb.source").set_value("gemma3-270m").run()
    at.selectbox(key="sb.target").set_value("smollm2-135m").run()
    at.selectbox(key="sb.checkpoint").set_value("other (type below)").run()
    at.text_input(key="sb.checkpoint_other").input(str(folder))
    at = use_free_text(at, FREE_TEXT)
    for page in ("1_answers", "2_cache_error", "3_routing", "4_alignment", "5_cache_space", "6_training"):
        at = goto(at, page)
        assert not errors(at), (page, errors(at))
    at = goto(at, "2_cache_error")
    assert any("without replay" in i.value for i in at.info)
    assert {t["name"] for t in figures(at)[0]["data"]} == {"translated = kept (no replay)"}


def test_training_page_shows_the_recorded_held_out_fidelity(pretrained):
    from mot_viz.engine.checkpoint import record_metrics
    from mot_viz.train.window_fidelity import fidelity_record, fidelity_table
    from mot_viz.train.mean_vector import mean_vectors

    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    path = pretrained["smollm2-to-gemma3"]
    mot, _ = load_checkpoint(path, source, target)
    means = mean_vectors(target, mot.channels.target_layers, [FREE_TEXT], "test prose")
    table = fidelity_table(mot, source, target, [FREE_TEXT, FREE_TEXT[::-1]], means, progress=False)
    record_metrics(path, "fidelity", {"command": "test", "squad": fidelity_record(table, "squad", means)})
    at = open_app("6_training")
    shown = next(d.value for d in at.dataframe if tuple(d.value.columns)[0] == "held-out text")
    assert list(shown["candidate"]) == ["translator", "mean vector"] and list(shown["n"]) == [2, 2]
    expected = table[table.candidate == "translator"]["centered_cos_k"].mean()
    assert shown.iloc[0]["centered_cos_k"] == pytest.approx(round(expected, 3))
    per_layer = [d.value for d in at.dataframe if "layer" in d.value.columns and "held-out text" in d.value.columns]
    assert len(per_layer) == 1 and sorted(set(per_layer[0]["layer"])) == sorted(mot.channels.target_layers)


# ----- hostile checkpoints and logs: a message on the page, never a traceback ---------------------------


def _choose_checkpoint(path: Path) -> AppTest:
    at = open_app()
    at.selectbox(key="sb.checkpoint").set_value("other (type below)").run()
    at.text_input(key="sb.checkpoint_other").input(str(path))
    translate_button(at).click().run()
    return at


def test_a_checkpoint_with_a_nan_weight_is_refused(pretrained_copy):
    from safetensors.torch import load_file, save_file

    path = pretrained_copy["smollm2-to-gemma3"]
    state = load_file(str(path / "translator.safetensors"))
    first = sorted(state)[0]
    state[first].view(-1)[0] = float("nan")
    save_file(state, str(path / "translator.safetensors"))
    at = _choose_checkpoint(path)
    assert not at.exception
    assert any("NaN or Inf" in e and "retrain" in e for e in errors(at))


@pytest.mark.parametrize("damage", ["rows missing keys", "absurd size", "not an object"])
def test_a_damaged_checkpoint_config_is_reported_with_its_fix(pretrained_copy, damage):
    path = pretrained_copy["smollm2-to-gemma3"]
    config = json.loads((path / "config.json").read_text())
    if damage == "rows missing keys":
        config["channels"] = [{"src_layer_idx": 1}]
    elif damage == "absurd size":
        config["translator"]["dim"] = 10 ** 9
    else:
        config = [config]
    (path / "config.json").write_text(json.dumps(config))
    at = _choose_checkpoint(path)
    assert not at.exception
    assert any(("Re-export the checkpoint" in e or "not the object MoT Viz writes" in e) for e in errors(at)), errors(at)


def test_training_page_survives_a_torn_log_line_and_a_malformed_evaluation(pretrained_copy):
    path = pretrained_copy["smollm2-to-gemma3"]
    with open(path / "log.jsonl", "a") as f:
        f.write('{"step": 15, "loss": 7.')  # what an interrupted append leaves
    config = json.loads((path / "config.json").read_text())
    config["metrics"]["evaluation"] = {"squad/validation": "not a table"}
    (path / "config.json").write_text(json.dumps(config))
    at = goto(_choose_checkpoint(path), "6_training")
    assert figures(at), "the complete log rows are still plotted"
    assert any("metrics.evaluation" in e and "results_md.py --record" in e for e in errors(at))
    assert any(x.label == "Per window layer" for x in at.expander) or any("How it was trained" in m.value for m in at.markdown)


def test_an_unexpected_error_in_a_page_is_a_message_with_details(monkeypatch):
    at = open_app("4_alignment")
    assert not errors(at)
    import mot_viz.analysis.figures

    def broken(*args, **kwargs):
        raise ZeroDivisionError("injected")

    monkeypatch.setattr(mot_viz.analysis.figures, "alignment_heatmap", broken)
    at.switch_page("views/4_alignment.py").run()
    assert not at.exception
    assert any("Unexpected error" in e and "ZeroDivisionError: injected" in e for e in errors(at))
    assert any(x.label == "Details" for x in at.expander)


# ----- explanations match method.md §6, and the cost panel is the shown translation's ------------------

REPLAY_IS_A_FORWARD_PASS = {  # page -> words its "What am I looking at?" must contain
    None: "one forward pass of its own over the context tokens",  # the caption under the method's picture
    "1_answers": "one forward pass over the same context tokens",
    "2_cache_error": "the replay is the target's own forward pass",
    "6_training": "the target replays the context",
    "8_long_context": "one forward pass over every token of the document",
    "9_logit_lens": "the target's own forward pass over the context",
    "10_multi_agent": "one forward pass over the story's tokens",
}


@pytest.mark.parametrize("page", list(REPLAY_IS_A_FORWARD_PASS))
def test_each_explanation_says_the_replay_is_a_target_forward_pass(page):
    at = open_app(page)
    text = " ".join(m.value for m in [*at.markdown, *at.caption])
    assert REPLAY_IS_A_FORWARD_PASS[page] in text
    assert "without having read" not in text and "never reads the text" not in text


def test_overview_cost_panel_is_the_shown_translation_beside_native_prefill():
    from mot_viz.engine.models import kv_cache_bytes

    at = open_app()
    costs, sizes = [d.value for d in at.dataframe if "stage" in d.value.columns or "model" in d.value.columns][:2]
    by_stage = dict(zip(costs["stage"], costs["seconds"]))
    native, side = by_stage["native prefill (target reads the text)"], by_stage["translator + replay"]
    translator, replay = by_stage["translator"], by_stage["replay (target forward pass)"]
    assert side == pytest.approx(translator + replay, abs=2e-3) and native > 0
    assert costs["× native prefill"].iloc[-1] == pytest.approx(1.0)
    target = load_test_model("gemma3-270m")
    assert sizes["MB per 1,000 tokens (fp16)"].iloc[1] == round(kv_cache_bytes(target.spec) / 1e6, 1)
    assert any("does not skip the target's prefill" in c.value for c in at.caption)


def test_routing_what_if_matches_the_library_and_reacts_to_the_choice():
    from mot_viz.analysis.whatif import what_if
    from mot_viz.engine.translator import GateOverride

    at = open_app("3_routing")
    summary = next(d.value for d in at.dataframe if "gates" in d.value.columns)
    assert summary["gates"].tolist() == ["the router's own gates", "every token to expert 0"]
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    sel = at.session_state["applied"]
    mot, _ = load_checkpoint(sel.checkpoint, source, target)
    base = translate(mot, source, target, sel.text)
    forced = what_if(mot, source, target, base, GateOverride("force", 0), sel.example, sel.suffix)
    assert summary["first-token KL to native"].iloc[1] == pytest.approx(forced.first_token_kl, rel=1e-3, abs=1e-4)
    assert summary["answer"].iloc[1] == forced.answer.text
    at.radio(key="pg.routing.whatif").set_value("uniform gates").run()
    assert not at.exception
    summary = next(d.value for d in at.dataframe if "gates" in d.value.columns)
    assert summary["gates"].iloc[1] == "uniform gates over all experts"
    experts = next(d.value for d in at.dataframe if "expert" in d.value.columns and "share" in d.value.columns)
    # each mixture's shares (shown to 4 decimals) sum to 1
    assert experts.groupby("mixture").share.sum().tolist() == pytest.approx([1.0, 1.0], rel=1e-3)


def test_cache_error_page_reuse_verdict_is_the_library_verdict_and_follows_the_thresholds(tmp_path, monkeypatch):
    from mot_viz.eval.verdict import VerdictThresholds

    monkeypatch.setenv("MOT_VIZ_VERDICT_RESULTS", str(tmp_path))
    (tmp_path / "smollm2-to-gemma3").mkdir()
    (tmp_path / "smollm2-to-gemma3" / "validation.json").write_text(json.dumps(
        {"held_out": 85, "balanced_accuracy": 0.66, "agreement": 0.647,
         "other_genres": [{"genre": "CoQA stories (their first question)", "examples": 98,
                           "balanced_accuracy": 0.61}]}))
    at = open_app("2_cache_error")
    layers = next(d.value for d in at.dataframe if "layer verdict" in d.value.columns)
    assert any(b.value.startswith("**Verdict: ") for b in [*at.success, *at.warning])
    assert any("on 65% of 85 held-out SQuAD examples (balanced accuracy 0.66" in c.value
               and "on 98 CoQA stories (their first question), never used for tuning, balanced accuracy 0.61" in c.value
               for c in at.caption)
    # the signals are the library's, on the same translation
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    sel = at.session_state["applied"]
    mot, _ = load_checkpoint(sel.checkpoint, source, target)
    rows = pd.DataFrame(translation_fidelity(translate(mot, source, target, sel.text), target, mot.channels))
    np.testing.assert_allclose(layers["attn_out_cos"], rows["attn_out_cos"].round(3), atol=1e-3)
    assert len(layers) == 2 and set(layers["layer verdict"]) <= {"reuse", "re-prefill"}
    thresholds = next(d.value for d in at.dataframe if "threshold" in d.value.columns)
    assert dict(zip(thresholds.signal, thresholds.threshold))["attn_out_cos"] == VerdictThresholds().attn_out_cos
    # a threshold nobody can reach turns every layer into re-prefill
    at.number_input(key="pg.error.verdict.attn_out_cos").set_value(1.5).run()
    assert not at.exception
    layers = next(d.value for d in at.dataframe if "layer verdict" in d.value.columns)
    assert set(layers["layer verdict"]) == {"re-prefill"}
    assert any("attn_out_cos fails its threshold at layers" in w.value for w in at.warning)


def test_fit_a_linear_translator_for_a_pair_without_a_checkpoint(app_cache):
    from mot_viz.train.quickfit import fits_dir

    at = open_app()
    at.selectbox(key="sb.target").set_value("smollm2-135m").run()  # smollm2 → smollm2: no checkpoint ships for it
    assert any(e.label.startswith("No checkpoint for this pair? Fit one") for e in at.expander)
    next(b for b in at.button if b.label == "Fit a linear translator").click().run()
    assert not at.exception and not errors(at)
    fitted = at.selectbox(key="sb.checkpoint").value
    assert fitted.startswith("fit: smollm2-135m-to-smollm2-135m-linear-")
    folder = fits_dir() / fitted.removeprefix("fit: ")
    assert folder.parent == app_cache / "fits" and (folder / "translator.safetensors").is_file()
    assert any("is now the checkpoint" in s.value for s in at.success)
    translate_button(at).click().run()
    assert not at.exception and not errors(at)
    assert at.session_state["applied"].checkpoint == str(folder)
    at = goto(at, "2_cache_error")  # every page works on it
    assert figures(at)
    # the fitted map carries the context: the identity pair's window is recovered closely
    layers = next(d.value for d in at.dataframe if "layer verdict" in d.value.columns)
    assert (layers["centered_cos_k"] > 0.9).all()


# ----- a second checkpoint on every page ---------------------------------------------------------------


def _second_translation(name: str, text: str = FREE_TEXT):
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(str(Path(os.environ["MOT_VIZ_PRETRAINED"]) / name), source, target)
    return mot, target, translate(mot, source, target, text)


def test_cache_error_page_overlays_a_second_checkpoint_with_its_own_verdict(tmp_path, monkeypatch):
    from mot_viz.analysis.cache_metrics import cache_error_table

    monkeypatch.setenv("MOT_VIZ_VERDICT_RESULTS", str(tmp_path))  # no checkpoint's verdict checked there
    at = goto(use_free_text(open_app(), FREE_TEXT, "Who designed the tower?", "Gustave Eiffel"), "2_cache_error")
    assert any("has not been checked against QA" in c.value for c in at.caption)
    at.selectbox(key="pg.error.second").set_value("smollm2-to-gemma3-single").run()
    assert not at.exception and not errors(at)
    per_layer, _, fidelity = figures(at)[:3]
    mot2, target, translation2 = _second_translation("smollm2-to-gemma3-single")
    expected = cache_error_table(translation2, mot2.channels)
    dashed = next(t for t in per_layer["data"] if t["name"] == "replayed (2nd)" and "relative L2" in t["hovertemplate"]
                  and t["hovertemplate"].startswith("K"))
    want = expected[(expected.kv == "K") & (expected.comparison == "replayed")].sort_values("layer")["rel_l2"]
    np.testing.assert_allclose(list(dashed["y"]), want, rtol=1e-5)
    assert "second" in {t["legendgroup"] for t in fidelity["data"]}
    rows = pd.DataFrame(translation_fidelity(translation2, target, mot2.channels))
    shown = next(t for t in fidelity["data"] if t["name"] == "second" and "centered" in t["hovertemplate"])
    np.testing.assert_allclose(list(shown["y"]), rows.sort_values("layer")["centered_cos_k"], atol=1e-5)
    verdicts = [b.value for b in [*at.success, *at.warning] if b.value.startswith("**Verdict: ")]
    assert len(verdicts) == 2  # one per checkpoint, side by side
    # a second checkpoint of the reverse pair is refused with its reason; the page still shows the first
    at.selectbox(key="pg.error.second").set_value("gemma3-to-smollm2").run()
    assert not at.exception and any("made for" in e for e in errors(at))
    assert len([b for b in [*at.success, *at.warning] if b.value.startswith("**Verdict: ")]) == 1


def test_routing_and_cache_space_pages_show_a_second_checkpoint():
    from mot_viz.analysis.cache_metrics import expert_usage
    from mot_viz.engine.channels import terminal_channels
    from mot_viz.engine.checkpoint import save_checkpoint
    from mot_viz.engine.mot import MoT
    from mot_viz.train.quickfit import fits_dir

    # another mixture for the same pair and window, among the user's fits (listed as "fit: …")
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    torch.manual_seed(7)
    channels = terminal_channels(source.spec.num_layers, target.spec.num_layers, 0.5)
    other = MoT.build(source.spec, target.spec, channels, dim=32, heads=4, output_activation="none", variant="mot",
                      num_experts=3, top_k=1)
    save_checkpoint(other, fits_dir() / "another-mixture")

    at = goto(use_free_text(open_app(), FREE_TEXT), "3_routing")
    at.selectbox(key="pg.routing.second").set_value("smollm2-to-gemma3-single").run()
    assert any("has no router" in i.value for i in at.info)  # a single translator has no routing to compare
    at.selectbox(key="pg.routing.second").set_value("fit: another-mixture").run()
    assert not at.exception and not errors(at)
    balance = at.dataframe[0].value
    assert list(balance["checkpoint"]) == ["smollm2-to-gemma3"] * 2 + ["fit: another-mixture (2nd)"] * 2
    usage_charts = [f for f in figures(at)
                    if any("importance share" in a.get("text", "") for a in f["layout"].get("annotations", []))]
    translation2 = translate(other, source, target, FREE_TEXT)
    assert len(usage_charts) == 2
    usage = expert_usage(translation2.translated.key_routing.gates)
    k_bars = [t for t in usage_charts[1]["data"] if t["name"] == "K"]
    assert len(usage) == 3 and all(len(t["x"]) == 3 for t in k_bars)  # the second mixture's 3 experts
    np.testing.assert_allclose(sorted(float(y) for t in k_bars for y in t["y"]),
                               sorted(usage[[c for c in usage if c.endswith("share")]].to_numpy().ravel()), atol=1e-6)

    at = goto(at, "5_cache_space")
    at.selectbox(key="pg.space.second").set_value("fit: another-mixture").run()
    at.multiselect(key="pg.space.kinds").set_value(["native target", "translated", "second translator"]).run()
    assert not at.exception and not errors(at)
    traces = figures(at)[0]["data"]
    points = {t["name"]: t for t in traces if t["mode"] == "markers"}
    assert len(points["second translator"]["x"]) == translation2.target_ids.shape[1]
    assert any(t["name"] == "native → second translator" for t in traces)


# ----- logit lens -------------------------------------------------------------------------------------


def _library_lens(sel, position: int, gold: int | None = None):
    from mot_viz.analysis.logit_lens import attention_shares, logit_lens, translation_lens_trace

    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(sel.checkpoint, source, target)
    linear, _ = load_checkpoint(str(Path(sel.checkpoint).with_name("smollm2-to-gemma3-linear")), source, target)
    trace = translation_lens_trace(mot, source, target, translate(mot, source, target, sel.text), sel.suffix, linear)
    return trace, logit_lens(target, trace, position, gold), attention_shares(trace, position)


def test_logit_lens_page_shows_the_librarys_lens():
    from mot_viz.analysis.shift.cases import answer_token_ids

    at = open_app("9_logit_lens")
    assert not errors(at)
    heatmap, ranks, attention = figures(at)
    sel = at.session_state["applied"]
    target = load_test_model("gemma3-270m")
    gold = answer_token_ids(target.tokenizer, sel.example, 1)[0]
    trace, lens, shares = _library_lens(sel, 0, gold)
    assert list(heatmap["data"][0]["x"]) == ["native", "mot", "linear", "no_context"]  # the linear map is found
    kl = lens.layers.pivot(index="layer", columns="condition", values="kl_to_native_final")
    assert np.allclose(np.array(heatmap["data"][0]["customdata"], dtype=float),
                       kl[["native", "mot", "linear", "no_context"]].values, rtol=1e-4, atol=1e-6)
    assert any(s.get("y0") == 3.5 and s.get("y1") == 5.5 for s in heatmap["layout"]["shapes"])  # window 4-5
    # at the last layer the lens is the model's own output: the Per-layer page's first-token KL
    from mot_viz.eval.answers import first_answer_logprobs
    from mot_viz.analysis.shift.metrics import kl_divergence

    translation = translate(load_checkpoint(sel.checkpoint, load_test_model("smollm2-135m"), target)[0],
                            load_test_model("smollm2-135m"), target, sel.text)
    expected = kl_divergence(*first_answer_logprobs(target, [translation.native_kv, translation.mixed_kv],
                                                    sel.suffix))
    assert kl.loc[kl.index.max(), "mot"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert any(f"{expected:.4f} nats" in c.value for c in at.caption)
    mot_rank = next(t for t in ranks["data"] if t["name"] == "mot")
    assert list(mot_rank["y"]) == lens.layers[lens.layers.condition == "mot"].sort_values("layer").token_rank.tolist()
    context = shares.groupby(["condition", "layer"], sort=False).context.mean()
    shown_native = next(t for t in attention["data"] if t["name"] == "native" and t.get("showlegend") is not False)
    assert np.allclose(list(shown_native["y"]), context.loc["native"].values, atol=1e-6)
    # the gold answer's first token can be followed instead
    at.radio(key="pg.lens.token").set_value("gold").run()
    gold_rank = next(t for t in figures(at)[1]["data"] if t["name"] == "native")
    assert list(gold_rank["y"]) == lens.layers[lens.layers.condition == "native"].sort_values("layer").gold_rank.tolist()
    # following the answer, another position reads the next answer token, and the view is in the link
    at.toggle(key="pg.lens.follow").set_value(True).run()
    assert not at.exception
    if trace.positions > 1:
        at.selectbox(key="pg.lens.position").set_value(1).run()
        assert not at.exception
        _, later, _ = _library_lens(sel, 1)
        z = np.array(figures(at)[0]["data"][0]["customdata"], dtype=float)
        assert np.allclose(z, later.layers.pivot(index="layer", columns="condition", values="kl_to_native_final")[
            ["native", "mot", "linear", "no_context"]].values, rtol=1e-4, atol=1e-6)
        assert at.query_params.get("lens.position") == "1"


def test_logit_lens_page_second_checkpoint_and_no_question():
    at = open_app("9_logit_lens")
    at.selectbox(key="pg.lens.second").set_value("smollm2-to-gemma3-linear").run()
    assert not at.exception and not errors(at)
    assert "second" in list(figures(at)[0]["data"][0]["x"])
    at = goto(use_free_text(open_app(), FREE_TEXT), "9_logit_lens")
    assert any("type a question" in i.value for i in at.info)
    assert not figures(at)


def test_logit_lens_page_refuses_a_question_too_long_to_read_in_one_message():
    from mot_viz.analysis.logit_lens import LENS_QUESTION_TOKENS

    at = goto(use_free_text(open_app(), FREE_TEXT, "Who " * LENS_QUESTION_TOKENS), "9_logit_lens")
    assert not at.exception and len(errors(at)) == 1 and not figures(at)
    assert errors(at)[0].startswith("**Context problem.** The question is ")
    assert f"the logit lens reads a question of at most {LENS_QUESTION_TOKENS}" in errors(at)[0]


def test_logit_lens_page_on_a_linear_checkpoint():
    at = open_app()
    at.selectbox(key="sb.checkpoint").set_value("smollm2-to-gemma3-linear")
    at = goto(use_free_text(at, FREE_TEXT, "Who built it?"), "9_logit_lens")
    assert not errors(at)
    assert list(figures(at)[0]["data"][0]["x"]) == ["native", "mot", "no_context"]  # no second linear map
