"""The layer patching findings of docs/results/lost-answers.md, from a results folder's patching.csv
(python -m mot_viz.eval.patching).

    .venv/bin/python scripts/patching_findings.py results/eval/smollm2-to-gemma3-mid-squad300

Per method: how many examples were scanned and lost, the mean gap; per target layer and group, the share of the
summed gold-answer log-probability gap won back by restoring it (over every scanned example and over the lost
answers) and lost by breaking it, with 95% bootstrap bands (mot_viz.analysis.patching.gap_shares); and the Spearman
rank correlation over layers between a layer's mean relative K/V error and its mean cost. Markdown on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mot_viz.analysis import eval_runs
from mot_viz.analysis import patching as patching_analysis
from mot_viz.eval.patching import PATCHING_FILE, PATCHING_SETTINGS, read_patching


def _band(row) -> str:
    return f"{row.share:+.2f} [{row.low:+.2f}, {row.high:+.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--bootstrap", type=int, default=1000)
    args = parser.parse_args(argv)
    folder = Path(args.results)
    patching = read_patching(folder / PATCHING_FILE)
    settings = json.loads((folder / PATCHING_SETTINGS).read_text())
    table = eval_runs.wide_table(eval_runs.open_run(folder))
    print(f"`{folder}`: {patching['id'].nunique()} examples scanned; settings {json.dumps(settings)}\n")
    for method in dict.fromkeys(patching["method"]):
        everyone = sorted(set(patching.loc[patching["method"] == method, "id"]))
        lost = patching_analysis.lost_examples(patching, table, method)
        shares = {name: patching_analysis.gap_shares(patching, method, ids, direction, n_boot=args.bootstrap)
                  .set_index("target")
                  for name, ids, direction in (("restore, all", everyone, "restore"), ("break, all", everyone, "break"),
                                               ("restore, lost", lost, "restore"))}
        gap = shares["restore, all"]["gap"].iloc[0]
        print(f"### {method}: {len(everyone)} examples, mean gap {gap:.3f} nats; {len(lost)} lost answers"
              + (f" (mean gap {shares['restore, lost']['gap'].iloc[0]:.3f})" if lost else "") + "\n")
        print("| target | restoring, every example | breaking, every example | restoring, lost answers |")
        print("|---|---|---|---|")
        for target in shares["restore, all"].index:
            cells = [_band(shares[k].loc[target]) if target in shares[k].index else "" for k in shares]
            print(f"| {target} | " + " | ".join(cells) + " |")
        errors = patching_analysis.layer_rows(patching[patching["method"] == method]).groupby("layer")[
            ["K_rel_l2", "V_rel_l2"]].mean()
        print("\nLargest mean relative error: "
              + "; ".join(f"{kv[0]} at layers " + ", ".join(f"{l} ({errors.loc[l, kv]:.2f})"
                                                            for l in errors[kv].nlargest(3).index)
                          for kv in ("K_rel_l2", "V_rel_l2")))
        rho = patching_analysis.error_cost_correlation(patching, method)
        print("Spearman ρ over the 18 layers, mean relative error against mean cost (every example): "
              + "; ".join(f"{r.direction} vs {r.error.split('_')[0]} error {r.spearman:+.2f}" for r in rho.itertuples())
              + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
