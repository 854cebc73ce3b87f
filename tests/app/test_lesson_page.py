"""The Lesson page driven by AppTest on the tiny test pair: every step draws its page's figure (a heavy one once its
background work is done, a progress line meanwhile), the step and the presenter switch live in the URL, back / next
move, and the lesson file holds every step and no external script; the method's picture on the pages; "Download this
view" on every page."""

from __future__ import annotations

import html
import re
import threading
from pathlib import Path

import plotly.graph_objects as go
import pytest

from app_helpers import goto, open_app, shown, translate_button
from mot_viz.app import lesson
from mot_viz.app.lesson import STEPS
from mot_viz.app.page import VIEW, View, view_document
from mot_viz.app.presenter import BACK, NEXT
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.testing import load_test_model
from mot_viz.train.synthetic_checkpoint import main as write_synthetic_checkpoint
from plotly_figures import figures

PAGES = [p.name for p in (Path(__file__).resolve().parents[2] / "views").glob("*.py")]

pytestmark = pytest.mark.usefixtures("pages_env")


def button(at, label: str):
    return next(b for b in at.button if b.label == label)


def built(at) -> None:
    """Wait until the shown step's background work is done (a heavy step), then run the page again, as its progress
    line's poll would."""
    index = at.session_state["pg.lesson.step"] - 1
    if STEPS[index].wait is not None:
        lesson.running(at.session_state["applied"]).wait(index)
        at.run()


def progress_lines(at) -> list[str]:
    return [p.proto.text for p in at.get("progress")]


def walk(at) -> list[str]:
    """Every step from the first with Next; each draws its header and its figures (or says why not) and no error
    box, once its background work is done; the headers shown."""
    headers = []
    for number in range(1, len(STEPS) + 1):
        assert at.session_state["pg.lesson.step"] == number
        built(at)
        headers.append(at.header[0].value)
        assert not at.exception and not at.error, (number, at.error)
        assert figures(at) or STEPS[number - 1].title == "Does it answer?", number
        if number < len(STEPS):
            button(at, NEXT).click().run()
    return headers


def test_every_step_draws_and_next_moves_through_them_with_the_step_in_the_url():
    at = goto(open_app(), "14_lesson")
    assert "lesson.step" not in at.query_params  # the first step is the default: a link leaves it out
    headers = walk(at)
    assert headers == [f"{i}. {s.title}" for i, s in enumerate(STEPS, 1)]
    assert at.query_params["lesson.step"] == str(len(STEPS))
    assert button(at, NEXT).disabled
    button(at, BACK).click().run()
    assert at.session_state["pg.lesson.step"] == len(STEPS) - 1
    assert at.query_params["lesson.step"] == str(len(STEPS) - 1)


def test_a_link_opens_on_its_step_in_presenter_mode():
    at = open_app(params={"lesson.step": "5", "lesson.presenter": "true"})
    at = goto(at, "14_lesson")
    built(at)
    assert not at.warning  # the link's options were taken
    assert at.header[0].value == f"5. {STEPS[4].title}"
    assert at.toggle(key="pg.lesson.presenter").value is True
    assert not any(b.label.startswith("Prepare") for b in at.button)  # no download section on a projector
    assert any("font-size" in h.proto.body for h in at.get("html"))  # the presenter's style
    at.toggle(key="pg.lesson.presenter").set_value(False).run()
    assert "lesson.presenter" not in at.query_params and at.query_params["lesson.step"] == "5"
    assert not any("font-size" in h.proto.body for h in at.get("html"))


def test_a_step_still_computing_shows_its_text_and_a_progress_line_then_its_figure(monkeypatch):
    """A heavy step opened before its background work is done: the page run completes at once with the step's text,
    its progress line and "try this", no figure; once the work is done, the next run draws the figure."""
    monkeypatch.setattr(lesson, "_WORK", {})  # no work kept from another test's session on the same selection
    index = next(i for i, s in enumerate(STEPS) if s.title == "What each layer's error costs")
    release = threading.Event()
    held = STEPS[index]

    def build(run):
        release.wait()
        return held.build(run)

    monkeypatch.setattr(lesson, "STEPS", STEPS[:index] + (held._replace(build=build),) + STEPS[index + 1:])
    at = goto(open_app(params={"lesson.step": str(index + 1)}), "14_lesson")
    assert at.header[0].value == f"{index + 1}. {held.title}"
    assert not at.exception and not at.error and not figures(at)
    assert [line for line in progress_lines(at) if line.startswith(held.wait)]
    assert any(i.value.startswith("**Try this:**") for i in at.info)
    release.set()
    lesson.running(at.session_state["applied"]).wait(index)
    at.run()
    assert figures(at) and not progress_lines(at) and not at.error


def test_an_unknown_step_in_a_link_falls_back_to_the_first():
    at = goto(open_app(params={"lesson.step": "42"}), "14_lesson")
    assert at.header[0].value == f"1. {STEPS[0].title}"
    assert any("lesson.step=42" in shown(w.value) for w in at.warning)


def test_the_other_pair_draws_every_step():
    at = open_app()
    at.selectbox(key="sb.source").set_value("gemma3-270m").run()
    at.selectbox(key="sb.target").set_value("smollm2-135m").run()
    translate_button(at).click().run()
    walk(goto(at, "14_lesson"))


