"""Permalinks: the applied view in the URL's query parameters (the pure part is mot_viz.app.permalink).

The applied selection and every page option (``pg.*`` widget key) not at its default live in ``st.query_params``,
so a reload or a copied link opens the same view: a fresh session's widgets are seeded from the URL before any is
drawn, a page option an opened link set is checked against its widget (:func:`check_linked_value`, through
mot_viz.app.page.widget_default), and every completed page run writes the view back (:func:`sync_link`). The
sidebar's "Copy link" and "Copy as Python" (:func:`share`).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from pathlib import Path
from urllib.parse import urlsplit

import streamlit as st

from ..analysis.eval_run_links import AppView, app_views
from ..analysis.eval_runs import EvalRun
from ..data.eval_data import BUILTIN_DATASETS
from ..engine.model_files import BUNDLED_MODELS
from ..engine.models import DEFAULT_SOURCE, DEFAULT_TARGET
from ..engine.synthetic import synthetic_names
from .loaders import available_checkpoints
from .long_context import LONG_DOCUMENTS
from .multi_agent import CONVERSATIONS, SHARD_DOCUMENTS
from .permalink import (MAX_QUERY_CHARS, PAGE_PREFIX, SidebarLink, check_value, fit_link, page_params, page_path,
                        parse_link, python_snippet, query_string, sidebar_params, text_digest, text_in_link)
from .settings import (DATASET_MODE, EXAMPLES_PER_DATASET, FREE_TEXT_MODE, MAX_CONTEXT_TOKENS, OTHER, REPO_ROOT,
                       page_option_groups)
from .state import Selection

LINK = "link.applied"  # the applied selection as a permalink.SidebarLink
LINK_NOTES = "link.ignored"  # what an opened link held that was ignored: one warning, until a page run completes
LINK_UNCHECKED = "link.unchecked"  # page options an opened link set that no widget_default has checked yet
_LINK_DRAWN = "link.drawn"  # linked page options that fit their widget's type this run: key -> value (checked at the end)
LINK_DROP = "link.drop"  # linked page options to forget at the start of the next run (a widget holds them now)
_LINK_RERUN = "link.rerun"  # a linked page option was dropped during the run: rerun to show the one warning
_LINK_SHOWN = "link.shown"  # the query parameters last written to this session's URL: what its address shows
_DEFAULTS = "link.defaults"  # page option -> its default, as the page last gave it (a link leaves defaults out)
_GROUPS_THIS_RUN = "link.groups"  # the option groups (pg.<group>.…) this page run offered: the running page's
_OPTION_GROUPS_SEEN: set[str] = set()  # every group a page offered in this process (one built at run time too)
EXCERPT_CHARS = 80  # the longest value (40: name) of a page option the link warning quotes; the rest is "…"
# where a Markdown renderer would make a link of bare text (scheme://, www., an e-mail's @): a zero-width space goes there
_AUTOLINK = re.compile(r"(?i)(?<=[a-z]:)(?=//)|(?<=www)(?=\.)|(?<=@)")
# what a link leaves out, in words (the query parameters a server would refuse are the long typed ones)
_LEFT_OUT = {"q": "the question", "gold": "the gold answer", "src": "the source model", "tgt": "the target model",
             "ckpt": "the checkpoint", "text": "the context text"}
MAX_REMEMBERED_TEXTS = 256  # long free texts this process can restore by digest
_LONG_TEXTS: OrderedDict[str, str] = OrderedDict()  # digest -> text; a link holds only the digest of these
_LONG_TEXTS_LOCK = threading.Lock()


def _remember_text(text: str) -> None:
    digest = text_digest(text)
    with _LONG_TEXTS_LOCK:
        _LONG_TEXTS[digest] = text
        _LONG_TEXTS.move_to_end(digest)
        while len(_LONG_TEXTS) > MAX_REMEMBERED_TEXTS:
            _LONG_TEXTS.popitem(last=False)


def _recall_text(digest: str) -> str | None:
    with _LONG_TEXTS_LOCK:
        return _LONG_TEXTS.get(digest)


def restore_link() -> None:
    """A fresh session: seed the sidebar and page widgets from the URL's link before any widget is drawn."""
    state = st.session_state
    if "applied" in state or "link.restored" in state:
        return
    state["link.restored"] = True
    params = st.query_params.to_dict()
    if not params:
        return
    parsed = parse_link(params, models=[*BUNDLED_MODELS, *synthetic_names()], checkpoints=list(available_checkpoints()),
                        datasets=list(BUILTIN_DATASETS), examples=EXAMPLES_PER_DATASET, recall_text=_recall_text,
                        option_groups=option_groups())
    link = parsed.sidebar
    for role, key in (("source", "sb.source"), ("target", "sb.target")):
        if getattr(link, role):
            state[key] = getattr(link, role)
    for role, value in parsed.typed.items():  # not loaded from a link; offered under "other"
        state[f"sb.{role}_other"] = value
    if link.checkpoint:
        state["sb.pair"] = (link.source or DEFAULT_SOURCE, link.target or DEFAULT_TARGET)  # keeps it (_checkpoint_picker)
        state["sb.checkpoint"] = link.checkpoint
    if link.text is not None:
        state.update({"sb.mode": FREE_TEXT_MODE, "sb.text": link.text, "sb.question": link.question or "",
                      "sb.gold": link.gold or ""})
    elif link.dataset is not None or link.example is not None:
        state["sb.mode"] = DATASET_MODE
        if link.dataset is not None:
            state["sb.dataset"] = link.dataset
        if link.example is not None:
            state["sb.example"] = link.example
    state.update(parsed.page)
    state[LINK_UNCHECKED] = set(parsed.page)
    if parsed.ignored:
        state[LINK_NOTES] = parsed.ignored


