"""What the app's page tests share: a session of the app opened as a reader opens it (on a URL, on a page), the
sidebar's Translate button, messages as the reader sees them, and what the app restores from a link. The environment
the pages run in is conftest's `pages_env` (the tiny test pair, a cache of the tests' own, `pretrained` as
pretrained/)."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

from streamlit.testing.v1 import AppTest

from mot_viz.app.loaders import available_checkpoints
from mot_viz.app.openings import DEFAULT_DATASET, DEFAULT_EXAMPLE
from mot_viz.app.permalink import parse_link
from mot_viz.app.settings import EXAMPLES_PER_DATASET, page_option_groups
from mot_viz.data.eval_data import BUILTIN_DATASETS, load_dataset
from mot_viz.engine.model_files import BUNDLED_MODELS

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TIMEOUT = 300  # seconds per script run: two CPU cores shared with training


def default_example():
    """The example the sidebar opens on (the dataset's examples as the app offers them: seed 0, the first n)."""
    return load_dataset(DEFAULT_DATASET, n=DEFAULT_EXAMPLE + 1, seed=0)[DEFAULT_EXAMPLE]


DEFAULT_LABEL = f"SQuAD #{DEFAULT_EXAMPLE}"  # the applied selection's label on the first screen


def open_app(page: str | None = None, params: dict[str, str] | None = None) -> AppTest:
    """A fresh session (a new browser tab) of the app opened on a URL with `params`, then on `page` (a file under
    views/, e.g. "views/12_methods.py"); neither run raises."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(params or {})
    at.run()
    assert not at.exception, at.exception
    return at if page is None else goto(at, page)


def open_view(page: str, params: dict[str, str] | None = None) -> AppTest:
    """A fresh session of one page's file alone (no navigation: the sidebar is drawn, nothing is translated), opened
    on a URL with `params`; the run raises nothing."""
    at = AppTest.from_file(page, default_timeout=TIMEOUT)
    at.query_params.update(params or {})
    at.run()
    assert not at.exception, at.exception
    return at


def goto(at: AppTest, page: str) -> AppTest:
    """Switch the session to `page` (a file under views/, or its name without folder and suffix: "3_routing")."""
    at.switch_page(page if page.startswith("views/") else f"views/{page}.py").run()
    assert not at.exception, at.exception
    return at


def translate_button(at: AppTest):
    return next(b for b in at.button if b.label == "Translate")


def shown(markdown: str) -> str:
    """A message as the reader sees it: the app escapes what it quotes (mot_viz.app.page.escape_markdown)."""
    return re.sub(r"\\(.)", r"\1", markdown)


def errors(at: AppTest) -> list[str]:
    return [shown(e.value) for e in at.error]


def restored(link: str):
    """What the app restores from a link's query (as a fresh session opened on it does): nothing may be ignored."""
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(link).query))
    parsed = parse_link(query, models=list(BUNDLED_MODELS), checkpoints=list(available_checkpoints()),
                        datasets=list(BUILTIN_DATASETS), examples=EXAMPLES_PER_DATASET,
                        option_groups=page_option_groups())
    assert not parsed.ignored and not parsed.typed, parsed.ignored
    return parsed
