"""Render the docs' figures to PNG from saved results (the same plotly figures as the app's pages).

    .venv/bin/python scripts/doc_figures.py shift results/shift/<sweep> [--starts 0,9,14] [--out docs/figures/shift]
    .venv/bin/python scripts/doc_figures.py long results/long/<checkpoint>-stacks [--out docs/figures/long]
    .venv/bin/python scripts/doc_figures.py conversation results/conversation/<checkpoint>-coqa
        [--out docs/figures/conversation]
    .venv/bin/python scripts/doc_figures.py methods results [--out docs/figures/methods]

Each figure is written as a self-contained HTML file (plotly.js inlined, nothing fetched) and photographed
in Debian's headless Chromium through Playwright, the same browser the app's browser test uses.
Writes <out>/<results folder>_<figure>.png and prints their paths.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

import pandas as pd

from mot_viz.analysis.multi_agent_figures import conversation_figure
from mot_viz.analysis.long_context import retention_curve_figure
from mot_viz.analysis.method_figures import quality_time_figure, shipped_points, side_by_side
from mot_viz.analysis.shift import SweepResult
from mot_viz.cli import run_cli
from mot_viz.fsutil import check_out_place
from mot_viz.analysis.shift.figures import (correction_vs_start_figure, metric_kl_figure, rho_trajectory_figure,
                                            shift_vs_start_figure)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def sweep_figures(result: SweepResult, trajectory_starts: list[int]) -> dict:
    """name -> plotly figure: the two failure modes, the correction and the output against the start, and ρ_k."""
    figures = {
        "shift_vs_start": shift_vs_start_figure(result.summary),
        "shift_vs_start_relative": shift_vs_start_figure(result.summary, relative=True),
        "correction_vs_start": correction_vs_start_figure(result.summary),
        "metric_kl": metric_kl_figure(result.summary, result.meta.get("metric")),
    }
    for start in trajectory_starts:
        traj = result.trajectories[result.trajectories["start"] == start]
        figures[f"rho_start{start}"] = rho_trajectory_figure(traj, 0, title=f"ρ_k at window start {start}, answer token 0")
    return figures


def render(figures: dict, out: Path, prefix: str, width: int = 1000, height: int = 520) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": width + 40, "height": height + 40})
        for name, fig in figures.items():
            html = Path(tmp) / f"{name}.html"
            fig.update_layout(width=width, height=height)
            fig.write_html(html, include_plotlyjs=True, full_html=True, config={"displayModeBar": False})
            page.goto(html.as_uri())
            plot = page.locator(".js-plotly-plot").first
            plot.wait_for(state="visible")
            page.wait_for_timeout(300)  # let plotly finish drawing
            path = out / f"{prefix}_{name}.png"
            plot.screenshot(path=str(path))
            written.append(path)
        browser.close()
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="kind", required=True, help="which results")
    shift = sub.add_parser("shift", help="a sweep written by scripts/shift_sweep.py (docs/shift.md)")
    shift.add_argument("--starts", default=None, help="comma-separated starts for ρ_k plots (default: first, last)")
    sub.add_parser("long", help="a folder written by python -m mot_viz.eval.long_context "
                                "(docs/results/long-documents.md)")
    sub.add_parser("conversation", help="a folder written by python -m mot_viz.eval.conversation "
                                        "(docs/results/conversations-and-hub.md)")
    sub.add_parser("methods", help="the results folder (results/): each method's mean F1 against its mean seconds, "
                                   "one point per results folder and setting "
                                   "(docs/results/other-ways-of-sharing.md)")
    for command in sub.choices.values():
        command.add_argument("results", type=Path, help="the results folder")
        command.add_argument("--out", type=Path, default=None, help="folder the figures are written to "
                                                                    "(default: docs/figures/<kind>)")
        command.add_argument("--overwrite", action="store_true", help="write into an --out folder holding other files")
    args = parser.parse_args()
    out = args.out or REPO / "docs" / "figures" / args.kind
    check_out_place(out, ours=lambda path: path.suffix == ".png", overwrite=args.overwrite)  # before any work
    if not Path(CHROMIUM).is_file():
        print("error: Chromium is not installed (apt-get install -y chromium, or bash scripts/setup.sh --test)",
              file=sys.stderr)
        return 2
    if args.kind == "shift":
        result = SweepResult.load(args.results)
        starts = sorted(result.summary["start"].unique().tolist())
        chosen = [int(s) for s in args.starts.split(",")] if args.starts else sorted({starts[0], starts[-1]})
        figures = sweep_figures(result, chosen)
    elif args.kind == "long":
        figures = {"retention": retention_curve_figure(pd.read_csv(args.results / "summary.csv"))}
    elif args.kind == "methods":
        points = side_by_side(shipped_points(args.results))
        figures = {"quality_time": quality_time_figure(points[points["metric"] == "F1"])}
    else:
        figures = {"turns": conversation_figure(pd.read_csv(args.results / "summary.csv"))}
    for path in render(figures, out, args.results.name):
        print(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
