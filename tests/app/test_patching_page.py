"""The Layer patching page driven by AppTest on the tiny test pair (MOT_VIZ_TEST_MODELS=1): its bars and groups are
the library's scan (mot_viz.engine.patching) of the same context, and its options live in the URL."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app_helpers import errors, goto, open_app, translate_button
from mot_viz.app.openings import DEFAULT_LONG_DOCUMENT
from mot_viz.analysis.methods import method_labels
from mot_viz.data.long_context import BUDGETS, long_examples
from mot_viz.engine.alignment import encode
from mot_viz.engine.patching import (ANSWER_SENTENCE, answer_sentence_buckets, answer_token_ids, layer_groups,
                                     patching_scan)
from mot_viz.engine.mot import translate
from mot_viz.engine.prompts import build_prompt
from mot_viz.sharing.linear import linear_cache
from plotly_figures import figures
from tolerance import close

PAGE = "views/13_layer_patching.py"


pytestmark = pytest.mark.usefixtures("pages_env")  # every page runs on the tiny test pair


@pytest.fixture(scope="module")
def library(default_context):
    """The page's default context (the sidebar's first example), its translation, question and gold answer, computed by the library."""
    source, target, mot, linear, example, prompt, translation = default_context
    question = target.ids_tensor(encode(target.tokenizer, prompt.suffix_text))
    answer = answer_token_ids(target.tokenizer, example, None)
    return source, target, mot, linear, example, prompt, translation, question, answer


def open_page() -> AppTest:
    at = open_app(PAGE)
    assert not at.error, errors(at)
    return at


def _bars(fig, direction: str) -> list[float]:
    return list(next(t for t in fig["data"] if t["name"].startswith(direction))["y"])


def test_the_bars_and_groups_are_the_librarys_scan_of_the_mot_cache(library):
    at = open_page()
    assert not any(k.startswith("patch.") for k in at.query_params)  # options at their defaults stay out of the link
    source, target, mot, _, example, _, translation, question, answer = library
    groups = layer_groups(target.spec, mot.channels.target_layers)
    expected = patching_scan(target.model, translation.native_kv, translation.mixed_kv, question, answer, groups)
    frame = expected.frame()
    figs = figures(at)
    assert len(figs) == 2  # the scan, and the method drawn last (its global layers lit)
    layers = frame[frame.target.str.startswith("layer ")]
    for direction, name in (("restore", "restoring"), ("break", "breaking")):
        want = layers[layers.direction == direction].share.tolist()
        assert close(_bars(figs[0], name), want, rtol=1e-4, equal_nan=True)
    shapes = figs[0]["layout"]["shapes"]  # the window shaded
    assert any(s["x0"] == min(mot.channels.target_layers) - 0.5 and s["x1"] == max(mot.channels.target_layers) + 0.5
               for s in shapes)
    table = at.dataframe[0].value.set_index("target")
    assert list(table.index) == list(groups)
    window = frame[(frame.target == "window") & (frame.direction == "restore")].share.iloc[0]
    assert close(table.loc["window", "restore share"], round(window, 3), rtol=1e-3)
    native = float(at.metric[0].value)
    assert close(native, round(expected.native, 3), rtol=1e-3)
    note = " ".join(m.value for m in at.markdown)
    assert "misses layers that only matter together" in note and "computes itself" in note


def test_method_group_and_buckets_follow_the_widgets_and_live_in_the_url(library):
    at = open_page()
    source, target, mot, linear, example, prompt, translation, question, answer = library
    offered = at.radio(key="pg.patch.method").options  # direct and kvcomm are not offered for this pair
    assert offered == [method_labels()["mot"], method_labels()["linear"]]
    at.radio(key="pg.patch.method").set_value("linear").run()
    at.multiselect(key="pg.patch.custom").set_value([0, 3]).run()
    at.toggle(key="pg.patch.buckets").set_value(True).run()
    assert not at.exception and not at.error, errors(at)
    kv = linear_cache(mot, linear, source, target, translation)
    groups = {**layer_groups(target.spec, mot.channels.target_layers), "your group": (0, 3)}
    buckets = answer_sentence_buckets(target.tokenizer, prompt.context_text, example.answers[0],
                                      translation.prefix_len, first=prompt.context_text.find("Passage:"))
    expected = patching_scan(target.model, translation.native_kv, kv, question, answer, groups, buckets).frame()
    figs = figures(at)
    assert len(figs) == 4  # all positions, the answer's sentence, the rest; the method drawn
    sentence = expected[(expected.bucket == ANSWER_SENTENCE) & expected.target.str.startswith("layer ")]
    assert close(_bars(figs[1], "breaking"), sentence[sentence.direction == "break"].share.tolist(), rtol=1e-4,
                 equal_nan=True)
    table = at.dataframe[0].value
    mine = table[(table.target == "your group") & (table.bucket == "all")]
    want = expected[(expected.target == "your group") & (expected.bucket == "all") & (expected.direction == "break")]
    assert close(mine["break share"].iloc[0], round(want.share.iloc[0], 3), rtol=1e-3)
    assert at.query_params.get("patch.method") == "linear" and at.query_params.get("patch.buckets") == "true"
    assert at.query_params.get("patch.custom")


def test_free_text_without_a_gold_answer_is_one_message():
    at = open_app()
    at.radio(key="sb.mode").set_value("Free text").run()
    at.text_area(key="sb.text").input("My own passage about the tower in Paris.").run()
    at.text_input(key="sb.question").input("Where is it?").run()
    at.text_input(key="sb.gold").input("").run()
    translate_button(at).click().run()
    at.switch_page(PAGE).run()
    assert not at.exception
    assert any("gold answer" in e.value for e in at.error)


def test_the_long_context_pages_document_is_scanned_and_its_choice_lives_in_the_url(library):
    source, target, mot, *_ = library
    at = open_page()
    at.session_state["pg.long.doc"] = 1  # as the Long context page leaves it: distractor stack #1, 512 tokens
    at.radio(key="pg.patch.context").set_value("long").run()
    assert not at.exception and not at.error, errors(at)
    doc = long_examples("stacks", target.tokenizer, BUDGETS[0], 2, seed=0)[1]
    prompt = build_prompt(doc.example, target.chat_frame)
    translation = translate(mot, source, target, prompt.context_text)
    assert translation.target_ids.shape[1] > 256  # the document, not the sidebar's SQuAD passage
    question = target.ids_tensor(encode(target.tokenizer, prompt.suffix_text))
    expected = patching_scan(target.model, translation.native_kv, translation.mixed_kv, question,
                             answer_token_ids(target.tokenizer, doc.example, None),
                             layer_groups(target.spec, mot.channels.target_layers)).frame()
    layers = expected[expected.target.str.startswith("layer ")]
    fig = figures(at)[0]
    assert close(_bars(fig, "restoring"), layers[layers.direction == "restore"].share.tolist(), rtol=1e-4,
                 equal_nan=True)
    assert close(float(at.metric[0].value), round(float(expected.native.iloc[0]), 3), rtol=1e-3)
    assert r"document: stacks \#1 at 512 target tokens" in " ".join(c.value for c in at.caption)
    assert at.query_params.get("patch.context") == "long" and at.query_params.get("long.doc") == "1"
    # the user's own document without a gold answer: one message, no scan
    at.session_state["pg.long.source"] = "yours"
    at.session_state["pg.long.text"] = "The tower in Paris was designed by Gustave Eiffel's company."
    at.session_state["pg.long.question"] = "Who designed the tower?"
    at.run()
    assert not at.exception and not figures(at)
    assert [e.value for e in at.error if "gold answer" in e.value and "Long context page" in e.value]


@pytest.mark.parametrize("doc", ["99999", "-5"])
def test_a_linked_document_number_out_of_range_is_named_and_dropped(doc):
    """long.doc past the last document, or negative (which indexing would have read from the end): the link warning
    names it with the range, the page scans the page's first document, and the option leaves the URL."""
    from test_permalinks import link_warning

    at = goto(open_app(params={"patch.context": "long", "long.doc": doc}), PAGE)
    assert not at.exception and not at.error, errors(at)
    assert f"long.doc={int(doc)} (the option takes a whole number from 0 to 63)" in link_warning(at)
    assert rf"document: stacks \#{DEFAULT_LONG_DOCUMENT} at 512 target tokens" in " ".join(c.value for c in at.caption)
    assert at.query_params.get("long.doc") is None


