"""The real app in headless Chromium: the default pair, every page, two tabs at once, permalinks, the sidebar's
quick fit; the README's screenshots (written to a temporary folder; `MOT_VIZ_UPDATE_SCREENSHOTS=1` writes them
to docs/screenshots, so a test run leaves the tree unchanged unless asked).

Starts ``streamlit run app.py`` on a free localhost port with the bundled models and whatever checkpoint the
app's default resolution picks in pretrained/ (or ``$MOT_VIZ_PRETRAINED``). Needs Debian's Chromium
(``apt-get install -y chromium``); skipped only when it is not installed. Slow: it runs the real models on CPU.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest

from mot_viz.app.openings import DEFAULT_EXAMPLE

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = (REPO / "docs" / "screenshots" if os.environ.get("MOT_VIZ_UPDATE_SCREENSHOTS") == "1"
               else Path(tempfile.mkdtemp(prefix="mot_viz_screenshots_")))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SLOW_MS = 900_000  # real models on two shared CPU cores: the answers alone can take minutes
FIRST_CLICK_MS = 180_000  # the quick fit's progress bar after a click: over a minute when other jobs share the cores
PAGES = {  # sidebar link -> screenshot name, with whether the page must show a chart
    "Answers": "answers",
    "Per-layer cache error": "cache_error",
    "Expert routing": "routing",
    "Token alignment": "alignment",
    "Cache space": "cache_space",
    "Training": "training",
    "Shift analysis": "shift_analysis",
}


@contextlib.contextmanager
def _serve(env: dict[str, str], name: str):
    """``streamlit run app.py`` on a free localhost port with `env` and the real bundled models; yields its URL."""
    from mot_viz.app.server import AppStartError, serve_app

    if not Path(CHROMIUM).is_file():
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    env = {k: v for k, v in env.items() if k != "MOT_VIZ_TEST_MODELS"}
    log = REPO / ".pytest_cache" / f"streamlit-{name}.log" if (REPO / ".pytest_cache").is_dir() else None
    try:
        with serve_app(env, log) as url:
            yield url
    except AppStartError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def app_url():
    with _serve(dict(os.environ), "app") as url:
        yield url


@pytest.fixture(scope="module")
def fit_cache(tmp_path_factory) -> Path:
    """The user cache (MOT_VIZ_CACHE) of the fit test's server: a temporary folder, so the fit it makes (and its
    bank) land there and never in ~/.cache; the converted bundled models are linked from the real cache."""
    from mot_viz.engine.model_cache import cache_dir

    models = cache_dir() / "models"
    models.mkdir(parents=True, exist_ok=True)  # converted on first use, once for every test and the app
    cache = tmp_path_factory.mktemp("mot_viz_cache")
    (cache / "models").symlink_to(models, target_is_directory=True)
    return cache


@pytest.fixture(scope="module")
def fit_app_url(fit_cache):
    """A server of the fit test's own: its user cache is `fit_cache`, and the click comes in the first session
    right after the server's first run."""
    with _serve({**os.environ, "MOT_VIZ_CACHE": str(fit_cache)}, "fit") as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _open(browser, url: str):
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(SLOW_MS)
    page.goto(url)
    return page


def _wait_until_settled(page) -> None:
    """Until the script run has finished: no "running" status widget and no stale (greyed) element left."""
    page.wait_for_timeout(500)  # a click's rerun may not have started yet
    page.wait_for_function(
        """() => !document.querySelector('[data-testid="stStatusWidget"]')
                 && !document.querySelector('[data-stale="true"]')""",
        timeout=SLOW_MS, polling=250,
    )


def _assert_no_failure(page) -> None:
    for selector in ('[data-testid="stException"]', '[data-testid="stAlertContentError"]'):
        found = page.locator(selector)
        assert found.count() == 0, found.first.inner_text()


