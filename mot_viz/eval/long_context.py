"""Long-context cache-augmented generation from a translated cache, against the target reading the document itself.

    python -m mot_viz.eval.long_context --checkpoint pretrained/smollm2-to-gemma3-mid --source stacks \
        --budgets 512 1024 2048 4096 --n 48 --out results/long/smollm2-to-gemma3-mid-stacks [--resume]

Per budget and document (mot_viz.data.long_context), the target answers from five caches of the same text:
*native* (the target prefills the whole document: the ceiling), *no context*, *mot* (the checkpoint's
translation of the source's cache, replayed), *linear* (the pair's closed-form map on the same source context,
replayed the same way) and *mean* (the window filled with mean native vectors: no context in the window).
Reported per budget: score with bootstrap intervals, retention = score ÷ native and gap closed =
(score − no context) ÷ (native − no context), both with paired bootstrap intervals over the same documents. On
request (--conditions), the other ways of sharing the document (mot_viz.sharing): *relay* / *relay_q* (the
source writes a message from the document, the target reads only it; --relay_tokens), *direct* (a full-depth map
without replay; --direct) and *kvcomm* (a pair of one architecture; --kvcomm_fraction, calibrated on the first
document), each with what it hands over and what the target computes over the document. Time to
the first answer token by stage (the target side's alignment + translator + replay + first token, beside the
target's own prefill + first token; the source's prefill in its own column, since in the use case the source
holds its cache already); the process's peak memory; and the bytes of both caches beside the bytes of the text.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..cli import run_cli
from ..data.long_context import BUDGETS, MIN_BUDGET, SOURCES, LongExample, check_fills, long_examples
from ..engine.checkpoint import load_checkpoint, read_config
from ..engine.models import LoadedModel, kv_cache_bytes, load_model
from ..engine.mot import MoT, Translation
from ..errors import ConfigError
from ..fsutil import write_csv_atomic, write_text_atomic
from ..sharing import registry
from ..sharing.caches import condition_caches, run_artifacts
from ..sharing.costs import (COST_COLUMNS, LOOPED_COLUMNS, MESSAGE_COLUMNS, cost_fields, cost_medians, sharing_stages,
                             work_text)
from ..sharing.method import Request
from ..sharing.registry import FLOOR, REFERENCE, TRANSLATED
from .answers import MAX_NEW_TOKENS, answers_from_caches, encode_question, first_token_seconds
from .layer_error_file import LAYER_ERROR_FILE, LayerErrorFile, check_resumed
from .long_settings import CONDITIONS, LongSettings, check_budget
from .processes import Spread, resumed_table, run_units, shown
from .results_folder import PATCHING_FILES, ResultsTable
from .qa_metrics import bootstrap_ci
from .qa_metrics import condition_ratios
from .policy import ALWAYS, with_always
from .report import message_shares, paired_differences, paired_markdown

KIND = "long_context"  # this evaluation, as the sharing registry names it
ROW_COLUMNS = ("budget", "source", "id", "depth", "evidence_fraction", "condition", "score", "exact_match", "answer",
               "gold", "context_tokens", "text_bytes", "build_seconds", "first_token_seconds", "source_prefill",
               "alignment", "translator", "replay", "native_prefill", "peak_rss_mb", "error", *MESSAGE_COLUMNS,
               *COST_COLUMNS, *LOOPED_COLUMNS)
TEXT_COLUMNS = ("source", "id", "depth", "condition", "answer", "gold", "error", "message", "target_work")
RESUME_KEYS = ("checkpoint", "source", "seed", "max_new_tokens", "conditions", "options")
RESULTS = ResultsTable(ROW_COLUMNS, TEXT_COLUMNS, ("budget", "id"),
                       ("score", "context_tokens", "text_bytes", "build_seconds", "first_token_seconds", "peak_rss_mb"),
                       ("evidence_fraction", "exact_match", "source_prefill", "alignment", "translator", "replay",
                        "native_prefill"), (ROW_COLUMNS[:-1], ROW_COLUMNS[:ROW_COLUMNS.index("error") + 1]))
RESULT_FILES = ("examples.csv", "summary.csv", "stages.csv", "paired.csv", "summary.json", "summary.md",
                LAYER_ERROR_FILE, *PATCHING_FILES)


def all_conditions() -> tuple[str, ...]:
    """Every way of sharing this evaluation answers under, in the registry's order (the order of the rows)."""
    return registry.choices(KIND)


