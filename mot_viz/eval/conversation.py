"""Conversations over one read: a translated cache kept over a whole CoQA conversation (the multi-agent case study).

The source model reads the story once; its cache is translated and replayed into the target (the *MoT* cache).
The target then answers the conversation turn by turn from the cache it keeps, and after each turn that turn's
question and reference answer are appended to every kept cache (the history CoQA's own task carries: the earlier
questions with their first reference answer), so every condition reads the same history and only the story's cache
differs. Conditions: *native* (the target read the story itself: the ceiling), *mot*, *no_context* (no story), and
on request (--conditions) the controls of mot_viz.eval.long_context, *linear* (the pair's closed-form map of the same
window, --linear, default <checkpoint>-linear, replayed as the MoT) and *mean* (the window filled with mean native
vectors: no story in the window), each built once per story and kept, and the ways of sharing the story of
mot_viz.sharing: *relay* (the source's summary of the story, written once per story and kept as the
conversation's context: the target reads only it), *direct* (the full-depth map's cache of the story, kept) and
*kvcomm* (a pair of one architecture: its cache and its plan, which hides the story from the unshared layers, kept
for every turn: the history is appended under that plan). *relay_q* is refused: its message answers one question,
and a conversation asks one per turn.

Per turn: F1 against the turn's references; the time of the turn (answer + appending the history), cumulative from
the start (MoT: alignment + translator + replay, then the turns; native: the target's own prefill, then the turns;
the source's prefill is reported apart, since in the use case the source has read the story for its own work);
the memory held, in fp16 bytes: the target's cache, and for MoT the translator's weights, plus, in *retain* mode
(every agent keeps its cache), the source's cache of the story, which *free* mode drops once it is handed over.

    python -m mot_viz.eval.conversation --checkpoint pretrained/smollm2-to-gemma3-mid --n 30 --turns 5 \\
        --out results/conversation/smollm2-to-gemma3-mid-coqa
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..cli import run_cli
from ..data.coqa import Conversation, coqa_conversations
from ..engine import hf
from ..engine.alignment import encode
from ..engine.checkpoint import load_checkpoint, read_config
from ..engine.models import LoadedModel, kv_cache_bytes, load_model
from ..engine.mot import MoT
from ..engine.prompts import QAExample, build_prompt
from ..errors import ConfigError, ContextError
from ..fsutil import write_csv_atomic, write_text_atomic
from ..sharing import registry
from ..sharing.caches import condition_caches, run_artifacts
from ..sharing.costs import COST_COLUMNS, LOOPED_COLUMNS, MESSAGE_COLUMNS, cost_fields, cost_medians, work_text
from ..sharing.method import Request
from ..sharing.registry import FLOOR, REFERENCE, TRANSLATED
from .answers import MAX_NEW_TOKENS, answers_from_caches
from .policy import ALWAYS
from .report import paired_differences
from .processes import Spread, resumed_table, run_units, shown
from .results_folder import ResultsTable
from .sharing_settings import SharingSettings
from .qa_metrics import bootstrap_ci, condition_ratios

KIND = "conversation"  # this evaluation, as the sharing registry names it
CONDITIONS = ALWAYS[KIND]  # every run's


def others() -> tuple[str, ...]:
    """The ways of sharing answered on request, in the rows' order."""
    return tuple(c for c in registry.choices(KIND) if c not in CONDITIONS)


def controls() -> tuple[str, ...]:
    """The controls on request: the pair's closed-form map of the window, the mean-vector window."""
    return registry.controls(others())


def shared() -> tuple[str, ...]:
    """The other ways of sharing the story on request (a method written for one question cannot serve a
    conversation)."""
    return registry.names(lambda m: not m.for_question, tuple(c for c in others() if c not in controls()))


def pairs() -> tuple[tuple[str, str], ...]:
    """The paired tests: does the MoT beat no story, its own map, a window with no story in it, each way of sharing
    it?"""
    return ((TRANSLATED, FLOOR), *((TRANSLATED, c) for c in controls()), *registry.control_pairs(controls()),
            *((TRANSLATED, c) for c in shared()), *((c, FLOOR) for c in shared()))