def test_default_pair_every_page_and_two_tabs(app_url, browser):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # two tabs open at once share the one cached translation and both finish
    first, second = _open(browser, app_url), _open(browser, app_url)
    for tab in (first, second):
        tab.get_by_text("Target tokens").wait_for()
        _wait_until_settled(tab)
        _assert_no_failure(tab)
    n_tokens = [int(t.locator('[data-testid="stMetricValue"]').first.inner_text()) for t in (first, second)]
    assert n_tokens[0] == n_tokens[1] > 0
    second.close()

    page = first
    page.get_by_role("button", name="Translate").click()  # an explicit Translate on the defaults
    page.get_by_text("Target tokens").wait_for()
    _wait_until_settled(page)
    _assert_no_failure(page)
    page.locator('[data-testid="stSidebarContent"]').evaluate("e => e.scrollTo(0, 0)")  # the click scrolled it
    page.screenshot(path=str(SCREENSHOTS / "overview.png"))

    nav = page.locator('[data-testid="stSidebarNav"]')
    for title, name in PAGES.items():
        nav.get_by_role("link", name=title, exact=True).click()
        page.get_by_role("heading", name=title, exact=True).wait_for()
        page.locator(".js-plotly-plot").first.wait_for(state="visible", timeout=SLOW_MS)
        _wait_until_settled(page)
        _assert_no_failure(page)
        assert page.locator(".js-plotly-plot").count() > 0, title
        if title == "Answers":
            rows = page.locator('[data-testid="stDataFrame"]')
            assert rows.count() == 1
            # the first screen's example, and the reason the app gives for it (mot_viz.app.openings), as measured
            page.get_by_text(f"The app opens on SQuAD #{DEFAULT_EXAMPLE} because").wait_for()
            scores = page.locator(".js-plotly-plot").first.evaluate("e => e.data[0]")
            answers = dict(zip(scores["x"], scores["customdata"]))
            assert answers["native"] == answers["mot"] == "Kromme Rijn", answers
            assert answers["no_context"] == answers["random"] == "The Rhine", answers
        page.wait_for_timeout(500)  # let plotly finish drawing before the screenshot
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
    # the last page is Shift analysis: its shipped sweep (results/shift) draws below the checkpoint's own window
    shipped = page.get_by_role("heading", name="Shipped sweep (results/shift)")
    shipped.scroll_into_view_if_needed()
    assert page.locator(".js-plotly-plot").count() >= 3 + 4  # the window's 3 figures, the sweep's 3 + ρ_k
    _assert_no_failure(page)
    page.wait_for_timeout(500)
    page.screenshot(path=str(SCREENSHOTS / "shift_sweep.png"))
    # Long context: a 512-token distractor stack read by the source, translated, replayed and answered
    nav.get_by_role("link", name="Long context", exact=True).click()
    page.get_by_role("heading", name="Long context", exact=True).wait_for()
    page.get_by_role("heading", name="Where along the document the window errs").wait_for(timeout=SLOW_MS)
    _wait_until_settled(page)
    _assert_no_failure(page)
    assert page.locator(".js-plotly-plot").count() >= 3  # retention curve, first-token stages, position error
    assert page.locator('[data-testid="stDataFrame"]').count() >= 2  # the answers and the cache sizes
    # … then a 2,048-token stack, where 15 of Gemma-3's 18 layers see only the last 512 positions
    page.get_by_role("combobox", name="Length (target tokens)").click()
    page.get_by_role("option", name="2048", exact=True).click()
    page.get_by_text(re.compile(r"\b(1[5-9]\d\d|20\d\d) target tokens translated and answered")).first.wait_for(
        timeout=SLOW_MS)
    _wait_until_settled(page)
    _assert_no_failure(page)
    assert _query(page)["long.budget"] == "2048"
    assert page.locator(".js-plotly-plot").count() >= 3
    page.get_by_role("heading", name="Where along the document the window errs").scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    page.screenshot(path=str(SCREENSHOTS / "long_context.png"))
    # Logit lens: each layer's reading of the next answer token under native, MoT, linear map and no context
    _nav_link(page, "Logit lens").click()  # past the first 10 pages: behind "View N more"
    page.get_by_role("heading", name="Logit lens", exact=True).wait_for()
    page.get_by_role("heading", name="Attention on the context").wait_for(timeout=SLOW_MS)
    _wait_until_settled(page)
    _assert_no_failure(page)
    assert page.locator(".js-plotly-plot").count() >= 3  # KL heat map, rank curves, attention shares
    page.wait_for_timeout(500)
    page.screenshot(path=str(SCREENSHOTS / "logit_lens.png"))
    # Multi-agent: a CoQA story read once by the source, five turns answered from each kept cache
    _nav_link(page, "Multi-agent").click()  # past the first 10 pages: behind "View N more"
    page.get_by_role("heading", name="Multi-agent", exact=True).wait_for()
    page.get_by_role("heading", name="F1, time and memory, turn by turn").wait_for(timeout=SLOW_MS)
    _wait_until_settled(page)
    _assert_no_failure(page)
    assert page.locator(".js-plotly-plot").count() >= 1 and page.locator('[data-testid="stDataFrame"]').count() >= 1
    page.wait_for_timeout(500)
    page.screenshot(path=str(SCREENSHOTS / "multi_agent.png"))
    # Layer patching: restoring and breaking each target layer of the direct map's cache (the page's first view where
    # the pair has one, saying why), then of the MoT's
    _nav_link(page, "Layer patching").click()
    page.get_by_role("heading", name="Layer patching", exact=True).wait_for()
    page.get_by_role("heading", name="Groups: layers patched together").wait_for(timeout=SLOW_MS)
    _wait_until_settled(page)
    _assert_no_failure(page)
    in_expanders = page.locator('[data-testid="stExpander"] .js-plotly-plot').count()  # the method's picture
    assert page.locator(".js-plotly-plot").count() - in_expanders == 1
    assert page.get_by_text("Opens on the direct map").count() == 1
    page.wait_for_timeout(500)
    page.screenshot(path=str(SCREENSHOTS / "layer_patching.png"))
    page.get_by_text("MoT (translated window, replayed)").first.click()
    page.wait_for_timeout(1000)
    _wait_until_settled(page)
    _assert_no_failure(page)
    assert _query(page)["patch.method"] == "mot"
    assert all((SCREENSHOTS / f"{n}.png").stat().st_size > 10_000
               for n in ["overview", "shift_sweep", "long_context", "logit_lens", "multi_agent", "layer_patching",
                         *PAGES.values()])