def pairs() -> tuple[tuple[str, str], ...]:
    """The paired tests: does the translation beat its own map, a window with no context in it, and no context at
    all, and how does it fare against each other way of sharing?"""
    every = all_conditions()
    sharing = tuple(c for c in every if c not in CONDITIONS)  # the other ways of sharing, on request
    return (*((TRANSLATED, c) for c in registry.controls(every)), (TRANSLATED, FLOOR), (TRANSLATED, REFERENCE),
            *registry.control_pairs(every), *((TRANSLATED, c) for c in sharing))


def check_settings(settings: LongSettings) -> dict:
    """Raise a MotVizError for settings no run can use, before any model is loaded; returns the checkpoint's config."""
    if settings.n < 1 or settings.bootstrap < 1 or settings.max_new_tokens < 1:
        raise ConfigError("--n, --bootstrap and --max_new_tokens must each be at least 1.")
    if not settings.budgets:
        raise ConfigError(f"give at least one budget, e.g. --budgets {' '.join(map(str, BUDGETS))}")
    twice = sorted({b for b in settings.budgets if settings.budgets.count(b) > 1})
    if twice or min(settings.budgets) < MIN_BUDGET:
        raise ConfigError(f"--budgets takes distinct numbers of target tokens of at least {MIN_BUDGET} (each is "
                          f"evaluated once), e.g. --budgets {' '.join(map(str, BUDGETS))}; got "
                          f"{' '.join(map(str, settings.budgets))}.")
    if settings.source not in SOURCES and not settings.source.endswith(".jsonl"):
        raise ConfigError(f"--source {settings.source!r}: use one of {SOURCES} or a .jsonl file path.")
    registry.check_names(settings.conditions, all_conditions())
    if not set(ALWAYS[KIND]) <= set(settings.conditions):
        raise ConfigError(f"--conditions must include native (every ratio divides by it); got {settings.conditions}.")
    config = read_config(settings.checkpoint)
    registry.check(Request(settings.conditions, config, settings.checkpoint, max(settings.budgets), settings.options))
    check_budget(max(settings.budgets), {role: (config[role]["name"], config[role].get("max_positions"))
                                         for role in ("source", "target")}, settings.max_new_tokens, ConfigError)
    return config


@dataclass
class DocumentResult:
    """One document evaluated: a row per condition (document_rows) and the translation they came from."""

    rows: list[dict]
    translation: Translation


def evaluate_document(mot: MoT, source: LoadedModel, target: LoadedModel, doc: LongExample, settings: LongSettings,
                      artifacts=None) -> DocumentResult:
    """Every condition's cache of one document, its answer, the time to its first answer token, and the stages (the
    stage columns are the MoT translation's, the direct row's its own map's). artifacts: what the run's methods
    loaded once (registry.load_artifacts)."""
    example = doc.example
    built = condition_caches(mot, source, target, example, seed=settings.seed, conditions=settings.conditions,
                             options=settings.options, artifacts=artifacts)
    translation, caches, build = built.translation, built.kv, built.seconds  # rows in the registry's order
    question = encode_question(target, example)  # once, for the first token's time and the answers
    first = {c: first_token_seconds(target, kv, question.suffix_ids, built.plans.get(c)) for c, kv in caches.items()}
    answers = answers_from_caches(target, caches, example, settings.max_new_tokens, plans=built.plans,
                                  question=question)
    tokens = int(translation.target_ids.shape[1])
    gold = " | ".join(example.answers) if example.kind == "extractive" else example.choices[example.label]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    rows = [{"budget": doc.budget, "source": doc.source, "id": example.id, "depth": doc.depth,
             "evidence_fraction": doc.evidence_fraction, "condition": c, "score": answers[c].score,
             "exact_match": answers[c].exact_match, "answer": answers[c].text, "gold": gold,
             "context_tokens": tokens, "text_bytes": len(example.context.encode()),
             "build_seconds": build[c], "first_token_seconds": first[c],
             **{stage: built.timings(c).get(stage, np.nan)
                for stage in ("source_prefill", "alignment", "translator", "replay", "native_prefill")},
             "peak_rss_mb": peak,
             **cost_fields(c, built.built[c], tokens, target, len(mot.channels.target_layers), built.target_side(c),
                           source)} for c in caches]
    return DocumentResult(rows, translation)


