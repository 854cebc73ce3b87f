"""Assemble the results pages' tables (docs/results.md, docs/results/*.md) from results/eval/*/,
results/long/*-stacks/ and pretrained/*/config.json.

    .venv/bin/python scripts/results_md.py > /tmp/tables.md
    .venv/bin/python scripts/results_md.py --write    # rewrite the pages' generated tables from their folders
    .venv/bin/python scripts/results_md.py --record   # also write each checkpoint's results into its config.json

Prints one section per evaluation folder (its command, date and table) and one table of how each
shipped checkpoint was trained. ``--write`` rewrites, in every results page, only what lies between a marker
``<!-- generated: results/eval/<folder> -->`` (or ``results/long/<folder>-stacks``) and the next
``<!-- end generated -->``: that folder's table as this script prints it. The prose around the tables, and the
tables assembled from several folders, are written by hand (tests/unit/test_results_pages.py checks that every
generated table matches its folder).
``--record`` stores every condition's metric, interval and retained share, with the folder and command
that measured it, under ``metrics.evaluation`` of each evaluated ``pretrained/*/config.json`` (the
app's Training page shows it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
# the results pages: the index and one page per study
PAGES = (ROOT / "docs" / "results.md", ROOT / "docs" / "results")
GENERATED = re.compile(r"(<!-- generated: (?P<source>[^ ]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)

from mot_viz.eval.qa_settings import EvalSettings
from mot_viz.eval.report import markdown_table, measured_these_weights, paired_differences, paired_markdown
from mot_viz.sharing.linear import LINEAR
from mot_viz.sharing.mean import MEAN
from mot_viz.sharing.registry import REFERENCE, SECOND, TRANSLATED

# (first checkpoint, second checkpoint): paired over the examples both were evaluated on, first − second
COMPARISONS = [("pretrained/smollm2-to-gemma3-mid", "pretrained/smollm2-to-gemma3-mid-single")]


def training_table() -> str:
    lines = ["| checkpoint | source → target | variant | window (target layers) | steps × rows | train time | final CE / MSE_K / MSE_V |",
             "|---|---|---|---|---|---|---|"]
    for cfg_file in sorted((ROOT / "pretrained").glob("*/config.json")):
        cfg = json.loads(cfg_file.read_text())
        t, tr = cfg.get("training", {}), cfg["translator"]
        last = (cfg.get("metrics") or {}).get("final_log") or {}
        rows = t.get("batch_size", 0) * t.get("grad_accum_steps", 0)
        window = [c["dst_layer_idx"] for c in cfg["channels"]]
        variant = f"{tr['variant']}" + (f" ({tr['num_experts']} experts, top-{tr['top_k']})" if tr["variant"] == "mot" else "")
        seconds = t.get("train_seconds")
        lines.append(
            f"| `{cfg_file.parent.name}` | {cfg['source']['name']} → {cfg['target']['name']} | {variant}, dim {tr['dim']} "
            f"| {window[0]}–{window[-1]} | {t.get('steps_done')} × {rows} | {seconds / 60:.0f} min |"
            f" {last.get('ce', float('nan')):.2f} / {last.get('mse_k', float('nan')):.3f} / {last.get('mse_v', float('nan')):.3f} |"
            if seconds else f"| `{cfg_file.parent.name}` | … | | | | | |"
        )
    return "\n".join(lines)


def examples_by_checkpoint() -> dict[str, pd.DataFrame]:
    """Every evaluated example row, gathered per checkpoint across folders (one run may be split over several)."""
    frames: dict[str, list[pd.DataFrame]] = {}
    for folder, meta in eval_folders():
        frames.setdefault(meta["settings"]["checkpoint"], []).append(pd.read_csv(folder / "examples.csv"))
    return {k: pd.concat(v).drop_duplicates(["dataset", "id", "condition"]) for k, v in frames.items()}


def comparison_table(first: str, second: str, frames: dict[str, pd.DataFrame]) -> str | None:
    if first not in frames or second not in frames:
        return None
    a = frames[first][frames[first]["condition"] == TRANSLATED]
    b = frames[second][frames[second]["condition"] == TRANSLATED].assign(condition=SECOND)
    ids = set(zip(a["dataset"], a["id"])) & set(zip(b["dataset"], b["id"]))
    both = pd.concat([a, b])
    both = both[[pair in ids for pair in zip(both["dataset"], both["id"])]]
    return paired_markdown(paired_differences(both, pairs=((TRANSLATED, SECOND),)))


def eval_folders() -> list[tuple[Path, dict]]:
    """Every finished evaluation folder with its summary.json, in name order."""
    folders = sorted((ROOT / "results" / "eval").glob("*/"))
    return [(f, json.loads((f / "summary.json").read_text())) for f in folders
            if (f / "summary.csv").exists() and (f / "summary.json").exists()]


def command_of(folder: Path, meta: dict) -> str:
    return EvalSettings.from_json(meta["settings"]).command(Path("results/eval") / folder.name)


def eval_section(folder: Path) -> str:
    """An evaluation folder's command, date, table and paired differences (python -m mot_viz.eval.evaluate)."""
    meta = json.loads((folder / "summary.json").read_text())
    out = [f"`{command_of(folder, meta)}` ({meta['date']}; prompts: {meta['settings'].get('prompt', 'plain')}; "
           f"skipped examples: {meta['skipped']})", "", markdown_table(pd.read_csv(folder / "summary.csv"))]
    paired = paired_differences(pd.read_csv(folder / "examples.csv"))
    if len(paired):
        out += ["", "Paired over the same examples:", "", paired_markdown(paired)]
    return "\n".join(out)


