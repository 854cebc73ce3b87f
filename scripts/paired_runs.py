"""Paired differences across evaluation runs on the same examples (same dataset, n and seed).

    .venv/bin/python scripts/paired_runs.py \\
        results/eval/mid-squad:mot=MoT results/eval/mid-squad:second=linear \\
        results/eval/mid-controls-squad:mean=mean --pairs MoT:linear MoT:mean linear:mean

Each input is FOLDER:CONDITION=LABEL (a condition of any results folder's examples.csv, renamed LABEL; read by
mot_viz.analysis.eval_runs, as the app's Evaluations page reads it); every pair A:B is the mean of A − B over the
examples both ran, per dataset (or document length, or turn), with a 95% bootstrap interval and the number of
examples each side wins (mot_viz.eval.report.paired_differences), printed as a markdown table.

With --against LABEL instead of --pairs, one table per dataset (or length, or turn) over the examples every label
ran: each label's mean with its interval, its share of the `native` label's mean, its gap closed (the share of the
context's gain captured, (x − no context) ÷ (native − no context), with a paired interval; needs a label `no context`),
its paired difference against LABEL, and its seconds as its run measured them (a QA run: mean seconds per example from
the question's arrival to the whole answer, and apart the work done ahead of the question, the source's prefill or
relay's writing; a long-context run: median seconds to the first answer token). Conditions that do not depend on the run's checkpoint (native, no_context, the relays, the direct
map) can so be set beside any checkpoint's run of the same examples; a line under the tables says whether the
folders' native answers scored the same, example for example (the same target answering the same prompts).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from mot_viz.analysis.eval_runs import check_one_pair, condition_rows, open_run
from mot_viz.analysis.method_figures import after_question_seconds
from mot_viz.cli import run_cli
from mot_viz.errors import ConfigError
from mot_viz.eval.qa_metrics import bootstrap_ci, paired_ratios
from mot_viz.eval.report import paired_differences, paired_markdown
from mot_viz.sharing.registry import REFERENCE, TRANSLATED, method



NO_CONTEXT = "no context"  # the label whose scores are the floor of gap closed


def written_ahead(condition: str) -> bool:
    """Whether a condition hands over a message written before the question (relay's: it needs none)."""
    way = method(condition)
    return way.message and not way.for_question


def own_source_prefill(condition: str) -> bool:
    """Whether a long-context row's work done ahead is its own: the translation's source prefill (the MoT's, a
    full-depth map's own translation: Method.side) or a message written ahead."""
    return condition == TRANSLATED or bool(method(condition).side) or written_ahead(condition)


def run_seconds(run, condition: str, rows: pd.DataFrame) -> pd.Series | float:
    """Each row's seconds as its run states them: a QA run's seconds per example (to the whole answer); a
    long-context run's median seconds to the first answer token for the row's length (its summary's; relay's: the
    target's prefill of the message and the question's pass, its writing done ahead); else none."""
    if run.kind.name == "evaluate":  # from the question's arrival, also in runs that counted relay's writing
        return after_question_seconds(rows, False, condition)
    if run.kind.name == "long_context":
        if written_ahead(condition):  # its writing needs no question: done ahead, also in runs that counted it
            medians = rows.groupby("group")[["message_prefill_seconds", "first_token_seconds"]].median().sum(axis=1)
            return rows["group"].map(medians)
        stated = run.summary[run.summary["condition"] == condition]
        return rows["group"].map(pd.Series(stated["first_token_seconds"].to_numpy(), index=run.kind.group(stated)))
    return np.nan


def run_ahead(run, condition: str, rows: pd.DataFrame) -> pd.Series | float:
    """Each row's work done ahead of the question, as its run records it: a QA run's ahead_seconds (the source's
    prefill, relay's writing); a long-context run's median per length of relay's writing or of a translation's
    source prefill; else none."""
    if run.kind.name == "evaluate":
        if "ahead_seconds" in rows and rows["ahead_seconds"].notna().all():
            return rows["ahead_seconds"]
        return rows["message_generate_seconds"] if written_ahead(condition) else np.nan
    if run.kind.name == "long_context":
        column = "message_generate_seconds" if written_ahead(condition) else "source_prefill"
        if own_source_prefill(condition) and column in rows and rows[column].notna().any():
            return rows["group"].map(rows.groupby("group")[column].median())
    return np.nan


def labelled_rows(runs: list[str]) -> tuple[list[pd.DataFrame], dict[str, pd.DataFrame]]:
    """The rows of each FOLDER:CONDITION=LABEL, and each folder's native rows (folders that ran native)."""
    frames, natives, opened = [], {}, []
    for spec in runs:
        folder, _, rest = spec.rpartition(":")
        condition, equals, label = rest.partition("=")
        if not (folder and equals and condition and label):
            raise ConfigError(f"{spec!r} is not FOLDER:CONDITION=LABEL. Write e.g. results/eval/smollm2-to-gemma3-mid-"
                              "squad300:mot=MoT.")
        run = open_run(folder)
        opened.append(run)
        rows = condition_rows(run, condition, label)
        frames.append(rows.assign(seconds_per_example=run_seconds(run, condition, rows),
                                  ahead_per_example=run_ahead(run, condition, rows),
                                  run=f"{run.folder.parent.name}/{run.name}"))
        if REFERENCE in run.conditions and str(run.folder) not in natives:
            natives[str(run.folder)] = condition_rows(run, REFERENCE, REFERENCE)
    if len({frame["condition"].iloc[0] for frame in frames}) < len(frames):
        raise ConfigError("two inputs have the same LABEL: give each FOLDER:CONDITION its own.")
    check_one_pair(opened)
    return frames, natives


def paired_runs(runs: list[str], pairs: list[str], n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """The paired differences of the pairs LABEL_A:LABEL_B over the runs FOLDER:CONDITION=LABEL."""
    frames, _ = labelled_rows(runs)
    split = [tuple(p.split(":", 1)) for p in pairs]
    labels = {frame["condition"].iloc[0] for frame in frames}
    unknown = [p for p, pair in zip(pairs, split) if len(pair) != 2 or not set(pair) <= labels]
    if unknown:
        raise ConfigError(f"--pairs {' '.join(unknown)}: each pair is LABEL_A:LABEL_B of the labels given "
                          f"({', '.join(sorted(labels))}).")
    return paired_differences(pd.concat(frames), pairs=split, n_boot=n_boot, seed=seed)


def against_table(runs: list[str], against: str, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per group (those every label ran), over the examples every label ran: each label's n, mean [95% CI], share of the label "native"
    (when given), difference against `against` [95% CI] with the examples each side wins, mean seconds, and the
    folder it was read from (seconds compare within one run only: each run had its own machine load)."""
    frames, _ = labelled_rows(runs)
    rows = pd.concat(frames, ignore_index=True)
    labels = list(dict.fromkeys(rows["condition"]))
    if against not in labels:
        raise ConfigError(f"--against {against}: not one of the labels given ({', '.join(labels)}).")
    out = []
    for group, part in rows.groupby("dataset", sort=False):
        wide = part.pivot_table(index="id", columns="condition", values="score").reindex(columns=labels).dropna()
        if wide.empty:  # a group (a dataset, a length) some label did not run
            continue
        shared = part[part["id"].isin(wide.index)]
        seconds = shared.groupby("condition")["seconds_per_example"].mean()
        ahead = shared.groupby("condition")["ahead_per_example"].mean()
        none = wide[NO_CONTEXT].to_numpy() if NO_CONTEXT in wide else np.full(len(wide), np.nan)
        run = shared.groupby("condition")["run"].first()
        paired = paired_differences(shared,
                                    pairs=[(label, against) for label in labels if label != against],
                                    n_boot=n_boot, seed=seed).set_index("a")
        for label in [c for c in labels if c in wide]:
            ci = bootstrap_ci(wide[label].to_numpy(), n_boot=n_boot, seed=seed)
            diff = paired.loc[label] if label in paired.index else None
            ratios = paired_ratios(wide[REFERENCE].to_numpy(), none, wide[label].to_numpy(), n_boot, seed) \
                if REFERENCE in wide else {}
            out.append({"group": group, "label": label, "n": len(wide), "mean": ci.mean, "ci_low": ci.lo,
                        "ci_high": ci.hi, "retained": ratios.get("retention", np.nan),
                        **{k: ratios.get(k, np.nan) for k in ("gap_closed", "gap_closed_ci_low", "gap_closed_ci_high")},
                        "diff": np.nan if diff is None else diff["diff"],
                        "diff_low": np.nan if diff is None else diff["ci_low"],
                        "diff_high": np.nan if diff is None else diff["ci_high"],
                        "better": "" if diff is None else f"{diff['a_better']} / {diff['b_better']}",
                        "seconds": float(seconds.get(label, np.nan)), "ahead": float(ahead.get(label, np.nan)),
                        "run": run[label]})
    if not out:
        raise ConfigError("no example was run under every label; give runs of the same examples (the same dataset, "
                          "n and seed; for long documents the same source and length).")
    return pd.DataFrame(out)


def coverage_note(runs: list[str]) -> str:
    """One line when the labels did not all run the same examples (another n, seed or dataset): how many each ran
    and how many every one did, which the tables are over (--pairs: each pair over the examples both ran)."""
    frames, _ = labelled_rows(runs)
    ran = {frame["condition"].iloc[0]: set(zip(frame["dataset"], frame["id"])) for frame in frames}
    every, some = set.intersection(*ran.values()), set.union(*ran.values())
    if every == some:
        return ""
    counts = ", ".join(f"{label} {len(examples)}" for label, examples in ran.items())
    return (f"The runs hold different examples ({counts}): {len(every)} of the {len(some)} are in every one, and "
            "the tables are over the examples the runs compared share. Runs of the same dataset, n and seed hold "
            "the same examples.")


def native_agreement(runs: list[str]) -> str:
    """One line: whether the native scores of the folders given agree on the examples they share."""
    _, natives = labelled_rows(runs)
    if len(natives) < 2:
        return ""
    (first, reference), *others = natives.items()
    key = ["dataset", "id"]
    lines = []
    for folder, rows in others:
        both = reference[[*key, "score"]].merge(rows[[*key, "score"]], on=key)
        differ = int((both["score_x"] != both["score_y"]).sum())
        lines.append(f"{folder}: {len(both) - differ} of {len(both)} the same")
    return f"native scores against {first}'s, example for example: " + "; ".join(lines) + "."


def against_markdown(table: pd.DataFrame, against: str) -> str:
    out = []
    for group, part in table.groupby("group", sort=False):
        out += [f"{group} (n = {part['n'].iloc[0]})", "",
                f"| method | mean [95% CI] | retained | gap closed [95% CI] | − {against} [95% CI] "
                f"| better / {against} better | seconds | done ahead, s | run |",
                "|---|---|---:|---|---|---|---:|---:|---|"]
        for r in part.itertuples():
            diff = "" if np.isnan(r.diff) else f"{r.diff:+.3f} [{r.diff_low:+.3f}, {r.diff_high:+.3f}]"
            share = "" if np.isnan(r.retained) else f"{r.retained:.1%}"
            gap = "" if np.isnan(r.gap_closed) else \
                f"{r.gap_closed:+.2f} [{r.gap_closed_ci_low:+.2f}, {r.gap_closed_ci_high:+.2f}]"
            seconds = "" if np.isnan(r.seconds) else f"{r.seconds:.2f}"
            ahead = "" if np.isnan(r.ahead) else f"{r.ahead:.2f}"
            out.append(f"| {r.label} | {r.mean:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] | {share} | {gap} | {diff} "
                       f"| {r.better} | {seconds} | {ahead} | {r.run} |")
        out.append("")
    return "\n".join(out).rstrip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="FOLDER:CONDITION=LABEL")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--pairs", nargs="+", help="LABEL_A:LABEL_B (A − B)")
    which.add_argument("--against", help="LABEL: one table of every label beside it")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples per interval")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resampling")
    args = parser.parse_args(argv)

    def body() -> None:
        coverage = coverage_note(args.runs)
        if coverage:  # said first, before any table
            print(f"{coverage}\n")
        if args.pairs:
            print(paired_markdown(paired_runs(args.runs, args.pairs, args.bootstrap, args.seed)))
            return
        print(against_markdown(against_table(args.runs, args.against, args.bootstrap, args.seed), args.against))
        agreement = native_agreement(args.runs)
        if agreement:
            print(f"\n{agreement}")

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
