"""Paired differences across evaluation runs on the same examples (same dataset, n and seed).

    .venv/bin/python scripts/paired_runs.py \\
        results/eval/mid-squad:mot=MoT results/eval/mid-squad:second=linear \\
        results/eval/mid-controls-squad:mean=mean --pairs MoT:linear MoT:mean linear:mean

Each input is FOLDER:CONDITION=LABEL (a condition of that folder's examples.csv, renamed LABEL); every
pair A:B is the mean of A − B over the examples both ran, with a 95% bootstrap interval and the number of
examples each side wins (mot_viz.eval.report.paired_differences), printed as a markdown table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


from mot_viz.eval.report import paired_differences, paired_markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="FOLDER:CONDITION=LABEL")
    parser.add_argument("--pairs", nargs="+", required=True, help="LABEL_A:LABEL_B (A − B)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples per interval")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resampling")
    args = parser.parse_args(argv)
    frames = []
    for spec in args.runs:
        folder, rest = spec.rsplit(":", 1)
        condition, label = rest.split("=", 1)
        df = pd.read_csv(Path(folder) / "examples.csv")
        part = df[df["condition"] == condition].assign(condition=label)
        if part.empty:
            parser.error(f"{folder} has no rows of condition '{condition}'")
        frames.append(part)
    pairs = [tuple(p.split(":", 1)) for p in args.pairs]
    paired = paired_differences(pd.concat(frames), pairs=pairs, n_boot=args.bootstrap, seed=args.seed)
    print(paired_markdown(paired))
    return 0


if __name__ == "__main__":
    sys.exit(main())
