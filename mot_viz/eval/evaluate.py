"""Evaluate a MoT checkpoint on QA (method.md §8, §9.2 control).

    python -m mot_viz.eval.evaluate --checkpoint pretrained/smollm2-to-gemma3 --datasets squad boolq --n 300 \
        [--second pretrained/smollm2-to-gemma3-single] --out results/eval/smollm2-to-gemma3

For the same examples, the target answers with the context natively, with no context, from the
MoT-translated cache, from the norm-matched random-window control, and (optionally) from a second
checkpoint of the same pair. Closed-set datasets are scored by length-normalised log-likelihood of each
choice label (rule a), extractive ones by greedy generation with SQuAD F1 and exact match. Writes
per-example CSV, a JSON summary and a Markdown table with 95% bootstrap intervals, the retained share
of native quality (translated ÷ native), the mean KV cosine to the native cache and time per example.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from ..cli import run_cli
from ..data.eval_data import BUILTIN_DATASETS, load_dataset
from ..engine.cache_errors import kv_cosine
from ..engine.checkpoint import WEIGHTS_FILE, read_config, weights_sha256
from ..engine.models import LoadedModel, load_model, model_device
from ..engine.mot import MoT, translate
from ..engine.replay_config import REPLAY_MODES
from ..engine.prompts import QAExample
from ..errors import CheckpointError, ConfigError
from ..fsutil import remove_stale_temporaries, write_csv_atomic, write_text_atomic
from ..sharing import registry
from ..sharing.caches import condition_caches, run_artifacts
from ..sharing.checkpoints import checked_config, full_depth, same_pair
from ..sharing.costs import COST_COLUMNS, LOOPED_COLUMNS, MESSAGE_COLUMNS, cost_fields
from ..sharing.method import Built, Request, translated_seconds
from ..sharing.registry import SECOND, method
from .answers import MAX_NEW_TOKENS, answers_from_caches
from .layer_error_file import LAYER_ERROR_FILE, LayerErrorFile, check_resumed
from .lm_check import run_lm
from .policy import DEFAULTS, with_always
from .processes import Spread, join, resumed_table, run_examples, shown, spread_out
from .qa_settings import MIN_CONTEXT_TOKENS, EvalSettings, load_evaluated, truncate_context
from .report import markdown_table, paired_differences, paired_markdown, summarize
from .results_folder import PATCHING_FILES, ResultsTable, check_results_folder

KIND = "evaluate"  # this evaluation, as the sharing registry names it

# one column per field of a row; "error" (type and message) is set on skipped rows only, the message columns on the
# relay conditions' rows only (the message, its source tokens and UTF-8 bytes, the source's seconds writing it and
# the target's seconds prefilling it). "seconds": from the question's arrival to the whole answer; "ahead_seconds":
# the cache's work that can be done before the question (sharing.caches.ConditionCaches.ahead: the source's prefill, relay's
# writing), not in "seconds"
ROW_COLUMNS = ("dataset", "id", "condition", "score", "exact_match", "answer", "gold", "kv_cosine", "seconds",
               "context_tokens", "error", *MESSAGE_COLUMNS, "ahead_seconds", *LOOPED_COLUMNS, *COST_COLUMNS)
# the columns of earlier versions' examples.csv, which --resume still reads: before the cost columns, before a
# message's loop was marked, before the work done ahead was apart (their "seconds" include it), before the message
# columns, and before skipped rows had an "error"
EARLIER_ROW_COLUMNS = (ROW_COLUMNS[:18], ROW_COLUMNS[:17], ROW_COLUMNS[:16], ROW_COLUMNS[:11], ROW_COLUMNS[:10])


def example_rows(mot: MoT, source: LoadedModel, target: LoadedModel, example: QAExample, settings: EvalSettings,
                 second: MoT | None = None, artifacts=None, layers: LayerErrorFile | None = None) -> list[dict]:
    """One row per condition of one example: score, exact match, answer text, KV cosine to native, seconds, what is
    handed to the target and what it computes (the cost columns); `artifacts`: what the run's methods loaded
    (registry.load_artifacts); `layers` gets the MoT cache's per-layer error (--layer_error)."""
    example = truncate_context(target, example, settings.max_context_tokens)
    built = condition_caches(mot, source, target, example, seed=settings.seed, conditions=settings.conditions,
                             options=settings.options, artifacts=artifacts)
    translation, caches, builds = built.translation, built.kv, dict(built.built)
    windows = {c: len(mot.channels.target_layers) for c in caches}
    sides = {c: built.target_side(c) for c in caches}
    if second is not None:
        other = translate(second, source, target, translation.text, with_native=False)
        builds[SECOND] = Built(other.mixed_kv, translated_seconds(other), other.timings.get("source_prefill", 0.0),
                               translation=other)
        caches[SECOND], windows[SECOND] = other.mixed_kv, len(second.channels.target_layers)
        sides[SECOND] = method(SECOND).target_side(builds[SECOND], other.timings)
    tokens = int(translation.target_ids.shape[1])
    rows = []
    # one batch (the no-context cache left-padded); a kvcomm cache alone, under its plan
    answers = answers_from_caches(target, caches, example, settings.max_new_tokens, built.prompt.suffix_text,
                                  plans=built.plans)
    for condition, kv in caches.items():
        ans = answers[condition]
        rows.append({
            "dataset": example.dataset, "id": example.id, "condition": condition, "score": ans.score,
            "exact_match": ans.exact_match, "answer": ans.text,
            "gold": " | ".join(example.answers) if example.kind == "extractive" else example.choices[example.label],
            # a relay cache holds the message, not the context: no cosine to the native cache (Method.comparable)
            "kv_cosine": kv_cosine(kv, translation.native_kv)
            if kv is not None and method(condition).comparable else np.nan,
            "seconds": builds[condition].seconds - builds[condition].ahead + ans.seconds,
            "ahead_seconds": builds[condition].ahead,
            "context_tokens": tokens,
            **cost_fields(condition, builds[condition], tokens, target, windows[condition], sides[condition], source),
        })
    if layers is not None:
        layers.add(translation, mot.channels, dataset=example.dataset, id=example.id)
    return rows