def _nav_link(page, title: str):
    """The sidebar's navigation link to the page `title`, the list first expanded when the link is behind its "View N
    more" button (past 12 pages the list shows 10)."""
    nav = page.locator('[data-testid="stSidebarNav"]')
    link = nav.get_by_role("link", name=title, exact=True)
    more = nav.get_by_test_id("stSidebarNavViewButton")
    if not link.is_visible() and more.count() and more.inner_text().endswith("more"):
        more.click()
    return link


def _open_page(page, runs: "_Runs", title: str) -> None:
    """Click the navigation's link to the page `title`, until that page's first run has completed."""
    since = len(runs.finished)
    _nav_link(page, title).click()
    page.get_by_role("heading", name=title, exact=True).wait_for()
    runs.wait(page, since)


def _link(**params: str) -> str:
    return urlencode({"src": "smollm2-135m", "tgt": "gemma3-270m", "ckpt": "smollm2-to-gemma3", **params})


def _open_alignment(context, url: str):
    page = context.new_page()
    page.set_default_timeout(SLOW_MS)
    page.goto(url)
    page.get_by_role("heading", name="Token alignment", exact=True).wait_for()
    page.locator(".js-plotly-plot").first.wait_for(state="visible", timeout=SLOW_MS)
    _wait_until_settled(page)
    _assert_no_failure(page)
    return page


def _assert_view(page, dataset: str, label: str, example: int, view: str) -> None:
    """The pair, checkpoint and context in the caption and the sidebar, the page option, and the URL."""
    from mot_viz.app.loaders import dataset_examples

    caption = page.get_by_text("smollm2-135m → gemma3-270m · checkpoint")
    assert f"context: {label} #{example}" in caption.inner_text() and "smollm2-to-gemma3" in caption.inner_text()
    sidebar = page.locator('[data-testid="stSidebarContent"]')
    last = len(dataset_examples(dataset)) - 1
    assert sidebar.get_by_label(f"Example (0–{last})").input_value() == str(example)
    assert sidebar.get_by_role("combobox", name="Dataset").input_value() == label
    assert sidebar.get_by_role("combobox", name="MoT checkpoint").input_value() == "smollm2-to-gemma3"
    assert page.get_by_role("radio", name=view, exact=True).is_checked()
    query = _query(page)
    assert (query["ds"], query["ex"], query.get("align.view", "shared characters")) == (dataset, str(example), view)


def _query(page) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(page.url).query))


def test_a_permalink_opens_the_same_view_and_another_tab_leaves_it_alone(app_url, browser):
    context = browser.new_context(viewport={"width": 1440, "height": 1000})  # a fresh browser: no session yet
    try:
        first = _open_alignment(context, f"{app_url}/alignment?{_link(ds='squad', ex='2', **{'align.view': 'weights'})}")
        _assert_view(first, "squad", "SQuAD", 2, "weights")
        for chrome in ("stAppDeployButton", "stMainMenu"):  # .streamlit/config.toml: toolbarMode = "minimal"
            assert first.locator(f'[data-testid="{chrome}"]').count() == 0, chrome
        second = _open_alignment(context, f"{app_url}/alignment?{_link(ds='boolq', ex='1')}")
        _assert_view(second, "boolq", "BoolQ", 1, "shared characters")
        _assert_view(first, "squad", "SQuAD", 2, "weights")  # untouched by the second tab
        # a rerun in the first tab (another page option) keeps its own selection and writes the option to its URL:
        # back at its default, the option leaves the link
        first.get_by_text("shared characters", exact=True).click()
        _wait_until_settled(first)
        _assert_no_failure(first)
        _assert_view(first, "squad", "SQuAD", 2, "shared characters")
        assert "align.view" not in _query(first)
        _assert_view(second, "boolq", "BoolQ", 1, "shared characters")
        # the copied link (the address bar) reopens the same view in a third tab
        third = _open_alignment(context, first.url)
        _assert_view(third, "squad", "SQuAD", 2, "shared characters")
        # another page keeps the view in its URL (the first link is the landing page)
        third.locator('[data-testid="stSidebarNav"]').get_by_role("link", name="Overview", exact=True).click()
        third.get_by_text("Target tokens").wait_for()
        _wait_until_settled(third)
        assert _query(third) == _query(first)
    finally:
        context.close()


LANDING_HEADING = "MoT Viz"  # the landing page's heading; every other page's heading is its title in the sidebar


