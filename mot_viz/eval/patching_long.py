"""The documents of one budget of a long-context results folder (python -m mot_viz.eval.long_context), as
python -m mot_viz.eval.patching scans them: rebuilt from the folder's summary.json settings as the run built them
(mot_viz.data.long_context.long_examples), the ones it scored (examples.csv rows without an error)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..data.long_context import long_examples
from ..engine.models import LoadedModel
from ..engine.prompts import QAExample
from ..errors import ConfigError
from .long_settings import LongSettings
from .results_folder import RESULTS_TABLE, SETTINGS_FILE, writer_of

WRITER = "long_context"


def is_long_folder(folder: Path) -> bool:
    """Whether `folder` holds the results of python -m mot_viz.eval.long_context."""
    return (writer_of(folder) or "").rsplit(".", 1)[-1] == WRITER


def long_settings(folder: Path, budget: int | None) -> tuple[LongSettings, int]:
    """The folder's long-context settings and the budget scanned (the only one the run had, or `budget`);
    ConfigError, before any model loads, for unreadable settings or a budget the run did not evaluate."""
    try:
        settings = LongSettings.from_json(json.loads((folder / SETTINGS_FILE).read_text())["settings"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{folder} has no readable caches' settings in {SETTINGS_FILE} ({exc}). Pass a folder "
                          "python -m mot_viz.eval.long_context wrote with --out") from exc
    budgets = ", ".join(map(str, settings.budgets))
    if budget is None and len(settings.budgets) > 1:
        raise ConfigError(f"{folder} holds the budgets {budgets}: pass --budget with one of them, e.g. --budget "
                          f"{settings.budgets[min(1, len(settings.budgets) - 1)]}")
    budget = settings.budgets[0] if budget is None else int(budget)
    if budget not in settings.budgets:
        raise ConfigError(f"{folder} has no documents at the budget {budget}: pass --budget with one of {budgets}")
    return settings, budget


def long_documents(folder: Path, settings: LongSettings, budget: int, target: LoadedModel) -> list[QAExample]:
    """The budget's documents the run scored, in the run's order."""
    table = pd.read_csv(folder / RESULTS_TABLE, dtype={"id": str, "error": str}, keep_default_na=False)
    scored = set(table.loc[(table["budget"].astype(int) == budget) & (table["error"] == ""), "id"])
    return [doc.example for doc in long_examples(settings.source, target.tokenizer, budget, settings.n, settings.seed)
            if doc.example.id in scored]
