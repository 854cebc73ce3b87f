"""Several readers, one hub: a long document split into shards, each read by its own source agent, answered by the
target from the translated shards composed in one cache (mot_viz.engine.shards).

    python -m mot_viz.eval.shards --checkpoint pretrained/smollm2-to-gemma3-mid --budget 1024 --shards 2 4 --n 50 \\
        --out results/shards/smollm2-to-gemma3-mid-stacks [--resume]

Documents are distractor stacks (mot_viz.data.long_context) of `budget` target tokens, split at paragraph boundaries
into k shards of about equal target tokens (shard_document); the prompt's frame before the document goes with the
first shard, the one after it with the last. The target answers from each setting's cache of the same document:

* *native* — the hub reads the whole text itself (its own prefill: the ceiling);
* *whole* — one source agent reads everything (mot.translate of the whole text, replayed);
* *shards_k* — k source agents each read one shard alone; their translations are placed at their offsets in one
  window and the whole document is replayed once (translate_shards);
* *evidence_k* — only the shard that holds the evidence, translated and replayed alone (in the prompt's frame);
* *no_context* — the question alone (the floor of gap closed);
* on request (--conditions, mot_viz.sharing), the other ways of sharing the document, each with one reader and
  with k: *relay* / *relay_q* (the reader writes a message from the whole document; *relay_k*: each of k agents
  writes its own message from its shard alone, and the hub reads only the messages, joined in document order) and
  *direct* (the full-depth map without replay of the whole document; *direct_k*: each shard translated alone by it
  and the shards' caches joined, every layer's keys moved to the shard's offset as the MoT's window is: a RoPE
  model's keys carry their position only in that rotation, and values none, so the move is exact. What a composed
  direct cache lacks is any reading across shards: no layer of the hub computes over the document, while the MoT's
  replay reads the whole document in its dense bottom layers); and the controls of mot_viz.eval.long_context:
  *linear* (the pair's closed-form map of the same window, --linear, default <checkpoint>-linear: one reader, and
  *linear_k* composed from k shards as the MoT's are) and *mean* (the window's K/V the mean native ones: no
  document in the window, whatever the shards).

Reported per setting: F1 with a bootstrap interval, what is handed to the hub and what it computes over the document
(sharing.costs.cost_fields), the seconds before the hub reads the question (the sources' reading excluded; k relay
agents write in parallel: the slowest one counts), retention (F1 ÷ native) and gap closed with paired intervals,
paired differences over the same documents, median seconds per stage (the sources' prefills summed and the slowest
agent's, i.e. their wall time when they read in parallel; alignment, translator, replay; the native prefill) and
the memory held in fp16 (models.kv_cache_bytes): every source agent's cache of what it read (summed, and the
largest one) and the hub's cache.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..cli import run_cli
from ..data.long_context import MIN_BUDGET, LongExample, distractor_stacks
from ..engine.checkpoint import load_checkpoint, read_config
from ..engine.models import LoadedModel, load_model
from ..engine.mot import MoT
from ..errors import ConfigError
from ..fsutil import write_csv_atomic, write_text_atomic
from ..sharing import registry
from ..sharing.caches import run_artifacts
from ..sharing.costs import COST_COLUMNS, LOOPED_COLUMNS, MESSAGE_COLUMNS, cost_fields, cost_medians, work_text
from ..sharing.method import Request
from ..sharing.registry import FLOOR, REFERENCE
from .answers import MAX_NEW_TOKENS, answers_from_caches
from .policy import on_request
from .processes import Spread, resumed_table, run_units, shown
from .results_folder import ResultsTable
from .sharing_settings import SharingSettings
from .long_settings import check_budget
from .qa_metrics import bootstrap_ci, condition_ratios
from .report import paired_differences, paired_markdown
from .shard_caches import SettingCache, mb, setting_caches

KIND = "shards"  # this evaluation, as the sharing registry names it
STAGES = ("source_prefill", "source_prefill_max", "alignment", "translator", "replay", "native_prefill")
ROW_COLUMNS = ("budget", "id", "depth", "evidence_fraction", "condition", "shards", "score", "exact_match", "answer",
               "gold", "hub_tokens", "source_tokens", *STAGES, "answer_seconds", "source_mb", "source_max_mb",
               "hub_mb", "peak_rss_mb", "error", *MESSAGE_COLUMNS, "message_generate_max_seconds", *COST_COLUMNS,
               *LOOPED_COLUMNS)
TEXT_COLUMNS = ("id", "depth", "condition", "answer", "gold", "error", "message", "target_work")
RESUME_KEYS = ("checkpoint", "budget", "shards", "seed", "max_new_tokens", "sharing", "options")
# on request (the registry's order): the other ways of sharing a document this evaluation composes from shards
# (relay, relay_q, direct) and the controls beside them (linear: the closed-form map of the window; mean: the
# mean-vector window)
RESULTS = ResultsTable(ROW_COLUMNS, TEXT_COLUMNS, ("id",),
                       ("score", "hub_tokens", "source_tokens", "answer_seconds", "source_mb", "source_max_mb",
                        "hub_mb", "peak_rss_mb"), ("evidence_fraction", "exact_match", *STAGES),
                       (ROW_COLUMNS[:-1], ROW_COLUMNS[:ROW_COLUMNS.index("error") + 1]))
RESULT_FILES = ("examples.csv", "summary.csv", "paired.csv", "summary.json", "summary.md")
NO_ROPE = ("gpt2", "opt")  # model types whose positions live in the hidden states: a shard cannot be moved
# target tokens a stack's paragraph holds at the least (a SQuAD paragraph is a few sentences): a shard holds at least
# one paragraph, so a budget holds at most budget // PARAGRAPH_TOKENS shards
PARAGRAPH_TOKENS = 16


def conditions(shards: tuple[int, ...], sharing: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The settings answered from, in the tables' order."""
    return (REFERENCE, "whole", *(f"shards_{k}" for k in shards), *(f"evidence_{k}" for k in shards),
            *(c for m in sharing for c in (m, *(f"{m}_{k}" for k in shards if not registry.method(m).one_reader))),
            FLOOR)


