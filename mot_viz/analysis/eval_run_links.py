"""Where the app shows one example of an evaluation results folder: the page, the sidebar's models, checkpoint and
dataset example, and the page's own options, or why the app cannot show it yet. Pure: no Streamlit; the Evaluations
page turns each view into a link with mot_viz.app.permalink."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from ..data.eval_data import BUILTIN_DATASETS, load_dataset
from ..engine.checkpoint import read_config
from ..errors import MotVizError
from .eval_runs import REPO_ROOT, EvalRun


@dataclass(frozen=True)
class AppView:
    """The app's view of one example: the page, the sidebar's models, checkpoint and dataset example, and the page's
    own options (widget keys "pg.<page>.<name>"); `reason` says why an example has none, `note` what the view shows
    otherwise than the run did."""

    page: str | None = None  # the page's file name in views/ without ".py", e.g. "1_answers"
    source: str | None = None
    target: str | None = None
    checkpoint: str | None = None  # the checkpoint's folder name
    dataset: str | None = None
    example: int | None = None
    options: dict = field(default_factory=dict)
    reason: str = ""
    note: str = ""


def _checkpoint_models(checkpoint: str) -> tuple[str, str] | None:
    """The source and target model names of a run's checkpoint (a path as the run was given it, from the working
    folder or the repository), or None when it is not here."""
    for path in (Path(checkpoint), REPO_ROOT / checkpoint):
        if (path / "config.json").is_file():
            try:
                config = read_config(str(path))
                return config["source"]["name"], config["target"]["name"]
            except (MotVizError, OSError, KeyError, TypeError, ValueError):
                return None
    return None


def app_views(run: EvalRun, table: pd.DataFrame, *, checkpoints: Iterable[str], examples_per_dataset: int,
              long_documents: int, conversations: int, shard_documents: int) -> list[AppView]:
    """For each row of a wide table of `run`, the app's view of that example, or why there is none yet.

    `checkpoints`: the checkpoint names the app offers; the other arguments: how many dataset examples (the
    sidebar's, load_dataset(name, n, seed=0)), long documents, conversations and sharded documents the app's pages
    offer, each the first of the evaluations' own sample with seed 0."""
    checkpoint = str(run.settings.get("checkpoint", ""))
    name = Path(checkpoint.rstrip("/")).name
    models = _checkpoint_models(checkpoint)
    seed = run.settings.get("seed", 0)
    if seed != 0:
        return [AppView(reason=f"the app offers the examples of seed 0; this run sampled seed {seed}")] * len(table)
    if name in set(checkpoints) and models is not None:
        return _views(run, table, dict(source=models[0], target=models[1], checkpoint=name), examples_per_dataset,
                      long_documents, conversations, shard_documents)
    # the example still opens, under the pair and checkpoint the app starts with
    note = (f"the run's checkpoint {checkpoint} is not among the app's checkpoints (pretrained/), so the example "
            "opens with the sidebar's own; copy the checkpoint there to see the run's")
    return [replace(v, note=note) if v.page else v for v in
            _views(run, table, {}, examples_per_dataset, long_documents, conversations, shard_documents)]


def _views(run: EvalRun, table: pd.DataFrame, base: dict, examples_per_dataset: int, long_documents: int,
           conversations: int, shard_documents: int) -> list[AppView]:
    """app_views of a run of seed 0 whose sidebar settings are `base` (pair and checkpoint; {}: the app's own)."""
    kind = run.kind.name
    if kind == "evaluate":
        return _dataset_views(run, table, base, examples_per_dataset)
    # a document's number is its place in the run's sample: the app's are the first of the same seeded draw
    order = run.rows.drop_duplicates("example")
    if kind == "conversation":  # a conversation's number is its story's, whatever the turn
        stories = {story: k for k, story in enumerate(dict.fromkeys(order["id"]))}
        number = dict(zip(order["example"], order["id"].map(stories)))
    else:  # a document's number is its place among the documents of its length
        number = dict(zip(order["example"], order.groupby("group").cumcount()))
    views = []
    for r in table.itertuples():
        k = int(number[r.example])
        if kind == "long_context":
            source = run.settings.get("source")
            budget = int(r.group.split()[-2])
            if source not in ("stacks", "qasper"):
                views.append(AppView(reason="the Long context page offers the built-in stacks and Qasper papers only"))
            elif k >= long_documents:
                views.append(AppView(reason=f"the Long context page offers the first {long_documents} documents"))
            else:
                views.append(AppView("8_long_context", **base, options={"pg.long.source": source,
                                                                         "pg.long.budget": budget, "pg.long.doc": k}))
        elif kind == "conversation":
            turns = int(run.settings.get("turns", 5))
            if k >= conversations or run.settings.get("max_story_tokens", 512) != 512:
                views.append(AppView(reason=f"the Multi-agent page offers the first {conversations} conversations "
                                            "of stories up to 512 tokens"))
            else:
                views.append(AppView("10_multi_agent", **base, options={"pg.agents.conversation": k,
                                                                         "pg.agents.turns": turns}))
        else:
            shard_counts = run.settings.get("shards", [2])
            if k >= shard_documents or int(run.settings.get("budget", 0)) != 1024:
                views.append(AppView(reason=f"the Multi-agent page reads the first {shard_documents} documents of "
                                            "1,024 tokens in shards"))
            else:
                views.append(AppView("10_multi_agent", **base, options={
                    "pg.agents.sharded": True, "pg.agents.shards": int(shard_counts[0]), "pg.agents.doc": k}))
    return views


def _dataset_views(run: EvalRun, table: pd.DataFrame, base: dict, examples_per_dataset: int) -> list[AppView]:
    """The sidebar's dataset example of each row of an `evaluate` run (its place among the examples offered)."""
    offered = {}
    for name in run.settings.get("datasets", []):
        if name in BUILTIN_DATASETS:
            try:
                for index, e in enumerate(load_dataset(name, n=examples_per_dataset, seed=0)):
                    offered[(e.dataset, e.id)] = (name, index)
            except (MotVizError, OSError, ValueError):
                continue
    views = []
    for r in table.itertuples():
        found = offered.get((r.dataset, r.id))
        if found is None:
            views.append(AppView(reason=f"the sidebar offers the first {examples_per_dataset} examples of each "
                                        "built-in dataset; this is not one of them"))
        else:
            views.append(AppView("1_answers", **base, dataset=found[0], example=found[1]))
    return views