def test_the_page_opens_on_the_direct_map_where_the_pair_has_one_and_says_why(pretrained_copy, monkeypatch):
    """Where the pair offers a full-depth direct map, the page opens on it (its gap is large enough to place, the
    MoT's often is not) and says why; the MoT stays one click away."""
    import shutil

    from mot_viz.engine.testing import load_test_model
    from mot_viz.train.quickfit import QuickFitConfig, fit_pair

    folder = next(iter(pretrained_copy.values())).parent
    # the tiny source has fewer layers than the tiny target: the reverse pair has a direct map
    fitted = fit_pair(load_test_model("gemma3-270m"), load_test_model("smollm2-135m"),
                      QuickFitConfig(tokens=256, min_context_tokens=16, max_context_tokens=48, direct=True, top_k=2))
    shutil.copytree(fitted, folder / "gemma3-to-smollm2-direct")
    monkeypatch.setenv("MOT_VIZ_PRETRAINED", str(folder))
    at = open_app()
    at.selectbox(key="sb.source").set_value("gemma3-270m").run()
    at.selectbox(key="sb.target").set_value("smollm2-135m").run()
    at.selectbox(key="sb.checkpoint").set_value("gemma3-to-smollm2").run()
    translate_button(at).click().run()
    at = goto(at, PAGE)
    assert not at.exception and not errors(at), errors(at)
    assert at.radio(key="pg.patch.method").value == "direct"
    assert any(c.value.startswith("Opens on the direct map") for c in at.caption)
    at.radio(key="pg.patch.method").set_value("mot").run()
    assert not any(c.value.startswith("Opens on the direct map") for c in at.caption)
    assert at.query_params.get("patch.method") == "mot"  # the MoT, no longer the page's first view, is in the link