def _wait_for_path(page, path: str, timeout: int = 60_000) -> None:
    """Until the address bar's path is `path` (the frontend writes it once it has handled the run's messages)."""
    try:
        page.wait_for_function("p => location.pathname === p", arg=path, timeout=timeout, polling=250)
    except Exception:  # playwright's TimeoutError: say which address it shows instead
        pytest.fail(f"the address bar shows {urlsplit(page.url).path!r}, not {path!r}: {page.url}")


def test_the_address_bar_names_the_page_shown_and_reopens_it(app_url, browser):
    """Every page of the sidebar's navigation in turn: once a click's run has finished, the address bar's path is
    that page's, and reloading the address shows the same page with the same view (query parameters)."""
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(SLOW_MS)
    runs = _Runs(page)  # before the first run (a reload's new connection is followed too)
    # every address the tab showed (history entries included), with how many runs had started when it did
    addresses: list[tuple[str, int]] = []
    page.on("framenavigated", lambda frame: addresses.append((frame.url, runs.kinds.count("new_session")))
            if frame == page.main_frame else None)

    def named_elsewhere(shown: int, started: int, path: str) -> list[str]:
        """The addresses since the `shown`-th that runs after the `started`-th showed with another path than `path`
        (each is a history entry: Back goes there)."""
        return [url for url, runs_seen in addresses[shown:] if runs_seen > started and urlsplit(url).path != path]

    try:
        page.goto(app_url)
        page.get_by_role("heading", name=LANDING_HEADING, exact=True).wait_for()
        runs.wait(page, 0)
        _wait_until_settled(page)
        nav = page.locator('[data-testid="stSidebarNav"]')
        failure = page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]')
        more = nav.get_by_test_id("stSidebarNavViewButton")  # past 12 pages the list shows 10 and "View N more"
        if more.count() and more.inner_text().endswith("more"):
            more.click()
        links = nav.get_by_role("link")
        entries = [(links.nth(i).inner_text().strip(), urlsplit(links.nth(i).get_attribute("href")).path)
                   for i in range(links.count())]
        titles = [title for title, _ in entries]
        assert titles[0] == "Overview" and {"Answers", "Long context", "Multi-agent"} < set(titles), titles
        assert len(set(titles)) == len({path for _, path in entries}) == len(entries), entries
        # a click while a page's first run still computes, as a reader on two cores does (the run is cut short
        # before it writes its options to the URL): the next run never writes the view under the page left
        nav.get_by_role("link", name="Answers", exact=True).click()
        page.get_by_role("heading", name="Answers", exact=True).wait_for()
        since, shown, started = len(runs.finished), len(addresses), runs.kinds.count("new_session")
        nav.get_by_role("link", name="Per-layer cache error", exact=True).click()
        page.get_by_role("heading", name="Per-layer cache error", exact=True).or_(failure).first.wait_for()
        runs.wait(page, since)
        _wait_until_settled(page)
        _assert_no_failure(page)
        path = entries[titles.index("Per-layer cache error")][1]
        _wait_for_path(page, path)
        assert not named_elsewhere(shown, started, path), named_elsewhere(shown, started, path)
        # every page after the landing one, then the landing page again: each click leaves another page
        for title, path in entries[1:] + entries[:1]:
            heading = page.get_by_role("heading", name=LANDING_HEADING if title == "Overview" else title, exact=True)
            since, shown, started = len(runs.finished), len(addresses), runs.kinds.count("new_session")
            _nav_link(page, title).click()
            heading.or_(failure).first.wait_for()
            _assert_no_failure(page)
            runs.wait(page, since)
            _wait_until_settled(page)
            _assert_no_failure(page)
            _wait_for_path(page, path)
            # never the previous page's path, not even for a moment
            wrong = named_elsewhere(shown, started, path)
            assert not wrong, f"after the click on {title!r} the address named another page: {wrong}"
            address, view = page.url, _query(page)
            assert {"src", "tgt", "ckpt", "ds", "ex"} <= set(view), (title, address)
            since = len(runs.finished)
            page.reload()  # the address as copied: a new session restores the page and its view from it alone
            heading.or_(failure).first.wait_for()
            _assert_no_failure(page)
            runs.wait(page, since)
            _wait_until_settled(page)
            _assert_no_failure(page)
            assert urlsplit(page.url).path == path, (title, page.url)
            assert _query(page) == view, title
    finally:
        page.close()


