"""Layer patching across an evaluation's examples: patching.csv of a results folder, written by

    python -m mot_viz.eval.patching results/eval/smollm2-to-gemma3-mid-squad300 --n 100 \
        --methods mot direct --direct pretrained/smollm2-to-gemma3-direct

or, for one budget of a long-context run (mot_viz.eval.patching_long),

    python -m mot_viz.eval.patching results/long/smollm2-to-gemma3-mid-stacks --budget 1024 --n 24

which rebuilds the folder's examples from its summary.json settings (as mot_viz.eval.layer_error does), builds each
example's native cache and each method's cache once, and runs the patching scan of mot_viz.engine.patching over
them: per target layer and per group (the window, the global and the sliding layers), restoring (the method's cache
with the native K/V there) and breaking (the native cache with the method's K/V there), read as the gold answer's
teacher-forced mean log-probability per token, and optionally (--buckets) only at the positions of the sentence
holding the gold answer, or only at the rest. Each layer's row also holds the relative L2 error of the method's K and
V against native there (mot_viz.analysis.cache_metrics, as layer_error.csv's), so cost and error sit side by side.

One row per example, method and reading (long format). The command resumes (the examples patching.csv holds for the
same settings, patching.json, are kept) and spreads over processes as the other evaluations do
(mot_viz.eval.processes: torchrun --nproc_per_node 2 -m mot_viz.eval.patching -- RESULTS …).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from ..cli import logger, run_cli
from ..data.eval_data import load_dataset
from ..engine import hf
from ..engine.cache_errors import layer_errors, token_vectors
from ..engine.checkpoint import WEIGHTS_FILE, load_checkpoint, read_config, weights_sha256
from ..engine.models import LoadedModel, load_model
from ..engine.mot import MoT, Translation, translate
from ..engine.patching import (ANSWER_SENTENCE, PatchingScan, answer_sentence_buckets, answer_token_ids,
                               layer_groups, patching_scan)
from ..engine.prompts import QAExample, build_prompt
from ..errors import ConfigError
from ..fsutil import check_out_place, checkout_path, write_text_atomic
from ..sharing import registry
from ..sharing.caches import run_artifacts
from ..sharing.method import Inputs, Request
from ..sharing.registry import REGISTRY, TRANSLATED, names
from .answers import encode_question
from .patching_long import WRITER, is_long_folder, long_documents, long_settings
from .example_rows import ExampleRowsFile, example_key
from .processes import barrier, join, merge_unit_files, unit_file_sources
from .qa_settings import EvalSettings, load_evaluated, truncate_context
from .sharing_settings import SharingSettings
from .results_folder import PARTS, PATCHING_FILES, RESULTS_TABLE, SETTINGS_FILE, results_rows, writer_of

log = logger(__name__)

PATCHING_FILE, PATCHING_SETTINGS = PATCHING_FILES
UNIT = ("dataset", "id")
COLUMNS = (*UNIT, "method", "direction", "target", "layers", "bucket", "logprob", "share", "native", "translated",
           "K_rel_l2", "V_rel_l2")
TEXT_COLUMNS = (*UNIT, "method", "direction", "target", "layers", "bucket")


def patchable() -> tuple[str, ...]:
    """The ways of sharing whose caches a scan patches against native (Method.patchable), in the registry's order."""
    return names(lambda m: m.patchable)


def check_methods(methods: Sequence[str]) -> tuple[str, ...]:
    """The methods, checked, each once in the order given: each must make a cache of the context (a relay does
    not)."""
    methods = tuple(dict.fromkeys(methods))
    for method in methods:
        known = REGISTRY.get(method)
        if known is not None and not known.patchable and (known.message or not known.comparable):
            raise ConfigError(f"'{method}' has no cache of the context to patch (the target reads "
                              f"{'the source’s message' if known.message else 'the question alone'} "
                              f"instead): choose among {', '.join(patchable())}")
        if method not in patchable():
            raise ConfigError(f"unknown method '{method}': choose among {', '.join(patchable())}")
    return methods


