"""Every registered way of sharing a context (mot_viz.sharing.registry) through every evaluation kind, on tiny models:
a method the evaluation offers writes its rows with costs that hold together; one it does not offer is refused in one
line before any model loads. Parametrized over the registry, so a method is tested everywhere the day it is added."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from mot_viz.engine.checkpoint import read_config
from mot_viz.engine.models import kv_cache_bytes
from mot_viz.errors import ConfigError, MotVizError
from mot_viz.eval import conversation, evaluate, long_context
from mot_viz.eval import shards as shard_eval
from mot_viz.eval.conversation import ConversationSettings
from mot_viz.eval.long_settings import LongSettings
from mot_viz.eval.qa_settings import EvalSettings
from mot_viz.eval.policy import ALWAYS
from mot_viz.eval.shards import ShardSettings
from mot_viz.sharing import registry
from mot_viz.sharing.method import Method, Request, layers_bytes
from mot_viz.sharing.native import NATIVE
from mot_viz.sharing.no_context import NO_CONTEXT
from mot_viz.sharing.trained import TrainedWay
from run_settings import settings_of
from test_conditions_everywhere import checkpoints, load  # noqa: F401  (checkpoints: a module fixture)

MODULES = {"evaluate": evaluate, "long_context": long_context, "conversation": conversation, "shards": shard_eval}
CASES = [(name, kind) for name in registry.REGISTRY for kind in registry.KINDS]


def asked(m: Method, kind: str) -> tuple[str, ...]:
    """The conditions of a run that asks for `m`, in the registry's order: the evaluation's own and `m` (the shards'
    settings: those on request only, ALWAYS["shards"] being every run's)."""
    if kind == "shards":
        return registry.names(among={m.name} - set(ALWAYS[kind]))
    return registry.names(among={*ALWAYS[kind], m.name})


def options_for(m: Method, paths) -> dict:
    """The options a run asking for `m` gives (those `m` reads): the test pair's maps and trained networks, a
    5-token message."""
    given = {"direct": str(paths["direct"]), "linear": str(paths["linear"]), "relay_tokens": 5,
             **{way.option.name: str(paths[name]) for name, way in registry.REGISTRY.items()
                if isinstance(way, TrainedWay)}}
    return {o.name: given.get(o.name) for o in m.options}


def pair_for(m: Method, paths) -> str:
    """The checkpoint of the pair a run asking for `m` evaluates: the test pair's MoT, or a MoT between two copies of
    the source where `m`'s own checks refuse the test pair (kvcomm shares K/V as they are)."""
    try:
        m.check(Request((m.name,), read_config(paths["mot"]), str(paths["mot"]), 300, options_for(m, paths)))
    except MotVizError:
        return str(paths["same"])
    return str(paths["mot"])


def settings_for(m: Method, kind: str, paths, data):
    """The settings of a tiny run of `kind` asking for `m` (a same-shape pair when it shares the source's K/V)."""
    checkpoint, conditions, options = pair_for(m, paths), asked(m, kind), options_for(m, paths)
    if kind == "evaluate":
        return settings_of(EvalSettings, checkpoint=checkpoint, second=None, datasets=(str(data),), n=1, seed=0,
                           max_new_tokens=3, max_context_tokens=64, bootstrap=20, conditions=conditions, **options)
    if kind == "long_context":
        return settings_of(LongSettings, checkpoint=checkpoint, source="stacks", budgets=(300,), n=1, seed=0,
                           max_new_tokens=3, bootstrap=20, conditions=conditions, **options)
    if kind == "conversation":
        return settings_of(ConversationSettings, checkpoint=checkpoint, n=1, turns=2, seed=0, max_new_tokens=3,
                           max_story_tokens=3000, bootstrap=20, conditions=conditions, **options)
    return settings_of(ShardSettings, checkpoint=checkpoint, budget=400, shards=(2,), n=1, seed=0, max_new_tokens=3,
                       bootstrap=20, sharing=conditions, **options)


def run(kind: str, settings, out) -> pd.DataFrame:
    MODULES[kind].run(settings, out, progress=False)
    return pd.read_csv(out / "examples.csv", dtype={"message": str}, keep_default_na=False, na_values=[""])


def refused(kind: str, settings) -> None:
    """The evaluation's checks (before any model loads) refuse `settings` in one line."""
    with pytest.raises(ConfigError) as err:
        MODULES[kind].check_settings(settings)
    assert "\n" not in str(err.value)


def offered(m: Method, kind: str) -> bool:
    """Whether `kind` answers under `m`: it is among its choices or every run's, and, in a conversation, it does not
    write for one question."""
    return (m.name in registry.choices(kind) or m.name in ALWAYS[kind]) and \
        not (kind == "conversation" and m.for_question)


def check_costs(m: Method, rows: pd.DataFrame, tokens: pd.Series, target) -> None:
    """The cost columns of `m`'s rows hold together with what it shares (sharing.costs)."""
    for i, r in rows.iterrows():
        n, work, work_tokens, handed = int(tokens[i]), r["target_work"], int(r["target_tokens"]), r["handed_bytes"]
        assert work in ("replay", "prefill", "none") and handed >= 0
        assert (work == "none") == (work_tokens == 0) and (work != "replay" or work_tokens == n)
        side = r["target_side_seconds"]
        assert math.isnan(side) or side >= 0
        if m.message:  # the message is what is handed over; the target prefills it; the writing counts when it
            # needs the question (the slowest agent's, when several write in parallel)
            assert handed == r["message_bytes"] == len(str(r["message"]).encode("utf-8")) and work == "prefill"
            assert r["message_looped"] in (0, 1)  # every evaluation's table marks a message that looped
            writing = r.get("message_generate_max_seconds", math.nan)
            writing = r["message_generate_seconds"] if pd.isna(writing) else writing
            assert side == pytest.approx(r["message_prefill_seconds"] + (writing if m.for_question else 0.0),
                                         rel=1e-9)
            continue
        assert pd.isna(r["message"]) and pd.isna(r["message_bytes"]) and pd.isna(r["message_looped"])
        if m is NATIVE:
            assert handed == kv_cache_bytes(target.spec, n) and work == "prefill" and work_tokens == n
            assert side == r.get("native_prefill", side)  # a row with the stage's column: that stage
        elif m is NO_CONTEXT:
            assert handed == 0 and work == "none" and side == 0
        elif isinstance(m, TrainedWay):  # what its network reads of the source: K/V of whole layers, or hidden states
            assert handed > 0 and (work == "none") == (work_tokens == 0) and side > 0
        else:  # a cache: whole layers of K and V at every context position, fp16
            layers = handed / layers_bytes(n, 1, target.spec.kv_hidden)
            assert layers == round(layers) and 1 <= layers <= target.spec.num_layers


@pytest.mark.parametrize("name,kind", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_every_method_in_every_evaluation(name, kind, checkpoints, data, tmp_path, monkeypatch):  # noqa: F811
    m = registry.REGISTRY[name]
    settings = settings_for(m, kind, checkpoints, data)
    monkeypatch.setattr(MODULES[kind], "load_model", load)
    if not offered(m, kind):
        monkeypatch.setattr(MODULES[kind], "load_model", lambda *a: pytest.fail("a model was loaded"))
        refused(kind, settings)
        return
    rows = run(kind, settings, tmp_path / kind)
    assert "skipped" not in set(rows["condition"]), rows.get("error")
    mine = rows[[registry.method(c).name == m.name for c in rows["condition"]]]
    target = load("source6" if pair_for(m, checkpoints).endswith("same") else "gemma3-270m")  # the pair's target
    if kind == "evaluate":
        assert len(mine) == 1  # one example
        r = mine.iloc[0]
        assert math.isfinite(r["kv_cosine"]) == m.comparable  # a cache of the context, compared with native's
        assert 0 <= r["ahead_seconds"] and r["seconds"] > 0
        if m.message:  # the message's columns, and its writing done ahead unless it needs the question
            assert r["message_bytes"] == len(str(r["message"]).encode("utf-8")) and 0 < r["message_tokens"] <= 5
            assert r["ahead_seconds"] == (0.0 if m.for_question else r["message_generate_seconds"])
        check_costs(m, mine, rows["context_tokens"], target)  # every evaluation writes the cost columns
        return
    if kind == "long_context":
        assert len(mine) == 1
        check_costs(m, mine, rows["context_tokens"], target)
    elif kind == "conversation":
        assert len(mine) == 2 and list(mine["turn"]) == [1, 2]  # every turn, from the cache built once
        check_costs(m, mine, rows["story_tokens"], target)
        assert mine["handed_bytes"].nunique() == 1
    else:  # one reader, and a hub composed from each shard count unless no shard count changes it
        assert len(mine) >= 1 and (rows["shards"] >= 0).all()
        check_costs(m, mine, rows["hub_tokens"] - len(target.prefix_ids), target)


def test_the_registry_names_each_method_once_with_a_label_and_an_evaluation():
    assert all(name == m.name and m.label and m.evaluations for name, m in registry.REGISTRY.items())
    assert all(registry.method(f"{name}_4").name == name for name in registry.REGISTRY)  # a shard count's setting
    assert registry.method("whole") is registry.method("shards_2") is registry.REGISTRY["mot"]
    with pytest.raises(ConfigError, match="choose from native"):
        registry.method("telepathy")
    for kind in registry.KINDS:
        assert list(registry.choices(kind)) == [c for c in registry.REGISTRY if c in registry.choices(kind)]