def test_fit_a_linear_translator_for_the_bundled_pair(fit_app_url, fit_cache, browser):
    """The sidebar's "Fit a linear translator" end to end on the real pair, clicked in a fresh server's first
    session: a bank, a ridge fit, a checkpoint in the user cache chosen for the pair, and a translation with it."""
    page = _open(browser, fit_app_url)
    page.get_by_text("Target tokens").wait_for()
    _wait_until_settled(page)
    sidebar = page.locator('[data-testid="stSidebarContent"]')
    sidebar.get_by_text("Fit a linear translator for this pair").click()  # the expander (a pair with a checkpoint)
    button = sidebar.get_by_role("button", name="Fit a linear translator", exact=True)
    button.click()
    # the click started the fit (its rerun first redraws the page: slow when other jobs share the two cores)
    progress = sidebar.locator('[data-testid="stProgress"]')
    try:
        progress.wait_for(timeout=FIRST_CLICK_MS)
    except Exception:  # playwright's TimeoutError
        # Seen in two clean-clone CI runs, never when the test runs alone: the fresh server's
        # first session dropped the first click (no progress, the server idle, nothing written to the fit cache).
        # Cause not found yet; a user clicks again, and so does the test.
        _wait_until_settled(page)
        button.click()
        progress.wait_for(timeout=SLOW_MS)
    sidebar.get_by_text("is now the checkpoint").wait_for(timeout=SLOW_MS)  # about a minute or more on two cores
    _wait_until_settled(page)
    _assert_no_failure(page)
    chosen = sidebar.get_by_role("combobox", name="MoT checkpoint").input_value()
    assert chosen.startswith("fit: smollm2-135m-to-gemma3-270m-linear-")
    name = chosen.removeprefix("fit: ")
    assert (fit_cache / "fits" / name / "translator.safetensors").is_file()
    page.get_by_role("button", name="Translate").click()  # the pages now show the fitted checkpoint
    page.get_by_text("smollm2-135m → gemma3-270m · checkpoint").filter(has_text=name).wait_for(timeout=SLOW_MS)
    _wait_until_settled(page)
    _assert_no_failure(page)
    page.close()


SHOT_WIDTH = 1920  # the instruments' screenshots: wide enough for every column of their tables
_BLOCK = "xpath=ancestor::div[@data-testid='stVerticalBlock'][1]"  # a fragment's (or a column's) own container
_PLOT_BLOCK = "xpath=ancestor::div[@data-testid='stVerticalBlock'][.//div[contains(@class, 'js-plotly-plot')]][1]"


class _Runs:
    """The script runs the server reports finished to one tab (the ForwardMsg script_finished on its websocket)."""

    def __init__(self, page) -> None:
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg  # streamlit is pinned

        self._message = ForwardMsg
        self.full, self.fragment = ForwardMsg.FINISHED_SUCCESSFULLY, ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY
        self.finished: list[int] = []
        self.kinds: list[str] = []  # every message's type, in order ("new_session" starts a run)
        page.on("websocket", lambda ws: ws.on("framereceived", self._frame))

    def _frame(self, payload) -> None:
        if isinstance(payload, bytes):
            msg = self._message()
            msg.ParseFromString(payload)
            self.kinds.append(msg.WhichOneof("type"))
            if msg.WhichOneof("type") == "script_finished":
                self.finished.append(msg.script_finished)

    def wait(self, page, since: int) -> list[int]:
        """Once a run after the first `since` has completed (not one cut short for a rerun): the statuses since."""
        deadline = time.monotonic() + SLOW_MS / 1000
        while not {self.full, self.fragment} & set(self.finished[since:]):
            assert time.monotonic() < deadline, "no script run completed"
            page.wait_for_timeout(250)
        return self.finished[since:]


def _wait_for_query(page, key: str, value: str | None = None, timeout: int = SLOW_MS) -> None:
    """Until the URL holds `key` (with `value`)."""
    page.wait_for_function("([k, v]) => { const q = new URLSearchParams(location.search); "
                           "return v === null ? q.has(k) : q.get(k) === v; }",
                           arg=[key, value], timeout=timeout, polling=250)


def _choose(page, combobox, option: str) -> None:
    """Pick `option` in a select box or multiselect (its list opens on a click; a click during a rerun may not)."""
    for _ in range(3):
        combobox.click()
        choice = page.get_by_role("option", name=option, exact=True)
        try:
            choice.wait_for(state="visible", timeout=15_000)
        except Exception:  # playwright's TimeoutError
            page.keyboard.press("Escape")
            continue
        choice.click()
        return
    pytest.fail(f"the option {option!r} never showed")


def _shoot(page, path: Path, first, last=None, width: int = SHOT_WIDTH, pad: int = 12) -> None:
    """A PNG of the region from `first` to `last` (the elements between included), in a viewport `width` wide and
    tall enough for all of it; the viewport is the usual one again afterwards."""
    last = last or first
    height = 0
    for _ in range(3):  # the layout follows the width: measure again
        top, bottom = first.bounding_box(), last.bounding_box()
        needed = max(1000, int(bottom["y"] + bottom["height"] - top["y"]) + 2 * pad + 300)
        if needed <= height:
            break
        height = needed
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(2000)  # plotly redraws for the new size
    # its top below Streamlit's header
    first.evaluate("e => { e.style.scrollMarginTop = '120px'; e.scrollIntoView({block: 'start'}); }")
    page.wait_for_timeout(500)
    top, bottom = first.bounding_box(), last.bounding_box()
    x0 = max(0.0, min(top["x"], bottom["x"]) - pad)
    x1 = max(top["x"] + top["width"], bottom["x"] + bottom["width"]) + pad
    y0 = max(0.0, top["y"] - pad)
    page.screenshot(path=str(path), clip={"x": x0, "y": y0, "width": x1 - x0,
                                          "height": bottom["y"] + bottom["height"] + pad - y0})
    page.set_viewport_size({"width": 1440, "height": 1000})
    page.wait_for_timeout(1000)


