"""Every row of every shipped results folder opens its own example in the app: the Evaluations page's link, read back
as a fresh session opened on it reads it (permalink.parse_link), names the example the sidebar or the page then loads,
and that example has the row's id. Only the data and the target's tokenizer are read (the long documents and stories
are cut with it), no model."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from app_helpers import restored
from mot_viz.analysis import eval_runs
from mot_viz.app.links import eval_run_views
from mot_viz.app.loaders import dataset_examples
from mot_viz.app.permalink import example_link
from mot_viz.data.coqa import coqa_conversations
from mot_viz.data.long_context import long_examples
from mot_viz.engine.model_files import bundled_model_dir
from mot_viz.engine.models import DEFAULT_TARGET

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = eval_runs.shipped_runs(ROOT / "results")


@pytest.fixture(autouse=True)
def real_checkpoints(monkeypatch):
    monkeypatch.delenv("MOT_VIZ_TEST_MODELS", raising=False)
    monkeypatch.delenv("MOT_VIZ_PRETRAINED", raising=False)


@functools.cache
def tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(bundled_model_dir(name)), trust_remote_code=False)


@functools.cache
def documents(target: str, source: str, budget: int, n: int) -> tuple[str, ...]:
    """The ids of the first `n` documents the Long context / Multi-agent page builds (the loaders' own call with
    n = number + 1; one call for the longest, as a shorter draw is its start)."""
    return tuple(d.example.id for d in long_examples(source, tokenizer(target), budget, n, seed=0))


@functools.cache
def stories(target: str, n: int, turns: int) -> tuple[str, ...]:
    return tuple(c.id for c in coqa_conversations(tokenizer(target), n, turns, 0, 512))


def test_the_shipped_results_are_all_walked():
    kinds = {eval_runs.open_run(f).kind.name for f in SHIPPED}
    assert {"evaluate", "long_context", "conversation", "shards"} <= kinds and len(SHIPPED) >= 20


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda f: str(f.relative_to(ROOT / "results")))
def test_every_row_opens_its_own_example(folder):
    run = eval_runs.open_run(folder)
    table = eval_runs.wide_table(run)
    views = eval_run_views(run, table)
    assert [v.reason for v in views if v.page is None] == []
    kind = run.kind.name
    if kind in ("long_context", "shards", "conversation"):  # the longest draw each page needs, read once
        numbers = [v.options.get("pg.long.doc", v.options.get("pg.agents.doc", v.options.get("pg.agents.conversation")))
                   for v in views]
        most = max(numbers) + 1
    for row, view in zip(table.itertuples(), views):
        parsed = restored(example_link(view))
        sidebar, page = parsed.sidebar, parsed.page
        target = sidebar.target or DEFAULT_TARGET
        if kind == "evaluate":
            example = dataset_examples(sidebar.dataset)[sidebar.example]
            assert (example.dataset, example.id) == (row.dataset, row.id)
        elif kind == "long_context":
            ids = documents(target, page["pg.long.source"], page["pg.long.budget"], most)
            assert ids[page["pg.long.doc"]] == row.id and f"{page['pg.long.budget']} tokens" in row.group
        elif kind == "shards":
            assert page["pg.agents.sharded"] is True
            assert documents(target, "stacks", 1024, most)[page["pg.agents.doc"]] == row.id
        else:
            assert stories(target, most, page["pg.agents.turns"])[page["pg.agents.conversation"]] == row.id
        if view.checkpoint is not None:
            assert sidebar.checkpoint == Path(str(run.settings["checkpoint"])).name
