"""How an evaluation runs its units (documents, conversations, examples): the rows an earlier run left to continue
(resumed_table, --resume), the loop that writes every result file whole after each unit (run_units), alone or
spread over processes:

    torchrun --nproc_per_node 4 -m mot_viz.eval.evaluate -- --checkpoint pretrained/smollm2-to-gemma3 --n 300 \
        --out results/eval/x

("--" keeps torchrun from reading --n as an abbreviation of one of its own options.)

Each process answers a fixed share of the units not yet done (every world-th one of the list, from its rank on) and
writes its rows to a part file of the results folder (.parts/rank-<r>-of-<n>.csv) after each unit, whole
(fsutil.write_text_atomic): an interrupted process loses at most the unit it was computing. When every process is
done they meet; rank 0 reads the parts, puts their rows with the rows kept from before in the order of the unit list
(a single process's order) and writes the evaluation's result files, then removes the parts. Summaries (bootstrap
intervals) are computed once, by rank 0, on the merged rows, so they are a single process's. --resume counts the rows
of the parts an interrupted run left as done, with one process or several (resumed_table), and the
first process to continue merges them into the result files before it computes anything. A results file of rows per
unit beside examples.csv (layer_error.csv) has parts of its own the same way (unit_file, merge_unit_files).

The processes join torch's process group as training's do (train.devices): gloo on the CPU, NCCL between GPUs, each
process on its own GPU (cuda:LOCAL_RANK) when $MOT_VIZ_DEVICE names cuda. Every process must see the results folder
(one machine, or a shared file system). A single process (no torchrun) writes no part file.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from ..errors import ContextError, MotVizError
from ..fsutil import write_csv_atomic, write_text_atomic
from ..train.devices import init_distributed, process_group, run_device
from .results_folder import (PARTS, RESULTS_TABLE, SETTINGS_FILE, ResultsTable, check_results_folder, complete_rows,
                             condition_label, earlier_run, has_results, part_files, read_rows, unit_key, whole_row)


@dataclass(frozen=True)
class Spread:
    """What a run needs to spread its units over processes: where its results go, whose settings they are (the
    parts' summary.json, which --resume checks) and its results table (the part files' columns, the unit columns)."""

    out_dir: Path
    settings: object  # a dataclass, as summary.json stores it
    table: ResultsTable


MEETING_TIMEOUT = datetime.timedelta(hours=24)


def join() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) alone; under torchrun it joins the process group first and, on CUDA,
    takes its own GPU, so it is called before any model loads (they then load onto cuda:LOCAL_RANK)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    # the processes meet once, at the end, where each waits for the slowest share: minutes apart on long documents,
    # past NCCL's default 10 minutes. A process that fails is ended by torchrun, so no one waits this long for it.
    return init_distributed(run_device(), timeout=MEETING_TIMEOUT)


def barrier() -> None:
    """Wait until every process of the run is here (nothing to wait for alone)."""
    group = process_group()
    if group is not None:
        group.barrier()


def spread_out(out_dir: Path) -> bool:
    """Whether a run into out_dir is spread over processes, or has the part files of an interrupted one to merge."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or (Path(out_dir) / PARTS).is_dir()


def part_path(out_dir: Path, rank: int, world: int, name: str = "") -> Path:
    """A process's part file: of examples.csv's rows, or (`name`) of another results file of rows per unit."""
    return Path(out_dir) / PARTS / (f"{Path(name).stem}." * bool(name) + f"rank-{rank}-of-{world}.csv")


def unit_file(out_dir: Path, name: str) -> Path:
    """Where this process writes `name`, a results file of rows per unit beside examples.csv (layer_error.csv), whole
    after each unit: the folder's own file alone, this process's part in a spread run (merge_unit_files merges them)."""
    rank, world = join()
    return Path(out_dir) / name if world == 1 else part_path(out_dir, rank, world, name)


def unit_file_sources(out_dir: Path, name: str) -> list[Path]:
    """The files whose rows of `name` a run keeps: the folder's own, then the parts an interrupted spread run left."""
    own = Path(out_dir) / name
    return [own] * own.is_file() + sorted((Path(out_dir) / PARTS).glob(f"{Path(name).stem}.rank-*-of-*.csv"))


def unit_file_names(out_dir: Path) -> list[str]:
    """The results files of rows per unit (unit_file) whose parts out_dir holds."""
    return sorted({p.name.split(".rank-")[0] + ".csv" for p in (Path(out_dir) / PARTS).glob("*.rank-*-of-*.csv")})


