"""Assemble docs/results.md's tables from results/eval/*/, results/long/*-stacks/ and pretrained/*/config.json.

    .venv/bin/python scripts/results_md.py > /tmp/tables.md
    .venv/bin/python scripts/results_md.py --record   # also write each checkpoint's results into its config.json

Prints one section per evaluation folder (its command, date and table) and one table of how each
shipped checkpoint was trained. The prose around the tables in docs/results.md is written by hand.
``--record`` stores every condition's metric, interval and retained share, with the folder and command
that measured it, under ``metrics.evaluation`` of each evaluated ``pretrained/*/config.json`` (the
app's Training page shows it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]

from mot_viz.eval.qa_settings import EvalSettings
from mot_viz.eval.report import markdown_table, measured_these_weights, paired_differences, paired_markdown

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
    a = frames[first][frames[first]["condition"] == "mot"]
    b = frames[second][frames[second]["condition"] == "mot"].assign(condition="second")
    ids = set(zip(a["dataset"], a["id"])) & set(zip(b["dataset"], b["id"]))
    both = pd.concat([a, b])
    both = both[[pair in ids for pair in zip(both["dataset"], both["id"])]]
    return paired_markdown(paired_differences(both, pairs=(("mot", "second"),)))


def eval_folders() -> list[tuple[Path, dict]]:
    """Every finished evaluation folder with its summary.json, in name order."""
    folders = sorted((ROOT / "results" / "eval").glob("*/"))
    return [(f, json.loads((f / "summary.json").read_text())) for f in folders
            if (f / "summary.csv").exists() and (f / "summary.json").exists()]


def command_of(folder: Path, meta: dict) -> str:
    return EvalSettings.from_json(meta["settings"]).command(Path("results/eval") / folder.name)


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
            second = summary[summary["condition"].isin(["native", "second"])].replace({"condition": {"second": "mot"}})
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


def long_context_tables() -> str:
    """One table per results/long/*-stacks folder: each condition's F1 per length, MoT's retention and gap closed
    (the share of the context's gain captured, (MoT − no context) ÷ (native − no context)) and its paired
    differences against the mean-vector window and the linear map (python -m mot_viz.eval.long_context)."""
    out = []
    for folder in sorted((ROOT / "results" / "long").glob("*-stacks")):
        summary = pd.read_csv(folder / "summary.csv")
        paired = pd.read_csv(folder / "paired.csv")
        out += [f"### `{folder.name}`", "", "| length (tokens) | n | native | no context | mean-vector window | linear map | "
                "MoT | MoT retention [95% CI] | MoT gap closed [95% CI] | MoT − mean vector [95% CI] "
                "| MoT − linear [95% CI] |", "|---:|---:|---|---|---|---|---|---|---|---|---|"]
        for budget, part in summary.groupby("budget", sort=True):
            by = part.set_index("condition")
            f1 = lambda c: f"{by.loc[c, 'mean']:.3f}" if c in by.index else "–"
            diffs = []
            for other in ("mean", "linear"):
                row = paired[(paired.dataset == f"stacks {budget} tokens") & (paired.a == "mot") & (paired.b == other)]
                diffs.append("–" if row.empty else f"{signed(row['diff'].iloc[0])} [{signed(row['ci_low'].iloc[0])}, "
                                                    f"{signed(row['ci_high'].iloc[0])}]")
            m = by.loc["mot"]
            out.append(f"| {budget:,} | {int(m['n'])} | {f1('native')} | {f1('no_context')} | {f1('mean')} | "
                       f"{f1('linear')} | {f1('mot')} | {m['retention']:.0%} [{m['retention_ci_low']:.0%}, "
                       f"{m['retention_ci_high']:.0%}] | {m['gap_closed']:.2f} [{m['gap_closed_ci_low']:.2f}, "
                       f"{m['gap_closed_ci_high']:.2f}] | {diffs[0]} | {diffs[1]} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print docs/results.md's tables from results/eval/ and pretrained/.")
    parser.add_argument("--record", action="store_true",
                        help="also write each checkpoint's results into its config.json (metrics.evaluation)")
    if parser.parse_args(argv).record:
        for config in record_in_configs():
            print(f"recorded evaluation results in {config.relative_to(ROOT)}", file=sys.stderr)
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
    for folder, meta in eval_folders():
        summary = folder / "summary.csv"
        print(f"\n### `{folder.name}`\n")
        print(f"`{command_of(folder, meta)}` ({meta['date']}; prompts: {meta['settings'].get('prompt', 'plain')}; "
              f"skipped examples: {meta['skipped']})\n")
        print(markdown_table(pd.read_csv(summary)))
        paired = paired_differences(pd.read_csv(folder / "examples.csv"))
        if len(paired):
            print("\nPaired over the same examples:\n")
            print(paired_markdown(paired))
    return 0


if __name__ == "__main__":
    sys.exit(main())