def record_in_configs() -> list[Path]:
    """Write each pretrained checkpoint's evaluation results into its config.json; returns the files written."""
    records: dict[Path, dict] = {}
    for folder, meta in eval_folders():
        if meta["settings"].get("replay", "checkpoint") != "checkpoint":
            continue  # measured with another replay than the checkpoint's own: not its result
        summary = pd.read_csv(folder / "summary.csv")
        # a --second checkpoint's rows are its own results too: its "second" condition is its "mot"
        views = [(meta["settings"]["checkpoint"], summary[summary["condition"] != "second"])]
        if meta["settings"].get("second"):
            second = summary[summary["condition"].isin([REFERENCE, SECOND])].replace(
                {"condition": {SECOND: TRANSLATED}})
            views.append((meta["settings"]["second"], second))
        for checkpoint, table in views:
            config = ROOT / checkpoint / "config.json"
            if not config.is_file() or config.parent.parent != ROOT / "pretrained":
                continue
            if not measured_these_weights(f"results/eval/{folder.name}", meta, checkpoint, config):
                continue
            for dataset, rows in table.groupby("dataset", sort=False):
                records.setdefault(config, {})[dataset] = {
                    "results": f"results/eval/{folder.name}", "command": command_of(folder, meta), "date": meta["date"],
                    "prompts": meta["settings"].get("prompt", "plain"),
                    "conditions": {r.condition: {"n": int(r.n), r.metric: round(float(r.mean), 4),
                                                 "ci95": [round(float(r.ci_low), 4), round(float(r.ci_high), 4)],
                                                 "retained": round(float(r.retained), 4)} for r in rows.itertuples()},
                }
    for config, evaluation in records.items():
        cfg = json.loads(config.read_text())
        cfg.setdefault("metrics", {})["evaluation"] = evaluation
        config.write_text(json.dumps(cfg, indent=2) + "\n")
    return sorted(records)


def signed(x: float) -> str:
    return f"{x:+.3f}".replace("-", "−")


