"""The lesson file (mot_viz.analysis.lesson_file): one HTML document holding plotly itself, every step, the run's facts
and context escaped, and no script loaded from anywhere."""

from __future__ import annotations

import re

import pandas as pd
import plotly.graph_objects as go

from mot_viz.analysis.lesson_file import LessonPage, LessonStep, lesson_html, markdown_html


def test_the_file_holds_plotly_every_step_and_nothing_from_the_network():
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1, 2]))
    pages = [LessonPage("One", "The **replay** runs `every` layer.", "Try <b>this</b>.",
                         LessonStep(figures=[(fig, pd.DataFrame({"x": [1]}), "one")],
                                    tables=[("Costs", pd.DataFrame({"stage": ["replay"], "seconds": [0.7]}))],
                                    note="a note")),
             LessonPage("Two & more", "Text.", "Try.", None, error="no gold answer")]
    document = lesson_html("Lesson", pages, {"checkpoint": "mid"}, "A <context> & more", "print(1)",
                           "http://localhost:8501/lesson?lesson.step=2")
    assert document.startswith("<!DOCTYPE html>") and document.count("<html") == 1
    assert not re.search(r"<script[^>]*\bsrc\s*=", document, re.I)
    assert len(document) > 3_000_000  # plotly's bundle is inside
    assert '<section id="step1"><h2>1. One</h2><p>The <b>replay</b> runs <code>every</code> layer.</p>' in document
    assert '<section id="step2"><h2>2. Two &amp; more</h2>' in document and "no gold answer" in document
    assert document.count('class="plotly-graph-div"') == 1 and "<td>replay</td>" in document
    assert "A &lt;context&gt; &amp; more" in document and "Try &lt;b&gt;this&lt;/b&gt;." in document
    assert "lesson.step=2" in document and "print(1)" in document
    view = lesson_html("View", [LessonPage("The figures", "", "", LessonStep(figures=[(fig, None, "one")]))], {}, "",
                       "", "")
    assert "Try this" not in view and '<h2>1. The figures</h2><div' in view  # a page's view: no text, no try


def test_markdown_html_escapes_everything_but_bold_and_code():
    assert markdown_html("**a** <i>b</i> `c`") == "<b>a</b> &lt;i&gt;b&lt;/i&gt; <code>c</code>"
