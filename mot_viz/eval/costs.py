"""python -m mot_viz.eval.costs RESULTS: what each way of sharing the context hands over and costs, per stage, read
from an evaluation folder with relay rows (python -m mot_viz.eval.evaluate); writes costs.csv and costs.md there.
What each way hands over and what the target computes are the cost columns the evaluation wrote from the methods'
own cost functions (mot_viz.sharing.costs.cost_fields); this command only averages them, beside the seconds of each
stage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from ..cli import run_cli
from ..errors import ConfigError
from ..fsutil import check_out_place, write_csv_atomic, write_text_atomic
from ..sharing.costs import work_text
from ..sharing.registry import names

MESSAGES = names(lambda m: m.message)  # the ways of sharing that hand over a message (relay, relay_q)

# ----- what each way of sharing the context hands over and costs, from an evaluation's examples.csv ----------------

def sharing_costs(rows: pd.DataFrame) -> pd.DataFrame:
    """Per condition of an evaluation with relay rows (mot_viz.eval.evaluate's examples.csv): what the target is
    handed and what it computes over the context (the rows' cost columns, written by each method's own cost
    functions: NaN and "" for results written before the evaluation recorded them), the message's tokens, and the
    mean seconds of each stage (the source writing, the target's prefill of the message, building the cache,
    answering), over the examples every condition answered.

    The answer's seconds are the example's batch decoding shared evenly among its conditions (answers_from_caches),
    so a relay row's whole seconds (``seconds`` + ``ahead_seconds``) less its writing and prefill are every
    condition's answer share, and a cache's building seconds are its row's whole seconds less that share (native: the
    target's prefill; mot: every stage of the translation, the source's reading included). ``ahead_seconds``: the
    part of the building that can be done before the question (the source's prefill; relay's writing);
    ``after_question_seconds``: the rest, and the answer.
    """
    scored = rows[rows["condition"] != "skipped"]
    # results written before the work done ahead was apart hold it inside "seconds"
    ahead = scored["ahead_seconds"].fillna(0.0) if "ahead_seconds" in scored else 0.0 * scored["seconds"]
    scored = scored.assign(ahead_seconds=ahead, whole_seconds=scored["seconds"] + ahead)
    relayed = scored[scored["condition"].isin(MESSAGES)]
    if relayed.empty:
        raise ConfigError("these results have no relay rows: evaluate with --conditions ... relay relay_q")
    share = (relayed["whole_seconds"] - relayed["message_generate_seconds"] - relayed["message_prefill_seconds"])
    answer = pd.Series(share.to_numpy(), index=list(zip(relayed["dataset"], relayed["id"]))).groupby(level=0).mean()
    out = []
    for condition, part in scored.groupby("condition", sort=False):
        keys = list(zip(part["dataset"], part["id"]))
        share_here = answer.reindex(keys).to_numpy()
        relay_row = condition in MESSAGES
        costed = "handed_bytes" in part and part["handed_bytes"].notna().any()
        out.append({
            "condition": condition, "n": len(part),
            "context_tokens": float(part["context_tokens"].mean()),
            "message_tokens": float(part["message_tokens"].mean()) if relay_row else float("nan"),
            "handed_bytes": float(part["handed_bytes"].mean()) if costed else float("nan"),
            "target_work": str(part["target_work"].iloc[0]) if costed else "",
            "target_tokens": float(part["target_tokens"].mean()) if costed else float("nan"),
            "write_seconds": float(part["message_generate_seconds"].mean()) if relay_row else float("nan"),
            "read_seconds": float(part["message_prefill_seconds"].mean()) if relay_row else float("nan"),
            "build_seconds": float((part["whole_seconds"].to_numpy() - share_here).mean()),
            "answer_seconds": float(share_here.mean()),
            "ahead_seconds": float(part["ahead_seconds"].mean()),
            "after_question_seconds": float(part["seconds"].mean()),
            "seconds": float(part["whole_seconds"].mean()),
        })
    return pd.DataFrame(out)


def _bytes(value: float) -> str:
    return "" if value != value else f"{value:,.0f}"  # NaN: results written before the cost columns


def costs_markdown(costs: pd.DataFrame) -> str:
    """sharing_costs as a markdown table (bytes handed over, seconds per example by stage)."""
    lines = ["| condition | n | context tokens | message tokens | handed over (bytes) | target computes "
             "| building the cache, s (source writes + target reads) | answering, s | total, s "
             "| done ahead of the question, s | after the question, s |",
             "|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|"]
    for r in costs.itertuples():
        relayed = r.condition in MESSAGES
        build = f"{r.build_seconds:.2f} ({r.write_seconds:.2f} + {r.read_seconds:.2f})" if relayed \
            else f"{r.build_seconds:.2f}"
        lines.append(f"| {r.condition} | {r.n} | {r.context_tokens:.0f} | {f'{r.message_tokens:.1f}' if relayed else ''} "
                     f"| {_bytes(r.handed_bytes)} | {work_text(r.target_work, r.target_tokens)} | {build} "
                     f"| {r.answer_seconds:.2f} | {r.seconds:.2f} "
                     f"| {r.ahead_seconds:.2f} | {r.after_question_seconds:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """python -m mot_viz.eval.costs RESULTS: write costs.md / costs.csv (sharing_costs) into an evaluation folder."""
    parser = argparse.ArgumentParser(description="What each way of sharing the context hands over and costs, from "
                                                 "an evaluation folder with relay rows (python -m mot_viz.eval.evaluate)")
    parser.add_argument("results", help="the evaluation's --out folder (examples.csv, summary.json)")
    args = parser.parse_args(argv)

    def body() -> None:
        folder = Path(args.results)
        check_out_place(folder, "RESULTS")  # a folder it can write into, before any work
        try:
            json.loads((folder / "summary.json").read_text())["settings"]
            rows = pd.read_csv(folder / "examples.csv", dtype={"message": str, "target_work": str},
                               keep_default_na=False, na_values=[""])
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"{folder} is not an evaluation folder ({exc}). Pass the --out folder of "
                              "python -m mot_viz.eval.evaluate.") from exc
        costs = sharing_costs(rows)
        write_csv_atomic(folder / "costs.csv", costs)
        table = costs_markdown(costs)
        note = ("Means per example. Handed over and what the target computes: as each way of sharing counts them "
                "(mot_viz.sharing.costs; empty for results written before evaluate recorded them); "
                "what the source reads is in every row's own build time (mot: the source's prefill; relay: its "
                "reading and writing). Answering: the example's batch decoding shared evenly among its conditions. "
                "Done ahead of the question: the source's prefill (mot, direct, kvcomm) and relay's writing (its "
                "message needs no question; relay_q's does); after the question: the rest, to the whole answer.")
        write_text_atomic(folder / "costs.md", f"Results: {folder}. {note}\n\n{table}\n")
        print(table)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
