"""A results folder (--out of the evaluation commands): whether it may be written, what an earlier run left in it
and which of its rows are whole (the run that reads them back and writes after each unit is eval.processes).

Shared by mot_viz.eval.evaluate, long_context, conversation and shards; each file is written atomically
(fsutil.write_text_atomic), so a kill leaves the old file or the new one, never a torn one.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..cli import logger
from ..errors import ConfigError
from ..fsutil import check_out_place, named, temp_parts

log = logger(__name__)

RESULTS_TABLE = "examples.csv"  # one row per unit and condition: what --resume reads back
SETTINGS_FILE = "summary.json"  # the run's settings (key "settings"): whose results the folder holds
# the rows each process of a run spread over processes writes (mot_viz.eval.processes): "rank-<r>-of-<n>.csv", and
# the run's settings (SETTINGS_FILE); merged into the result files, and removed, when the processes are done
PARTS = ".parts"
# what python -m mot_viz.eval.patching adds to an evaluation's or a long-context run's folder (its rows, its settings):
# a later --resume of that run keeps them
PATCHING_FILES = ("patching.csv", "patching.json")


def part_files(out_dir: Path) -> list[Path]:
    """The part files of out_dir, those a run spread over processes is writing or an interrupted one left."""
    return sorted((out_dir / PARTS).glob("rank-*-of-*.csv"))


def check_out(out_dir: Path) -> None:
    """Raise ConfigError unless out_dir is a folder this process can create and write into.

    Nothing is created here (the folder appears with the first results): a run refused later leaves no empty folder.
    """
    check_out_place(out_dir)


def command_of(settings) -> str:
    """The command that writes results of `settings` ("python -m mot_viz.eval.evaluate")."""
    return " ".join(settings.command().split()[:3])


def writer_of(out_dir: Path) -> str | None:
    """The command whose results out_dir holds, as its summary.md's first line names it ("Command: `python -m …`"),
    or None."""
    try:
        first = (out_dir / "summary.md").read_text(errors="replace").split("\n", 1)[0]
    except OSError:
        return None
    found = re.match(r"Command: `(python -m [\w.]+)", first)
    return found[1] if found else None


def check_results_folder(out_dir: Path, settings, files: tuple[str, ...], overwrite: bool = False,
                         resume: bool = False) -> None:
    """Raise ConfigError, before any model loads, unless out_dir is a folder this run may write its `files` into:
    a folder it can write (check_out), empty or missing, or holding only results of this command (its summary.json
    holds settings of this command, and every file is one of `files`, what such a folder holds; summary.md's
    "Command:" line names the evaluation of another's folder). A folder holding anything else (a user's
    files, another evaluation's results) is written into only with `overwrite`, which cannot go with `resume`."""
    check_out(out_dir)
    if overwrite and resume:
        raise ConfigError("--resume keeps the results --out holds and --overwrite replaces them. Pass one of them.")
    if overwrite or not out_dir.is_dir():
        return
    present = sorted(p.name for p in out_dir.iterdir())
    if not present:
        return
    command, writer = command_of(settings), writer_of(out_dir)
    ours = _holds_settings_of(out_dir, settings) or _holds_settings_of(out_dir / PARTS, settings)
    files = (*files, PARTS)
    # named by its module alone: older versions ran the same evaluation as "python -m mot_viz.evaluate"
    same = writer is None or writer.rsplit(".", 1)[-1] == command.rsplit(".", 1)[-1]
    if not ours and not same:
        raise ConfigError(f"--out {out_dir} holds the results of another evaluation ({writer}), not of {command}"
                          + (", so --resume cannot continue them" if resume else "") + ". Pass another --out folder, "
                          "or --overwrite to replace them.")
    if not ours and writer is not None and SETTINGS_FILE in present:
        raise ConfigError(f"--out {out_dir} holds a {SETTINGS_FILE} that does not read as settings of {command} (it "
                          "was damaged or edited). Pass another --out folder, or --overwrite to replace its results.")
    leftovers = [name for name in present if (temp_parts(Path(name)) or ("",))[0] in files]  # of killed writes
    foreign = [name for name in present if name not in leftovers and (not ours or name not in files)]
    if foreign:
        raise ConfigError(f"--out {out_dir} holds files that are not results of this {command} run "
                          f"({named(foreign)}), which it could overwrite. Pass a new or empty folder, or --overwrite "
                          "to write into this one (files of the same names are replaced).")


def _holds_settings_of(out_dir: Path, settings) -> bool:
    """Whether out_dir's summary.json holds settings of the command of `settings` (from_json reads them)."""
    try:
        type(settings).from_json(json.loads((out_dir / SETTINGS_FILE).read_text())["settings"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def differing(before, settings, keys: tuple[str, ...]) -> list[str]:
    """The settings of `keys` that differ between two runs; of a mapping (the ways of sharing's options), the entries
    that differ, by name."""
    out = []
    for k in keys:
        a, b = getattr(before, k), getattr(settings, k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [name for name in dict.fromkeys([*a, *b]) if a.get(name) != b.get(name)]
        elif a != b:
            out.append(k)
    return out


def earlier_run(out_dir: Path, settings, resume: bool, keys: tuple[str, ...], unit: str = "examples") -> bool:
    """Whether out_dir holds results of an earlier run of `settings` to continue (--resume): its result files, or the
    part files of a run spread over processes (PARTS). Results of other settings (any of `keys` differs), or of these
    without --resume, are refused with ConfigError; `settings` is a dataclass with a from_json classmethod, as
    summary.json stores it."""
    metas = [meta for meta in (out_dir / SETTINGS_FILE,) if has_results(out_dir)]
    metas += [meta for meta in (out_dir / PARTS / SETTINGS_FILE,) if meta.is_file()]
    if not metas:
        return False
    changed = []
    for meta in metas:
        try:
            before = type(settings).from_json(json.loads(meta.read_text())["settings"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"--out {out_dir} holds an unreadable {meta.relative_to(out_dir)} ({exc}). Pass another "
                              "--out folder.") from exc
        changed += [k for k in differing(before, settings, keys) if k not in changed]
    if changed:
        raise ConfigError(f"--out {out_dir} holds results of other settings ({', '.join(changed)} differ), which "
                          "--resume cannot continue. Pass another --out folder.")
    if not resume:
        raise ConfigError(f"--out {out_dir} already holds results of these settings. Add --resume to keep them and "
                          f"compute only the missing {unit}, or pass another --out folder.")
    return True


@dataclass(frozen=True)
class ResultsTable:
    """The examples.csv of an evaluation (a row per unit and condition) and what --resume checks of its rows."""

    columns: tuple[str, ...]
    text_columns: tuple[str, ...]  # read as text (ids, answers), never as numbers
    units: tuple[str, ...]  # the columns naming one unit (a document, a budget and a document, a conversation)
    numbers: tuple[str, ...]  # finite numbers on every scored row
    optional: tuple[str, ...] = ()  # numbers where not empty (a stage or a metric some conditions lack)
    earlier: tuple[tuple[str, ...], ...] = ()  # the columns of earlier versions' tables, which --resume still reads


def condition_label(row: dict) -> str:
    """The label of a scored row among its unit's rows: its condition."""
    return row["condition"]


def has_results(out_dir: Path) -> bool:
    return (out_dir / RESULTS_TABLE).is_file() and (out_dir / SETTINGS_FILE).is_file()


def unit_key(values) -> tuple:
    """A unit's key (its values of a table's unit columns) comparable however it was read: texts as they are, numbers
    as floats (a budget 1024 read back from a CSV as 1024 or 1024.0)."""
    return tuple(v if isinstance(v, str) else float(v) for v in values)


def results_rows(folder: Path, command: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """The examples.csv of a folder python -m mot_viz.eval.`command` wrote, as a command that reads it back (patching,
    layer_error) reads it before any model loads: ids as text; ConfigError, naming the fix, for a file that cannot be
    read, binary data, or a table without `columns` (another tool's examples.csv)."""
    path = folder / RESULTS_TABLE
    fix = f"Pass a folder python -m mot_viz.eval.{command} wrote with --out, or run it again there."
    try:
        with open(path, "rb") as f:
            binary = binary_start(f.read(HEAD_BYTES))
        rows = None if binary else pd.read_csv(path, dtype={"dataset": str, "id": str}, keep_default_na=False)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise ConfigError(f"{path} does not read as the table {command} writes ({exc}). {fix}") from exc
    if rows is None:
        raise ConfigError(f"{path} holds binary data, not the table {command} writes. {fix}")
    lacking = [c for c in columns if c not in rows]
    if lacking:
        raise ConfigError(f"{path} has no column {', '.join(lacking)} (its columns: "
                          f"{', '.join(map(str, rows.columns[:8]))}), so it is not the table {command} writes. {fix}")
    return rows


def read_rows(source, text_columns: tuple[str, ...]) -> pd.DataFrame:
    """A results table as the evaluation wrote it: `text_columns` as texts ("None", "1.50"), floats exactly as they
    were written, empty fields missing."""
    return pd.read_csv(source, dtype=dict.fromkeys(text_columns, str), keep_default_na=False, na_values=[""],
                       float_precision="round_trip")


HEAD_BYTES = 64 * 2**10  # the start of a results table that tells text from binary data: its header lies within it


def binary_start(head: bytes) -> bool:
    """Whether a file starting with `head` is binary data rather than a CSV table: its first line holds a NUL byte or
    bytes that are not UTF-8 (a character cut at head's end aside). A NUL in a later row is text (a model's answer, a
    user's gold answer "Paris\\u0000"): the writers keep it as U+FFFD (fsutil.write_csv_atomic)."""
    line = head.split(b"\n", 1)[0]
    try:
        codecs.getincrementaldecoder("utf-8")().decode(line)  # not final: a character cut short is no error
    except UnicodeDecodeError:
        return True
    return b"\x00" in line


def table_text(raw: bytes) -> str | None:
    """A results table's bytes as text, or None when they are binary data (binary_start of their start, or bytes that
    are not UTF-8 further on)."""
    if binary_start(raw[:HEAD_BYTES]):
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


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
                  keys: tuple[str, ...], label, wanted: set, whole, units: str = "examples") -> pd.DataFrame:
    """The rows of an earlier results table that --resume keeps: those of every unit (its `keys` columns) with a whole
    row (whole(row as a dict of texts)) for each of the `wanted` labels (label(row) of its scored rows), or its one
    "skipped" row. A unit with a row cut short or damaged (a run killed while writing it, by versions that wrote in
    place, or an edit) is computed again, and a log line says so; a file that is not such a table at all (another
    header than one of `headers`, binary data) is refused with ConfigError. `text_columns` are read as text; `units`
    names the units in the log line."""
    fix = "Move it away (or pass another --out folder) and run again without --resume."
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror}). {fix}") from exc
    text = table_text(raw)
    if text is None:
        raise ConfigError(f"{path} holds binary data, not the CSV table MoT Viz writes. {fix}")
    try:  # a file cut inside its header holds no row yet
        header, *body = list(csv.reader(io.StringIO(text, newline=""))) if "\n" in text else [list(headers[0])]
    except csv.Error as exc:
        raise ConfigError(f"{path} does not parse as CSV ({exc}), so it is not the table MoT Viz writes. "
                          f"{fix}") from exc
    if tuple(header) not in headers:
        raise ConfigError(f"{path} has the columns {', '.join(header[:12])}, not those of an examples.csv MoT Viz "
                          f"writes ({', '.join(headers[0])}). {fix}")
    if body and not text.endswith("\n"):  # every row ends with a newline: the last one was cut short
        body.pop()
    at_key = [header.index(k) for k in keys]
    unit = lambda fields: tuple(fields[i] for i in at_key)  # noqa: E731
    kept_rows = [fields for fields in body if len(fields) == len(header) and whole(dict(zip(header, fields)))]
    found = {}
    for fields in kept_rows:
        row = dict(zip(header, fields))
        found.setdefault(unit(fields), []).append(None if row["condition"] == "skipped" else label(row))
    done = {key for key, got in found.items() if set(got) in ({None}, wanted)}
    redo = {unit(fields) for fields in body} - done
    if redo or len(kept_rows) < len(body) or not text.endswith("\n"):
        log.warning(f"{path} was cut short or damaged (a run killed while writing it): {len(redo)} {units} "
                    "without a whole row per condition are computed again")
    kept = io.StringIO()
    csv.writer(kept, lineterminator="\n").writerows([header] + [f for f in kept_rows if unit(f) in done])
    kept.seek(0)
    return read_rows(kept, text_columns)  # kept rows are written back unchanged