def _quoted_option(key: str, value: object = None, with_value: bool = True) -> str:
    """A linked page option as the link warning quotes it: a short excerpt of its name and value (EXCERPT_CHARS)."""
    name, shown = key[len(PAGE_PREFIX):], repr(value)
    name = name if len(name) <= EXCERPT_CHARS // 2 else name[: EXCERPT_CHARS // 2 - 1] + "…"
    shown = shown if len(shown) <= EXCERPT_CHARS else shown[: EXCERPT_CHARS - 1] + "…"
    return f"{name}={shown}" if with_value else name


def link_notes_text(notes: list[str]) -> str:
    """What an opened link held that was ignored, as plain text for the one warning: bare URLs and addresses in it
    broken by a zero-width space, so the app's own warning never shows a link (escape_markdown escapes the rest)."""
    return _AUTOLINK.sub("\u200b", "; ".join(notes))


def option_groups() -> set[str]:
    """The page option groups this app has: those its page files name and any a page offered in this process."""
    return {*page_option_groups(), *_OPTION_GROUPS_SEEN}


def begin_page_run() -> None:
    """A page run starts: no page option offered yet (a stopped run or a fragment's rerun may have left some)."""
    st.session_state.pop(_GROUPS_THIS_RUN, None)


def offer_page_option(key: str, default: object) -> None:
    """A page offers the option `key`, first valued `default`, this run (every widget_default): its group is the
    running page's, and a link leaves the option out while it holds that default."""
    if key.startswith(PAGE_PREFIX):
        st.session_state.setdefault(_DEFAULTS, {})[key] = default
        group = key[len(PAGE_PREFIX):].split(".")[0]
        _OPTION_GROUPS_SEEN.add(group)
        st.session_state.setdefault(_GROUPS_THIS_RUN, set()).add(group)


def check_linked_value(key: str, default: object, options: list | None) -> None:
    """Keep a page option an opened link set if it fits the widget's type and options; else drop it (and say so)."""
    state = st.session_state
    state[LINK_UNCHECKED].discard(key)
    fits, value = check_value(state[key], default, options)
    if fits:
        state[key] = value
        state.setdefault(_LINK_DRAWN, {})[key] = value
        return
    takes = (f"a whole number from {options.start} to {options.stop - 1}" if isinstance(options, range)
             else f"values like {default!r}")
    state.setdefault(LINK_NOTES, []).append(f"the page option {_quoted_option(key, state[key])} "
                                             f"(the option takes {takes})")
    state[_LINK_RERUN] = True  # the warning is drawn above the page: show it in a fresh run
    del state[key]


