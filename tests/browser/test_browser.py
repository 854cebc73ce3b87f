"""The real app in headless Chromium: the default pair, every page, two tabs at once, permalinks, the sidebar's
quick fit; README screenshots.

Starts ``streamlit run app.py`` on a free localhost port with the bundled models and whatever checkpoint the
app's default resolution picks in pretrained/ (or ``$MOT_VIZ_PRETRAINED``). Needs Debian's Chromium
(``apt-get install -y chromium``); skipped only when it is not installed. Slow: it runs the real models on CPU.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "docs" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SLOW_MS = 900_000  # real models on two shared CPU cores: the answers alone can take minutes
PAGES = {  # sidebar link -> screenshot name, with whether the page must show a chart
    "Answers": "answers",
    "Per-layer cache error": "cache_error",
    "Expert routing": "routing",
    "Token alignment": "alignment",
    "Cache space": "cache_space",
    "Training": "training",
    "Shift analysis": "shift_analysis",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serve(env: dict[str, str]):
    """``streamlit run app.py`` on a free localhost port with `env`; yields its URL."""
    if not Path(CHROMIUM).is_file():
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    port = _free_port()
    env = {k: v for k, v in env.items() if k != "MOT_VIZ_TEST_MODELS"}  # the real bundled models
    cmd = [str(REPO / ".venv" / "bin" / "streamlit"), "run", "app.py", "--server.headless", "true",
           "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
           "--server.fileWatcherType", "none"]
    if not Path(cmd[0]).is_file():
        cmd[:1] = [sys.executable, "-m", "streamlit"]
    log = open(REPO / ".pytest_cache" / f"streamlit-{port}.log", "w") if (REPO / ".pytest_cache").is_dir() \
        else subprocess.DEVNULL
    server = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("the Streamlit server did not come up within a minute")
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.fixture(scope="module")
def app_url():
    with _serve(dict(os.environ)) as url:
        yield url


@pytest.fixture(scope="module")
def fit_cache(tmp_path_factory) -> Path:
    """The user cache (MOT_VIZ_CACHE) of the fit test's server: a temporary folder, so the fit it makes (and its
    bank) land there and never in ~/.cache; the converted bundled models are linked from the real cache."""
    from mot_viz.model_cache import cache_dir

    models = cache_dir() / "models"
    models.mkdir(parents=True, exist_ok=True)  # converted on first use, once for every test and the app
    cache = tmp_path_factory.mktemp("mot_viz_cache")
    (cache / "models").symlink_to(models, target_is_directory=True)
    return cache


@pytest.fixture(scope="module")
def fit_app_url(fit_cache):
    """A server of the fit test's own: its user cache is `fit_cache`, and the click comes in the first session
    right after the server's first run (which Streamlit runs through its legacy pages/ shim)."""
    with _serve({**os.environ, "MOT_VIZ_CACHE": str(fit_cache)}) as url:
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
        page.wait_for_timeout(500)  # let plotly finish drawing before the screenshot
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
    # the last page is Shift analysis: its shipped sweep (results/shift) draws below the checkpoint's own window
    shipped = page.get_by_role("heading", name="Shipped sweep (results/shift)")
    shipped.scroll_into_view_if_needed()
    assert page.locator(".js-plotly-plot").count() >= 3 + 4  # the window's 3 figures, the sweep's 3 + ρ_k
    _assert_no_failure(page)
    page.wait_for_timeout(500)
    page.screenshot(path=str(SCREENSHOTS / "shift_sweep.png"))
    assert all((SCREENSHOTS / f"{n}.png").stat().st_size > 10_000
               for n in ["overview", "shift_sweep", *PAGES.values()])


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
    caption = page.get_by_text("smollm2-135m → gemma3-270m · checkpoint")
    assert f"context: {label} #{example}" in caption.inner_text() and "smollm2-to-gemma3" in caption.inner_text()
    sidebar = page.locator('[data-testid="stSidebarContent"]')
    assert sidebar.get_by_label("Example (0–49)").input_value() == str(example)
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
        # a rerun in the first tab (another page option) keeps its own selection and writes the option to its URL
        first.get_by_text("shared characters", exact=True).click()
        _wait_until_settled(first)
        _assert_no_failure(first)
        _assert_view(first, "squad", "SQuAD", 2, "shared characters")
        assert _query(first)["align.view"] == "shared characters"
        _assert_view(second, "boolq", "BoolQ", 1, "shared characters")
        # the copied link (the address bar) reopens the same view in a third tab
        third = _open_alignment(context, first.url)
        _assert_view(third, "squad", "SQuAD", 2, "shared characters")
        # another page keeps the view in its URL (the first link is the landing page; it is titled "app" instead of
        # "Overview" when this server's first session opened a page's URL before any ran app.py)
        third.locator('[data-testid="stSidebarNav"] a').first.click()
        third.get_by_text("Target tokens").wait_for()
        _wait_until_settled(third)
        assert _query(third) == _query(first)
    finally:
        context.close()


def test_fit_a_linear_translator_for_the_bundled_pair(fit_app_url, fit_cache, browser):
    """The sidebar's "Fit a linear translator" end to end on the real pair, clicked in a fresh server's first
    session: a bank, a ridge fit, a checkpoint in the user cache chosen for the pair, and a translation with it."""
    page = _open(browser, fit_app_url)
    page.get_by_text("Target tokens").wait_for()
    _wait_until_settled(page)
    sidebar = page.locator('[data-testid="stSidebarContent"]')
    sidebar.get_by_text("Fit a linear translator for this pair").click()  # the expander (a pair with a checkpoint)
    sidebar.get_by_role("button", name="Fit a linear translator", exact=True).click()
    sidebar.locator('[data-testid="stProgress"]').wait_for(timeout=60_000)  # the click started the fit
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
