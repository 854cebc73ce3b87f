"""Per window layer: how much a translator's fidelity differs from a baseline's on the same held-out contexts.

    .venv/bin/python research/probes/fidelity_per_layer.py --baseline results/fidelity/smollm2-to-gemma3-mid-linear \
        --candidates results/fidelity/smollm2-to-gemma3-mid [more …] [--corpus squad lambada-heldout] \
        [--metrics centered_cos_k centered_cos_v]

Reads the per-context CSVs that ``python -m mot_viz.eval.fidelity --out DIR`` writes (``DIR/<checkpoint>-<corpus>.csv``;
give each as ``DIR/<checkpoint>``), pairs candidate and baseline by context and layer, and prints a markdown table:
per layer, the mean over contexts of (candidate − baseline) with its 95% percentile-bootstrap interval over
contexts (mot_viz.eval.qa_metrics.bootstrap_ci, seed 0). Bold: the interval excludes zero.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from mot_viz.eval.qa_metrics import bootstrap_ci


def per_layer(baseline: Path, candidate: Path, corpus: str, metric: str) -> dict[int, str]:
    """layer -> "mean [lo, hi]" of candidate − baseline over the contexts both measured."""
    read = lambda prefix: pd.read_csv(f"{prefix}-{corpus}.csv").query("candidate == 'translator'")
    both = read(candidate).merge(read(baseline), on=["context", "layer"], suffixes=("", "_base"))
    cells = {}
    for layer, g in both.groupby("layer"):
        ci = bootstrap_ci(g[metric] - g[f"{metric}_base"])
        text = f"{ci.mean:+.4f} [{ci.lo:+.4f}, {ci.hi:+.4f}]"
        cells[int(layer)] = f"**{text}**" if ci.lo > 0 or ci.hi < 0 else text
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="CSV prefix of the baseline (DIR/<checkpoint>)")
    parser.add_argument("--candidates", type=Path, nargs="+", required=True, help="CSV prefixes of the candidates")
    parser.add_argument("--corpus", nargs="+", default=["squad", "lambada-heldout"])
    parser.add_argument("--metrics", nargs="+", default=["centered_cos_k", "centered_cos_v"])
    args = parser.parse_args()
    rows, layers = [], set()
    for candidate in args.candidates:
        for corpus in args.corpus:
            for metric in args.metrics:
                cells = per_layer(args.baseline, candidate, corpus, metric)
                layers |= set(cells)
                rows.append((candidate.name, corpus, metric, cells))
    order = sorted(layers)
    print(f"Minus `{args.baseline.name}`, mean over contexts [95% bootstrap interval]\n")
    print("| candidate | text | metric | " + " | ".join(f"layer {l}" for l in order) + " |")
    print("|---|---|---|" + "---|" * len(order))
    for name, corpus, metric, cells in rows:
        print(f"| {name} | {corpus} | {metric} | " + " | ".join(cells.get(l, "—") for l in order) + " |")


if __name__ == "__main__":
    main()
