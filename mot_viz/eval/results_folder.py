"""A results folder (--out of the evaluation commands): whether it may be written, what an earlier run left in it
and which of its rows --resume keeps, and the loop that writes every result file whole after each unit.

Shared by mot_viz.eval.evaluate, long_context, conversation and shards; each file is written atomically
(fsutil.write_text_atomic), so a kill leaves the old file or the new one, never a torn one.
"""

from __future__ import annotations

import csv
import io
import json
import math
import tempfile
from pathlib import Path

import pandas as pd

from ..cli import logger
from ..errors import ConfigError, MotVizError

log = logger(__name__)

RESULTS_TABLE = "examples.csv"  # one row per unit and condition: what --resume reads back
SETTINGS_FILE = "summary.json"  # the run's settings (key "settings"): whose results the folder holds


def check_out(out_dir: Path) -> None:
    """Raise ConfigError unless out_dir is a folder this process can create and write into.

    Nothing is created here (the folder appears with the first results): a run refused later leaves no empty folder.
    """
    existing = next(p for p in (out_dir, *out_dir.absolute().parents) if p.exists())
    if not existing.is_dir():
        what = "is a file" if existing == out_dir else f"lies inside the file {existing}"
        raise ConfigError(f"--out {out_dir} {what}. Pass a folder (it is created when missing).")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as exc:
        raise ConfigError(f"Cannot write into --out {out_dir} ({exc.strerror}). Pass a folder you can write to.") from exc


def earlier_run(out_dir: Path, settings, resume: bool, keys: tuple[str, ...], unit: str = "examples") -> bool:
    """Whether out_dir holds results of an earlier run of `settings` to continue (--resume). Results of other settings
    (any of `keys` differs), or of these without --resume, are refused with ConfigError; `settings` is a dataclass
    with a from_json classmethod, as summary.json stores it."""
    table, meta = out_dir / RESULTS_TABLE, out_dir / SETTINGS_FILE
    if not (table.is_file() and meta.is_file()):
        return False
    try:
        before = type(settings).from_json(json.loads(meta.read_text())["settings"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--out {out_dir} holds an unreadable {meta.name} ({exc}). Pass another --out folder.") from exc
    changed = [k for k in keys if getattr(before, k) != getattr(settings, k)]
    if changed:
        raise ConfigError(f"--out {out_dir} holds results of other settings ({', '.join(changed)} differ), which "
                          "--resume cannot continue. Pass another --out folder.")
    if not resume:
        raise ConfigError(f"--out {out_dir} already holds results of these settings. Add --resume to keep them and "
                          f"compute only the missing {unit}, or pass another --out folder.")
    return True


def resumed_table(out_dir: Path, settings, resume: bool, keys: tuple[str, ...], columns: tuple[str, ...],
                  text_columns: tuple[str, ...], unit: str) -> pd.DataFrame | None:
    """The examples.csv of an earlier run of `settings` in out_dir to continue (--resume, see earlier_run), for the
    evaluations that write every file whole after each unit (a kill never tears one): a table that does not parse,
    or has other columns than `columns`, is refused with ConfigError; `text_columns` are read as text."""
    if not earlier_run(out_dir, settings, resume, keys, unit=unit):
        return None
    path = out_dir / RESULTS_TABLE
    try:
        rows = pd.read_csv(path, dtype=dict.fromkeys(text_columns, str), keep_default_na=False, na_values=[""],
                           float_precision="round_trip")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} cannot be read as results ({exc}). Move it away to start again, or pass another "
                          "--out folder.") from exc
    if tuple(rows.columns) != tuple(columns):
        raise ConfigError(f"{path} does not hold this evaluation's columns. Move it away to start again, or pass "
                          "another --out folder.")
    return rows


def whole_row(row: dict, keys: tuple[str, ...], numbers: tuple[str, ...], optional: tuple[str, ...] = ()) -> bool:
    """Whether a row of a results table parses completely: its `keys` and condition set, and a scored row's
    `numbers` finite numbers (`optional` ones numbers where not empty)."""
    if not all(row.get(k) for k in (*keys, "condition")):
        return False
    if row["condition"] == "skipped":
        return True
    try:
        values = [float(row[k]) for k in numbers]
        [float(row[k]) for k in optional if row[k]]  # empty where a condition has none
    except (KeyError, ValueError):
        return False
    return all(map(math.isfinite, values))