def document_rows(mot: MoT, source: LoadedModel, target: LoadedModel, doc: LongExample, settings: LongSettings,
                  artifacts=None, layers: LayerErrorFile | None = None) -> list[dict]:
    """One row per condition of one document: score, answer, time by stage, peak memory. A document shorter than its
    budget is refused (check_fills): the run counts it as skipped, with its length. `layers` gets the MoT cache's
    per-layer error (--layer_error)."""
    check_fills(doc)
    result = evaluate_document(mot, source, target, doc, settings, artifacts)
    if layers is not None:
        layers.add(result.translation, mot.channels, budget=doc.budget, id=doc.example.id)
    return result.rows


def summarize(df: pd.DataFrame, n_boot: int = 1000, seed: int = 0, relay_tokens: int | None = None) -> pd.DataFrame:
    """Per source, budget and condition: score with its interval, retention and gap closed against native with
    paired intervals, median time to the first answer token, cache and text megabytes; for a relay (`relay_tokens`:
    the run's --relay_tokens) the share of its messages at the cap and the share that looped (report.message_shares)."""
    scored = df[df["condition"] != "skipped"]
    out = []
    for (src, budget), part in scored.groupby(["source", "budget"], sort=True):
        wide = part.pivot_table(index="id", columns="condition", values="score").dropna()
        stages = _stage_medians(part)
        for condition in [c for c in all_conditions() if c in wide]:
            rows = part[part["condition"] == condition]
            ci = bootstrap_ci(wide[condition].to_numpy(), n_boot=n_boot, seed=seed)
            # the default conditions: Method.target_side of the document's stages (their medians); the others: as
            # their rows recorded it
            side = registry.method(condition).target_side(None, stages) if condition in CONDITIONS \
                else rows["target_side_seconds"].median()
            ttft = side + rows["first_token_seconds"].median()
            out.append({"source": src, "budget": int(budget), "condition": condition, "n": len(wide),
                        "metric": "F1" if rows["exact_match"].notna().any() else "accuracy",
                        "mean": ci.mean, "ci_low": ci.lo, "ci_high": ci.hi,
                        **(condition_ratios(wide, condition, n_boot, seed) if not registry.method(condition).bound
                           else {}),
                        "first_token_seconds": float(ttft),
                        "build_seconds": float(rows["build_seconds"].median()),
                        "context_tokens": float(rows["context_tokens"].median()),
                        "text_mb": float(rows["text_bytes"].median()) / 1e6, **cost_medians(rows),
                        **message_shares(rows, condition, relay_tokens)})
    return pd.DataFrame(out)


def _stage_medians(part: pd.DataFrame) -> pd.Series:
    """Median seconds of each stage over the documents of `part` (one row each: the native row), with the target
    side of the translated path (alignment + translator + replay) as "target_side"."""
    m = part[part["condition"] == REFERENCE].median(numeric_only=True)
    m["target_side"] = m["alignment"] + m["translator"] + m["replay"]
    return m


def stage_table(df: pd.DataFrame) -> pd.DataFrame:
    """Median seconds of each stage per source and budget, and the target side's ratio to its own prefill."""
    rows = []
    for (src, budget), part in df.groupby(["source", "budget"], sort=True):
        m = _stage_medians(part)
        rows.append({"source": src, "budget": int(budget), "n": int((part["condition"] == REFERENCE).sum()),
                     "source prefill": m["source_prefill"], "alignment": m["alignment"], "translator": m["translator"],
                     "replay": m["replay"], "target side (alignment + translator + replay)": m["target_side"],
                     "native prefill": m["native_prefill"],
                     "target side ÷ native": m["target_side"] / m["native_prefill"], **sharing_stages(part),
                     "peak RSS (MB)": part.loc[part["condition"] == REFERENCE, "peak_rss_mb"].max()})
    return pd.DataFrame(rows)


def _fmt(value: float, spec: str, missing: str = "n/a") -> str:
    """A number for a table; NaN (a ratio over a zero native score, a time not measured) as `missing`."""
    return missing if value is None or np.isnan(value) else format(value, spec)