def merge_unit_files(out_dir: Path, units, key, columns: tuple[str, ...], own: bool, names=None) -> None:
    """Write each results file of rows per unit (`names`, else those whose parts out_dir holds) from its parts, and
    first the folder's own file when `own`: each unit's rows (its `columns`) from the first file that holds it (every
    process's part repeats the rows kept from before), in unit order; the fields as they were written."""
    place = {tuple(map(str, k if isinstance(k, tuple) else (k,))): i for i, k in enumerate(map(key, units))}
    for name in unit_file_names(out_dir) if names is None else names:
        files = unit_file_sources(out_dir, name)
        files = files if own or not (Path(out_dir) / name).is_file() else files[1:]
        if not files:
            continue
        frames = [pd.read_csv(f, dtype=str, keep_default_na=False) for f in files]
        first, kept = set(), []
        for frame in frames:
            unit = [tuple(values) for values in frame[list(columns)].itertuples(index=False)]
            mine = [u not in first for u in unit]
            first |= {u for u, new in zip(unit, mine) if new}
            kept += [(place.get(u, -1), row) for u, new, row in zip(unit, mine, frame.itertuples(index=False)) if new]
        kept.sort(key=lambda item: item[0])
        write_text_atomic(Path(out_dir) / name,
                          pd.DataFrame([row for _, row in kept], columns=frames[0].columns).to_csv(index=False))


def in_unit_order(rows: list[dict], units, key, columns: tuple[str, ...]) -> None:
    """Sort `rows` (in place, stably) by their unit's place in `units` (key(unit): its values of `columns`, a tuple or
    one value); rows of units not in the list (kept from an earlier run with another --n) first, in their order."""
    place = {unit_key(k if isinstance(k, tuple) else (k,)): i for i, k in enumerate(map(key, units))}
    rows.sort(key=lambda row: place.get(unit_key(row[c] for c in columns), -1))


def begin(spread: Spread, rows: list[dict], units, key, write):
    """Start a run into spread.out_dir, once every process has read the rows it keeps (`rows`, with those of the part
    files an interrupted run left): rank 0 writes them into the result files in unit order and removes the parts,
    then, when the run is spread, writes the settings the new parts are of. Returns (rank, world size, the write to
    use): write() itself, or, for a spread run or one that merged parts, write() of the rows in unit order (rows
    computed now go to their unit's place among those of the parts)."""
    rank, world = join()
    folder, merged = Path(spread.out_dir) / PARTS, bool(part_files(spread.out_dir))
    # alone, the files of rows per unit (unit_file) are kept in unit order too, those of the parts merged first
    files = unit_file_names(spread.out_dir) if merged and rows and world == 1 else []
    barrier()
    if merged or world > 1:
        write = _in_order(write, rows, units, key, spread, files)
    if rank == 0:
        if folder.is_dir():
            if merged and rows:
                write()
            shutil.rmtree(folder)
        if world > 1:
            folder.mkdir(parents=True)
            write_text_atomic(folder / SETTINGS_FILE, json.dumps({"settings": spread.settings.to_json()}, indent=2,
                                                                 default=str))
    barrier()  # no process writes its part before rank 0 has cleared the folder
    return rank, world, write


def _in_order(write, rows: list[dict], units, key, spread: Spread, files: list[str]):
    def ordered():
        in_unit_order(rows, units, key, spread.table.units)
        result = write()
        if files:
            merge_unit_files(spread.out_dir, units, key, spread.table.units, own=True, names=files)
        return result

    return ordered


def run_share(spread: Spread, rank: int, world: int, units, rows: list[dict], done: set, key, unit_rows, write,
              desc: str, progress: bool):
    """This process's share of the units not in `done` (a fixed split: every world-th one from its rank on), each
    unit's unit_rows(unit) written to its part file as soon as they are computed; then, once every process is done,
    rank 0 adds every part's rows to `rows` and writes the result files (returns write()'s result: begin's, which puts
    the rows in unit order) and removes the parts. The other ranks return None."""
    todo = [unit for unit in units if key(unit) not in done]
    path, own = part_path(spread.out_dir, rank, world), []
    for unit in tqdm(todo[rank::world], desc=f"{desc} (rank 0 of {world})", disable=not progress or rank != 0,
                     dynamic_ncols=True):
        own += unit_rows(unit)
        write_csv_atomic(path, pd.DataFrame(own, columns=spread.table.columns))  # as the result files are written
    barrier()  # every part is whole
    if rank != 0:
        return None
    for part in part_files(spread.out_dir):  # read back as --resume reads them, so values match a resumed run's
        rows += read_rows(part, spread.table.text_columns).to_dict(orient="records")
    result = write()
    merge_unit_files(spread.out_dir, units, key, spread.table.units, own=False)
    shutil.rmtree(Path(spread.out_dir) / PARTS)
    return result