def drop_linked_page_options(failed: bool) -> bool:
    """After a page run: forget linked page options the page could not use, and say which (True: rerun now).

    `failed`: the page raised, so every linked option not yet confirmed is suspect; otherwise those a widget
    replaced (a radio or select box shows its first choice for a value it does not offer).
    """
    state = st.session_state
    drawn = state.pop(_LINK_DRAWN, {})
    groups = state.pop(_GROUPS_THIS_RUN, set())
    if failed:
        dropped = set(drawn) | state.get(LINK_UNCHECKED, set())
        state[LINK_UNCHECKED] = set()
    else:
        dropped = {key for key, value in drawn.items() if key in state and state[key] != value}
        # linked options of this page that none of its widgets took: the page has no such option
        unknown = {key for key in state.get(LINK_UNCHECKED, set()) if key[len(PAGE_PREFIX):].split(".")[0] in groups}
        if unknown:
            state[LINK_UNCHECKED] -= unknown
            many = len(unknown) > 1
            names = ", ".join(_quoted_option(k, state[k]) for k in sorted(unknown) if k in state)
            state.setdefault(LINK_NOTES, []).append(f"the page option{'s' if many else ''} {names} (this page does "
                                                    "not offer it)")
            for key in unknown:  # out of the URL this run already
                state.pop(key, None)
            state[_LINK_RERUN] = True
    if dropped:
        state.setdefault(LINK_DROP, set()).update(dropped)
        many = len(dropped) > 1
        why = f"the page failed with {'them' if many else 'it'}" if failed else "not among the choices"
        names = ", ".join(_quoted_option(k, drawn.get(k), k in drawn) for k in sorted(dropped))
        state.setdefault(LINK_NOTES, []).append(f"the page option{'s' if many else ''} {names} ({why})")
    return state.pop(_LINK_RERUN, False) or bool(dropped)


def link_of_widgets(source: str, target: str) -> SidebarLink:
    """The sidebar's current choice as a link (what a Translate press applies)."""
    state = st.session_state
    checkpoint = state["sb.checkpoint_other"].strip() if state["sb.checkpoint"] == OTHER else state["sb.checkpoint"]
    if state["sb.mode"] == FREE_TEXT_MODE:
        if not text_in_link(state["sb.text"]):
            _remember_text(state["sb.text"])
        return SidebarLink(source, target, checkpoint, text=state["sb.text"], question=state["sb.question"],
                           gold=state["sb.gold"])
    return SidebarLink(source, target, checkpoint, dataset=state["sb.dataset"], example=int(state["sb.example"]))


def _view_link() -> tuple[dict[str, str], list[str]]:
    """The query parameters of this session's view, cut to what the server accepts, and the keys left out."""
    state = st.session_state
    link = state.get(LINK)
    pages = {k: state[k] for k in state.keys() if isinstance(k, str) and k.startswith(PAGE_PREFIX)}
    for value in pages.values():  # a page's text too long for the link goes by its digest: remember it, as th's
        if isinstance(value, str) and value and not text_in_link(value):
            _remember_text(value)
    defaults = page_params(state.get(_DEFAULTS, {}))
    options = {k: v for k, v in page_params(pages).items() if defaults.get(k) != v}
    return fit_link({**(sidebar_params(link) if link is not None else {}), **options})


def link_params() -> dict[str, str]:
    """The query parameters of this session's view: the applied selection and every page option that differs from
    its default (within MAX_QUERY_CHARS: a longer link would fail with "400 Bad Request").

    A default is left out so that a switch of page changes no query parameter: the navigation's new address comes
    after the switching run's messages have been handled (Streamlit's frontend sets it once React has drawn them), so
    a parameter the new page's first run wrote would land under the previous page's address, a history entry that
    names the page left. An opened link without an option shows its default, the same view.
    """
    return _view_link()[0]


