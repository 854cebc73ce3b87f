"""What a page draws with: its teaching note, its caption, figures with their data, error messages, and the
first value of each keyed widget, kept while its page or mode is not shown."""

from __future__ import annotations

import contextvars
import string
import traceback
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from ..analysis.lesson_file import LessonPage, LessonStep, lesson_html
from ..analysis.method_diagram import HIGHLIGHT_LABELS, diagram_of
from ..engine.models import DEFAULT_SOURCE, DEFAULT_TARGET
from ..engine.mot import MoT, Translation
from ..engine.prompts import QAExample, choice_label_texts
from ..errors import MotVizError
from .links import LINK_UNCHECKED, check_linked_value, offer_page_option, python_code
from .loaders import available_checkpoints, second_translation
from .openings import DEFAULT_DATASET, DEFAULT_EXAMPLE
from .permalink import PAGE_PREFIX
from .settings import DATASET_MODE, DEFAULT_FREE_TEXT
from .state import Run

# Widget keys that outlive the page that shows them (see keep_widget_state); buttons are never listed.
_DEFAULTS: dict[str, object] = {
    "sb.source": DEFAULT_SOURCE, "sb.source_other": "", "sb.target": DEFAULT_TARGET, "sb.target_other": "",
    "sb.checkpoint_other": "", "sb.mode": DATASET_MODE, "sb.dataset": DEFAULT_DATASET, "sb.example": DEFAULT_EXAMPLE,
    "sb.text": DEFAULT_FREE_TEXT, "sb.question": "Who designed the tower?", "sb.gold": "Gustave Eiffel",
}
VIEW = "view"  # the View of the page shown: what "Download this view" writes
PAGE_KEY_PREFIX = PAGE_PREFIX  # pages give their widgets keys starting with "pg.", so they persist (and are linked)
# Markdown (and Streamlit's :color[…] / :icon: / $math$ extensions) reads only ASCII punctuation as syntax, and
# CommonMark lets a backslash make any of it literal
_MARKDOWN_ESCAPES = str.maketrans({c: "\\" + c for c in string.punctuation})


def escape_markdown(text: object) -> str:
    """`text` as literal characters inside a Markdown message (st.error, st.caption, …): a link, image, HTML tag or
    emphasis in it shows as typed. Text shown on its own goes through :func:`show_text` instead."""
    return str(text).translate(_MARKDOWN_ESCAPES)


def show_text(label: str, text: str) -> None:
    """Text that came from a user, a link, a dataset or a model, shown verbatim (st.text reads no Markdown/HTML)."""
    st.text(f"{label}: {text}")


def choices_text(example: QAExample) -> str:
    """A closed question's choices, one ``label: text`` line each (for :func:`show_text`)."""
    return "".join(f"\n{lab}: {text}" for lab, text in zip(choice_label_texts(example), example.choices))


def question_header(example: QAExample | None) -> None:
    """The question a page answers, its choices and its gold answer(s); a free text without a question stops the page
    with what to do."""
    if example is None:
        st.info("This free-text context has no question. Type one in the sidebar (and a gold answer to score it), "
                "then press **Translate**.")
        st.stop()
    show_text("Question", example.question)
    if example.choices:
        show_text("Choices", choices_text(example))
    if example.answers:
        show_text("Gold answer", " | ".join(example.answers))
    else:
        st.caption("No gold answer given, so the answers are not scored.")


def explain(markdown: str) -> None:
    """The page's short teaching note."""
    with st.expander("What am I looking at?"):
        st.markdown(markdown)


def method_picture(run: Run, highlight: str) -> None:
    """The run's checkpoint drawn as the method (analysis.method_diagram) with what the page is about lit, in a
    closed expander."""
    with st.expander(f"Where this sits in the method ({HIGHLIGHT_LABELS[highlight]} lit)"):
        st.plotly_chart(diagram_of(run.mot, highlight), width="stretch", key=f"fig.method_diagram.{highlight}")


def run_caption(run: Run, document: str | None = None) -> None:
    """One line naming the pair, checkpoint and context the page shows: the sidebar's, or `document`, a page's own."""
    sel = run.selection
    shown = (f"document: {escape_markdown(document)}" if document is not None else
             f"context: {escape_markdown(sel.label)} ({len(run.target_tokens)} target / {len(run.source_tokens)} "
             "source tokens)")
    st.caption(f"{escape_markdown(sel.source)} → {escape_markdown(sel.target)} · checkpoint "
               f"{escape_markdown(Path(sel.checkpoint).name)} · {shown}")


def show_figure(fig: go.Figure, data: pd.DataFrame, name: str) -> None:
    """A plotly chart (PNG from its modebar camera) with a CSV download of the data behind it."""
    st.plotly_chart(fig, width="stretch", key=f"fig.{name}",
                    config={"toImageButtonOptions": {"format": "png", "filename": name, "scale": 2},
                            "displaylogo": False})
    st.download_button(f"Download the data (CSV): {name}.csv", data.to_csv(index=False).encode("utf-8"),
                       file_name=f"{name}.csv", mime="text/csv", key=f"dl.{name}", on_click="ignore")
    view = st.session_state.get(VIEW)
    if view is not None:
        view.show(name, fig, DRAWING.get())


DRAWING: contextvars.ContextVar[str | None] = contextvars.ContextVar("drawing", default=None)  # the fragment drawing


