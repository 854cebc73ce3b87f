"""layer_error.csv, the per-layer error of the MoT cache against the target's native cache, per example: its rows
(layer_error_rows: per target layer, the relative L2 error ‖mot − native‖ / ‖native‖ and the mean per-token cosine of
the cache the "mot" condition answers from, for K and for V, over the context positions; mot_viz.engine.cache_errors,
comparison "replayed"), reading it back (read_layer_errors) and writing it example by example (LayerErrorFile, an
ExampleRowsFile). One row per example and layer (long format), so folders stay small. Written by ``--layer_error``
of evaluate and long_context, or afterwards by ``python -m mot_viz.eval.layer_error``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd

from ..cli import logger
from ..engine.cache_errors import KV_NAMES, compared_caches, layer_errors, token_vectors
from ..engine.channels import Channels
from ..engine.mot import Translation
from ..errors import ConfigError
from .example_rows import ExampleRowsFile, example_key

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
        torn.add(example_key(next(csv.reader([cut]), [])[: len(unit)]))
    try:
        table = pd.read_csv(io.StringIO(text), dtype={c: str for c in unit if c != "budget"}, keep_default_na=False,
                            float_precision="round_trip")
    except (ValueError, pd.errors.ParserError) as exc:
        raise ConfigError(f"{path} does not read as a {LAYER_ERROR_FILE} ({exc}). Move it away and record it "
                          "again.") from exc
    numbers = table[["layer", *METRICS]].apply(pd.to_numeric, errors="coerce")
    keys = [example_key(k) for k in zip(*(table[c] for c in unit))]
    torn |= {k for k, bad in zip(keys, numbers.isna().any(axis=1)) if bad}
    counts = pd.Series(keys, dtype=object).value_counts()
    torn = (torn | set(counts.index[counts < counts.max()])) & set(keys)  # a row cut inside its id names none
    if torn:
        log.warning(f"{path} was cut short or damaged: {len(torn)} example(s) without a whole row per layer are "
                    "computed again")
    return table[[k not in torn for k in keys]].reset_index(drop=True)


class LayerErrorFile(ExampleRowsFile):
    """The layer_error.csv of a results folder, written example by example (ExampleRowsFile)."""

    def __init__(self, out_dir: Path, unit: tuple[str, ...], keep=None):
        """keep: the examples (tuples of the unit's values) whose rows an earlier run wrote and that stay; the file's
        other rows are dropped (their examples are computed again). None: keep no row."""
        super().__init__(out_dir, LAYER_ERROR_FILE, unit, (*unit, "layer", "in_window", *METRICS),
                         lambda path: read_layer_errors(path, unit), keep)

    def add(self, translation: Translation, channels: Channels, **unit) -> None:
        self.add_rows([unit[c] for c in self.unit], layer_error_rows(translation, channels, **unit))


def check_resumed(out_dir: Path, unit: tuple[str, ...], previous: pd.DataFrame | None) -> None:
    """Raise ConfigError, before a model loads, when --layer_error resumes a run whose kept examples (the scored rows of
    `previous`, the rows --resume keeps) lack their rows of layer_error.csv: an earlier run without --layer_error
    (or a damaged file); --resume computes only the examples it lacks, so theirs would be missing for good."""
    if previous is None:
        return
    scored = previous[previous["condition"] != "skipped"]
    kept = set(zip(*(scored[c] for c in unit)))
    missing = {example_key(k) for k in kept} - LayerErrorFile(out_dir, unit, kept).done
    if missing:
        raise ConfigError(f"--out {out_dir} holds {len(missing)} example(s) without their per-layer errors (computed "
                          f"without --layer_error), which --resume does not compute again. Record them first with "
                          f"`python -m mot_viz.eval.layer_error {out_dir}`, then resume with --layer_error; or resume "
                          "without --layer_error.")