@dataclass(frozen=True)
class MethodCache:
    """A method's cache of one context, as a scan patches it against native."""

    kv: list[hf.KV]  # per layer [1, n_kv, P + N, d_h], the positions of the native cache
    hidden: dict[int, tuple[int, int]] | None = None  # kvcomm: the positions its reader may not see, per layer


def method_cache(method: str, mot: MoT, source: LoadedModel, target: LoadedModel, translation: Translation,
                 artifact=None, options=None) -> MethodCache:
    """`method`'s cache of the translation's context, as its way of sharing builds it (the MoT's own is the
    translation's replayed cache) from what it loaded (`artifact`: Method.load) and the run's `options`; ConfigError
    where what it loads is missing."""
    way = REGISTRY[check_methods([method])[0]]
    way.ready(artifact)
    built = way.build(Inputs(mot, source, target, translation, options=options or {}, artifact=artifact))
    return MethodCache(built.kv, None if built.plan is None else dict(built.plan.hide))


def gold_question(target: LoadedModel, example: QAExample) -> tuple:
    """(question ids [1, S], the gold answer's token ids) of `example`, as the evaluation prompts it."""
    return encode_question(target, example).suffix_ids, answer_token_ids(target.tokenizer, example, None)


def gold_buckets(target: LoadedModel, example: QAExample, prefix_len: int) -> dict[str, tuple[int, ...]]:
    """The context's positions in the sentence holding the gold answer (in the passage) and the rest."""
    context = build_prompt(example, target.chat_frame).context_text
    answer = next((a for a in example.answers if a.strip()), "")
    return answer_sentence_buckets(target.tokenizer, context, answer, prefix_len,
                                   first=max(context.find("Passage:"), 0))


def layer_error_columns(native: list[hf.KV], kv: list[hf.KV], prefix_len: int) -> dict[int, dict[str, float]]:
    """Per layer, the relative L2 error of the method's K and V against native over the context positions."""
    out = {}
    for layer, ((k, v), (nk, nv)) in enumerate(zip(kv, native)):
        out[layer] = {f"{name}_rel_l2": layer_errors(token_vectors(c[:, :, prefix_len:]),
                                                      token_vectors(r[:, :, prefix_len:]))["rel_l2"]
                      for name, c, r in (("K", k, nk), ("V", v, nv))}
    return out


def scan_rows(scan: PatchingScan, errors: dict[int, dict[str, float]], **unit) -> list[dict]:
    """One row per reading of a scan, each layer's row with its K/V error (groups: none)."""
    rows = []
    for row in scan.frame().to_dict(orient="records"):
        layer = int(row["target"].split()[1]) if row["target"].startswith("layer ") else None
        rows.append({**unit, **row, **(errors[layer] if layer is not None else {"K_rel_l2": None, "V_rel_l2": None})})
    return rows


def scan_example(mot: MoT, source: LoadedModel, target: LoadedModel, example: QAExample, translation: Translation,
                 methods: Sequence[str], buckets: bool = False, artifacts=None, options=None) -> list[dict]:
    """Every method's patching scan of one example (rows of patching.csv); the caches built once (`artifacts`: what
    the methods loaded for the run, by name)."""
    artifacts = artifacts or {}
    question, answer = gold_question(target, example)
    groups = layer_groups(target.spec, mot.channels.target_layers)
    positions = gold_buckets(target, example, translation.prefix_len) if buckets else None
    rows = []
    for method in methods:
        cache = method_cache(method, mot, source, target, translation, artifacts.get(method), options)
        scan = patching_scan(target.model, translation.native_kv, cache.kv, question, answer, groups,
                             positions, hidden=cache.hidden)
        rows += scan_rows(scan, layer_error_columns(translation.native_kv, cache.kv, translation.prefix_len),
                          dataset=example.dataset, id=example.id, method=method)
    return rows


