"""Fresh start of the app as a user meets it (a measurement, not a test).

    .venv/bin/python benchmarks/fresh_start.py [--repeats 2] [--label "what changed"] [--out benchmarks/fresh_start.md]

Each repeat starts a new ``streamlit run app.py`` (a fresh process: nothing cached in memory; the bundled models
must already be converted in the user cache, as after the README's setup) and, in headless Chromium, times:

* server: from launching the process until its health check answers;
* Overview: from launching the process until the Overview shows the translation's numbers (the "Target tokens"
  metric and the cost panel) and the script run has finished;
* first Answers visit: from clicking "Answers" in the sidebar until its figure is drawn and the run has finished.

Run it on an idle machine. It writes the current table to --out (git keeps earlier ones).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

from mot_viz.app.server import serve_app
from mot_viz.fsutil import write_text_atomic

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TIMEOUT_MS = 600_000
SETTLED = """() => !document.querySelector('[data-testid="stStatusWidget"]')
                   && !document.querySelector('[data-stale="true"]')"""


def one_start(browser) -> dict[str, float]:
    t0 = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "MOT_VIZ_TEST_MODELS"}
    with serve_app(env) as url:
        up = time.perf_counter() - t0
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url)
        page.get_by_text("Target tokens").wait_for()
        page.get_by_text("What it costs").wait_for()
        page.wait_for_function(SETTLED, polling=100)
        overview = time.perf_counter() - t0
        t1 = time.perf_counter()
        page.get_by_role("link", name="Answers", exact=True).first.click()
        page.get_by_role("heading", name="Answers", exact=True).wait_for()
        page.locator(".js-plotly-plot").first.wait_for(state="visible")
        page.wait_for_function(SETTLED, polling=100)
        answers = time.perf_counter() - t1
        page.close()
    return {"server": up, "overview": overview, "answers": answers}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="fresh starts timed (the median is reported)")
    parser.add_argument("--label", default="the app as it is", help="heading of the new table (what changed)")
    parser.add_argument("--out", default="benchmarks/fresh_start.md",
                        help="markdown file the table is written to (git keeps earlier ones)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    load = os.getloadavg()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
        runs = []
        for i in range(args.repeats):
            runs.append(one_start(browser))
            print(f"start {i + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in runs[-1].items()), flush=True)
        browser.close()
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    title = "# Fresh start of the app"
    targets = {"server": None, "overview": 15.0, "answers": 8.0}
    names = {"server": "server answers its health check", "overview": "launch → Overview shows the translation",
             "answers": "click → first Answers page drawn"}
    lines = [title, "", f"## {datetime.date.today()}: {args.label}", "",
             f"`python benchmarks/fresh_start.py --repeats {args.repeats}` on {platform.machine()}, "
             f"{os.cpu_count()} CPU cores; load average before the run {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}. "
             "Each start is a new `streamlit run app.py` process (the bundled models already converted in the user "
             "cache), timed in headless Chromium; medians of the starts, each start's times in the last column.", "",
             "| step | median (s) | target | met | every start (s) |", "|---|---:|---:|---|---|"]
    for key, value in med.items():
        target = targets[key]
        lines.append(f"| {names[key]} | {value:.1f} | {'' if target is None else f'{target:.0f}'} | "
                     f"{'' if target is None else ('yes' if value <= target else 'no')} | "
                     f"{', '.join(f'{r[key]:.1f}' for r in runs)} |")
    write_text_atomic(Path(args.out), title + "\n\n" + "\n".join(lines[1:]).strip() + "\n")  # git keeps earlier runs
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
