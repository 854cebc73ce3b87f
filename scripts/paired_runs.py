"""Paired differences across evaluation runs on the same examples (same dataset, n and seed).

    .venv/bin/python scripts/paired_runs.py \\
        results/eval/mid-squad:mot=MoT results/eval/mid-squad:second=linear \\
        results/eval/mid-controls-squad:mean=mean --pairs MoT:linear MoT:mean linear:mean

Each input is FOLDER:CONDITION=LABEL (a condition of any results folder's examples.csv, renamed LABEL; read by
mot_viz.analysis.eval_runs, as the app's Evaluations page reads it); every pair A:B is the mean of A − B over the
examples both ran, per dataset (or document length, or turn), with a 95% bootstrap interval and the number of
examples each side wins (mot_viz.eval.report.paired_differences), printed as a markdown table.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from mot_viz.analysis.eval_runs import condition_rows, open_run
from mot_viz.cli import run_cli
from mot_viz.errors import ConfigError
from mot_viz.eval.report import paired_differences, paired_markdown


def paired_runs(runs: list[str], pairs: list[str], n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """The paired differences of the pairs LABEL_A:LABEL_B over the runs FOLDER:CONDITION=LABEL."""
    frames = []
    for spec in runs:
        folder, _, rest = spec.rpartition(":")
        condition, equals, label = rest.partition("=")
        if not (folder and equals and condition and label):
            raise ConfigError(f"{spec!r} is not FOLDER:CONDITION=LABEL. Write e.g. results/eval/smollm2-to-gemma3-mid-"
                              "squad300:mot=MoT.")
        frames.append(condition_rows(open_run(folder), condition, label))
    split = [tuple(p.split(":", 1)) for p in pairs]
    labels = {frame["condition"].iloc[0] for frame in frames}
    unknown = [p for p, pair in zip(pairs, split) if len(pair) != 2 or not set(pair) <= labels]
    if unknown:
        raise ConfigError(f"--pairs {' '.join(unknown)}: each pair is LABEL_A:LABEL_B of the labels given "
                          f"({', '.join(sorted(labels))}).")
    return paired_differences(pd.concat(frames), pairs=split, n_boot=n_boot, seed=seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="FOLDER:CONDITION=LABEL")
    parser.add_argument("--pairs", nargs="+", required=True, help="LABEL_A:LABEL_B (A − B)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples per interval")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resampling")
    args = parser.parse_args(argv)
    return run_cli(lambda: print(paired_markdown(paired_runs(args.runs, args.pairs, args.bootstrap, args.seed))))


if __name__ == "__main__":
    sys.exit(main())
