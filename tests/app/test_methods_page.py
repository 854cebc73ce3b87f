"""The Methods page driven by AppTest on the tiny test pair (MOT_VIZ_TEST_MODELS=1), like tests/app/test_app_pages.py:
its answers, scores and bytes are checked against mot_viz.analysis.methods computed directly on the same context."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app_helpers import errors, open_app, shown
from mot_viz.analysis.methods import cache_methods, method_labels, relay_methods
from plotly_figures import figures

PAGE = "views/12_methods.py"


pytestmark = pytest.mark.usefixtures("pages_env")  # every page runs on the tiny test pair


@pytest.fixture(scope="module")
def library(default_context):
    """The page's default context (the sidebar's first example) translated and shared by every method, computed by the library."""
    return default_context


def open_page() -> AppTest:
    at = open_app(PAGE)
    assert not at.error, errors(at)
    return at


def test_the_page_shows_the_librarys_answers_and_bytes_and_says_what_is_not_offered(library):
    at = open_page()
    source, target, mot, linear, example, prompt, translation = library
    expected = cache_methods(mot, source, target, example, translation, prompt.suffix_text, {"linear": linear})
    answers = at.dataframe[0].value
    assert answers["method"].tolist() == [method_labels()[m] for m in ("native", "no_context", "mot", "linear")]
    assert answers["answer"].tolist() == expected.answers["answer"].tolist()
    assert answers["F1"].tolist() == pytest.approx(expected.answers["score"].tolist())
    sizes = at.dataframe[1].value
    assert sizes["bytes"].tolist() == expected.handed_over["bytes"].tolist()
    assert sizes["what"].tolist() == expected.handed_over["what"].tolist()
    captions = [shown(c.value) for c in at.caption]
    assert any(c.startswith(f"**{method_labels()['direct']}** is not offered") for c in captions)
    assert any(c.startswith(f"**{method_labels()['kvcomm']}** is not offered") and "one shape per layer" in c
               for c in captions)
    assert any("produces no cache of the context" in c for c in captions)
    figs = figures(at)
    assert len(figs) == 3  # time by stage, K/V error, quality against time
    bars = next(f for f in figs if all(t.get("orientation") == "h" for t in f["data"]))
    assert {t["name"] for t in bars["data"]} >= {"source prefill", "translation", "replay", "first answer token"}
    title = lambda f: f["layout"].get("yaxis", {}).get("title", {}).get("text", "")  # noqa: E731
    errors_fig = next(f for f in figs if title(f).startswith("K: rel_l2"))
    mot_trace = next(t for t in errors_fig["data"] if t["name"] == method_labels()["mot"])
    want = expected.kv_error[(expected.kv_error["method"] == "mot") & (expected.kv_error["kv"] == "K")]
    assert list(mot_trace["y"]) == pytest.approx(want["rel_l2"].tolist(), rel=1e-4)
    assert "The relay's messages" not in [h.value for h in at.subheader]  # the relay only on request
    note = " ".join(m.value for m in at.markdown)  # method.md §6: the replay is the target's own forward pass
    assert "one forward pass over every context token" in note and "never reads the text" not in note
    assert "does not spare the target reading the text" in note


def test_the_relay_on_request_shows_the_librarys_messages_and_the_view_lives_in_the_url(library):
    at = open_page()
    at.radio(key="pg.methods.kv").set_value("V").run()
    at.checkbox(key="pg.methods.relay").check().run()
    assert not at.exception and not at.error, errors(at)
    assert "The relay's messages" in [h.value for h in at.subheader]
    source, target, mot, _, example, _, translation = library
    expected = relay_methods(mot, source, target, example, translation)
    texts = [t.value for t in at.text]
    for condition, message in expected.messages.items():
        assert f"{method_labels()[condition]}: {message}" in texts  # plain text, as the source wrote it
    answers = at.dataframe[0].value.set_index("method")
    for row in expected.answers.itertuples():
        assert answers.loc[method_labels()[row.method], "answer"] == row.answer
    sizes = at.dataframe[1].value.set_index("method")
    for row in expected.handed_over.itertuples():
        assert sizes.loc[method_labels()[row.method], "bytes"] == row.bytes == len(expected.messages[row.method].encode())
    assert at.query_params.get("methods.relay") == "true" and at.query_params.get("methods.kv") == "V"


def test_a_broken_direct_map_in_pretrained_leaves_out_that_method_only(pretrained_copy, monkeypatch):
    """A folder marked as the pair's direct map whose weights do not load: the page shows every other method and
    says why the direct map is left out (the user never chose it)."""
    import json

    folder = next(iter(pretrained_copy.values())).parent
    broken = folder / "smollm2-to-gemma3-direct"
    broken.mkdir()
    config = json.loads((folder / "smollm2-to-gemma3" / "config.json").read_text())
    config["replay"]["direct"] = True
    (broken / "config.json").write_text(json.dumps(config))
    (broken / "translator.safetensors").write_bytes(b"not safetensors at all")
    monkeypatch.setenv("MOT_VIZ_PRETRAINED", str(folder))
    at = open_page()  # no error, no exception
    answers = at.dataframe[0].value
    assert answers["method"].tolist() == [method_labels()[m] for m in ("native", "no_context", "mot", "linear")]
    captions = [shown(c.value) for c in at.caption]
    note = next(c for c in captions if c.startswith(f"**{method_labels()['direct']}** is not offered"))
    assert "the full-depth map smollm2-to-gemma3-direct does not load (CheckpointError: " in note
    assert note.endswith("Fix or remove it; the other methods are shown.")


def test_a_broken_linear_map_in_pretrained_leaves_out_that_method_only(pretrained_copy, monkeypatch):
    """The pair's linear checkpoint on offer, its weights damaged: the page shows every other method and says why the
    linear map is left out, as it does for a broken direct map."""
    folder = next(iter(pretrained_copy.values())).parent
    (folder / "smollm2-to-gemma3-linear" / "translator.safetensors").write_bytes(b"not safetensors at all")
    monkeypatch.setenv("MOT_VIZ_PRETRAINED", str(folder))
    at = open_page()  # no error, no exception
    answers = at.dataframe[0].value
    assert answers["method"].tolist() == [method_labels()[m] for m in ("native", "no_context", "mot")]
    captions = [shown(c.value) for c in at.caption]
    note = next(c for c in captions if c.startswith(f"**{method_labels()['linear']}** is not offered"))
    assert "the linear map smollm2-to-gemma3-linear does not load (CheckpointError: " in note
    assert note.endswith("Fix or remove it; the other methods are shown.")