def stacks_table(folder: Path) -> str:
    """A results/long/*-stacks folder's table: each condition's F1 per length, MoT's retention and gap closed (the
    share of the context's gain captured, (MoT − no context) ÷ (native − no context)) and its paired differences
    against the mean-vector window and the linear map (python -m mot_viz.eval.long_context)."""
    summary = pd.read_csv(folder / "summary.csv")
    paired = pd.read_csv(folder / "paired.csv")
    out = ["| length (tokens) | n | native | no context | mean-vector window | linear map | "
           "MoT | MoT retention [95% CI] | MoT gap closed [95% CI] | MoT − mean vector [95% CI] "
           "| MoT − linear [95% CI] |", "|---:|---:|---|---|---|---|---|---|---|---|---|"]
    for budget, part in summary.groupby("budget", sort=True):
        by = part.set_index("condition")
        f1 = lambda c: f"{by.loc[c, 'mean']:.3f}" if c in by.index else "–"
        diffs = []
        for other in (MEAN.name, LINEAR.name):
            row = paired[(paired.dataset == f"stacks {budget} tokens") & (paired.a == TRANSLATED) & (paired.b == other)]
            diffs.append("–" if row.empty else f"{signed(row['diff'].iloc[0])} [{signed(row['ci_low'].iloc[0])}, "
                                                f"{signed(row['ci_high'].iloc[0])}]")
        m = by.loc[TRANSLATED]
        gap = [f"{m[c]:.2f}".replace("-", "−") for c in ("gap_closed", "gap_closed_ci_low", "gap_closed_ci_high")]
        out.append(f"| {budget:,} | {int(m['n'])} | {f1('native')} | {f1('no_context')} | {f1('mean')} | "
                   f"{f1('linear')} | {f1('mot')} | {m['retention']:.0%} [{m['retention_ci_low']:.0%}, "
                   f"{m['retention_ci_high']:.0%}] | {gap[0]} [{gap[1]}, {gap[2]}] | {diffs[0]} | {diffs[1]} |")
    return "\n".join(out)


def long_context_tables() -> str:
    """One table per results/long/*-stacks folder (stacks_table)."""
    return "\n".join(f"### `{folder.name}`\n\n{stacks_table(folder)}\n"
                     for folder in sorted((ROOT / "results" / "long").glob("*-stacks")))


def generated_table(source: str, root: Path = ROOT) -> str:
    """What a page's marker `<!-- generated: SOURCE -->` holds: an evaluation folder's section (results/eval/*) or
    a distractor-stacks folder's table (results/long/*-stacks); SOURCE is relative to the repository's root."""
    folder = root / source
    if source.startswith("results/eval/") and (folder / "summary.json").is_file():
        return eval_section(folder)
    if source.startswith("results/long/") and source.endswith("-stacks") and (folder / "summary.csv").is_file():
        return stacks_table(folder)
    raise SystemExit(f"<!-- generated: {source} -->: no such results folder with a generated table; a marker names "
                     "a results/eval/<folder> or results/long/<folder>-stacks folder that holds its summary")


def regenerate(text: str, root: Path = ROOT) -> str:
    """The page with every generated table rewritten from its folder, and nothing outside the markers touched."""
    return GENERATED.sub(lambda m: f"{m[1]}{generated_table(m['source'], root)}\n{m[4]}", text)


def stale_tables(text: str, root: Path = ROOT) -> list[str]:
    """The folders whose generated table in this page no longer matches what the folder gives."""
    return [m["source"] for m in GENERATED.finditer(text) if m["body"] != generated_table(m["source"], root) + "\n"]


def results_pages() -> list[Path]:
    index, studies = PAGES
    return [index, *sorted(studies.glob("*.md"))]


def write_pages() -> list[Path]:
    """Rewrite the generated tables of every results page; returns the pages that changed."""
    changed = []
    for page in results_pages():
        text = page.read_text()
        new = regenerate(text)
        if new != text:
            page.write_text(new)
            changed.append(page)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the results pages' tables from results/eval/, results/long/ "
                                                 "and pretrained/; --write rewrites the pages' generated tables.")
    parser.add_argument("--record", action="store_true",
                        help="also write each checkpoint's results into its config.json (metrics.evaluation)")
    parser.add_argument("--write", action="store_true",
                        help="rewrite every generated table of docs/results.md and docs/results/*.md from its folder")
    args = parser.parse_args(argv)
    if args.record:
        for config in record_in_configs():
            print(f"recorded evaluation results in {config.relative_to(ROOT)}", file=sys.stderr)
    if args.write:
        for page in write_pages():
            print(f"rewrote the generated tables of {page.relative_to(ROOT)}", file=sys.stderr)
        return 0
    print("## How the shipped checkpoints were trained\n")
    print(training_table())
    frames = examples_by_checkpoint()
    for first, second in COMPARISONS:
        table = comparison_table(first, second, frames)
        if table:
            print(f"\n### `{first}` (mot) − `{second}` (second), paired over the examples both ran\n")
            print(table)
    print("\n## Long context\n")
    print(long_context_tables())
    for folder, _ in eval_folders():
        print(f"\n### `{folder.name}`\n")
        print(eval_section(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