ROW_COLUMNS = ("id", "genre", "turn", "condition", "score", "answer", "gold", "turn_seconds", "cache_tokens",
               "story_tokens", "source_tokens", "source_prefill", "alignment", "translator", "replay",
               "native_prefill", "error", *MESSAGE_COLUMNS, *COST_COLUMNS, *LOOPED_COLUMNS)
TEXT_COLUMNS = ("id", "genre", "condition", "answer", "gold", "error", "message", "target_work")
RESUME_KEYS = ("checkpoint", "turns", "seed", "max_new_tokens", "max_story_tokens", "conditions", "options")
RESULTS = ResultsTable(ROW_COLUMNS, TEXT_COLUMNS, ("id",),
                       ("turn", "score", "turn_seconds", "cache_tokens", "story_tokens", "source_tokens"),
                       ("source_prefill", "alignment", "translator", "replay", "native_prefill"),
                       (ROW_COLUMNS[:-1], ROW_COLUMNS[:ROW_COLUMNS.index("error") + 1]))
RESULT_FILES = ("examples.csv", "summary.csv", "paired.csv", "summary.json", "summary.md")
HISTORY_ROOM = 24  # target tokens allowed per turn for its question and reference answer in the position check


@dataclass
class ConversationSettings(SharingSettings):
    """How one conversation run was made; written beside its results."""

    checkpoint: str
    n: int  # conversations
    turns: int  # turns per conversation
    seed: int = 0
    max_new_tokens: int = MAX_NEW_TOKENS
    max_story_tokens: int = 512
    bootstrap: int = 1000
    conditions: tuple[str, ...] = CONDITIONS  # CONDITIONS and any of controls() and shared()
    options: dict = field(default_factory=dict)  # the ways of sharing's options, by name (registry.run_options)
    recorded: dict = field(default_factory=dict)  # what their artifacts recorded (kvcomm's layers; set by run())

    @classmethod
    def offered(cls) -> tuple[str, ...]:
        return registry.choices(KIND)

    @classmethod
    def from_json(cls, data: dict) -> ConversationSettings:
        return cls(**{**cls.split_json(data), "conditions": tuple(data.get("conditions", CONDITIONS))})

    def command(self, out_dir: Path | None = None) -> str:
        return (f"python -m mot_viz.eval.conversation --checkpoint {self.checkpoint} --n {self.n} --turns "
                f"{self.turns} --seed {self.seed} --max_new_tokens {self.max_new_tokens} --max_story_tokens "
                f"{self.max_story_tokens}"
                + ("" if self.conditions == CONDITIONS else f" --conditions {' '.join(self.conditions)}")
                + self.option_args(self.conditions)
                + (f" --out {out_dir}" if out_dir is not None else ""))


def check_settings(settings: ConversationSettings) -> dict:
    """Raise a MotVizError for settings no run can use, before any model is loaded; returns the checkpoint's config."""
    if min(settings.n, settings.turns, settings.max_new_tokens, settings.bootstrap, settings.max_story_tokens) < 1:
        raise ConfigError("--n, --turns, --max_new_tokens, --max_story_tokens and --bootstrap must each be at least "
                          "1 (a conversation needs a turn).")
    for_question = registry.names(lambda m: m.for_question, settings.conditions)
    if for_question:
        raise ConfigError(f"{for_question[0]} writes the background for one question, and a conversation asks one "
                          "per turn: use relay (the source's summary of the story, written once and kept).")
    registry.check_names(settings.conditions, CONDITIONS + controls() + shared())
    if not set(CONDITIONS) <= set(settings.conditions):
        raise ConfigError(f"--conditions always holds {' '.join(CONDITIONS)} (the tables compare against them).")
    config = read_config(settings.checkpoint)
    registry.check(Request(settings.conditions, config, settings.checkpoint, settings.max_story_tokens,
                           settings.options))
    needed = settings.max_story_tokens + settings.turns * (HISTORY_ROOM + settings.max_new_tokens) + 64
    for role in ("source", "target"):
        limit = config[role].get("max_positions")
        if role == "target" and limit and needed > limit:
            raise ConfigError(f"a {settings.max_story_tokens}-token story and {settings.turns} turns of answers up to "
                              f"{settings.max_new_tokens} tokens need about {needed} positions; the target model "
                              f"'{config[role]['name']}' allows {limit}. Lower --max_new_tokens, --max_story_tokens or "
                              "--turns.")
        if role == "source" and limit and settings.max_story_tokens + 64 > limit:
            raise ConfigError(f"a {settings.max_story_tokens}-token story does not fit the source model "
                              f"'{config[role]['name']}' ({limit} positions). Lower --max_story_tokens.")
    return config