class View:
    """The figures a page shows now, in page order, each with the fragment (if any) that drew it, and the view's
    address: the page run starts one, and a fragment's run alone replaces that fragment's figures and the address, so
    "Download this view" writes what the reader sees (read when the button is pressed, on another thread)."""

    def __init__(self, page_file: str):
        self.page_file = page_file
        self.address = ""
        self._figures: list[tuple[str | None, str, go.Figure]] = []  # (fragment, name, figure)
        self._at: int | None = None  # where a fragment's run alone puts its figures

    def show(self, name: str, fig: go.Figure, fragment: str | None) -> None:
        figures = [f for f in self._figures if f[1] != name]
        at = len(figures) if self._at is None or fragment is None else self._at
        self._figures = figures[:at] + [(fragment, name, fig)] + figures[at:]
        if self._at is not None and fragment is not None:
            self._at += 1

    def redraw(self, fragment: str) -> None:
        """A fragment runs alone: its figures go, and those it draws now take their place."""
        self._at = next((i for i, f in enumerate(self._figures) if f[0] == fragment), len(self._figures))
        self._figures = [f for f in self._figures if f[0] != fragment]

    def drawn(self, address: str) -> None:
        """A run (the page's, or a fragment's alone) has completed, with the view's address."""
        self._at, self.address = None, address

    def figures(self) -> list[tuple[str, go.Figure]]:
        return [(name, fig) for _, name, fig in list(self._figures)]


def view_document(view: View, sel) -> bytes:
    """The view's file: its figures (plotly inside), the pair, checkpoint and context, how to reproduce it."""
    shown = LessonPage("The figures", "", "", LessonStep(figures=[(f, None, n) for n, f in view.figures()]))
    facts = {"source → target": f"{sel.source} → {sel.target}", "checkpoint": Path(sel.checkpoint).name,
             "context": sel.label}
    return lesson_html(f"MoT Viz: {sel.source} → {sel.target}", [shown], facts, sel.text, python_code(sel),
                       view.address).encode("utf-8")


def download_view() -> None:
    """"Download this view": the figures the page shows when the button is pressed (options changed since
    included), with the applied pair, checkpoint, context and link, as one HTML file (plotly inside) that opens with
    no server and no network. Nothing on a page without figures."""
    view, sel = st.session_state.get(VIEW), st.session_state.get("applied")
    if view is None or not view.figures() or sel is None:
        return
    with st.expander("Download this view"):
        st.caption("This page's figures as they are when you press the button, interactive, in one HTML file "
                   "(about 5 MB: plotly is inside) that opens in any browser with no server and no network, with the "
                   "pair, checkpoint and context they show.")
        st.download_button("Download this view (HTML)", lambda: view_document(view, sel), file_name="mot_view.html",
                           mime="text/html", key="view.download", on_click="ignore")


def show_error(exc: BaseException) -> None:
    """An error as a message, never a traceback: a user-caused one with its fix, anything else with a details expander."""
    if isinstance(exc, MotVizError):
        st.error(f"**{exc.title}.** {escape_markdown(exc)}", icon="⚠️")  # a message may quote what a user typed
        return
    st.error(f"**Unexpected error.** {type(exc).__name__}: {escape_markdown(exc)}\n\nThe page could not be drawn. "
             "Other pages and "
             "another context or checkpoint may still work; if this persists, please report it with the details.",
             icon="🛑")
    with st.expander("Details"):
        st.code("".join(traceback.format_exception(exc)), language=None)


# ----- keyed widgets -------------------------------------------------------------------------------


def keep_widget_state() -> None:
    """Keep every keyed widget's value when its page or mode is not shown (Streamlit drops unrendered widgets)."""
    for key, value in _DEFAULTS.items():
        st.session_state.setdefault(key, value)
    for key in list(st.session_state.keys()):
        if isinstance(key, str) and (key.startswith("sb.") or key.startswith(PAGE_KEY_PREFIX)):
            st.session_state[key] = st.session_state[key]


def widget_default(key: str, default: object, options: list | None = None) -> None:
    """Give a keyed widget its first value (widgets then take no value= argument, so none is overridden).

    A value no longer offered among `options` (e.g. a removed checkpoint) falls back to the default, and so does
    a value an opened link set that does not fit the default's type or the options (the page's warning names it).
    """
    offer_page_option(key, default)
    if key in st.session_state.get(LINK_UNCHECKED, ()):  # a value an opened link set: it must fit this widget
        check_linked_value(key, default, options)
    if key not in st.session_state or (options is not None and st.session_state[key] not in options):
        st.session_state[key] = default


NO_SECOND = "(none)"


def second_checkpoint(run: Run, key: str) -> tuple[str, str] | None:
    """"Compare with a second checkpoint": (name, path) of the one chosen for this page (keyed, so linked), or None."""
    others = {name: path for name, path in available_checkpoints().items() if path != run.selection.checkpoint}
    widget_default(key, NO_SECOND, [NO_SECOND, *others])
    choice = st.selectbox("Compare with a second checkpoint (optional)", [NO_SECOND, *others], key=key,
                          help="Its translation of the same context is shown beside (or over) this one.")
    return None if choice == NO_SECOND else (choice, others[choice])


class SecondRun(NamedTuple):
    """A second checkpoint chosen on a page, with its translation of the same context."""

    name: str
    path: str
    mot: MoT
    translation: Translation


def second_run(run: Run, key: str) -> SecondRun | None:
    """second_checkpoint, loaded: None when none is chosen, or when it does not fit the pair (the page says why)."""
    chosen = second_checkpoint(run, key)
    if chosen is None:
        return None
    try:
        return SecondRun(*chosen, *second_translation(run.selection, chosen[1]))
    except MotVizError as exc:  # e.g. made for another pair
        show_error(exc)
        return None
