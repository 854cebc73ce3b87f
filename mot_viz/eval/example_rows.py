"""A results folder's per-example table in long format (several rows per example: layer_error.csv, patching.csv),
written example by example: the rows of the examples kept from an earlier run, each new example's added and the file
rewritten whole (fsutil.write_text_atomic), so a run stopped at any point leaves whole examples; in a run spread over
processes each writes its own part, which rank 0 merges (mot_viz.eval.processes.unit_file)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pandas as pd

from ..fsutil import write_text_atomic
from .processes import unit_file, unit_file_sources


def example_key(values) -> tuple[str, ...]:
    """The values naming one example (its unit columns), as text: how rows of the file and of a results table match."""
    return tuple(str(v) for v in values)


class ExampleRowsFile:
    """The table `name` of a results folder, one example's rows at a time."""

    def __init__(self, folder: Path, name: str, unit: Sequence[str], columns: Sequence[str],
                 read: Callable[[Path], pd.DataFrame], keep: Iterable | None = None):
        """unit: the columns naming one example; read: the file's reader (whole examples only); keep: the examples
        (tuples of the unit's values) whose rows an earlier run wrote and that stay; the file's other rows are dropped
        (their examples are computed again). None: keep no row."""
        self.path, self.unit, self.columns = unit_file(Path(folder), name), tuple(unit), tuple(columns)
        self.rows: dict[tuple[str, ...], list[dict]] = {}
        wanted = {example_key(k) for k in keep or ()}
        for path in unit_file_sources(Path(folder), name) if keep is not None else ():
            for key, part in read(path).groupby(list(self.unit), sort=False):
                if example_key(key) in wanted:
                    self.rows.setdefault(example_key(key), part.to_dict(orient="records"))

    @property
    def done(self) -> set[tuple[str, ...]]:
        return set(self.rows)

    def add_rows(self, key, rows: list[dict]) -> None:
        """One example's rows (key: its unit's values), the file written at once."""
        self.rows[example_key(key)] = rows
        self.path.parent.mkdir(parents=True, exist_ok=True)
        table = pd.DataFrame([r for rows in self.rows.values() for r in rows], columns=list(self.columns))
        write_text_atomic(self.path, table.to_csv(index=False, float_format="%.6g"))