def turn_example(conversation: Conversation, turn: int) -> QAExample:
    """Turn `turn` of a conversation as a QA example over its story."""
    t = conversation.turns[turn]
    return QAExample(id=f"{conversation.id}_turn{turn}", dataset="coqa/validation", context=conversation.story,
                     question=t.question, answers=t.answers)


def history_text(suffix_text: str, answer: str) -> str:
    """What a turn appends to every kept cache: its question (the suffix) and the reference answer, then a blank
    line before the next question (as CoQA's task writes its history)."""
    return f"{suffix_text} {answer}\n\n"


def cache_mb(lm: LoadedModel, tokens: int) -> float:
    """Megabytes of `tokens` positions of the model's cache in fp16 (every layer, K and V)."""
    return kv_cache_bytes(lm.spec, tokens) / 1e6


def translator_mb(mot: MoT) -> float:
    """Megabytes of the translator's weights in fp16 (as shipped)."""
    return sum(p.numel() for p in mot.parameters()) * 2 / 1e6


@torch.no_grad()
def conversation_rows(mot: MoT, source: LoadedModel, target: LoadedModel, conversation: Conversation,
                      settings: ConversationSettings, artifacts=None) -> list[dict]:
    """One row per turn and condition: the answer, its F1, the turn's seconds and the cache the condition keeps.
    Every cache of the story is built once (sharing.caches.condition_caches: a relay's message is written once per
    story; the linear map's window is of the MoT's own source context); a kvcomm cache is answered and
    extended under its plan. artifacts: what the run's methods loaded once (registry.load_artifacts)."""
    if not conversation.turns:
        raise ContextError(f"conversation {conversation.id} has no turns: there is nothing to answer.")
    built = condition_caches(mot, source, target, turn_example(conversation, 0), conditions=settings.conditions,
                             options=settings.options, artifacts=artifacts)
    translation, plans = built.translation, built.plans
    caches = {c: built.kv[c] for c in settings.conditions}
    timings = translation.timings
    tokens = int(translation.target_ids.shape[1])
    fixed = {"id": conversation.id, "genre": conversation.source, "story_tokens": tokens,
             "source_tokens": int(translation.source.source_ids.shape[1]),
             **{stage: timings.get(stage, np.nan) for stage in ("source_prefill", "alignment", "translator", "replay",
                                                                 "native_prefill")}}
    costs = {c: cost_fields(c, built.built[c], tokens, target, len(mot.channels.target_layers), built.target_side(c),
                            source) for c in caches}
    rows = []
    for turn in range(len(conversation.turns)):
        example = turn_example(conversation, turn)
        suffix = build_prompt(example, target.chat_frame).suffix_text
        answers = answers_from_caches(target, caches, example, settings.max_new_tokens, suffix, plans=plans)
        history = target.ids_tensor(encode(target.tokenizer, history_text(suffix, example.answers[0])))
        for condition, kv in caches.items():
            start = time.perf_counter()
            caches[condition] = hf.run(target.model, history, kv, plans.get(condition), logits_to_keep=None).kv
            rows.append({**fixed, "turn": turn + 1, "condition": condition, "score": answers[condition].score,
                         "answer": answers[condition].text, "gold": " | ".join(example.answers),
                         "turn_seconds": answers[condition].seconds + time.perf_counter() - start,
                         "cache_tokens": int(caches[condition][0][0].shape[2]), **costs[condition]})
    return rows