def _stack(parts: list[Path], path: Path, gap: int = 16) -> None:
    from PIL import Image

    images = [Image.open(p).convert("RGB") for p in parts]
    out = Image.new("RGB", (max(i.width for i in images), sum(i.height for i in images) + gap * (len(images) - 1)),
                    "white")
    y = 0
    for image in images:
        out.paste(image, (0, y))
        y += image.height + gap
    out.save(path)


def test_instrument_screenshots_and_fragment_links(app_url, browser, tmp_path):
    """README screenshots of five instruments on the default pair and the checkpoint the app opens on (mid-depth): the
    reuse verdict, expert what-if, paired cache-space projection, two checkpoints compared, the quick fit's expander;
    and a page option inside app.fragment: its fragment-only rerun writes the option to the URL."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(SLOW_MS)
    runs = _Runs(page)  # before the first run
    try:
        page.goto(app_url)
        page.get_by_text("Target tokens").wait_for()
        _wait_until_settled(page)
        _assert_no_failure(page)
        plots = page.locator(".js-plotly-plot")

        # Per-layer cache error: its options start at their defaults, which the URL leaves out
        _open_page(page, runs, "Per-layer cache error")
        assert not any(key.startswith("error.") for key in _query(page))
        _wait_until_settled(page)
        _assert_no_failure(page)
        verdict = page.get_by_role("heading", name="Reuse verdict: use this translated cache, or the target's own prefill?",
                                   exact=True).locator(_BLOCK)
        assert verdict.locator('[data-testid="stAlert"]').filter(has_text="Verdict:").count() == 1
        assert verdict.locator('[data-testid="stDataFrame"]').count() == 2  # per window layer; the thresholds
        _shoot(page, SCREENSHOTS / "verdict.png", verdict)

        # a page option inside a fragment ("Tensor" above the heatmap): its rerun alone writes it to the URL
        titles = page.locator(".js-plotly-plot .gtitle")
        assert titles.filter(has_text=re.compile(r"^K: ")).count() == 1
        since = len(runs.finished)
        page.locator('[data-testid="stRadio"]').filter(has_text="Tensor").get_by_text("V", exact=True).click()
        _wait_for_query(page, "error.kv", "V", timeout=120_000)
        assert runs.wait(page, since) == [runs.fragment]  # the fragment reran, not the page
        titles.filter(has_text=re.compile(r"^V: ")).wait_for(timeout=60_000)
        assert titles.filter(has_text=re.compile(r"^K: ")).count() == 0
        # "Download this view" after that fragment's rerun alone: the file holds the V heatmap, not the K one
        _wait_until_settled(page)  # a rerun still drawing would redraw the expander closed
        page.get_by_test_id("stExpander").filter(has_text="Download this view").locator("summary").click()
        button = page.get_by_role("button", name="Download this view (HTML)")
        button.wait_for(state="visible", timeout=60_000)
        with page.expect_download(timeout=120_000) as download:
            button.click()
        download.value.save_as(tmp_path / "view.html")
        shown = (tmp_path / "view.html").read_text(encoding="utf-8")
        assert re.search(r'"text":\s*"V: ', shown) and not re.search(r'"text":\s*"K: ', shown)
        assert "error.kv=V" in shown  # the view's address, with the option
        query = _query(page)
        assert query["ckpt"] == "smollm2-to-gemma3-mid" and not {"error.metric", "error.comparison"} & set(query)

        # a second checkpoint: dashed per-layer lines, a "second" fidelity curve
        since = len(runs.finished)
        _choose(page, page.get_by_role("combobox", name="Compare with a second checkpoint (optional)"),
                "smollm2-to-gemma3-mid-linear")
        assert runs.wait(page, since)[-1] == runs.full
        _wait_until_settled(page)
        _assert_no_failure(page)
        assert _query(page)["error.second"] == "smollm2-to-gemma3-mid-linear"
        per_layer = plots.filter(has=page.locator(".legendtext", has_text="translated (2nd)"))
        per_layer.wait_for()
        assert per_layer.evaluate("e => [...e.querySelectorAll('path.js-line')]"
                                  ".filter(p => !['', 'none'].includes(p.style.strokeDasharray)).length") > 0
        fidelity = plots.filter(has=page.locator(".legendtext", has_text=re.compile(r"^second$")))
        fidelity.wait_for()
        first, second = tmp_path / "per_layer.png", tmp_path / "fidelity.png"
        _shoot(page, first, page.get_by_role("heading", name="Per layer", exact=True).locator(
            "xpath=ancestor::div[@data-testid='stElementContainer'][1]"), per_layer)
        _shoot(page, second, fidelity.locator(_PLOT_BLOCK))
        _stack([first, second], SCREENSHOTS / "compare_two.png")

        # Expert routing: "drop one expert" in the what-if (a fragment)
        _open_page(page, runs, "Expert routing")
        _wait_until_settled(page)
        _assert_no_failure(page)
        what_if = page.get_by_role("heading", name="What if the router chose differently?", exact=True) \
            .locator(_PLOT_BLOCK)
        since = len(runs.finished)
        what_if.get_by_text("drop one expert", exact=True).click()
        _wait_for_query(page, "routing.whatif", "drop one expert")
        runs.wait(page, since)
        _wait_until_settled(page)
        _assert_no_failure(page)
        what_if.locator(".legendtext").filter(has_text="dropped").first.wait_for()
        assert what_if.locator('[data-testid="stDataFrame"]').count() == 1
        _shoot(page, SCREENSHOTS / "what_if.png", what_if)

        # Cache space: the replayed target and the linear map shown too, each joined to its native point
        _open_page(page, runs, "Cache space")
        _wait_until_settled(page)
        _assert_no_failure(page)
        show = page.get_by_role("combobox", name="Show")
        for kind in ("replayed target", "linear map"):
            since = len(runs.finished)
            _choose(page, show, kind)
            page.wait_for_function("k => (new URLSearchParams(location.search).get('space.kinds') || '').includes(k)",
                                   arg=kind, polling=250)
            runs.wait(page, since)
            page.keyboard.press("Escape")  # the multiselect's list stays open
        _wait_until_settled(page)
        _assert_no_failure(page)
        space = show.locator(_PLOT_BLOCK)
        assert space.get_by_role("checkbox", name="Join each token's native and translated points").is_checked()
        legend = space.locator(".legendtext")
        legend.filter(has_text="native → linear map").wait_for()
        assert {"native → translated", "native → replayed target", "replayed target", "linear map"} \
            <= set(legend.all_text_contents())
        _shoot(page, SCREENSHOTS / "paired_projection.png", space)

        # the sidebar's quick fit, opened (the fit itself: test_fit_a_linear_translator_for_the_bundled_pair)
        fit = page.locator('[data-testid="stSidebarContent"] [data-testid="stExpander"]') \
            .filter(has_text="Fit a linear translator for this pair")
        fit.get_by_text("Fit a linear translator for this pair").click()
        fit.get_by_role("button", name="Fit a linear translator", exact=True).wait_for(state="visible")
        _shoot(page, SCREENSHOTS / "quick_fit.png", fit, width=1440)
        _assert_no_failure(page)
    finally:
        page.close()
    assert all((SCREENSHOTS / f"{n}.png").stat().st_size > 10_000
               for n in ("verdict", "what_if", "paired_projection", "compare_two", "quick_fit"))


def test_evaluations_lost_answers_and_one_opened_in_the_app(app_url, browser):
    """The Evaluations page on the shipped mid SQuAD run, filtered to the answers MoT lost; the first lost example
    opens from the page's "Open in the app" button (a new tab) on the Answers page, showing that example."""
    from mot_viz import app
    from mot_viz.analysis import eval_runs
    from mot_viz.app.permalink import example_link

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    run = eval_runs.open_run(REPO / "results/eval/smollm2-to-gemma3-mid-squad300")
    table = eval_runs.wide_table(run)
    lost = eval_runs.select(table, run.translated, lost=True, translated=run.translated)
    views = dict(zip(table["example"], app.eval_run_views(run, table)))
    assert 0 < len(lost) < len(table) and all(views[e].page for e in lost["example"]), "every lost answer opens"

    page = _open(browser, f"{app_url}/evaluations?{urlencode({'evals.lost': 'true'})}")
    page.get_by_role("heading", name="Evaluations", exact=True).wait_for()
    page.get_by_text(f"{len(lost)} of {len(table)} examples.").wait_for(timeout=SLOW_MS)
    _wait_until_settled(page)
    _assert_no_failure(page)
    page.locator('[data-testid="stDataFrame"]').nth(2).wait_for(timeout=SLOW_MS)  # the summary, examples, slice
    page.locator(".js-plotly-plot").first.wait_for(state="visible", timeout=SLOW_MS)  # MoT − native by length
    _wait_until_settled(page)
    _assert_no_failure(page)
    page.get_by_role("heading", name="Examples", exact=True).scroll_into_view_if_needed()
    page.wait_for_timeout(500)  # let plotly finish drawing before the screenshot
    page.screenshot(path=str(SCREENSHOTS / "evaluations.png"))

    view = views[lost["example"].iloc[0]]  # the example the button opens first: the first the filter keeps
    button = page.locator('[data-testid="stLinkButton"] a', has_text="Open in the app")
    assert button.get_attribute("href") == example_link(view)
    with page.context.expect_page() as opened:
        button.click()
    answers = opened.value
    answers.set_default_timeout(SLOW_MS)
    answers.get_by_role("heading", name="Answers", exact=True).wait_for(timeout=SLOW_MS)
    _wait_until_settled(answers)
    _assert_no_failure(answers)
    caption = answers.get_by_text("smollm2-135m → gemma3-270m · checkpoint").inner_text()
    assert f"context: SQuAD #{view.example}" in caption and view.checkpoint in caption
    answers.close()
    page.close()


