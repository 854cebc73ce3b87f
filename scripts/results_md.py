"""Assemble docs/RESULTS.md's tables from results/eval/*/ and pretrained/*/config.json.

    .venv/bin/python scripts/results_md.py > /tmp/tables.md

Prints one section per evaluation folder (its command, date and table) and one table of how each
shipped checkpoint was trained. The prose around the tables in docs/RESULTS.md is written by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mot_viz.evaluate import markdown_table  # noqa: E402


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


def main() -> int:
    print("## How the shipped checkpoints were trained\n")
    print(training_table())
    for folder in sorted((ROOT / "results" / "eval").glob("*/")):
        summary = folder / "summary.csv"
        if not summary.exists():
            continue
        meta = json.loads((folder / "summary.json").read_text())
        s = meta["settings"]
        print(f"\n### `{folder.name}`\n")
        print(f"`python -m mot_viz.evaluate --checkpoint {s['checkpoint']}"
              + (f" --second {s['second']}" if s.get("second") else "")
              + f" --datasets {' '.join(s['datasets'])} --n {s['n']} --seed {s['seed']} --out results/eval/{folder.name}` "
              f"({meta['date']}; skipped examples: {meta['skipped']})\n")
        print(markdown_table(pd.read_csv(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
