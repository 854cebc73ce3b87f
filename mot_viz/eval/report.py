"""The evaluator's reports (method.md §8, §12): per-condition means with bootstrap intervals and the share of
native kept, paired differences over the same examples, their markdown tables, and the QA results a checkpoint's
config.json records (shown on the app's Training page)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..engine.checkpoint import weights_sha256
from ..errors import CheckpointError
from ..sharing.registry import FLOOR, REFERENCE, SECOND, choices, method
from .policy import EVALUATE_PAIRS
from .answers import CONDITION_LABELS
from .qa_metrics import bootstrap_ci, paired_ratios


def summarize(df: pd.DataFrame, n_boot: int = 1000, seed: int = 0, relay_tokens: int | None = None) -> pd.DataFrame:
    """Per dataset and condition: mean metric with a 95% bootstrap interval, retained share and gap closed (the share
    of the context's gain captured, (x − no context) ÷ (native − no context); NaN without no-context rows) with paired
    intervals (qa_metrics.paired_ratios), cosine, seconds from the question's arrival and work done ahead of it."""
    scored = df[df["condition"] != "skipped"]
    out = []
    for dataset, part in scored.groupby("dataset", sort=False):
        wide = part.pivot_table(index="id", columns="condition", values="score")
        native = wide[REFERENCE].to_numpy()
        none = wide[FLOOR].to_numpy() if FLOOR in wide else np.full(len(wide), np.nan)
        for condition in [c for c in (*choices("evaluate"), SECOND) if c in wide]:
            values = wide[condition].to_numpy()
            ci = bootstrap_ci(values, n_boot=n_boot, seed=seed)
            ratios = paired_ratios(native, none, values, n_boot, seed)
            cond_rows = part[part["condition"] == condition]
            em = cond_rows["exact_match"].dropna()
            ahead = cond_rows["ahead_seconds"] if "ahead_seconds" in cond_rows else pd.Series(dtype=float)
            out.append({
                "dataset": dataset, "condition": condition, "n": len(values),
                "metric": "F1" if em.size else "accuracy", "mean": ci.mean, "ci_low": ci.lo, "ci_high": ci.hi,
                "exact_match": float(em.mean()) if em.size else np.nan,
                "retained": ratios["retention"],
                "retained_ci_low": ratios["retention_ci_low"],
                "retained_ci_high": ratios["retention_ci_high"],
                "gap_closed": ratios["gap_closed"],
                "gap_closed_ci_low": ratios["gap_closed_ci_low"],
                "gap_closed_ci_high": ratios["gap_closed_ci_high"],
                "kv_cosine": float(cond_rows["kv_cosine"].mean()),
                "seconds_per_example": float(cond_rows["seconds"].mean()),
                "ahead_seconds_per_example": float(ahead.mean()) if ahead.notna().any() else np.nan,
                **message_shares(cond_rows, condition, relay_tokens),
            })
    return pd.DataFrame(out)


def message_shares(rows: pd.DataFrame, condition: str, relay_tokens: int | None) -> dict:
    """A relay's messages that stopped at the length cap (source tokens == the run's --relay_tokens) and that ended
    where the source began to repeat itself (sharing.relay.repeats_itself), as shares of its rows; NaN for a condition
    that writes no message, and a loop's share NaN in results written before loops were marked."""
    if relay_tokens is None or not method(condition).message:
        return {"messages_at_cap": np.nan, "messages_looped": np.nan}
    looped = rows["message_looped"] if "message_looped" in rows else pd.Series(dtype=float)
    return {"messages_at_cap": float((rows["message_tokens"] >= relay_tokens).mean()),
            "messages_looped": float(looped.mean()) if looped.notna().any() else np.nan}


PAIRS = EVALUATE_PAIRS  # the evaluations' policy's, in the order the shipped paired.csv files list them


def paired_differences(df: pd.DataFrame, pairs=PAIRS, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per dataset, for each (a, b) pair of conditions present: mean of a − b over the same examples, with a 95%
    bootstrap interval and how many examples each side wins. This is the test of 'beats the control'."""
    scored = df[df["condition"] != "skipped"]
    out = []
    for dataset, part in scored.groupby("dataset", sort=False):
        wide = part.pivot_table(index="id", columns="condition", values="score")
        for a, b in pairs:
            if a not in wide or b not in wide:
                continue
            diff = (wide[a] - wide[b]).dropna().to_numpy()
            ci = bootstrap_ci(diff, n_boot=n_boot, seed=seed)
            out.append({"dataset": dataset, "a": a, "b": b, "n": len(diff), "diff": ci.mean, "ci_low": ci.lo,
                        "ci_high": ci.hi, "a_better": int((diff > 0).sum()), "b_better": int((diff < 0).sum())})
    return pd.DataFrame(out)


def paired_markdown(paired: pd.DataFrame) -> str:
    lines = ["| dataset | difference | n | mean [95% CI] | a better / b better |", "|---|---|---:|---|---|"]
    for r in paired.itertuples():
        lines.append(f"| {r.dataset} | {r.a} − {r.b} | {r.n} | {r.diff:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}] "
                     f"| {r.a_better} / {r.b_better} |")
    return "\n".join(lines)


def markdown_table(summary: pd.DataFrame) -> str:
    """The summary as a table; gap closed = (x − no context) ÷ (native − no context), the share of the context's gain
    captured; s / example from the question's arrival to the whole answer, the work done ahead of it apart; at cap:
    the share of relay messages that stopped at --relay_tokens; looped: the share that ended where the source began to
    repeat itself. Summaries written before a column existed leave it
    blank."""
    def get(r, name: str) -> float:
        return getattr(r, name, np.nan)

    def fmt(value: float, spec: str) -> str:
        return "" if value is None or np.isnan(value) else format(value, spec)

    lines = ["| dataset | condition | n | metric | mean [95% CI] | EM | retained [95% CI] | gap closed [95% CI] "
             "| KV cosine | s / example | s done ahead | at cap | looped |",
             "|---|---|---:|---|---|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in summary.itertuples():
        gap = fmt(get(r, "gap_closed"), "+.2f")
        gap = f"{gap} [{fmt(get(r, 'gap_closed_ci_low'), '+.2f')}, {fmt(get(r, 'gap_closed_ci_high'), '+.2f')}]" \
            if gap else ""
        lines.append(
            f"| {r.dataset} | {r.condition} | {r.n} | {r.metric} | {r.mean:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] "
            f"| {fmt(r.exact_match, '.3f')} | {r.retained:.1%} [{r.retained_ci_low:.1%}, {r.retained_ci_high:.1%}] "
            f"| {gap} | {fmt(r.kv_cosine, '.3f')} | {r.seconds_per_example:.2f} "
            f"| {fmt(get(r, 'ahead_seconds_per_example'), '.2f')} | {fmt(get(r, 'messages_at_cap'), '.0%')} "
            f"| {fmt(get(r, 'messages_looped'), '.0%')} |"
        )
    return "\n".join(lines)


def evaluation_table(config: dict) -> pd.DataFrame | None:
    """The QA results recorded in a checkpoint's config.json (metrics.evaluation; scripts/results_md.py --record):
    one row per dataset and condition with n, the metric, its 95% interval and the share of native kept."""
    evaluation = (config.get("metrics") or {}).get("evaluation")
    if not evaluation:
        return None
    rows = []
    try:
        for dataset, record in evaluation.items():
            for condition, values in record["conditions"].items():
                metric = next(k for k in values if k not in ("n", "ci95", "retained"))
                low, high = values["ci95"]
                rows.append({"dataset": dataset, "condition": CONDITION_LABELS.get(condition, condition),
                             "n": values["n"], "metric": metric, "mean": round(values[metric], 3),
                             "95% CI": f"[{low:.3f}, {high:.3f}]", "retained": f"{values['retained']:.1%}",
                             "prompts": record.get("prompts", "plain"), "results": record["results"]})
    except (AttributeError, KeyError, TypeError, ValueError, StopIteration) as exc:
        raise CheckpointError(f"metrics.evaluation in the checkpoint's config.json is malformed ({type(exc).__name__}: "
                              f"{exc}). Record it again with scripts/results_md.py --record.") from exc
    return pd.DataFrame(rows)


def measured_these_weights(results: str, meta: dict, checkpoint: str, config: Path) -> bool:
    """Whether the evaluation folder `results` (its summary.json: meta) measured the current weights of `checkpoint`
    (whose config.json is `config`): its recorded weights digest matches, or, for folders from before digests were
    recorded, the checkpoint's config already cites the folder (scripts/results_md.py --record keeps those)."""
    recorded = (meta.get("weights_sha256") or {}).get(checkpoint)
    if recorded is not None:
        return recorded == weights_sha256(config.parent)
    cited = (json.loads(config.read_text()).get("metrics") or {}).get("evaluation") or {}
    return any(isinstance(r, dict) and r.get("results") == results for r in cited.values())