def evaluate_examples(mot: MoT, source: LoadedModel, target: LoadedModel, examples: list[QAExample],
                      settings: EvalSettings, second: MoT | None = None, progress: bool = True,
                      checkpoint_every: int = 0, on_checkpoint=None, artifacts=None,
                      layers: LayerErrorFile | None = None) -> pd.DataFrame:
    """example_rows of every example (ROW_COLUMNS); an example that fails for any reason is one "skipped" row.

    on_checkpoint(rows so far as a DataFrame) is called every checkpoint_every examples (partial results),
    and before an interruption or an error between examples is re-raised.
    artifacts: what the run's methods loaded once (registry.load_artifacts: the mean window, the direct map, ...).
    """
    rows = []
    try:
        for i, example in enumerate(tqdm(examples, desc="evaluate", disable=not progress, dynamic_ncols=True)):
            if on_checkpoint is not None and checkpoint_every and i and i % checkpoint_every == 0:
                on_checkpoint(pd.DataFrame(rows, columns=ROW_COLUMNS))
            try:
                rows += example_rows(mot, source, target, example, settings, second, artifacts, layers)
            except Exception as exc:  # e.g. a lone surrogate the tokenizer rejects: counted with its reason, never silent
                rows.append({"dataset": example.dataset, "id": example.id, "condition": "skipped",
                             "error": f"{type(exc).__name__}: {exc}"})
    except BaseException:  # Ctrl-C or a failure outside one example: what was computed is written first
        if on_checkpoint is not None and rows:
            on_checkpoint(pd.DataFrame(rows, columns=ROW_COLUMNS))
        raise
    return pd.DataFrame(rows, columns=ROW_COLUMNS)


# settings a --resume must share with the run it continues (n may grow or shrink)
RESUME_KEYS = ("checkpoint", "second", "datasets", "seed", "max_new_tokens", "max_context_tokens", "conditions",
               "replay", "options")
TEXT_COLUMNS = ("dataset", "id", "condition", "answer", "gold", "error", "message")
RESULTS = ResultsTable(ROW_COLUMNS, TEXT_COLUMNS, ("dataset", "id"), ("score", "seconds", "context_tokens"),
                       ("exact_match", "kv_cosine"), EARLIER_ROW_COLUMNS)