def test_methods_side_by_side_with_the_text_relay(app_url, browser):
    """The Methods page on the default context with the text relay (opened from its link): every method's answer,
    its time by stage, its K/V error and the shipped results' quality against time, and the relay's messages; the
    ways of sharing whose networks are shipped in pretrained/ (C2C, LSC, Interlat) among them."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = _open(browser, f"{app_url}/methods?{urlencode({'methods.relay': 'true'})}")
    page.get_by_role("heading", name="Methods", exact=True).wait_for()
    page.get_by_role("heading", name="The relay's messages", exact=True).wait_for(timeout=SLOW_MS)
    _wait_until_settled(page)
    _assert_no_failure(page)
    plots = page.locator(".js-plotly-plot")
    plots.nth(2).wait_for(state="visible", timeout=SLOW_MS)  # time by stage, K/V error, quality against time
    assert plots.count() == 3
    assert page.get_by_role("checkbox", name="Include the text relay").is_checked()
    drawn = " ".join(plots.nth(0).all_inner_texts())  # time by stage: one bar per method, the trained ways' too
    for name in ("C2C projection path", "C2C fuser", "LSC shared latent", "Interlat latent hand-off"):
        assert name in drawn, f"{name} is not on the Methods page (its network in pretrained/ was not offered)"
    page.get_by_role("heading", name="Answers", exact=True).scroll_into_view_if_needed()
    page.wait_for_timeout(500)  # let plotly finish drawing before the screenshot
    page.screenshot(path=str(SCREENSHOTS / "methods.png"))
    page.close()


def test_the_lesson_in_presenter_mode_with_the_arrow_keys_and_its_file_offline(app_url, browser, tmp_path):
    """The Lesson page opened in presenter mode (sidebar hidden): every step reached with the → key draws its header
    and no error; then, out of presenter mode, the downloaded lesson file opens with networking off and draws every
    figure with the plotly inside it."""
    from mot_viz.app.lesson import STEPS

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = _open(browser, f"{app_url}/lesson?{urlencode({'lesson.presenter': 'true'})}")
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.get_by_role("heading", name=f"1. {STEPS[0].title}").wait_for()
    _wait_until_settled(page)
    page.locator('[data-testid="stSidebar"]').wait_for(state="hidden", timeout=30_000)  # the presenter's style
    shown, drawn = {}, {}  # seconds after the arrow key until the step's header, and until its run settled
    for number, step in enumerate(STEPS, 1):
        if number > 1:
            start = time.monotonic()
            page.locator("body").press("ArrowRight")
            page.get_by_role("heading", name=f"{number}. {step.title}").wait_for(timeout=SLOW_MS)
            shown[number] = time.monotonic() - start
            page.get_by_text("Try this:").wait_for(timeout=SLOW_MS)  # the step's text is drawn, figure or not
            _wait_until_settled(page)
            drawn[number] = time.monotonic() - start
        _assert_no_failure(page)
        assert _query(page).get("lesson.step", "1") == str(number)
        if number == 3:
            page.wait_for_timeout(500)  # let plotly finish drawing before the screenshot
            page.screenshot(path=str(SCREENSHOTS / "lesson_presenter.png"))
    print("seconds after the arrow key, to the step's header:", {k: round(v, 1) for k, v in shown.items()},
          "to a settled page:", {k: round(v, 1) for k, v in drawn.items()})
    page.locator("body").press("ArrowLeft")
    page.get_by_role("heading", name=f"{len(STEPS) - 1}. {STEPS[-2].title}").wait_for()

    page.get_by_test_id("stCheckbox").get_by_text("Presenter mode").click()
    page.get_by_role("heading", name="Download this lesson").wait_for()
    page.get_by_role("button", name="Prepare the lesson file").click()
    with page.expect_download(timeout=SLOW_MS) as download:
        page.get_by_role("button", name="Download this lesson (HTML)").click()
    path = tmp_path / "lesson.html"
    download.value.save_as(path)
    page.close()
    print(f"lesson file: {path.stat().st_size / 1e6:.1f} MB")

    offline = browser.new_context(offline=True, viewport={"width": 1200, "height": 900})
    requests = []
    offline.on("request", lambda r: requests.append(r.url))
    shown = offline.new_page()
    shown.goto(path.as_uri())
    figures = shown.locator(".plotly-graph-div")
    figures.last.locator(".main-svg").first.wait_for(timeout=60_000)
    assert figures.count() >= len(STEPS) - 1
    assert shown.locator(".plotly-graph-div .main-svg").count() >= figures.count()  # each one drawn
    for number, step in enumerate(STEPS, 1):
        assert shown.locator(f"#step{number} h2").inner_text() == f"{number}. {step.title}"
    assert not [u for u in requests if not u.startswith("file:")]
    shown.screenshot(path=str(SCREENSHOTS / "lesson_file.png"))
    offline.close()