def pairs(shards: tuple[int, ...], sharing: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    """The paired differences: what composing k shards costs against one reader and the hub reading, and what the
    other shards add to the one that holds the answer; the other ways of sharing against the MoT, one reader and k."""
    out = [("whole", REFERENCE)]
    for k in shards:
        out += [(f"shards_{k}", "whole"), (f"shards_{k}", REFERENCE), (f"shards_{k}", f"evidence_{k}"),
                (f"evidence_{k}", "whole")]
    for m in sharing:
        out += [("whole", m), *((f"shards_{k}", f"{m}_{k}") for k in shards if not registry.method(m).one_reader)]
    return tuple(out)


@dataclass
class ShardSettings(SharingSettings):
    """How one shard run was made; written beside its results."""

    checkpoint: str
    budget: int  # target tokens per document
    shards: tuple[int, ...]  # shard counts compared (each ≥ 2)
    n: int  # documents
    seed: int = 0
    max_new_tokens: int = MAX_NEW_TOKENS
    bootstrap: int = 1000
    sharing: tuple[str, ...] = ()  # other ways of sharing the document and controls (policy.on_request(KIND))
    options: dict = field(default_factory=dict)  # the ways of sharing's options, by name (registry.run_options)
    recorded: dict = field(default_factory=dict)  # what their artifacts recorded (set by run())

    @classmethod
    def offered(cls) -> tuple[str, ...]:
        return registry.choices(KIND)

    @classmethod
    def from_json(cls, data: dict) -> ShardSettings:
        return cls(**{**cls.split_json(data), "shards": tuple(data["shards"]),
                      "sharing": tuple(data.get("sharing", ()))})

    def command(self, out_dir: Path | None = None) -> str:
        """The command line that runs this evaluation (writing to `out_dir` when given)."""
        return (f"python -m mot_viz.eval.shards --checkpoint {self.checkpoint} --budget {self.budget} --shards "
                f"{' '.join(map(str, self.shards))} --n {self.n} --seed {self.seed} --max_new_tokens "
                f"{self.max_new_tokens}" + (f" --conditions {' '.join(self.sharing)}" if self.sharing else "")
                + self.option_args(self.sharing)
                + (f" --out {out_dir}" if out_dir is not None else ""))


def check_settings(settings: ShardSettings) -> dict:
    """Raise a MotVizError for settings no run can use, before any model is loaded; returns the checkpoint's config."""
    if min(settings.n, settings.bootstrap, settings.max_new_tokens) < 1:
        raise ConfigError("--n, --bootstrap and --max_new_tokens must each be at least 1.")
    if not settings.shards or min(settings.shards) < 2 or len(set(settings.shards)) != len(settings.shards):
        raise ConfigError(f"--shards takes distinct shard counts of at least 2 (one reader is the 'whole' setting), "
                          f"e.g. --shards 2 4; got {list(settings.shards)}.")
    if settings.budget < MIN_BUDGET:
        raise ConfigError(f"--budget is a number of target tokens of at least {MIN_BUDGET}, got {settings.budget}.")
    most = settings.budget // PARAGRAPH_TOKENS
    if max(settings.shards) > most:
        raise ConfigError(f"--shards {max(settings.shards)}: a {settings.budget}-token document holds far fewer "
                          f"paragraphs, and shards are cut between paragraphs. Ask for at most {most} shards (a few "
                          "per document is what the comparison is for), or a larger --budget.")
    config = read_config(settings.checkpoint)
    if config["target"]["model_type"] in NO_ROPE:
        raise ConfigError(f"the target model '{config['target']['name']}' ({config['target']['model_type']}) has no "
                          "rotary position embedding, so translated shards cannot be placed at their offsets. Choose "
                          "a checkpoint whose target is a RoPE model (Llama, Qwen2, Gemma 3).")
    check_budget(settings.budget, {role: (config[role]["name"], config[role].get("max_positions"))
                                   for role in ("source", "target")}, settings.max_new_tokens, ConfigError)
    registry.check_names(settings.sharing, on_request(KIND))
    registry.check(Request(settings.sharing, config, settings.checkpoint, settings.budget, settings.options))
    return config


@dataclass
class DocumentResult:
    """One document evaluated: a row per setting (document_rows) and the settings' caches they came from."""

    rows: list[dict]
    caches: dict[str, SettingCache]


def evaluate_document(mot: MoT, source: LoadedModel, target: LoadedModel, doc: LongExample,
                      settings: ShardSettings, artifacts=None) -> DocumentResult:
    """Every setting's cache of one document, its answer and F1, the seconds of its stages, the memory it holds,
    what is handed to the hub and what it computes (artifacts: what the run's methods loaded once)."""
    example = doc.example
    caches = setting_caches(mot, source, target, doc, settings.shards, settings.sharing, settings.options, artifacts)
    p, window = len(target.prefix_ids), len(mot.channels.target_layers)
    answers = answers_from_caches(target, {c: s.kv for c, s in caches.items()}, example, settings.max_new_tokens)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    rows = [{"budget": doc.budget, "id": example.id, "depth": doc.depth, "evidence_fraction": doc.evidence_fraction,
             "condition": c, "shards": s.shards, "score": answers[c].score, "exact_match": answers[c].exact_match,
             "answer": answers[c].text, "gold": " | ".join(example.answers), "hub_tokens": s.hub_tokens,
             "source_tokens": s.source_tokens, **{stage: s.timings.get(stage, np.nan) for stage in STAGES},
             "answer_seconds": answers[c].seconds, "source_mb": s.source_mb, "source_max_mb": s.source_max_mb,
             "hub_mb": mb(target.spec, s.hub_tokens), "peak_rss_mb": peak, "error": None,
             **cost_fields(c, s.built, s.hub_tokens - p, target, window,
                           registry.method(c).target_side(s.built, s.timings), source)}
            for c, s in caches.items()]
    return DocumentResult(rows, caches)


def document_rows(mot: MoT, source: LoadedModel, target: LoadedModel, doc: LongExample,
                  settings: ShardSettings, artifacts=None) -> list[dict]:
    """One row per setting of one document: its answer and F1, the seconds of its stages, the memory it holds."""
    return evaluate_document(mot, source, target, doc, settings, artifacts).rows


def summarize(rows: pd.DataFrame, shards: tuple[int, ...], n_boot: int = 1000, seed: int = 0,
              sharing: tuple[str, ...] = ()) -> pd.DataFrame:
    """Per setting: F1 with its interval over the documents every setting answered, retention and gap closed
    against native with paired intervals, median seconds per stage (and before the hub reads the question), median
    memory (MB), what is handed to the hub and what it computes."""
    scored = rows[rows["condition"] != "skipped"]
    wide = scored.pivot_table(index="id", columns="condition", values="score").dropna()
    out = []
    for condition in [c for c in conditions(shards, sharing) if c in wide]:
        part = scored[scored["condition"] == condition]
        ci = bootstrap_ci(wide[condition].to_numpy(), n_boot=n_boot, seed=seed)
        medians = part[[*STAGES, "answer_seconds", "hub_tokens", "source_mb", "source_max_mb", "hub_mb"]].median()
        out.append({"condition": condition, "n": len(wide), "mean": ci.mean, "ci_low": ci.lo, "ci_high": ci.hi,
                    **(condition_ratios(wide, condition, n_boot, seed) if not registry.method(condition).bound
                       else {}), **{k: float(v) for k, v in medians.items()},
                    "target_side_seconds": float(part["target_side_seconds"].median())
                    if "target_side_seconds" in part else np.nan, **cost_medians(part)})
    return pd.DataFrame(out)


def _fmt(value, spec: str) -> str:
    return "–" if value is None or pd.isna(value) else format(value, spec)


def markdown(summary: pd.DataFrame) -> str:
    """The summary as one table: F1, retention, gap closed, median seconds per stage, memory."""
    lines = ["| setting | n | F1 [95% CI] | retention [95% CI] | gap closed | source prefill s: sum / slowest | "
             "alignment + translator s | replay s | native prefill s | source caches MB: sum / largest | "
             "hub cache MB | s before the question | handed over (bytes) | hub computes |",
             "|---|---:|---|---|---:|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in summary.to_dict(orient="records"):
        ratio = (f"{_fmt(r.get('retention'), '.1%')} [{_fmt(r.get('retention_ci_low'), '.1%')}, "
                 f"{_fmt(r.get('retention_ci_high'), '.1%')}]" if "retention" in r and not pd.isna(r["retention"])
                 else "–")
        lines.append(f"| {r['condition']} | {r['n']} | {r['mean']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | "
                     f"{ratio} | {_fmt(r.get('gap_closed'), '+.2f')} | {_fmt(r['source_prefill'], '.2f')} / "
                     f"{_fmt(r['source_prefill_max'], '.2f')} | "
                     f"{_fmt(r['alignment'] + r['translator'], '.3f')} | {_fmt(r['replay'], '.2f')} | "
                     f"{_fmt(r['native_prefill'], '.2f')} | {r['source_mb']:.1f} / {r['source_max_mb']:.1f} | "
                     f"{r['hub_mb']:.1f} | {_fmt(r.get('target_side_seconds'), '.2f')} | "
                     f"{_fmt(r.get('handed_bytes'), ',.0f')} | "
                     f"{work_text(r.get('target_work', ''), r.get('target_tokens', np.nan))} |")
    return "\n".join(lines) + "\n"


def write(out_dir: Path, rows: pd.DataFrame, settings: ShardSettings) -> pd.DataFrame:
    """Every result file of the run, each written whole (a kill never leaves a torn file)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows, settings.shards, settings.bootstrap, settings.seed, settings.sharing)
    paired = paired_differences(rows.assign(dataset=f"stacks {settings.budget} tokens"),
                                pairs(settings.shards, settings.sharing),
                                settings.bootstrap, settings.seed)
    for name, frame in (("examples.csv", rows), ("summary.csv", summary), ("paired.csv", paired)):
        write_csv_atomic(out_dir / name, frame)
    skipped = rows.loc[rows["condition"] == "skipped", ["id", "error"]].to_dict(orient="records")
    meta = {"settings": settings.to_json(), "date": str(datetime.date.today()), "skipped": skipped,
            "summary": summary.to_dict(orient="records")}
    write_text_atomic(out_dir / "summary.json", json.dumps(meta, indent=2, default=str))
    write_text_atomic(out_dir / "summary.md", f"Command: `{settings.command(out_dir)}`\n\nDate: {meta['date']}. "
                      f"Distractor stacks of {settings.budget} target tokens; skipped documents: {len(skipped)}. "
                      "Seconds are medians of one run on this machine; memory is fp16 KV cache (every layer, a "
                      "sliding layer counted at most its window), medians over the documents.\n\n"
                      + (markdown(summary) if len(summary) else "")
                      + ("\nPaired differences over the same documents:\n\n" + paired_markdown(paired) + "\n"
                         if len(paired) else ""))
    return summary


def run(settings: ShardSettings, out_dir: Path, resume: bool = False, progress: bool = True,
        overwrite: bool = False) -> pd.DataFrame:
    """Evaluate the documents (those out_dir already holds are kept with --resume) and write the results; partial
    results are written after every document and on an interruption. overwrite: write into an out_dir that holds
    other files (results_folder.check_results_folder)."""
    config = check_settings(settings)
    previous = resumed_table(out_dir, settings, resume, overwrite, RESUME_KEYS, RESULT_FILES, RESULTS,
                             set(conditions(settings.shards, settings.sharing)), "documents")
    source, target = load_model(config["source"]["name"]), load_model(config["target"]["name"])
    docs = distractor_stacks(target.tokenizer, settings.budget, settings.n, settings.seed)
    mot = load_checkpoint(settings.checkpoint, source, target)[0]
    artifacts = run_artifacts(settings.sharing, settings.options, source, target, mot)
    settings.recorded = registry.recorded(artifacts)
    rows = [] if previous is None else previous.to_dict(orient="records")

    def key(d):  # a document's place in the results: its id
        return d.example.id

    def compute(d):  # its rows, one per setting and way of sharing
        return document_rows(mot, source, target, d, settings, artifacts)

    def skipped(d):  # what the row of a document that does not fit says of it
        return {"budget": d.budget, "id": d.example.id, "depth": d.depth}

    def write_results():
        return write(out_dir, pd.DataFrame(rows, columns=ROW_COLUMNS), settings)

    return run_units(docs, rows, {r["id"] for r in rows}, key, compute, skipped, write_results, "shards", progress,
                     spread=Spread(out_dir, settings, RESULTS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="the MoT checkpoint folder to evaluate")
    parser.add_argument("--budget", type=int, default=1024, help="target tokens per document")
    parser.add_argument("--shards", type=int, nargs="+", default=[2, 4], help="shard counts (source agents) compared")
    parser.add_argument("--n", type=int, default=50, help="documents (stacks balance three evidence depths)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the document sample")
    parser.add_argument("--max_new_tokens", type=int, default=MAX_NEW_TOKENS, help="longest generated answer")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of each interval")
    parser.add_argument("--conditions", nargs="+", choices=on_request(KIND), default=[],
                        help="other ways of sharing the document, each with one reader and with every shard count: "
                             "relay / relay_q (each agent writes a message; the hub reads them), direct (--direct); "
                             "the controls linear (--linear) and mean (the mean-vector window, one reader)")
    registry.add_options(parser, registry.choices(KIND))  # each way of sharing's own flags (Method.options)
    parser.add_argument("--out", required=True, help="folder of the results (created when missing)")
    parser.add_argument("--resume", action="store_true", help="keep the documents --out already holds")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an --out folder that holds other files, replacing those of the same names")
    args = parser.parse_args(argv)
    sharing = registry.names(among=args.conditions)

    def body():
        options = registry.run_options(vars(args), sharing, registry.choices(KIND), args.checkpoint)
        settings = ShardSettings(args.checkpoint, args.budget, tuple(args.shards), args.n, args.seed,
                                 args.max_new_tokens, args.bootstrap, sharing, options)
        return shown(run(settings, Path(args.out), args.resume, overwrite=args.overwrite), markdown)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