# what a results folder of this command holds (costs.*: python -m mot_viz.eval.costs's reading of these results)
RESULT_FILES = ("examples.csv", "summary.csv", "paired.csv", "summary.json", "summary.md", "lm.csv", "lm.md",
                "costs.csv", "costs.md", LAYER_ERROR_FILE, *PATCHING_FILES)


def check_replay_setting(settings: EvalSettings, config: dict) -> None:
    """Raise ConfigError for --replay none with a checkpoint that translates a window only."""
    if settings.replay == "none" and not full_depth(config):
        raise ConfigError(f"--replay none uses the translated K/V as the whole cache, but --checkpoint "
                          f"{settings.checkpoint} translates a window of {len(config['channels'])} of the target's "
                          f"{config['target']['num_layers']} layers. Pass another --replay, or evaluate a full-depth map "
                          "with --conditions direct --direct CHECKPOINT.")


def check_settings(settings: EvalSettings) -> None:
    """Raise ConfigError/CheckpointError for settings no run can use, before any model is loaded."""
    for flag, value, least in (("--n", settings.n, 1), ("--bootstrap", settings.bootstrap, 1),
                               ("--max_new_tokens", settings.max_new_tokens, 1),
                               ("--max_context_tokens", settings.max_context_tokens, MIN_CONTEXT_TOKENS)):
        if value < least:
            raise ConfigError(f"{flag} must be at least {least}, got {value}. Pass {flag} {least} or more.")
    registry.check_names(settings.conditions, registry.choices(KIND))
    config = checked_config("--checkpoint", settings.checkpoint)
    second = checked_config("--second", settings.second) if settings.second else config
    check_replay_setting(settings, config)
    registry.check(Request(settings.conditions, config, settings.checkpoint, settings.max_context_tokens,
                           settings.options))
    if not same_pair(config, second):
        raise CheckpointError(f"--second {settings.second} was made for another model pair than --checkpoint "
                              f"{settings.checkpoint}. Pass a second checkpoint of the same pair.")
    limit = config["target"].get("max_positions")
    if limit and settings.max_context_tokens >= limit:
        raise ConfigError(f"--max_context_tokens {settings.max_context_tokens} leaves no room for the question: the "
                          f"target model '{config['target']['name']}' allows {limit} tokens. Pass a smaller value.")
    if limit and settings.max_context_tokens + settings.max_new_tokens >= limit:
        raise ConfigError(f"--max_new_tokens {settings.max_new_tokens} with --max_context_tokens "
                          f"{settings.max_context_tokens} leaves no room for the question: the target model "
                          f"'{config['target']['name']}' allows {limit} tokens. Pass a smaller --max_new_tokens "
                          "(answers are a few words) or --max_context_tokens.")


def previous_rows(out_dir: Path, settings: EvalSettings, resume: bool, overwrite: bool = False) -> pd.DataFrame | None:
    """The rows of an earlier run of these settings in out_dir, to keep (--resume); results of others, and files
    that are not this command's results, are refused (unless overwrite). An example with a row cut short or damaged
    is computed again (processes.resumed_table)."""
    wanted = set(settings.conditions) | ({SECOND} if settings.second else set())
    return resumed_table(out_dir, settings, resume, overwrite, RESUME_KEYS, RESULT_FILES, RESULTS, wanted, "examples")


def check_run(settings: EvalSettings, out_dir: Path, resume: bool = False, overwrite: bool = False):
    """Everything checked before a model is loaded. Returns the examples of each dataset and the rows to keep."""
    check_settings(settings)
    model_device()  # an unavailable device ($MOT_VIZ_DEVICE) is refused before anything is read or written
    examples = {name: load_dataset(name, n=settings.n, seed=settings.seed) for name in settings.datasets}
    previous = (previous_rows(out_dir, settings, resume, overwrite) if settings.datasets
                else check_results_folder(out_dir, settings, RESULT_FILES, overwrite, resume))
    remove_stale_temporaries(out_dir)  # results files of runs killed while writing them
    return examples, previous


