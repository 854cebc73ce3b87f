"""Per-layer error of the MoT cache against the target's native cache, per example: layer_error.csv of a results
folder, written by ``--layer_error`` of evaluate and long_context, or afterwards, for a folder already written, by

    python -m mot_viz.eval.layer_error results/eval/smollm2-to-gemma3-mid-squad300 [--budgets 512 1024]

which rebuilds the folder's examples from its summary.json settings and translates each again (the translation is
deterministic: no answer is regenerated). The metrics are the Per-layer cache error page's
(mot_viz.analysis.cache_metrics, comparison "replayed"): per target layer, the relative L2 error ‖mot − native‖ /
‖native‖ and the mean per-token cosine of the cache the "mot" condition answers from against the native one, for K
and for V, over the context positions. One row per example and layer (long format), so folders stay small.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

import pandas as pd

from ..cli import logger, run_cli
from ..engine.cache_errors import KV_NAMES, compared_caches, layer_errors, token_vectors
from ..engine.channels import Channels
from ..engine.mot import Translation
from ..errors import ConfigError
from ..fsutil import write_text_atomic
from .processes import unit_file, unit_file_sources
from .results_folder import RESULTS_TABLE, SETTINGS_FILE, writer_of

log = logger(__name__)

LAYER_ERROR_FILE = "layer_error.csv"
METRICS = ("K_rel_l2", "V_rel_l2", "K_cosine", "V_cosine")  # the columns after the unit's, "layer" and "in_window"
UNITS = {"evaluate": ("dataset", "id"), "long_context": ("budget", "id")}  # what names one example, per writer


def layer_error_rows(translation: Translation, channels: Channels, **unit) -> list[dict]:
    """One row per target layer of one translation (computed with its native cache): the `unit` columns (e.g.
    dataset=…, id=…), the layer, whether it is in the translated window, and METRICS of the replayed cache."""
    window = set(channels.target_layers)
    rows = []
    for layer, (cand, ref) in compared_caches(translation, channels, "replayed").items():
        row = {**unit, "layer": layer, "in_window": layer in window}
        for j, kv in enumerate(KV_NAMES):
            errors = layer_errors(token_vectors(cand[j]), token_vectors(ref[j]))
            row[f"{kv}_rel_l2"], row[f"{kv}_cosine"] = errors["rel_l2"], errors["cosine"]
        rows.append(row)
    return rows


def _key(values) -> tuple[str, ...]:
    return tuple(str(v) for v in values)


def read_layer_errors(path: Path, unit: tuple[str, ...]) -> pd.DataFrame:
    """A layer_error.csv (the unit columns read as text, budgets as numbers), the rows of whole examples only;
    ConfigError for another table. An example with a row cut short or damaged, or fewer layers than the others (a
    file cut, by versions that wrote in place, or edited), is left out, and a log line says so: it is computed
    again."""
    text = path.read_text(encoding="utf-8", errors="replace")
    columns = (*unit, "layer", "in_window", *METRICS)
    header = tuple(text.split("\n", 1)[0].rstrip("\r").split(","))
    if header != columns:
        raise ConfigError(f"{path} has the columns {', '.join(header[:8])}, not those of a {LAYER_ERROR_FILE} "
                          f"({', '.join(columns)}). Move it away and record it again.")
    torn = set()
    if "\n" in text and not text.endswith("\n"):  # its last row was cut: that example is computed again
        text, cut = text.rsplit("\n", 1)
        text += "\n"
        torn.add(_key(next(csv.reader([cut]), [])[: len(unit)]))
    try:
        table = pd.read_csv(io.StringIO(text), dtype={c: str for c in unit if c != "budget"}, keep_default_na=False,
                            float_precision="round_trip")
    except (ValueError, pd.errors.ParserError) as exc:
        raise ConfigError(f"{path} does not read as a {LAYER_ERROR_FILE} ({exc}). Move it away and record it "
                          "again.") from exc
    numbers = table[["layer", *METRICS]].apply(pd.to_numeric, errors="coerce")
    keys = [_key(k) for k in zip(*(table[c] for c in unit))]
    torn |= {k for k, bad in zip(keys, numbers.isna().any(axis=1)) if bad}
    counts = pd.Series(keys, dtype=object).value_counts()
    torn = (torn | set(counts.index[counts < counts.max()])) & set(keys)  # a row cut inside its id names none
    if torn:
        log.warning(f"{path} was cut short or damaged: {len(torn)} example(s) without a whole row per layer are "
                    "computed again")
    return table[[k not in torn for k in keys]].reset_index(drop=True)


class LayerErrorFile:
    """The layer_error.csv of a results folder: rows of the examples kept from before, and each new example's added
    (layer_error_rows) and written at once, the file rewritten whole (fsutil.write_text_atomic); in a run spread over
    processes each writes its own part, which rank 0 merges (mot_viz.eval.processes.unit_file)."""

    def __init__(self, out_dir: Path, unit: tuple[str, ...], keep=None):
        """keep: the examples (tuples of the unit's values) whose rows an earlier run wrote and that stay; the file's
        other rows are dropped (their examples are computed again). None: keep no row."""
        self.path, self.unit = unit_file(Path(out_dir), LAYER_ERROR_FILE), unit
        self.rows: dict[tuple[str, ...], list[dict]] = {}
        wanted = {_key(k) for k in keep or ()}
        for path in unit_file_sources(Path(out_dir), LAYER_ERROR_FILE) if keep is not None else ():
            for key, part in read_layer_errors(path, unit).groupby(list(unit), sort=False):
                if _key(key) in wanted:
                    self.rows.setdefault(_key(key), part.to_dict(orient="records"))

    @property
    def done(self) -> set[tuple[str, ...]]:
        return set(self.rows)

    def add(self, translation: Translation, channels: Channels, **unit) -> None:
        self.rows[_key(unit[c] for c in self.unit)] = layer_error_rows(translation, channels, **unit)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        table = pd.DataFrame([r for rows in self.rows.values() for r in rows],
                             columns=[*self.unit, "layer", "in_window", *METRICS])
        write_text_atomic(self.path, table.to_csv(index=False, float_format="%.6g"))


def check_resumed(out_dir: Path, unit: tuple[str, ...], previous: pd.DataFrame | None) -> None:
    """Raise ConfigError, before a model loads, when --layer_error resumes a run whose kept examples (the scored rows of
    `previous`, the rows --resume keeps) lack their rows of layer_error.csv: an earlier run without --layer_error
    (or a damaged file); --resume computes only the examples it lacks, so theirs would be missing for good."""
    if previous is None:
        return
    scored = previous[previous["condition"] != "skipped"]
    kept = set(zip(*(scored[c] for c in unit)))
    missing = {_key(k) for k in kept} - LayerErrorFile(out_dir, unit, kept).done
    if missing:
        raise ConfigError(f"--out {out_dir} holds {len(missing)} example(s) without their per-layer errors (computed "
                          f"without --layer_error), which --resume does not compute again. Record them first with "
                          f"`python -m mot_viz.eval.layer_error {out_dir}`, then resume with --layer_error; or resume "
                          "without --layer_error.")


# ----- recording a folder already written --------------------------------------------------------------------------


def _kind(folder: Path) -> tuple[str, dict]:
    """Which evaluation wrote `folder` ("evaluate" or "long_context") and its settings; ConfigError otherwise."""
    fix = ("Pass a folder that python -m mot_viz.eval.evaluate or long_context wrote with --out, e.g. "
           "results/eval/smollm2-to-gemma3-mid-squad300.")
    writer = writer_of(folder)
    name = writer.rsplit(".", 1)[-1] if writer else None
    if name not in UNITS or not (folder / RESULTS_TABLE).is_file():
        what = f"holds results of {writer}" if writer else "is not a results folder"
        raise ConfigError(f"{folder} {what}, not of evaluate or long_context. {fix}")
    try:
        settings = json.loads((folder / SETTINGS_FILE).read_text())["settings"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{folder} has no readable {SETTINGS_FILE} ({exc}). {fix}") from exc
    return name, settings


def record(folder: str | Path, budgets: tuple[int, ...] | None = None, progress: bool = True) -> Path:
    """Write `folder`'s layer_error.csv for every scored example it holds (of `budgets` only, for a long_context
    folder, when given), keeping the rows it already has (the command resumes)."""
    from tqdm import tqdm

    from ..engine.checkpoint import read_config
    from ..engine.mot import translate
    from ..engine.prompts import build_prompt
    from . import evaluate, long_context

    folder = Path(folder)
    name, raw = _kind(folder)
    rows = pd.read_csv(folder / RESULTS_TABLE, dtype={"dataset": str, "id": str}, keep_default_na=False)
    lacking = [c for c in (*UNITS[name], "condition") if c not in rows]
    if lacking:
        raise ConfigError(f"{folder / RESULTS_TABLE} has no column {', '.join(lacking)} (its columns: "
                          f"{', '.join(map(str, rows.columns[:8]))}), so it is not the table {name} writes. Pass a "
                          f"folder python -m mot_viz.eval.{name} wrote with --out, or run it again there.")
    scored = {_key(k) for k in zip(*(rows.loc[rows["condition"] != "skipped", c] for c in UNITS[name]))}
    layers = LayerErrorFile(folder, UNITS[name], scored)
    module = evaluate if name == "evaluate" else long_context
    settings = (evaluate.EvalSettings if name == "evaluate" else long_context.LongSettings).from_json(raw)
    if name == "long_context" and budgets and set(budgets) - set(settings.budgets):
        raise ConfigError(f"--budgets {' '.join(map(str, budgets))}: {folder} holds the budgets "
                          f"{' '.join(map(str, settings.budgets))}. Pass some of those.")
    config = read_config(settings.checkpoint)
    source, target = module.load_model(config["source"]["name"]), module.load_model(config["target"]["name"])
    if name == "evaluate":
        mot = evaluate.load_evaluated(settings.checkpoint, settings, source, target)  # replays as the run did
        from ..data.eval_data import load_dataset

        todo = [(evaluate.truncate_context(target, e, settings.max_context_tokens), {"dataset": e.dataset, "id": e.id})
                for d in settings.datasets for e in load_dataset(d, n=settings.n, seed=settings.seed)]
    else:
        mot = long_context.load_checkpoint(settings.checkpoint, source, target)[0]
        todo = [(d.example, {"budget": d.budget, "id": d.example.id}) for b in (budgets or settings.budgets)
                for d in long_context.long_examples(settings.source, target.tokenizer, b, settings.n, settings.seed)]
    todo = [(e, unit) for e, unit in todo if _key(unit.values()) in scored - layers.done]
    for example, unit in tqdm(todo, desc="layer error", disable=not progress, dynamic_ncols=True):
        text = build_prompt(example, target.chat_frame).context_text  # the context the evaluation translated
        layers.add(translate(mot, source, target, text), mot.channels, **unit)
    return layers.path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Record the per-layer K/V error of the MoT cache against the "
                                                 "native one for every example of an evaluation's results folder")
    parser.add_argument("results", help="a folder python -m mot_viz.eval.evaluate or long_context wrote with --out")
    parser.add_argument("--budgets", type=int, nargs="+", help="long_context folders: only these budgets")
    args = parser.parse_args(argv)
    return run_cli(lambda: print(f"wrote {record(args.results, tuple(args.budgets or ()))}"))


if __name__ == "__main__":
    sys.exit(main())