def summarize(rows: pd.DataFrame, target_spec_mb: float, source_spec_mb: float, translator: float,
              n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per turn and condition: F1 with its interval, MoT's retention of native F1 (paired), the cumulative seconds
    (medians over conversations) and the memory held (medians, MB): target cache, + translator, + source cache
    (retain). target_spec_mb / source_spec_mb: each model's fp16 cache MB per token."""
    scored = rows[rows["condition"] != "skipped"].copy()
    scored["turn"] = scored["turn"].astype(int)
    # every run's conditions: Method.target_side of each row's stages (its columns); the others: as their rows recorded
    # it (linear and mean: not measured, NaN)
    start = {**{c: registry.method(c).target_side(None, scored) for c in CONDITIONS},
             **{c: scored["target_side_seconds"] for c in controls() + shared() if c in set(scored["condition"])}}
    scored["start_seconds"] = 0.0
    for condition, seconds in start.items():
        mask = scored["condition"] == condition
        scored.loc[mask, "start_seconds"] = seconds[mask] if isinstance(seconds, pd.Series) else seconds
    scored = scored.sort_values(["id", "condition", "turn"])
    scored["cumulative_seconds"] = scored["start_seconds"] + scored.groupby(["id", "condition"])["turn_seconds"].cumsum()
    out = []
    for turn, part in scored.groupby("turn", sort=True):
        wide = part.pivot_table(index="id", columns="condition", values="score").dropna()
        for condition in [c for c in CONDITIONS + controls() + shared() if c in wide]:
            rows_c = part[part["condition"] == condition]
            ci = bootstrap_ci(wide[condition].to_numpy(), n_boot=n_boot, seed=seed)
            target_mb = float(rows_c["cache_tokens"].median()) * target_spec_mb
            source_mb = float(rows_c["source_tokens"].median()) * source_spec_mb
            out.append({"turn": int(turn), "condition": condition, "n": len(wide), "mean": ci.mean, "ci_low": ci.lo,
                        "ci_high": ci.hi,
                        **(condition_ratios(wide, condition, n_boot, seed) if not registry.method(condition).bound
                           else {}),
                        "start_seconds": float(rows_c["start_seconds"].median()),
                        "cumulative_seconds": float(rows_c["cumulative_seconds"].median()),
                        "memory_mb": target_mb + (translator if condition == TRANSLATED else 0.0),
                        "memory_retain_mb": target_mb + (translator if condition == TRANSLATED else 0.0)
                        + (source_mb if registry.method(condition).reads_source else 0.0), **cost_medians(rows_c)})
    return pd.DataFrame(out)


def overall(rows: pd.DataFrame, n_boot: int = 1000, seed: int = 0, condition: str = TRANSLATED) -> dict:
    """Each condition's F1 over all turns (the mean of each conversation's turns, then over conversations) and
    `condition`'s (default the MoT's) retention of native's and gap closed, with paired intervals over the
    conversations."""
    scored = rows[rows["condition"] != "skipped"]
    wide = scored.pivot_table(index="id", columns="condition", values="score", aggfunc="mean").dropna()
    return {**{c: float(wide[c].mean()) for c in wide.columns}, "n": len(wide),
            **condition_ratios(wide, condition, n_boot, seed)}


def markdown(summary: pd.DataFrame) -> str:
    """The summary as one table per condition block: F1 per turn, retention, cumulative time and memory."""
    lines = ["| turn | native F1 [95% CI] | MoT F1 [95% CI] | no story F1 | MoT retention [95% CI] | cumulative s: "
             "native / MoT | memory MB: native / MoT free / MoT retain |", "|---|---|---|---|---|---|---|"]
    for turn, part in summary.groupby("turn", sort=True):
        c = part.set_index("condition")
        fmt = lambda name: f"{c.loc[name, 'mean']:.3f} [{c.loc[name, 'ci_low']:.3f}, {c.loc[name, 'ci_high']:.3f}]"
        m, native = c.loc[TRANSLATED], c.loc[REFERENCE]
        lines.append(f"| {turn} | {fmt(REFERENCE)} | {fmt(TRANSLATED)} | {c.loc[FLOOR, 'mean']:.3f} | "
                     f"{m['retention']:.1%} [{m['retention_ci_low']:.1%}, {m['retention_ci_high']:.1%}] | "
                     f"{native['cumulative_seconds']:.2f} / {m['cumulative_seconds']:.2f} | "
                     f"{native['memory_mb']:.1f} / {m['memory_mb']:.1f} / {m['memory_retain_mb']:.1f} |")
    return "\n".join(lines) + "\n"


def sharing_markdown(summary: pd.DataFrame, paired: pd.DataFrame, rows: pd.DataFrame | None = None,
                     n_boot: int = 1000, seed: int = 0) -> str:
    """The controls and the other ways of sharing the story beside the MoT (none: ""): per condition, the last turn's
    F1, with `rows` its F1 over all turns and gap closed there (overall), the paired difference MoT − condition over
    the conversations (each its turns' mean), the seconds before the first turn (the source's reading excluded), what
    is handed over and what the target computes over the story."""
    if not len(summary):
        return ""
    last = summary[summary["turn"] == summary["turn"].max()].set_index("condition")
    listed = [c for c in (TRANSLATED, *controls(), *shared()) if c in last.index]
    if listed == [TRANSLATED]:
        return ""
    diffs = paired[paired["a"] == TRANSLATED].set_index("b") if len(paired) else pd.DataFrame()
    lines = ["", "Ways of sharing the story and the controls (F1 at the last turn and over all turns, each "
             "conversation its turns' mean; gap closed over all turns; MoT − condition over all turns, paired):", "",
             "| condition | F1 | F1, all turns | gap closed, all turns [95% CI] | MoT − condition [95% CI] "
             "| s before turn 1 | handed over (bytes) | target computes |",
             "|---|---:|---:|---|---|---:|---:|---|"]
    for c in listed:
        r = last.loc[c]
        d = diffs.loc[c] if c in diffs.index else None
        diff = "" if d is None else f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"
        whole, gap = "", ""
        if rows is not None:
            o = overall(rows, n_boot, seed, c)
            whole = f"{o[c]:.3f}"
            gap = f"{o['gap_closed']:+.2f} [{o['gap_closed_ci_low']:+.2f}, {o['gap_closed_ci_high']:+.2f}]"
        lines.append(f"| {c} | {r['mean']:.3f} | {whole} | {gap} | {diff} | {r['start_seconds']:.2f} | "
                     f"{r['handed_bytes']:,.0f} | {work_text(r['target_work'], r['target_tokens'])} |")
    return "\n".join(lines) + "\n"


def write(out_dir: Path, rows: pd.DataFrame, settings: ConversationSettings, sizes: dict[str, float]) -> pd.DataFrame:
    """Every result file of the run, each written whole (a kill never leaves a torn file)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows, sizes["target_mb_per_token"], sizes["source_mb_per_token"], sizes["translator_mb"],
                        settings.bootstrap, settings.seed)
    # over conversations, each its turns' mean
    paired = paired_differences(rows.assign(dataset="coqa"), pairs(), settings.bootstrap, settings.seed)
    for name, frame in (("examples.csv", rows), ("summary.csv", summary), ("paired.csv", paired)):
        write_csv_atomic(out_dir / name, frame)
    skipped = rows.loc[rows["condition"] == "skipped", ["id", "error"]].to_dict(orient="records")
    meta = {"settings": settings.to_json(), "date": str(datetime.date.today()), "skipped": skipped, "sizes": sizes,
            "summary": summary.to_dict(orient="records")}
    write_text_atomic(out_dir / "summary.json", json.dumps(meta, indent=2, default=str))
    n = rows.loc[rows["condition"] != "skipped", "id"].nunique()
    total = ""
    if len(summary):
        o = overall(rows, settings.bootstrap, settings.seed)
        total = (f"\nOver all turns ({o['n']} conversations, each its turns' mean): native F1 {o[REFERENCE]:.3f}, MoT "
                 f"{o[TRANSLATED]:.3f}, no story {o[FLOOR]:.3f}; MoT keeps {o['retention']:.1%} "
                 f"[{o['retention_ci_low']:.1%}, {o['retention_ci_high']:.1%}] of native's, gap closed "
                 f"{o['gap_closed']:+.2f} [{o['gap_closed_ci_low']:+.2f}, {o['gap_closed_ci_high']:+.2f}].\n")
    write_text_atomic(out_dir / "summary.md", f"Command: `{settings.command(out_dir)}`\n\nDate: {meta['date']}. "
                      f"{n} conversations, skipped: {len(skipped)}. Translator {sizes['translator_mb']:.1f} MB (fp16); "
                      "memory is the median over conversations after each turn, in fp16 MB; seconds are medians of "
                      "one run on this machine.\n\n" + (markdown(summary) if len(summary) else "") + total
                      + sharing_markdown(summary, paired, rows, settings.bootstrap, settings.seed))
    return summary


def run(settings: ConversationSettings, out_dir: Path, resume: bool = False, progress: bool = True,
        overwrite: bool = False) -> pd.DataFrame:
    """Evaluate the conversations (those out_dir already holds are kept with --resume) and write the results;
    partial results are written after every conversation and on an interruption. overwrite: write into an out_dir
    that holds other files (results_folder.check_results_folder)."""
    config = check_settings(settings)
    wanted = {(turn, c) for turn in range(1, settings.turns + 1) for c in settings.conditions}
    previous = resumed_table(out_dir, settings, resume, overwrite, RESUME_KEYS, RESULT_FILES, RESULTS, wanted,
                             "conversations", label=lambda row: (int(float(row["turn"])), row["condition"]))
    source, target = load_model(config["source"]["name"]), load_model(config["target"]["name"])
    conversations = coqa_conversations(target.tokenizer, settings.n, settings.turns, settings.seed,
                                       settings.max_story_tokens)
    mot = load_checkpoint(settings.checkpoint, source, target)[0]
    # what the methods load once; a calibrated one (kvcomm's layer choice) on the first story
    artifacts = run_artifacts(settings.conditions, settings.options, source, target, mot,
                              [turn_example(c, 0) for c in conversations[:1]])
    settings.recorded = registry.recorded(artifacts)
    sizes = {"target_mb_per_token": cache_mb(target, 1), "source_mb_per_token": cache_mb(source, 1),
             "translator_mb": translator_mb(mot)}
    rows = [] if previous is None else previous.to_dict(orient="records")

    def key(c):  # a conversation's place in the results: its id
        return c.id

    def compute(c):  # its rows, one per turn and condition
        return conversation_rows(mot, source, target, c, settings, artifacts)

    def skipped(c):  # what the row of a conversation that does not fit says of it
        return {"id": c.id, "genre": c.source}

    def write_results():
        return write(out_dir, pd.DataFrame(rows, columns=ROW_COLUMNS), settings, sizes)

    return run_units(conversations, rows, {r["id"] for r in rows}, key, compute, skipped, write_results,
                     "conversations", progress, "conversations", spread=Spread(out_dir, settings, RESULTS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="the MoT checkpoint folder to evaluate")
    parser.add_argument("--n", type=int, default=30, help="CoQA conversations")
    parser.add_argument("--turns", type=int, default=5, help="turns per conversation (CoQA's first ones)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the conversation sample")
    parser.add_argument("--max_new_tokens", type=int, default=MAX_NEW_TOKENS, help="longest generated answer")
    parser.add_argument("--max_story_tokens", type=int, default=512, help="longest story, in target tokens")
    parser.add_argument("--conditions", nargs="+", choices=CONDITIONS + others(), default=[],
                        help="caches beside native, mot and no_context (always answered): the controls linear (the "
                             "pair's closed-form map, --linear) and mean (the mean-vector window), and the ways of "
                             "sharing the story relay, direct (with --direct), kvcomm (a pair of one architecture)")
    registry.add_options(parser, registry.choices(KIND))  # each way of sharing's own flags (Method.options)
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of each interval")
    parser.add_argument("--out", required=True, help="folder of the results (created when missing)")
    parser.add_argument("--resume", action="store_true", help="keep the conversations --out already holds")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an --out folder that holds other files, replacing those of the same names")
    args = parser.parse_args(argv)
    conditions = CONDITIONS + tuple(c for c in others() if c in args.conditions)

    def body():
        options = registry.run_options(vars(args), conditions, registry.choices(KIND), args.checkpoint)
        settings = ConversationSettings(args.checkpoint, args.n, args.turns, args.seed, args.max_new_tokens,
                                        args.max_story_tokens, args.bootstrap, conditions, options)
        return shown(run(settings, Path(args.out), args.resume, overwrite=args.overwrite), markdown)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