def run(settings: EvalSettings, out_dir: Path, progress: bool = True, resume: bool = False,
        checked=None, overwrite: bool = False, layer_error: bool = False) -> pd.DataFrame:
    """Evaluate and write the results; with resume, examples out_dir already has rows for are not recomputed;
    layer_error: also write layer_error.csv (mot_viz.eval.layer_error), keeping the rows of the examples kept.

    checked: what check_run returned for these arguments (it is called when not given, with overwrite).
    """
    examples, previous = checked or check_run(settings, out_dir, resume, overwrite)
    if layer_error:  # the examples kept need their rows of layer_error.csv: --resume would not compute them
        check_resumed(out_dir, ("dataset", "id"), previous)
    config = read_config(settings.checkpoint)
    source = load_model(config["source"]["name"])
    target = load_model(config["target"]["name"])
    mot = load_evaluated(settings.checkpoint, settings, source, target)
    second = load_evaluated(settings.second, settings, source, target) if settings.second else None
    # what the methods load once; a calibrated one (kvcomm's layer choice) on the first example of the first dataset
    first = next((part[:1] for part in examples.values() if part), [])
    artifacts = run_artifacts(settings.conditions, settings.options, source, target, mot,
                              lambda: [truncate_context(target, e, settings.max_context_tokens) for e in first])
    settings.recorded = registry.recorded(artifacts)
    settings.prompt = "plain" if target.chat_frame is None else f"chat template of {target.spec.name}"
    done = set() if previous is None else set(zip(previous["dataset"], previous["id"]))
    layers = LayerErrorFile(out_dir, ("dataset", "id"), done) if layer_error else None
    if spread_out(out_dir):  # torchrun, or the parts of an interrupted run to merge (mot_viz.eval.processes)
        return run_examples(examples, previous, lambda e: example_rows(mot, source, target, e, settings, second,
                            artifacts, layers), lambda frames: _write(out_dir, frames, settings),
                            Spread(out_dir, settings, RESULTS), progress)
    frames = []
    for part in examples.values():
        wanted = {(e.dataset, e.id) for e in part}
        if previous is not None:  # earlier rows of this run's examples, in the order they were computed
            frames.append(previous[[key in wanted for key in zip(previous["dataset"], previous["id"])]])
        todo = [e for e in part if (e.dataset, e.id) not in done]
        # partial results (every 25 examples, after each dataset, and on an interruption) survive a stopped run
        partial = lambda df: _write(out_dir, frames + [df], settings)  # noqa: E731
        frames.append(evaluate_examples(mot, source, target, todo, settings, second, progress, 25, partial, artifacts,
                                        layers))
        _write(out_dir, frames, settings)
    return _write(out_dir, frames, settings)


def evaluated_weights(settings: EvalSettings) -> dict[str, str]:
    """SHA-256 of the weights of each evaluated checkpoint ({path as given: digest}): what a record of the results in
    that checkpoint's config.json is checked against (scripts/results_md.py --record), so retrained weights do not
    inherit the results of the ones they replaced."""
    out = {}
    for path in (settings.checkpoint, settings.second):
        if path and (Path(path) / WEIGHTS_FILE).is_file():
            out[str(path)] = weights_sha256(Path(path))
    return out