def resumed_table(out_dir: Path, settings, resume: bool, overwrite: bool, keys: tuple[str, ...],
                  files: tuple[str, ...], table: ResultsTable, wanted: set, unit: str,
                  label=condition_label) -> pd.DataFrame | None:
    """Check out_dir (check_results_folder: it
    may hold only results of this command, whose `files` these are, unless `overwrite`), and return the rows of an
    earlier run of `settings` there to continue (--resume, see earlier_run; None when there is none): every unit
    with a whole row for each of the `wanted` labels (label(row)), or its one skipped row (complete_rows), in the
    result files or in the part files a run spread over processes left (those of units the result files lack).

    Under torchrun this process first joins the others (processes.join: before any model loads)."""
    join()
    check_results_folder(out_dir, settings, files, overwrite, resume)
    if overwrite or not earlier_run(out_dir, settings, resume, keys, unit=unit):
        return None

    def whole(row) -> bool:
        return whole_row(row, table.units, table.numbers, table.optional)

    def read(path, headers) -> pd.DataFrame:
        return complete_rows(path, headers, table.text_columns, table.units, label, wanted, whole, unit)

    tables = [read(out_dir / RESULTS_TABLE, (table.columns, *table.earlier))] if has_results(out_dir) else []
    for part in part_files(out_dir):
        found = {unit_key(key) for frame in tables for key in zip(*(frame[c] for c in table.units))}
        rows = read(part, (table.columns,))
        tables.append(rows[[unit_key(key) not in found for key in zip(*(rows[c] for c in table.units))]])
    if not tables:  # only the settings of a spread run killed before its first unit
        return read_rows(io.StringIO(",".join(table.columns) + "\n"), table.text_columns)
    return pd.concat([t for t in tables if len(t)] or tables[:1], ignore_index=True)


def unit_rows(unit, compute, skipped, skip=MotVizError) -> list[dict]:
    """compute(unit)'s rows, or when it raises one of `skip` one "skipped" row: skipped(unit)'s fields and the
    error (e.g. a document a model cannot hold: counted with its reason)."""
    try:
        return compute(unit)
    except skip as exc:
        return [{**skipped(unit), "condition": "skipped", "error": f"{type(exc).__name__}: {exc}"}]


def run_units(units, rows: list[dict], done: set, key, compute, skipped, write, desc: str, progress: bool,
              what: str | None = "documents", spread=None, skip=MotVizError):
    """The loop of a resumable evaluation: every unit (document, conversation) whose key(unit) is not in `done`
    adds unit_rows(unit)'s rows to `rows` (compute(unit)'s, or one "skipped" row when it raises one of `skip`);
    write() writes every result file after each unit, and on Ctrl-C or a failure what was computed is written first.
    Returns write()'s result; a run whose every unit was skipped (`what` names them; None: never) raises
    ContextError once its results are written.

    spread (processes.Spread: the results folder, the settings, the results table): under torchrun each process
    computes its share of the units and rank 0 writes the merged results (processes.run_share); the other ranks
    return None. Alone, a process first merges the part files an interrupted spread run left (processes.begin)."""
    rank, world, write = begin(spread, rows, units, key, write) if spread is not None else (0, 1, write)
    if world > 1:
        result = run_share(spread, rank, world, units, rows, done, key,
                           lambda unit: unit_rows(unit, compute, skipped, skip), write, desc, progress)
        if rank != 0:
            return None
    else:
        try:
            for unit in tqdm(units, desc=desc, disable=not progress, dynamic_ncols=True):
                if key(unit) in done:
                    continue
                rows += unit_rows(unit, compute, skipped, skip)
                write()
        except BaseException:
            if rows:
                write()
            raise
        result = write()
    if what and rows and all(row["condition"] == "skipped" for row in rows):
        raise ContextError(f"all {what} ({len(rows)}) were skipped, so there is nothing to report (the first: "
                           f"{rows[0]['error']}). The results folder lists each with its reason; fix what they name "
                           "and run again.")
    return result


def run_examples(examples: dict[str, list], previous: pd.DataFrame | None, compute, write, spread: Spread,
                 progress: bool):
    """mot_viz.eval.evaluate's examples (each dataset's, a QA example named by its dataset and id) as the units of
    run_units: compute(example) gives its rows, and an example that raises anything is one skipped
    row with its reason, as evaluate_examples counts it. The rows `previous` keeps of other examples are dropped, as a
    single process drops them; write(frames) writes the result files of the rows."""
    units = [example for part in examples.values() for example in part]
    names = {(e.dataset, e.id) for e in units}
    kept = [] if previous is None else previous.to_dict(orient="records")
    rows = [r for r in kept if (r["dataset"], r["id"]) in names]
    done = {(r["dataset"], r["id"]) for r in rows}

    def key(example) -> tuple[str, str]:
        return example.dataset, example.id

    def skipped(example) -> dict:
        return {"dataset": example.dataset, "id": example.id}

    def write_rows():
        return write([pd.DataFrame(rows, columns=spread.table.columns)])

    return run_units(units, rows, done, key, compute, skipped, write_rows, "evaluate", progress, what=None,
                     spread=spread, skip=Exception)


def shown(summary, table) -> None:
    """Print table(summary) in the process that wrote the results (alone, or rank 0; the others have None)."""
    if summary is not None:
        print(table(summary))