def markdown(summary: pd.DataFrame, stages: pd.DataFrame, cache_mb: dict[str, float]) -> str:
    """The run's tables: one per source and budget, then the stages."""
    lines = []
    for (src, budget), part in summary.groupby(["source", "budget"], sort=True) if len(summary) else ():
        metric = part["metric"].iloc[0]
        n = int(part["n"].iloc[0])
        relayed = bool("messages_at_cap" in part and part["messages_at_cap"].notna().any())
        lines += ["", f"### {src}, {budget} target tokens ({n} document{'s' * (n != 1)}, {metric})", "",
                  f"| condition | {metric} [95% CI] | retention [95% CI] | gap closed [95% CI] | first token (s) "
                  "| handed over (bytes) | target computes (positions) |" + " messages at cap / looped |" * relayed,
                  "|---|---|---|---|---:|---:|---|" + "---:|" * relayed]
        for r in part.itertuples():
            paired = (f"{_fmt(r.retention, '.1%')} [{_fmt(r.retention_ci_low, '.1%')}, "
                      f"{_fmt(r.retention_ci_high, '.1%')}] | {_fmt(r.gap_closed, '+.2f')} "
                      f"[{_fmt(r.gap_closed_ci_low, '+.2f')}, {_fmt(r.gap_closed_ci_high, '+.2f')}]"
                      if not registry.method(r.condition).bound else "| ")
            lines.append(f"| {r.condition} | {r.mean:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] | {paired} | "
                         f"{_fmt(r.first_token_seconds, '.2f', '')} | "
                         f"{_fmt(getattr(r, 'handed_bytes', np.nan), ',.0f', '')} | "
                         f"{work_text(getattr(r, 'target_work', ''), getattr(r, 'target_tokens', np.nan))} |"
                         + (f" {_fmt(r.messages_at_cap, '.0%', '')} / {_fmt(r.messages_looped, '.0%', '')} |"
                            if relayed and pd.notna(r.messages_at_cap) else " |" * relayed))
    if len(stages):
        lines += ["", "Median seconds per document (one run, this machine); peak RSS is the process's:", "",
                  "| " + " | ".join(stages.columns) + " |", "|" + "---|" * len(stages.columns)]
        lines += ["| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row) + " |"
                  for row in stages.itertuples(index=False)]
    if cache_mb:
        lines += ["", "KV cache per 1,000 tokens (fp16, every layer): "
                  + ", ".join(f"{name} {mb:.1f} MB" for name, mb in cache_mb.items()) + "."]
    return "\n".join(lines).strip() + "\n"