# ----- the results file -------------------------------------------------------------------------------------------


@dataclass
class PatchingSettings(SharingSettings):
    """How a folder's patching.csv was recorded (patching.json): --resume keeps its rows only under the same."""

    methods: tuple[str, ...]
    buckets: bool
    weights: dict[str, str] | None = None  # method -> SHA-256 of its map's weights (a replaced map is another run)
    budget: int | None = None  # a long-context folder's budget scanned (None: an evaluation's folder)
    options: dict = field(default_factory=dict)  # the ways of sharing's options, by name (registry.run_options)
    recorded: dict = field(default_factory=dict)  # what their artifacts recorded (set by record())

    @classmethod
    def offered(cls) -> tuple[str, ...]:
        return patchable()

    @classmethod
    def from_json(cls, data: dict) -> PatchingSettings:
        return cls(**{**cls.split_json(data), "methods": tuple(data["methods"]), "buckets": bool(data.get("buckets"))})

    def same_run(self, other: PatchingSettings) -> bool:
        """Whether `other` records the same scan (what the artifacts recorded apart)."""
        return replace(self, recorded={}) == replace(other, recorded={})


NUMBERS = ("logprob", "share", "native", "translated", "K_rel_l2", "V_rel_l2")  # empty where a reading has none


def read_patching(path: Path) -> pd.DataFrame:
    """A patching.csv, the rows of whole examples only; ConfigError for another table. An example with a row cut
    short or damaged, or fewer rows than the others (a file cut by a kill, or edited), is left out and a log line says
    so: --resume computes it again."""
    text = path.read_text(encoding="utf-8", errors="replace")
    header = tuple(text.split("\n", 1)[0].rstrip("\r").split(","))
    if header != COLUMNS:
        raise ConfigError(f"{path} has the columns {', '.join(header[:8])}, not those of a {PATCHING_FILE}. Move it "
                          "away and record it again.")
    try:
        body = list(csv.reader(io.StringIO(text, newline="")))[1:]
    except csv.Error as exc:
        raise ConfigError(f"{path} does not parse as CSV ({exc}), so it is not a {PATCHING_FILE}. Move it away and "
                          "record it again.") from exc
    key = lambda fields: example_key(fields[:len(UNIT)])  # noqa: E731
    whole = [len(fields) == len(COLUMNS) and _numbers(dict(zip(COLUMNS, fields))) for fields in body]
    if body and not text.endswith("\n"):  # every row ends with a newline: the last one was cut short
        whole[-1] = False
    counts = pd.Series([key(f) for f, ok in zip(body, whole) if ok], dtype=object).value_counts()
    torn = {key(f) for f, ok in zip(body, whole) if not ok} | set(counts.index[counts < counts.max()])
    if torn:
        log.warning(f"{path} was cut short or damaged: {len(torn)} example(s) without whole rows are computed again")
    kept = io.StringIO()
    csv.writer(kept, lineterminator="\n").writerows([COLUMNS, *(f for f, ok in zip(body, whole)
                                                               if ok and key(f) not in torn)])
    kept.seek(0)
    return pd.read_csv(kept, dtype={c: str for c in TEXT_COLUMNS}, keep_default_na=False,
                       na_values={"share": [""], "K_rel_l2": [""], "V_rel_l2": [""]}, float_precision="round_trip")


def _numbers(row: dict) -> bool:
    """Whether a patching.csv row's numbers parse (each empty where its reading has none, or a number)."""
    try:
        [float(row[c]) for c in NUMBERS if row[c] != ""]
    except ValueError:
        return False
    return row["logprob"] != ""


class PatchingFile(ExampleRowsFile):
    """The patching.csv of a results folder, written example by example (ExampleRowsFile)."""

    def __init__(self, folder: Path, keep: set[tuple[str, str]] | None):
        super().__init__(folder, PATCHING_FILE, UNIT, COLUMNS, read_patching, keep)