def sync_link() -> dict[str, str]:
    """Write the view to the URL when it differs (setting query parameters does not rerun the script)."""
    params = link_params()
    _write_link(params)
    return params


def view_address(page_file: str, params: dict[str, str]) -> str:
    """A view's address: the app's scheme, host and port as the browser reached it (localhost:8501 where it did not
    say), the page's path and the view's query parameters (link_params)."""
    parts = urlsplit(st.context.url or "http://localhost:8501/")
    return f"{parts.scheme}://{parts.netloc}/{page_path(page_file)}" + query_string(params)


def _write_link(params: dict[str, str]) -> None:
    if st.query_params.to_dict() != params:
        st.query_params.from_dict(params)
    st.session_state[_LINK_SHOWN] = params


def eval_run_views(run: EvalRun, table) -> list[AppView]:
    """The app's view of each row of a results folder's wide table (analysis.eval_run_links.app_views), under this
    app's checkpoints and the examples, documents and conversations its sidebar and pages offer."""
    return app_views(run, table, checkpoints=list(available_checkpoints()), examples_per_dataset=EXAMPLES_PER_DATASET,
                     long_documents=LONG_DOCUMENTS, conversations=CONVERSATIONS, shard_documents=SHARD_DOCUMENTS)


def python_code(sel: Selection) -> str:
    """The "Copy as Python" snippet: library code that translates the applied context and prints per-layer numbers."""
    link = st.session_state.get(LINK) or SidebarLink()
    path = Path(sel.checkpoint)
    shown = str(path.relative_to(REPO_ROOT)) if path.is_absolute() and path.is_relative_to(REPO_ROOT) else sel.checkpoint
    return python_snippet(sel.source, sel.target, shown, dataset=link.dataset, example=link.example,
                          text=link.text if link.dataset is None else None, examples_per_dataset=EXAMPLES_PER_DATASET,
                          max_context_tokens=MAX_CONTEXT_TOKENS)


def share(sel: Selection, applied_now: bool) -> None:
    """The sidebar's "Copy link" and "Copy as Python" for the applied selection `sel`.

    applied_now: `sel` was applied in this run (a Translate press, a first visit): the URL gets the view at once,
    on the page shown. Otherwise the URL gets back the view it showed: a click in the navigation starts a run whose
    query parameters Streamlit has emptied, and the sidebar is drawn before st.navigation names the new page, so the
    browser would write anything new under the previous page's address (a history entry naming the page left).
    Writing what it shows changes no address, and the navigation then carries it to the new page's; the new page's
    options start at their defaults, which a link leaves out (:func:`link_params`), so its completed run
    (mot_viz.app.frame.run_page) writes nothing new either, unless the page itself changed an option.
    """
    if applied_now:
        sync_link()
    elif _LINK_SHOWN in st.session_state:
        _write_link(st.session_state[_LINK_SHOWN])
    params = link_params()
    left_out = _view_link()[1]
    with st.expander("Copy link", expanded=bool(left_out)):
        st.caption("The address bar holds this view's link. Or append this to the app's address and page "
                   "(e.g. `…:8501/cache_error`):")
        st.code(query_string(params) or "(the defaults: no parameters)", language=None, wrap_lines=True)
        if left_out:
            what = ", ".join(_LEFT_OUT.get(k, f"the page option {k}") for k in left_out)
            st.warning(f"This link leaves out {what}: with it the link would be longer than the app's server accepts "
                       f"({MAX_QUERY_CHARS:,} characters after the address), and opening it would fail with "
                       "“400 Bad Request”. Whoever opens the link types that again in the sidebar.", icon="✂️")
    with st.expander("Copy as Python"):
        st.caption("The same translation with the library, printing the Per-layer cache error page's numbers "
                   "(run it from the repository root).")
        st.code(python_code(sel), language="python")
