"""The frame of every page run: the shared sidebar once, the applied selection, the Run every page reads, and the
one place an error becomes a message.

Every page reads the *applied* selection (what the last "Translate" — or the first visit — chose) through
:func:`current_run`. app.py runs the pages inside :func:`navigation_frame`; each page's entry is :func:`run_page`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable

import streamlit as st

from ..analysis.figures import token_labels
from ..engine.alignment import check_text
from ..errors import MotVizError
from .links import (LINK_DROP, LINK_NOTES, begin_page_run, drop_linked_page_options, link_notes_text, restore_link,
                    sync_link, view_address)
from .loaders import get_checkpoint, get_model, get_translation
from .page import DRAWING, VIEW, View, download_view, escape_markdown, keep_widget_state, show_error
from .sidebar import sidebar
from .state import Run, Selection


def current_run() -> Run:
    """The applied selection's models, checkpoint and translation; on a user error, shows it and stops the page."""
    sel = applied_selection()
    try:
        with st.spinner(f"Loading {escape_markdown(sel.source)} and {escape_markdown(sel.target)} …"):
            note = st.empty()  # a first load's one-time steps (a .gguf file is converted once)
            source, target = (get_model(name, progress=lambda m: note.info(escape_markdown(m), icon="⏳"))
                              for name in (sel.source, sel.target))
            note.empty()
        with st.spinner("Loading the checkpoint …"):
            mot, config = get_checkpoint(sel.checkpoint, source, target)
        for text in (sel.text, sel.suffix or ""):  # before a cache hashes it (a lone surrogate fails there raw)
            check_text(text)
        with st.spinner("Translating the context (source prefill, alignment, translator, replay) …"):
            translation = get_translation(sel)
    except MotVizError as exc:
        show_error(exc)
        st.stop()
    return Run(sel, source, target, mot, config, translation,
               token_labels(target.tokenizer, translation.target_ids[0].tolist()),
               token_labels(source.tokenizer, translation.source.source_ids[0].tolist()))


def applied_selection() -> Selection:
    """The selection the pages show (set by the sidebar that page_setup draws)."""
    if "applied" not in st.session_state:  # a page run on its own that skipped page_setup: draw the sidebar now
        return _setup()
    return st.session_state["applied"]


# True while run_page runs a page body (a fragment rerun runs only the fragment, outside it)
_IN_PAGE_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("mot_viz_page_run", default=False)
# True while app.py's navigation frame runs a page: the frame has drawn the sidebar for this run already
_FRAME_DREW_SIDEBAR: contextvars.ContextVar[bool] = contextvars.ContextVar("mot_viz_frame_sidebar", default=False)


def _setup() -> Selection:
    st.set_page_config(page_title="MoT Viz", page_icon="🔀", layout="wide")
    restore_link()
    for key in st.session_state.pop(LINK_DROP, ()):  # linked page options that failed: their defaults apply
        st.session_state.pop(key, None)
    keep_widget_state()
    if st.session_state.get(LINK_NOTES):  # until a page run completes (a rerun may come first); quotes the URL
        st.warning("This link holds values the app cannot restore, so it shows the defaults instead of: "
                   + escape_markdown(link_notes_text(st.session_state[LINK_NOTES])) + ".", icon="⚠️")
    return sidebar()


@contextlib.contextmanager
def navigation_frame():
    """The entry script's frame around ``st.navigation(...).run()``: draws the sidebar once for every page."""
    _setup()
    token = _FRAME_DREW_SIDEBAR.set(True)
    try:
        yield
    finally:  # also on st.stop / rerun, so a reused script thread starts clean
        _FRAME_DREW_SIDEBAR.reset(token)


def run_page(body: Callable[[], None], view_download: bool = True) -> None:
    """Every page's entry: the shared sidebar, then the page body; the one place an error becomes a message.

    A library error shows its fix; anything else a short message with a "Details" expander, never a bare
    traceback. st.stop and reruns are BaseExceptions and pass through. A completed run writes the view to the URL.
    `view_download`: the page ends with "Download this view", its figures in one HTML file (page.download_view).
    """
    page_setup()
    begin_page_run()
    page_file = body.__code__.co_filename  # the page's file (views/): its path in the view's address
    view = st.session_state[VIEW] = View(page_file)  # the figures this run shows, for "Download this view"
    token = _IN_PAGE_RUN.set(True)
    try:
        body()
        if view_download:
            download_view()
    except Exception as exc:
        _show_failure(exc, in_page_run=True)
    finally:
        _IN_PAGE_RUN.reset(token)
    if drop_linked_page_options(failed=False):  # a widget replaced a linked value it does not offer
        st.rerun()
    view.drawn(view_address(page_file, sync_link()))  # with the page options this run gave their first values
    st.session_state.pop(LINK_NOTES, None)  # shown in this completed run


def fragment(body: Callable[..., None]) -> Callable[..., None]:
    """A part of a page that its own widgets rerun alone (st.fragment): changing one option redraws one figure.

    Like a page run, a fragment run shows an error as a message and writes the view (its options included) to the
    URL when it completes.
    """
    @st.fragment
    @functools.wraps(body)
    def part(*args, **kwargs) -> None:
        in_page_run = _IN_PAGE_RUN.get()  # else a rerun of this fragment alone
        view = st.session_state.get(VIEW)
        if view is not None and not in_page_run:
            view.redraw(body.__qualname__)
        token = DRAWING.set(body.__qualname__)
        try:
            body(*args, **kwargs)
        except Exception as exc:  # Streamlit would show a fragment's exception as a traceback
            _show_failure(exc, in_page_run)
        finally:
            DRAWING.reset(token)
        if not in_page_run:  # a page run writes the URL once it completes
            params = sync_link()
            if view is not None:
                view.drawn(view_address(view.page_file, params))

    return part


def _show_failure(exc: Exception, in_page_run: bool) -> None:
    """A page (or fragment) that raised: the message; in a page run that followed an opened link, the page reruns
    with the link's page options dropped first."""
    if in_page_run and drop_linked_page_options(failed=True):
        st.rerun()
    show_error(exc)


def page_setup() -> Selection:
    """The first call of every page: the shared sidebar, and the applied selection.

    Inside app.py's navigation frame the sidebar is already drawn and this only returns the selection; a page file
    run on its own (``streamlit run views/3_routing.py``: that one page, no navigation) draws the sidebar itself.
    """
    return applied_selection() if _FRAME_DREW_SIDEBAR.get() else _setup()