def _write(out_dir: Path, frames: list[pd.DataFrame], settings: EvalSettings) -> pd.DataFrame:
    df = pd.concat([f for f in frames if len(f)] or [pd.DataFrame(columns=ROW_COLUMNS)])
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(df, settings.bootstrap, settings.seed,
                        settings.options.get("relay_tokens") if registry.names(lambda m: m.message, settings.conditions)
                        else None)
    # each file is whole or absent, whenever the run is killed (a torn examples.csv would be resumed)
    write_csv_atomic(out_dir / "examples.csv", df)
    write_csv_atomic(out_dir / "summary.csv", summary)
    paired = paired_differences(df, n_boot=settings.bootstrap, seed=settings.seed)
    write_csv_atomic(out_dir / "paired.csv", paired)
    skipped = df.loc[df["condition"] == "skipped", ["dataset", "id", "error"]].to_dict(orient="records")
    meta = {"settings": settings.to_json(), "date": str(datetime.date.today()), "skipped": len(skipped),
            "skipped_examples": skipped, "summary": summary.to_dict(orient="records"),
            "weights_sha256": evaluated_weights(settings)}
    write_text_atomic(out_dir / "summary.json", json.dumps(meta, indent=2, default=str))
    write_text_atomic(out_dir / "summary.md",
        f"Command: `{settings.command()}`\n\nDate: {meta['date']}. Prompts: {settings.prompt}. Skipped examples: {len(skipped)}.\n\n"
        + "".join(f"* skipped {r['dataset']} {r['id']}: {r['error']}\n" for r in skipped) + ("\n" if skipped else "")
        + markdown_table(summary)
        + ("\n\nPaired differences over the same examples:\n\n" + paired_markdown(paired) if len(paired) else "") + "\n"
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="the MoT checkpoint folder to evaluate")
    parser.add_argument("--second", help="a second checkpoint of the same pair, e.g. the single variant")
    parser.add_argument("--datasets", nargs="*", default=["squad", "boolq"],
                        help="built-in dataset names (" + ", ".join(BUILTIN_DATASETS) + ", mmlu:<subject>) "
                             "or paths of .jsonl files")
    parser.add_argument("--n", type=int, default=300, help="examples per dataset (at least 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the example sample and the random control")
    parser.add_argument("--max_new_tokens", type=int, default=MAX_NEW_TOKENS,
                        help="longest generated answer, in target tokens")
    parser.add_argument("--max_context_tokens", type=int, default=448,
                        help=f"passages are cut to this many target tokens (at least {MIN_CONTEXT_TOKENS})")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of each interval (at least 1)")
    parser.add_argument("--lm_sequences", type=int, default=0,
                        help="also measure the target's cross-entropy on this many held-out LAMBADA sequences "
                             "(rows after the training bank of the checkpoint's stream)")
    parser.add_argument("--conditions", nargs="+", choices=registry.choices(KIND),
                        default=list(DEFAULTS[KIND]),
                        help="which conditions to answer under (native is always added); e.g. "
                             "'--conditions native mot' to evaluate a variant on examples a full run already covered; "
                             "'mean' adds the mean-vector control (window = mean native K/V over LAMBADA prose); "
                             "'relay' and 'relay_q' have the source write a text message the target reads instead "
                             "of the context (see --relay_tokens)")
    parser.add_argument("--replay", choices=REPLAY_MODES, default="checkpoint",
                        help="replay as each checkpoint says (checkpoint), densely everywhere (dense), with the "
                             "method's sparse top-32 attention from layer 2 up (sparse), or not at all (none: a "
                             "full-depth map's translated K/V are the cache)")
    registry.add_options(parser, registry.choices(KIND))  # each way of sharing's own flags (Method.options)
    parser.add_argument("--out", required=True, help="folder of the results (created when missing)")
    parser.add_argument("--layer_error", action="store_true", help="also write layer_error.csv: per example and "
                        "target layer, the K/V error of the MoT cache against the native one")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows --out already holds from a run of the same settings (any --n) and "
                             "compute only the missing examples")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an --out folder that holds other files, replacing those of the same names")
    args = parser.parse_args(argv)
    conditions = with_always(KIND, args.conditions)  # native always: shares divide by it
    out_dir = Path(args.out)

    def body() -> None:
        options = registry.run_options(vars(args), conditions, registry.choices(KIND), args.checkpoint)
        settings = EvalSettings(args.checkpoint, args.second, tuple(args.datasets), args.n, args.seed,
                                args.max_new_tokens, args.max_context_tokens, args.bootstrap, conditions,
                                replay=args.replay, options=options)
        if args.lm_sequences < 0:
            raise ConfigError(f"--lm_sequences must be at least 0, got {args.lm_sequences}. Pass 0 to skip the LM check.")
        checked = check_run(settings, out_dir, args.resume, args.overwrite)  # before any model is loaded
        if args.lm_sequences and join()[0] == 0:  # one process writes lm.csv
            run_lm(settings, out_dir, args.lm_sequences)
        if args.datasets:
            shown(run(settings, out_dir, resume=args.resume, checked=checked, layer_error=args.layer_error),
                  markdown_table)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