def _evaluate_settings(folder: Path):
    """The folder's evaluate settings; ConfigError (before any model loads) for any other folder."""
    fix = ("Pass a folder python -m mot_viz.eval.evaluate or python -m mot_viz.eval.long_context wrote with --out, "
           "e.g. results/eval/smollm2-to-gemma3-mid-squad300.")
    writer = writer_of(folder)
    if (writer or "").rsplit(".", 1)[-1] != "evaluate" or not (folder / RESULTS_TABLE).is_file():
        what = f"holds results of {writer}" if writer else "is not a results folder"
        raise ConfigError(f"{folder} {what}, not of evaluate or long_context. {fix}")
    try:
        return EvalSettings.from_json(json.loads((folder / SETTINGS_FILE).read_text())["settings"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{folder} has no readable caches' settings in {SETTINGS_FILE} ({exc}). {fix}") from exc


def map_weights(methods: Sequence[str], options, checkpoint: str) -> dict[str, str]:
    """Method -> SHA-256 of the weights of the checkpoint it reads: the MoT's own, or the checkpoint folder one of its
    options names (a map: --direct, --linear), so that a map replaced under the same path is another scan."""
    paths = {TRANSLATED: checkpoint}
    for name in methods:
        for o in REGISTRY[name].options:
            value = options.get(o.name)
            if isinstance(value, str) and (Path(value) / WEIGHTS_FILE).is_file():
                paths[name] = value
    return {m: weights_sha256(Path(path)) for m, path in paths.items() if m in methods}


def _check_settings(folder: Path, settings: PatchingSettings, resume: bool) -> None:
    """Raise ConfigError, before any model loads, unless the folder's earlier patching.csv (if any) may be continued
    with `settings`: --resume given, its patching.json readable and the same, its rows a patching.csv's (damaged
    examples among them are computed again: read_patching)."""
    path = folder / PATCHING_SETTINGS
    if not path.is_file() or not (folder / PATCHING_FILE).is_file() and not unit_file_sources(folder, PATCHING_FILE):
        return
    try:
        before = PatchingSettings.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} does not read as the settings of its {PATCHING_FILE} ({type(exc).__name__}: "
                          f"{exc}), so its rows cannot be continued. Move {PATCHING_FILE} and {PATCHING_SETTINGS} away "
                          "and record them again.") from exc
    for source in unit_file_sources(folder, PATCHING_FILE) if resume else ():
        read_patching(source)  # another table is refused here, not after the models load
    if not resume:
        raise ConfigError(f"{folder} already holds a {PATCHING_FILE}: pass --resume to continue it (with the same "
                          "options), or move it away")
    if not before.same_run(settings):
        raise ConfigError(f"{folder}'s {PATCHING_FILE} was recorded with {before.to_json()}, not "
                          f"{settings.to_json()}: pass the same options to --resume, or move the file away")


def record(folder: str | Path, methods: Sequence[str] = (TRANSLATED,), n: int | None = None, options=None,
           buckets: bool = False, resume: bool = False, progress: bool = True, budget: int | None = None) -> Path:
    """Write `folder`'s patching.csv for its first `n` scored examples (all: None), keeping, with `resume`, the
    examples it already holds. `options`: the ways of sharing's options as given (by Option.name: --direct,
    --linear, ...; registry.run_options resolves them)."""
    folder = Path(folder)
    check_out_place(folder, "RESULTS")  # a folder it can write into, before any work
    methods = check_methods(methods)
    if n is not None and n < 1:
        raise ConfigError(f"--n must be at least 1, got {n}")
    long = is_long_folder(folder)  # a long-context run's documents at one budget, else an evaluation's examples
    settings, budget = long_settings(folder, budget) if long else (_evaluate_settings(folder), None)
    # a folder copied out of the checkout names its checkpoint relative to it
    settings = replace(settings, checkpoint=str(checkout_path(settings.checkpoint)))
    rows = results_rows(folder, WRITER if long else "evaluate", ("budget", "id", "error") if long
                        else (*UNIT, "condition"))  # another tool's examples.csv: refused before any model loads
    options = registry.run_options(options or {}, methods, patchable(), settings.checkpoint, "--methods")
    config = read_config(settings.checkpoint)
    registry.check(Request(methods, config, settings.checkpoint, 0, options))
    patching = PatchingSettings(methods, buckets, map_weights(methods, options, settings.checkpoint), budget, options)
    _check_settings(folder, patching, resume)
    rank, world = join()
    source, target = load_model(config["source"]["name"]), load_model(config["target"]["name"])
    if long:
        mot = load_checkpoint(settings.checkpoint, source, target)[0]
        examples = long_documents(folder, settings, budget, target)[:n]
    else:
        kept = rows["condition"] != "skipped"
        scored = set(zip(rows.loc[kept, "dataset"], rows.loc[kept, "id"]))
        mot = load_evaluated(settings.checkpoint, settings, source, target)
        examples = [truncate_context(target, e, settings.max_context_tokens)
                    for d in settings.datasets for e in load_dataset(d, n=settings.n, seed=settings.seed)]
        examples = [e for e in examples if (e.dataset, e.id) in scored][:n]
    artifacts = run_artifacts(methods, options, source, target, mot, examples[:1])
    patching.recorded = registry.recorded(artifacts)
    keys = [(e.dataset, e.id) for e in examples]
    barrier()
    file = PatchingFile(folder, set(keys) if resume else None)
    if rank == 0:
        write_text_atomic(folder / PATCHING_SETTINGS, json.dumps(patching.to_json(), indent=2))
    todo = [e for e in examples if (e.dataset, e.id) not in file.done][rank::world]
    for example in tqdm(todo, desc=f"patching (rank {rank} of {world})", disable=not progress or rank != 0,
                        dynamic_ncols=True):
        text = build_prompt(example, target.chat_frame).context_text  # the context the evaluation translated
        translation = translate(mot, source, target, text)
        file.add_rows((example.dataset, example.id), scan_example(mot, source, target, example, translation, methods,
                                                             buckets, artifacts, options))
    barrier()
    if world > 1 and rank == 0:
        merge_unit_files(folder, keys, lambda key: key, UNIT, own=True, names=[PATCHING_FILE])
        for part in unit_file_sources(folder, PATCHING_FILE)[1:]:
            part.unlink()
        if not any((folder / PARTS).iterdir()):
            (folder / PARTS).rmdir()
    barrier()
    return folder / PATCHING_FILE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Record, for every example of an evaluation's results folder, which "
                                                 "target layers' translated K/V cost the gold answer (layer patching)")
    parser.add_argument("results", help="a folder python -m mot_viz.eval.evaluate wrote with --out")
    parser.add_argument("--methods", nargs="+", default=[TRANSLATED], help=f"caches to patch: {', '.join(patchable())}")
    parser.add_argument("--n", type=int, help="only the first N scored examples (default: all)")
    registry.add_options(parser, patchable())  # each way of sharing's own flags (Method.options)
    parser.add_argument("--buckets", action="store_true",
                        help="also patch only the sentence holding the gold answer, and only the rest")
    parser.add_argument("--resume", action="store_true", help="keep the examples patching.csv already holds")
    parser.add_argument("--budget", type=int, help="a long-context folder's budget to scan (one of its budgets)")
    args = parser.parse_args(argv)
    written = lambda: record(args.results, args.methods, args.n, vars(args), args.buckets,  # noqa: E731
                             args.resume, budget=args.budget)
    return run_cli(lambda: print(f"wrote {written()}"))


if __name__ == "__main__":
    sys.exit(main())
