"""Permalinks: the applied view in the URL and back (mot_viz.app.permalink), driven through AppTest on tiny models.

The pure encode/decode functions are tested on their own first; then the app: a non-default selection and page
option reach ``st.query_params``, a fresh session opened on those parameters shows the same view, free text
(short and long) round-trips, hostile parameters give one warning and the defaults, and the sidebar's
"Copy as Python" snippet translates the same text and prints the numbers the Per-layer cache error page shows.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import time
from urllib.parse import parse_qsl, urlencode

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import mot_viz.engine.models
from app_helpers import DEFAULT_LABEL, errors, goto, open_app, shown, translate_button
from mot_viz.app.openings import DEFAULT_EXAMPLE
from mot_viz import app
from mot_viz.app.permalink import (MAX_QUERY_CHARS, MAX_TEXT_IN_LINK, SidebarLink, check_value, decode_value,
                                   encode_value, fit_link, page_params, parse_link, query_string, sidebar_params,
                                   text_digest)
from mot_viz.app.server import serve_app
from mot_viz.app.settings import EXAMPLES_PER_DATASET
from mot_viz.engine.testing import load_test_model
from plotly_figures import figures

FREE_TEXT = "The Eiffel Tower is in Paris. It was built by Gustave Eiffel's company from 1887 to 1889.\n"
LINK_ARGS = dict(models=["smollm2-135m", "gemma3-270m"], checkpoints=["smollm2-to-gemma3", "other-ckpt"],
                 datasets=["squad", "boolq"], examples=50)


pytestmark = pytest.mark.usefixtures("pages_env")  # every page runs on the tiny test pair


def copied_link(at: AppTest) -> dict[str, str]:
    code = next(c.value for c in at.code if c.value.startswith("?"))
    return dict(parse_qsl(code[1:], keep_blank_values=True))


def python_code(at: AppTest) -> str:
    return next(c.value for c in at.code if c.language == "python")


def link_warning(at: AppTest) -> str:
    """The one warning naming what an opened link held that was ignored."""
    found = [shown(w.value) for w in at.warning if w.value.startswith("This link holds values")]
    assert len(found) == 1, [w.value for w in at.warning]
    return found[0]


def sidebar_values(at: AppTest) -> dict[str, object]:
    return {key: at.session_state[key] for key in ("sb.source", "sb.target", "sb.checkpoint", "sb.mode",
                                                   "sb.dataset", "sb.example")}


# ----- the pure encoding --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["K", "shared characters", "", "1", "true", "null", "[x", '"quoted"', "NaN",
                                   24, 0, -3, 0.5, 1.0, True, False, ["centered_cos_k", "attn_out_cos"], [], [1, 2]])
def test_page_values_keep_their_type_through_a_link(value):
    encoded = encode_value(value)
    assert isinstance(encoded, str)
    decoded = decode_value(encoded)
    assert decoded == value and type(decoded) is type(value)
    assert encode_value("K") == "K" and encode_value("shared characters") == "shared characters"  # readable


def test_values_a_link_cannot_carry_are_left_out():
    assert encode_value((1, 2)) is None and encode_value(float("nan")) is None and encode_value({"a": 1}) is None
    assert page_params({"pg.shift.live": ("perturbation", 4), "pg.error.kv": "V", "sb.example": 3, "applied": 1,
                        "pg.bad key": "x"}) == {"error.kv": "V"}
    for raw in ("NaN", "Infinity", "1e999", '{"a": 1}', "[[1]]"):  # hostile values read as text, never as numbers
        assert decode_value(raw) == raw


def test_check_value_against_the_widget_default_and_options():
    assert check_value(7, "K") == (False, None)
    assert check_value("abc", 24) == (False, None)
    assert check_value(True, 24) == (False, None) and check_value(1, False) == (False, None)
    fits, value = check_value(1, 0.5)
    assert fits and value == 1.0 and isinstance(value, float)
    assert check_value("V", "K", ["K", "V"]) == (True, "V")
    assert check_value("X", "K", ["K", "V"]) == (False, None)
    assert check_value(["a"], ["a", "b"]) == (True, ["a"]) and check_value([1], ["a"]) == (False, None)
    assert check_value("x", ["a"]) == (False, None)


def test_a_sidebar_link_round_trips():
    dataset = SidebarLink("gemma3-270m", "smollm2-135m", "other-ckpt", dataset="boolq", example=7)
    params = sidebar_params(dataset)
    assert params == {"src": "gemma3-270m", "tgt": "smollm2-135m", "ckpt": "other-ckpt", "ds": "boolq", "ex": "7"}
    parsed = parse_link(params, **LINK_ARGS)
    assert parsed.sidebar == dataset and not parsed.ignored and not parsed.page
    free = SidebarLink("smollm2-135m", "gemma3-270m", "smollm2-to-gemma3", text="Paris.\n", question="Where?",
                       gold="Paris | France")
    assert parse_link(sidebar_params(free), **LINK_ARGS).sidebar == free
    no_question = SidebarLink("smollm2-135m", "gemma3-270m", "smollm2-to-gemma3", text="Paris.", question="", gold="")
    assert set(sidebar_params(no_question)) == {"src", "tgt", "ckpt", "text"}
    assert parse_link(sidebar_params(no_question), **LINK_ARGS).sidebar == no_question


def test_a_long_text_is_linked_by_its_digest():
    text = "x" * (MAX_TEXT_IN_LINK + 1)
    params = sidebar_params(SidebarLink("smollm2-135m", "gemma3-270m", "smollm2-to-gemma3", text=text, question="Q"))
    assert "text" not in params and params["th"] == text_digest(text) and len(params["th"]) == 16
    assert parse_link(params, **LINK_ARGS, recall_text={text_digest(text): text}.get).sidebar.text == text
    lost = parse_link(params, **LINK_ARGS)
    assert lost.sidebar.text is None and lost.sidebar.question is None
    assert len(lost.ignored) == 1 and f"sha256:{params['th']}" in lost.ignored[0]
    assert len(sidebar_params(SidebarLink(text="y" * MAX_TEXT_IN_LINK))["text"]) == MAX_TEXT_IN_LINK


@pytest.mark.parametrize("params, named", [
    ({"src": "no-such-model"}, "source model 'no-such-model'"),
    ({"tgt": "/etc/passwd"}, "target model '/etc/passwd'"),
    ({"ckpt": "../../secret"}, "checkpoint '../../secret'"),
    ({"ds": "imagenet", "ex": "1"}, "dataset 'imagenet'"),
    ({"ex": "abc"}, "example index 'abc'"),
    ({"ex": "-1"}, "example index '-1'"),
    ({"ex": "50"}, "example index '50'"),
    ({"ex": "99999999999999999999"}, "example index '99999999999999999999'"),
    ({"ex": "1.5"}, "example index '1.5'"),
    ({"what": "x"}, "unknown parameter 'what'"),
    ({"q": "Who?"}, "q (a question and gold answer go with free text only)"),
    ({"text": "Paris.", "ds": "squad"}, "the dataset example (the link also holds free text)"),
])
def test_hostile_parameters_are_named_and_dropped(params, named):
    parsed = parse_link(params, **LINK_ARGS)
    assert any(line.startswith(named) for line in parsed.ignored), parsed.ignored
    link = parsed.sidebar
    assert link.source is None and link.target is None and link.checkpoint is None and link.example is None
    assert link.dataset in (None, "squad")


def test_a_link_cut_inside_a_fingerprint_says_it_was_cut_short():
    """A chat or mail program that cuts a long address cuts the fingerprint at its end: named as cut, not as a text
    this app has not seen, nor restored as the text "sha256:…"."""
    text = "x" * (MAX_TEXT_IN_LINK + 1)
    whole = sidebar_params(SidebarLink("smollm2-135m", "gemma3-270m", "smollm2-to-gemma3", text=text))
    for cut in (whole["th"][:7], ""):
        parsed = parse_link({**whole, "th": cut}, **LINK_ARGS, recall_text={text_digest(text): text}.get)
        assert parsed.sidebar.text is None and len(parsed.ignored) == 1
        assert parsed.ignored[0].endswith("is not 16 hex characters: the link was cut short (copy it again, whole))")
    option = page_params({"pg.long.text": text})["long.text"]
    parsed = parse_link({"long.text": option[:15]}, **LINK_ARGS, recall_text={text_digest(text): text}.get)
    assert parsed.page == {} and parsed.ignored == [f"the page option 'long.text' (its text's fingerprint "
                                                    f"{option[:15]} is not 16 hex characters: the link was cut short "
                                                    "(copy it again, whole))"]
    assert parse_link({"long.text": option}, **LINK_ARGS, recall_text={text_digest(text): text}.get).page == {
        "pg.long.text": text}


# ----- the app: the URL holds the applied view ------------------------------------------------------


def test_the_applied_selection_and_page_options_are_in_the_url_and_a_fresh_session_restores_them():
    at = open_app()
    assert at.query_params == {"src": "smollm2-135m", "tgt": "gemma3-270m", "ckpt": "smollm2-to-gemma3",
                               "ds": "squad", "ex": str(DEFAULT_EXAMPLE)}
    at.number_input(key="sb.example").set_value(3).run()
    assert at.query_params["ex"] == str(DEFAULT_EXAMPLE)  # not applied yet: the URL keeps the applied view
    translate_button(at).click().run()
    assert at.query_params["ex"] == "3" and at.session_state["applied"].label == "SQuAD #3"
    at = goto(at, "2_cache_error")
    at.radio(key="pg.error.metric").set_value("cosine").run()
    at.radio(key="pg.error.kv").set_value("V").run()
    at.multiselect(key="pg.error.fidelity").set_value(["attn_out_cos"]).run()
    params = dict(at.query_params)
    assert params["error.metric"] == "cosine" and params["error.kv"] == "V"
    assert params["error.fidelity"] == '["attn_out_cos"]'
    assert copied_link(at).items() >= {"ex": "3", "error.kv": "V"}.items()  # the sidebar's "Copy link"

    fresh = open_app(params=params)  # a new tab opened on the copied URL
    assert not fresh.warning
    assert sidebar_values(fresh) == sidebar_values(at)
    assert fresh.session_state["applied"] == at.session_state["applied"]
    assert fresh.query_params == params  # written back unchanged: no churn
    fresh = goto(fresh, "2_cache_error")
    assert not any(w.value.startswith("This link") for w in fresh.warning)
    assert fresh.radio(key="pg.error.metric").value == "cosine" and fresh.radio(key="pg.error.kv").value == "V"
    assert fresh.multiselect(key="pg.error.fidelity").value == ["attn_out_cos"]
    shown, before = figures(fresh)[1], figures(at)[1]  # the same heatmap (V, replayed, cosine)
    assert shown["layout"]["title"] == before["layout"]["title"] and "V: cosine" in str(shown["layout"]["title"])
    assert np.array_equal(np.asarray(shown["data"][0]["z"], dtype=float), np.asarray(before["data"][0]["z"], dtype=float))
    assert fresh.query_params == params


def test_a_switch_of_page_writes_no_query_parameter_the_address_did_not_show():
    """A page's options at their defaults stay out of the link, so the run a click in the navigation starts writes
    nothing new: the browser would put it under the address it still shows, the page left (links.link_params)."""
    at = open_app()
    shown = dict(at.query_params)
    pages = ["1_answers", "2_cache_error", "3_routing", "4_alignment", "5_cache_space", "6_training",
             "7_shift_analysis", "9_logit_lens"]
    for page in pages:
        at = goto(at, page)
        assert dict(at.query_params) == shown, page
    at = goto(at, "2_cache_error")
    at.radio(key="pg.error.kv").set_value("V").run()  # a changed option enters the link at once …
    shown = dict(at.query_params)
    assert shown["error.kv"] == "V"
    for page in pages:  # … and stays in it, unchanged, on every page after
        at = goto(at, page)
        assert dict(at.query_params) == shown, page
    assert at.session_state["pg.error.kv"] == "V"


def test_another_pair_and_checkpoint_round_trip(pretrained):
    at = open_app(params={"src": "gemma3-270m", "tgt": "smollm2-135m", "ckpt": "gemma3-to-smollm2", "ds": "boolq",
                          "ex": "4"})
    assert not at.warning and not at.error
    applied = at.session_state["applied"]
    assert (applied.source, applied.target, applied.label) == ("gemma3-270m", "smollm2-135m", "BoolQ #4")
    assert applied.checkpoint == str(pretrained["gemma3-to-smollm2"])
    assert at.selectbox(key="sb.checkpoint").value == "gemma3-to-smollm2"


def test_free_text_round_trips():
    at = open_app()
    at.radio(key="sb.mode").set_value("Free text").run()
    at.text_area(key="sb.text").input(FREE_TEXT)
    at.text_input(key="sb.question").input("Who built the tower?")
    at.text_input(key="sb.gold").input("Gustave Eiffel | Eiffel")
    translate_button(at).click().run()
    params = dict(at.query_params)
    assert params["text"] == FREE_TEXT and params["q"] == "Who built the tower?"
    assert params["gold"] == "Gustave Eiffel | Eiffel" and "ds" not in params and "ex" not in params

    fresh = open_app(params=params)
    assert not fresh.warning
    assert fresh.session_state["sb.mode"] == "Free text" and fresh.text_area(key="sb.text").value == FREE_TEXT
    assert fresh.text_input(key="sb.gold").value == "Gustave Eiffel | Eiffel"
    assert fresh.session_state["applied"] == at.session_state["applied"]
    assert fresh.session_state["applied"].example.answers == ("Gustave Eiffel", "Eiffel")


def test_a_long_free_text_is_linked_by_digest_and_restored_only_where_it_was_seen(monkeypatch):
    text = (FREE_TEXT * 12)[: MAX_TEXT_IN_LINK + 50]
    at = open_app()
    at.radio(key="sb.mode").set_value("Free text").run()
    at.text_area(key="sb.text").input(text)
    at.text_input(key="sb.question").input("Who built the tower?")
    translate_button(at).click().run()
    params = dict(at.query_params)
    assert "text" not in params and params["th"] == text_digest(text)

    assert open_app(params=params).session_state["applied"] == at.session_state["applied"]  # this app process saw it
    monkeypatch.setattr(app.links, "_LONG_TEXTS", type(app.links._LONG_TEXTS)())  # e.g. after a restart
    lost = open_app(params=params)
    assert len(lost.warning) == 1 and f"sha256:{params['th']}" in link_warning(lost)
    assert "paste the text under Free text" in link_warning(lost)
    assert lost.session_state["applied"].label == DEFAULT_LABEL  # the default context, not a half-restored one
    assert "th" not in lost.query_params  # the URL now says what is shown


def test_hostile_parameters_give_one_warning_and_the_defaults():
    default = open_app()
    at = open_app(params={"src": "no-such-model", "tgt": "gemma3-270m", "ckpt": "missing-checkpoint", "ds": "squad",
                "ex": "abc", "junk": "1", "error.kv": "7", "error.metric": "bogus", "answers.max_new": "1000",
                "answers.second": "not-a-checkpoint"})
    assert len(at.warning) == 1 and not at.error
    warning = link_warning(at)
    for named in ("no-such-model", "missing-checkpoint", "'abc'", "'junk'"):
        assert named in warning
    assert sidebar_values(at) == sidebar_values(default)
    assert at.session_state["applied"] == default.session_state["applied"]
    assert at.session_state["sb.source_other"] == "no-such-model"  # offered under "other", not loaded
    assert at.query_params["src"] == "smollm2-135m" and at.query_params["ex"] == str(DEFAULT_EXAMPLE)

    for params in ({"ex": "99999999999999999999"}, {"ex": "-3"}, {"ds": "squad", "ex": str(EXAMPLES_PER_DATASET)},
                   {"ckpt": ""}):
        other = open_app(params=params)
        assert not other.error and other.session_state["applied"] == default.session_state["applied"]

    at = goto(at, "2_cache_error")  # a wrong type, and a value the radio does not offer: the defaults
    warning = link_warning(at)
    assert "error.kv=7" in warning and "error.metric='bogus'" in warning
    assert at.radio(key="pg.error.kv").value == "K" and at.radio(key="pg.error.metric").value == "rel_l2"
    at = goto(at, "1_answers")  # out of the slider's range (the widget raises), and a checkpoint not offered
    assert not at.error
    warning = link_warning(at)
    assert "answers.max_new=1000" in warning and "answers.second='not-a-checkpoint'" in warning
    assert at.slider(key="pg.answers.max_new").value == app.DEFAULT_MAX_NEW_TOKENS
    assert at.selectbox(key="pg.answers.second").value == "(none)"
    assert "answers.max_new" not in at.query_params  # back at its default, which a link leaves out
    at.run()  # the warnings were shown once
    assert not any(w.value.startswith("This link") for w in at.warning)


# ----- hostile links: markup, invalid Unicode, length, unknown options -----------------------------------

EVIL = "[click](https://evil.example) ![x](https://evil.example/a.png) <img src=https://evil.example/b.png>"
MARKDOWN_ELEMENTS = ("markdown", "caption", "info", "warning", "error", "success")  # bodies Streamlit reads as Markdown


def markdown_bodies(at: AppTest) -> list[str]:
    return [e.value for kind in MARKDOWN_ELEMENTS for e in getattr(at, kind)]


def assert_no_markup_from(at: AppTest, needles=("](https://evil.example", "<img src=")) -> None:
    """No Markdown element holds the crafted link, image or tag unescaped (an escaped one shows as typed)."""
    for body in markdown_bodies(at):
        assert not any(n in body for n in needles), body


def test_user_text_from_a_link_is_shown_as_typed_never_as_markup():
    text, question, gold = f"Paris is in France. {EVIL}\n", f"Where is Paris? {EVIL}", f"France | {EVIL}"
    at = open_app(params={"text": text, "q": question, "gold": gold, "src": EVIL})
    assert at.session_state["applied"].text == text  # restored, and translated as typed
    assert_no_markup_from(at)
    assert any(t.value.strip() == text.strip() for t in at.text)  # the overview's "translated context", verbatim
    assert "source model '[click](https:\u200b//evil" in link_warning(at)  # quoted short, escaped, no link
    at = goto(at, "1_answers")
    assert_no_markup_from(at)
    plain = [t.value for t in at.text]
    assert f"Question: {question}" in plain and f"Gold answer: France | {EVIL}" in plain
    assert not at.exception


def test_a_page_option_a_link_escapes_into_a_lone_surrogate_is_named_and_dropped():
    at = open_app(params={"error.kv": '"\\ud800"', "error.metric": "cosine"})  # JSON's escape: "\ud800" once decoded
    at = goto(at, "2_cache_error")
    assert not at.exception and not errors(at)
    assert "error.kv=" in link_warning(at) and "ud800" in link_warning(at)
    assert at.radio(key="pg.error.kv").value == "K" and at.radio(key="pg.error.metric").value == "cosine"
    assert "error.kv" not in at.query_params and at.query_params["error.metric"] == "cosine"


def test_a_copied_link_never_exceeds_what_the_server_accepts_and_says_what_it_left_out():
    text = "東京は日本の首都です。" * 70  # 770 characters, but about 7,000 once percent-encoded
    question = "Which city is the capital? " * 600  # 16,200 characters: no link can carry it
    at = use_free_text_link(open_app(), text, question, "Tokyo")
    params = copied_link(at)
    assert len(query_string(params)) <= MAX_QUERY_CHARS and dict(at.query_params) == params
    assert "text" not in params and params["th"] == text_digest(text) and "q" not in params
    assert params["gold"] == "Tokyo"
    left = [shown(w.value) for w in at.warning if w.value.startswith("This link leaves out")]
    assert len(left) == 1 and left[0].startswith("This link leaves out the question:") and "400 Bad Request" in left[0]
    fresh = open_app(params=params)  # this app process has seen the text: the link restores it, without the question
    assert fresh.session_state["applied"].text == text and fresh.session_state["sb.question"] == ""
    short = use_free_text_link(open_app(), text, "Which city?", "Tokyo")
    assert not any(w.value.startswith("This link leaves out") for w in short.warning)
    assert copied_link(short)["q"] == "Which city?"


def use_free_text_link(at: AppTest, text: str, question: str, gold: str) -> AppTest:
    at.radio(key="sb.mode").set_value("Free text").run()
    at.text_area(key="sb.text").input(text)
    at.text_input(key="sb.question").input(question)
    at.text_input(key="sb.gold").input(gold)
    translate_button(at).click().run()
    assert not at.exception
    return at


def test_the_length_bound_holds_for_any_link():
    huge = SidebarLink("smollm2-135m", "gemma3-270m", "smollm2-to-gemma3", text="ü" * MAX_TEXT_IN_LINK,
                       question="q" * 20_000, gold="g" * 9_000)
    params = {**sidebar_params(huge), "error.kv": "K"}
    assert "th" in params  # 1,000 characters, 6,000 once percent-encoded: by its digest
    kept, left_out = fit_link(params)
    assert len(query_string(kept)) <= MAX_QUERY_CHARS and left_out == ["q"]
    assert kept["gold"] == huge.gold and kept["error.kv"] == "K"
    assert fit_link(params, limit=5_000)[1] == ["q", "gold"]
    assert fit_link({"ds": "squad"}) == ({"ds": "squad"}, [])


def _request_status(url: str, path: str) -> int:
    """The status of GET `path`, sent as a browser opens a link over a network: its headers, 1,460-byte pieces."""
    host, port = url.removeprefix("http://").split(":")
    head = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) "
            "AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36\r\nAccept: text/html,"
            "application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\nAccept-Language: en-US,en;q=0.9\r\n"
            f"Referer: {url}/\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        try:
            for i in range(0, len(head), 1460):
                sock.sendall(head[i:i + 1460])
                time.sleep(0.001)
        except OSError:  # the server may answer and close before the whole head is sent
            pass
        return int(sock.recv(64).split()[1])


def test_the_server_accepts_the_longest_link_and_refuses_past_its_header_limit(app_cache, pretrained):
    env = {**os.environ, "MOT_VIZ_TEST_MODELS": "1", "MOT_VIZ_CACHE": str(app_cache),
           "MOT_VIZ_PRETRAINED": str(next(iter(pretrained.values())).parent)}
    longest = "/cache_error?" + urlencode({"src": "smollm2-135m", "text": "x" * MAX_QUERY_CHARS})[:MAX_QUERY_CHARS]
    with serve_app(env) as url:
        assert _request_status(url, longest) == 200
        assert _request_status(url, "/?text=" + "x" * 20_000) == 400  # past the 16 KiB MAX_QUERY_CHARS stays under


def test_a_long_page_option_is_quoted_short_and_its_urls_never_become_links():
    value = "see https://evil.example/a, www.evil.example and me@evil.example " + "x" * 5000
    at = goto(open_app(params={"error.metric": value, "error." + "k" * 300: value}), "2_cache_error")
    warning = link_warning(at)
    assert len(warning) < 600 and "x" * 100 not in warning and "k" * 50 not in warning
    quoted = warning.split("error.metric=", 1)[1].split(" (", 1)[0]
    assert quoted.startswith("'see https:") and quoted.endswith("…") and len(quoted.replace("\u200b", "")) <= 80
    for linkable, broken in (("https://", "https:\u200b//"), ("www.", "www\u200b."), ("me@evil", "me@\u200bevil")):
        assert linkable not in warning and broken in warning  # a zero-width space: shown as typed, never a link


def test_unknown_page_options_are_named_once_and_leave_the_url():
    at = open_app(params={"nosuch.option": "1", "error.bogus": "x", "error.kv": "V"})
    assert "nosuch.option" in link_warning(at) and "no page of this app has it" in link_warning(at)
    assert "nosuch.option" not in at.query_params and at.query_params["error.kv"] == "V"
    at = goto(at, "2_cache_error")
    assert "error.bogus='x' (this page does not offer it)" in link_warning(at)
    assert "error.bogus" not in at.query_params and at.radio(key="pg.error.kv").value == "V"
    assert "pg.error.bogus" not in at.session_state
    at.run()  # said once
    assert not any(w.value.startswith("This link") for w in at.warning)
    assert "error.bogus" not in at.query_params and at.query_params["error.kv"] == "V"


# ----- "Copy as Python" ---------------------------------------------------------------------------------


def run_snippet(code: str) -> tuple[dict, str]:
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<copy as python>", "exec"), namespace)
    return namespace, out.getvalue()


@pytest.fixture
def test_models(monkeypatch):
    monkeypatch.setattr(mot_viz.engine.models, "load_model", load_test_model)  # what MOT_VIZ_TEST_MODELS=1 serves the app


def test_copy_as_python_translates_the_same_text_and_prints_the_page_numbers(test_models):
    at = goto(open_app(params={"ds": "squad", "ex": "2"}), "2_cache_error")
    code = python_code(at)
    assert f"load_dataset('squad', n={EXAMPLES_PER_DATASET}, seed=0)[2]" in code
    namespace, printed = run_snippet(code)
    assert namespace["text"] == at.session_state["applied"].text  # exactly the context the app translated
    replayed = namespace["replayed"]
    per_layer = figures(at)[0]
    for kv in ("K", "V"):
        shown = next(t for t in per_layer["data"] if t["name"] == "replayed"
                     and t["hovertemplate"].startswith(f"{kv} layer") and "cosine similarity" in t["hovertemplate"])
        assert list(shown["x"]) == list(replayed.index)
        assert np.allclose(np.asarray(shown["y"], dtype=float), replayed[("cosine", kv)].to_numpy(), atol=1e-6)
    first = replayed[("cosine", "K")].iloc[0]
    assert f"{first:.6f}" in printed and "rel_l2" in printed


def test_copy_as_python_on_free_text(test_models):
    at = open_app(params={"text": FREE_TEXT, "q": "Who built it?"})
    namespace, printed = run_snippet(python_code(at))
    assert namespace["text"] == at.session_state["applied"].text
    assert len(namespace["replayed"]) == 6 and "cosine" in printed  # every target layer of the tiny Gemma