def complete_rows(path: Path, headers: tuple[tuple[str, ...], ...], text_columns: tuple[str, ...],
                  keys: tuple[str, ...], labels: tuple[str, ...], wanted: set[tuple[str, ...]], whole,
                  units: str = "examples") -> pd.DataFrame:
    """The rows of an earlier results table that --resume keeps: those of every unit (its `keys` columns) with a whole
    row (whole(row as a dict of texts)) for each of the `wanted` labels (values of its `labels` columns), or its one
    "skipped" row. A unit with a row cut short or damaged (a run killed while writing it, by versions that wrote in
    place) is computed again, and a log line says so; a file that is not such a table at all (another header than
    one of `headers`, binary data) is refused with ConfigError. `text_columns` are read as text; `units` names the
    units in the log line."""
    fix = "Move it away (or pass another --out folder) and run again without --resume."
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror}). {fix}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        raise ConfigError(f"{path} holds binary data, not the CSV table MoT Viz writes. {fix}")
    # a file cut inside its header holds no row yet
    header, *body = list(csv.reader(io.StringIO(text, newline=""))) if "\n" in text else [list(headers[0])]
    if tuple(header) not in headers:
        raise ConfigError(f"{path} has the columns {', '.join(header[:12])}, not those of an examples.csv MoT Viz "
                          f"writes ({', '.join(headers[0])}). {fix}")
    if body and not text.endswith("\n"):  # every row ends with a newline: the last one was cut short
        body.pop()
    at_key, at_label = [header.index(k) for k in keys], [header.index(k) for k in labels]
    unit = lambda fields: tuple(fields[i] for i in at_key)  # noqa: E731
    whole = [fields for fields in body if len(fields) == len(header) and whole(dict(zip(header, fields)))]
    found = {}
    for fields in whole:
        found.setdefault(unit(fields), set()).add(tuple(fields[i] for i in at_label))
    done = {key for key, got in found.items() if got == wanted or _skipped_only(got, labels)}
    redo = {unit(fields) for fields in body} - done
    if redo or len(whole) < len(body) or not text.endswith("\n"):
        log.warning(f"{path} was cut short or damaged (a run killed while writing it): {len(redo)} {units} "
                    "without a whole row per condition are computed again")
    kept = io.StringIO()
    csv.writer(kept, lineterminator="\n").writerows([header] + [f for f in whole if unit(f) in done])
    kept.seek(0)
    # texts stay texts ("None", "1.50"), floats round-trip exactly: kept rows are written back unchanged
    return pd.read_csv(kept, dtype=dict.fromkeys(text_columns, str), keep_default_na=False, na_values=[""],
                       float_precision="round_trip")


def _skipped_only(found: set[tuple[str, ...]], labels: tuple[str, ...]) -> bool:
    """Whether a unit's labels are its one "skipped" row's (the condition column "skipped", whatever the others)."""
    at = labels.index("condition")
    return len(found) == 1 and next(iter(found))[at] == "skipped"


def run_units(units, rows: list[dict], done: set, key, compute, skipped, write, desc: str, progress: bool):
    """The loop of a resumable evaluation: every unit (document, conversation) whose key(unit) is not in `done`
    adds compute(unit)'s rows to `rows`, or one "skipped" row (skipped(unit)'s fields and the error) when it raises a
    MotVizError (e.g. a document a model cannot hold: counted with its reason); write() writes every result file
    after each unit, and on Ctrl-C or a failure what was computed is written first. Returns write()'s result."""
    from tqdm import tqdm

    try:
        for unit in tqdm(units, desc=desc, disable=not progress, dynamic_ncols=True):
            if key(unit) in done:
                continue
            try:
                rows += compute(unit)
            except MotVizError as exc:
                rows.append({**skipped(unit), "condition": "skipped", "error": f"{type(exc).__name__}: {exc}"})
            write()
    except BaseException:
        if rows:
            write()
        raise
    return write()