def test_the_lesson_file_holds_every_step_and_loads_no_script_from_the_network():
    at = goto(open_app(), "14_lesson")
    button(at, "Prepare the lesson file").click().run()
    assert not at.exception
    document = at.session_state["lesson.file"][1].decode("utf-8")
    for i, step in enumerate(STEPS, 1):
        assert f'<section id="step{i}"><h2>{i}. {html.escape(step.title)}' in document
    assert not re.search(r"<script[^>]*\bsrc\s*=", document, re.I)  # plotly is inside the file
    assert document.count("Plotly.newPlot") >= len(STEPS)  # every step's figures, drawn by the bundled plotly
    assert document.count('class="plotly-graph-div"') >= len(STEPS) - 1
    assert "streamlit run app.py" in document and "lesson.step" not in document.split("Reproduce it")[0]


def test_the_overview_opens_on_the_checkpoint_drawn_and_names_every_page():
    at = open_app()
    mot, _ = load_checkpoint(at.session_state["applied"].checkpoint, load_test_model("smollm2-135m"),
                             load_test_model("gemma3-270m"))
    diagram = figures(at)[0]
    for group, spec in (("source", mot.source), ("target", mot.target)):
        assert sorted(y for t in diagram["data"] if t.get("legendgroup") == group for y in t["y"]) == list(
            range(spec.num_layers))
    assert [tuple(t["meta"]) for t in diagram["data"] if t.get("legendgroup") == "channels"] == mot.channels.pairs()
    assert "replay" in at.caption[0].value
    linked = [link.proto.page for link in at.get("page_link")]
    assert sorted(linked) == sorted(re.sub(r"^[0-9]+_", "", Path(file).stem) for file in PAGES)  # each page once
    assert linked[0] == "lesson"


@pytest.mark.parametrize("page,lit", [("2_cache_error", "target: the window"), ("3_routing", "4 experts"),
                                      ("13_layer_patching", "target: global (full-attention) layers"),
                                      ("7_shift_analysis", "target: the window")])  # the test window: at the top
def test_a_page_draws_the_method_with_its_part_lit(page, lit):
    at = goto(open_app(), page)
    diagram = next(f for f in figures(at) if "source: its other layers" in {t.get("name") for t in f["data"]})
    traces = {t["name"]: t for t in diagram["data"]}
    assert traces[lit]["opacity"] == 1.0 and traces["source: its other layers"]["opacity"] < 1.0


def test_a_synthetic_pair_draws_every_step(pretrained_copy, monkeypatch):
    """Random-weight models of the bundled pair's shapes (mot_viz.engine.synthetic) with a synthetic checkpoint."""
    source, target = "synthetic:smollm2-135m", "synthetic:gemma3-270m"
    folder = next(iter(pretrained_copy.values())).parent
    assert write_synthetic_checkpoint(["--source", source, "--target", target, "--out",
                                       str(folder / "synthetic-pair")]) == 0
    monkeypatch.setenv("MOT_VIZ_PRETRAINED", str(folder))
    monkeypatch.delenv("MOT_VIZ_TEST_MODELS")  # synthetic models are built, not the test mode's stand-ins
    at = open_app("views/14_lesson.py", params={"src": source, "tgt": target, "ckpt": "synthetic-pair"})
    assert at.session_state["applied"].source == source
    assert not at.error, [e.value for e in at.error]
    walk(at)


def test_try_it_opens_the_steps_page_with_its_option_set():
    at = goto(open_app(params={"lesson.step": "3"}), "14_lesson")
    button(at, "Try it on its page").click().run()
    assert not at.exception
    assert at.title[0].value == "Expert routing"
    assert at.radio(key="pg.routing.whatif").value == "drop one expert"
    assert at.query_params["routing.whatif"] == "drop one expert"


def test_a_page_downloads_its_view_as_one_file_and_the_lesson_offers_its_own():
    at = goto(open_app(), "4_alignment")
    assert [d.label for d in at.get("download_button") if d.label.startswith("Download this view")] == [
        "Download this view (HTML)"]
    view = at.session_state[VIEW]
    assert [name for name, _ in view.figures()] == ["alignment_shared_characters"]
    assert view.address.split("?")[0].endswith("/alignment")
    document = view_document(view, at.session_state["applied"]).decode("utf-8")
    assert document.count('class="plotly-graph-div"') == 1 and html.escape(view.address) in document
    at = goto(at, "14_lesson")
    assert not any(d.label.startswith("Download this view") for d in at.get("download_button"))


def test_the_view_file_holds_the_figures_shown_after_an_option_changed():
    """An option changed after the page loaded (Token alignment's view): the file then holds the new figure alone, and
    the view's address carries the option (a fragment's run alone, in Chromium: the browser test)."""
    at = goto(open_app(), "4_alignment")
    at.radio(key="pg.align.view").set_value("weights").run()
    view = at.session_state[VIEW]
    assert [name for name, _ in view.figures()] == ["alignment_weights"]
    assert "align.view=weights" in view.address
    document = view_document(view, at.session_state["applied"]).decode("utf-8")
    assert document.count('class="plotly-graph-div"') == 1 and "weights %{z" in document


def test_a_fragment_run_alone_replaces_its_own_figures_in_place():
    """The view's record of what is shown: a fragment that runs alone drops the figures it drew and puts those it
    draws now where they were; the page's other figures stay, in page order."""
    view = View("views/2_cache_error.py")
    for name, fragment in (("head", None), ("errors_K", "_errors"), ("errors_V", "_errors"), ("tail", "_tail")):
        view.show(name, go.Figure(), fragment)
    view.drawn("http://localhost:8501/cache_error")
    view.redraw("_errors")
    view.show("errors_K_relative", go.Figure(), "_errors")
    view.drawn("http://localhost:8501/cache_error?x=1")
    assert [name for name, _ in view.figures()] == ["head", "errors_K_relative", "tail"]
    assert view.address.endswith("?x=1")