def write(out_dir: Path, rows: pd.DataFrame, settings: LongSettings, cache_mb: dict[str, float]) -> pd.DataFrame:
    """Every result file of the run, each written whole (a kill never leaves a torn file)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows, settings.bootstrap, settings.seed, settings.options.get("relay_tokens"))
    stages = stage_table(rows)
    per_budget = rows.assign(dataset=rows["source"].astype(str) + " " + rows["budget"].astype(str) + " tokens")
    paired = paired_differences(per_budget, pairs(), settings.bootstrap, settings.seed)
    for name, frame in (("examples.csv", rows), ("summary.csv", summary), ("stages.csv", stages),
                        ("paired.csv", paired)):
        write_csv_atomic(out_dir / name, frame)
    skipped = rows.loc[rows["condition"] == "skipped", ["budget", "id", "error"]].to_dict(orient="records")
    meta = {"settings": settings.to_json(), "date": str(datetime.date.today()), "skipped": skipped,
            "summary": summary.to_dict(orient="records"), "stages": stages.to_dict(orient="records"),
            "cache_mb_per_1000_tokens": cache_mb}
    write_text_atomic(out_dir / "summary.json", json.dumps(meta, indent=2, default=str))
    write_text_atomic(out_dir / "summary.md", f"Command: `{settings.command(out_dir)}`\n\nDate: {meta['date']}. "
                      f"Skipped documents: {len(skipped)}.\n"
                      + "".join(f"* skipped {r['budget']} tokens {r['id']}: {r['error']}\n" for r in skipped)
                      + markdown(summary, stages, cache_mb)
                      + ("\nPaired differences over the same documents:\n\n" + paired_markdown(paired) + "\n"
                         if len(paired) else ""))
    return summary


def run(settings: LongSettings, out_dir: Path, resume: bool = False, progress: bool = True,
        overwrite: bool = False, layer_error: bool = False) -> pd.DataFrame:
    """Evaluate every budget's documents (those out_dir already holds are kept with --resume) and write the results;
    partial results are written after every document and on an interruption. overwrite: write into an out_dir that
    holds other files (results_folder.check_results_folder). layer_error: also write layer_error.csv
    (mot_viz.eval.layer_error), keeping the rows of the documents kept."""
    config = check_settings(settings)
    previous = resumed_table(out_dir, settings, resume, overwrite, RESUME_KEYS, RESULT_FILES, RESULTS,
                             set(settings.conditions), "documents")
    if layer_error:  # the documents kept need their rows of layer_error.csv: --resume would not compute them
        check_resumed(out_dir, ("budget", "id"), previous)
    source, target = load_model(config["source"]["name"]), load_model(config["target"]["name"])
    docs = [d for b in settings.budgets for d in long_examples(settings.source, target.tokenizer, b, settings.n,
                                                                settings.seed)]
    mot = load_checkpoint(settings.checkpoint, source, target)[0]
    # what the methods load once; a calibrated one (kvcomm's layer choice) on the first document
    artifacts = run_artifacts(settings.conditions, settings.options, source, target, mot, [d.example for d in docs[:1]])
    settings.recorded = registry.recorded(artifacts)
    cache_mb = {f"source {source.spec.name}": kv_cache_bytes(source.spec) / 1e6,
                f"target {target.spec.name}": kv_cache_bytes(target.spec) / 1e6}
    rows = [] if previous is None else previous.to_dict(orient="records")
    layers = LayerErrorFile(out_dir, ("budget", "id"), [(r["budget"], r["id"]) for r in rows]) if layer_error else None

    def key(d):  # a document's place in the results: its budget and id
        return d.budget, d.example.id

    def compute(d):  # its rows, one per condition
        return document_rows(mot, source, target, d, settings, artifacts, layers)

    def skipped(d):  # what the row of a document that does not fit says of it
        return {"budget": d.budget, "source": d.source, "id": d.example.id}

    def write_results():
        return write(out_dir, pd.DataFrame(rows, columns=ROW_COLUMNS), settings, cache_mb)

    done = {(int(r["budget"]), r["id"]) for r in rows}
    return run_units(docs, rows, done, key, compute, skipped, write_results, "long context", progress,
                     spread=Spread(out_dir, settings, RESULTS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="the MoT checkpoint folder to evaluate")
    parser.add_argument("--source", default="stacks", help=f"{' | '.join(SOURCES)} | a .jsonl file of long contexts")
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS), help="target tokens per document")
    parser.add_argument("--n", type=int, default=48, help="documents per budget (stacks balance three depths)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the document sample")
    parser.add_argument("--conditions", nargs="+", choices=all_conditions(), default=list(CONDITIONS),
                        help="caches to answer from (native is always needed)")
    parser.add_argument("--max_new_tokens", type=int, default=MAX_NEW_TOKENS, help="longest generated answer")
    registry.add_options(parser, registry.choices(KIND))  # each way of sharing's own flags (Method.options)
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of each interval")
    parser.add_argument("--out", required=True, help="folder of the results (created when missing)")
    parser.add_argument("--resume", action="store_true", help="keep the documents --out already holds")
    parser.add_argument("--layer_error", action="store_true", help="also write layer_error.csv: per document and "
                        "target layer, the K/V error of the MoT cache against the native one")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an --out folder that holds other files, replacing those of the same names")
    args = parser.parse_args(argv)
    conditions = with_always(KIND, args.conditions)

    def body():
        options = registry.run_options(vars(args), conditions, registry.choices(KIND), args.checkpoint)
        settings = LongSettings(args.checkpoint, args.source, tuple(args.budgets), args.n, args.seed,
                                args.max_new_tokens, args.bootstrap, conditions, options)
        return shown(run(settings, Path(args.out), args.resume, overwrite=args.overwrite,
                         layer_error=args.layer_error), lambda s: markdown(s, pd.DataFrame(), {}))

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
