"""The other ways of sharing a context (relay, relay_q, direct, kvcomm) in the long-context, conversation and shard
evaluations: each runs, the relay's target reads only the message, each survives --resume, and bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from mot_viz.engine.channels import terminal_channels
from mot_viz.engine.checkpoint import save_checkpoint
from mot_viz.engine.models import kv_cache_bytes
from mot_viz.engine.mot import MoT
from mot_viz.engine.testing import load_test_model, tiny_model
from mot_viz.errors import ConfigError
from mot_viz.eval import long_context
from mot_viz.eval.long_context import LongSettings
from mot_viz.eval.relay import read_message
from mot_viz.train.quickfit import QuickFitConfig, fit_pair

DIRECT = QuickFitConfig(tokens=256, min_context_tokens=16, max_context_tokens=48, direct=True)


def load(name: str):
    """The models of the test pair: a 6-layer tiny Llama source (a direct map needs a source layer per target layer)
    and the tiny Gemma 3 target."""
    return tiny_model("llama", 300, 6, 0, max_positions=4096, name=name) if name == "source6" \
        else load_test_model(name)


def random_checkpoint(source, target, path: Path, **kwargs) -> Path:
    torch.manual_seed(7)
    mot = MoT.build(source.spec, target.spec, terminal_channels(source.spec.num_layers, target.spec.num_layers, 0.5),
                    dim=32, heads=4, output_activation="none", **kwargs)
    return save_checkpoint(mot, path, metrics={"note": "randomly initialised test checkpoint"})


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A MoT of the test pair, its direct map and its linear window, and a MoT between two copies of the source
    (kvcomm's pair)."""
    root = tmp_path_factory.mktemp("checkpoints")
    source, target = load("source6"), load("gemma3-270m")
    paths = {"mot": random_checkpoint(source, target, root / "mot", variant="mot", num_experts=4, top_k=2),
             "same": random_checkpoint(source, source, root / "same", variant="single"),
             "linear": random_checkpoint(source, target, root / "linear", variant="linear")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOT_VIZ_CACHE", str(root / "cache"))
        paths["direct"] = fit_pair(source, target, DIRECT)
    return paths


def long_settings(checkpoints, **kw) -> LongSettings:
    base = dict(checkpoint=str(checkpoints["mot"]), linear=None, source="stacks", budgets=(300,), n=1,
                seed=0, max_new_tokens=3, bootstrap=20,
                conditions=("native", "no_context", "mot", "relay", "relay_q", "direct"), relay_tokens=5,
                direct=str(checkpoints["direct"]))
    return LongSettings(**{**base, **kw})


def test_long_context_answers_under_every_way_of_sharing_and_resumes(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(long_context, "load_model", load)
    out = tmp_path / "long"
    summary = long_context.run(long_settings(checkpoints), out, progress=False)
    rows = pd.read_csv(out / "examples.csv", dtype={"message": str}, keep_default_na=False, na_values=[""])
    assert list(rows["condition"]) == ["native", "no_context", "mot", "relay", "relay_q", "direct"]
    row = rows.set_index("condition")
    target = load_test_model("gemma3-270m")
    n = int(row.loc["mot", "context_tokens"])
    for relay in ("relay", "relay_q"):  # the message's columns, as evaluate's rows hold them
        r = row.loc[relay]
        assert 0 < r["message_tokens"] <= 5 and r["message_bytes"] == len(str(r["message"]).encode())
        assert r["handed_bytes"] == r["message_bytes"] and r["target_work"] == "prefill"
        assert r["target_side_seconds"] == pytest.approx(r["message_generate_seconds"] + r["message_prefill_seconds"])
        # the target computed over the message only: its prompt with the message in the document's place
        kv, _ = read_message(target, long_context.long_examples("stacks", target.tokenizer, 300, 1, 0)[0].example,
                             str(r["message"]))
        assert r["target_tokens"] == kv[0][0].shape[2] - len(target.prefix_ids) < n
    assert row.loc["native", "handed_bytes"] == kv_cache_bytes(target.spec, n)
    assert row.loc["mot", "target_work"] == "replay" and row.loc["mot", "target_tokens"] == n
    assert row.loc["direct", "target_work"] == "none" and row.loc["no_context", "handed_bytes"] == 0
    # direct hands over every layer's K and V, the MoT its window's
    assert row.loc["direct", "handed_bytes"] / row.loc["mot", "handed_bytes"] == pytest.approx(
        target.spec.num_layers / 3)
    assert pd.isna(row.loc["direct", "replay"]) and row.loc["direct", "translator"] > 0
    s = summary.set_index("condition")
    assert s.loc["relay", "first_token_seconds"] == pytest.approx(  # the writing and reading counted, one document
        row.loc["relay", "target_side_seconds"] + row.loc["relay", "first_token_seconds"])
    stages = pd.read_csv(out / "stages.csv")
    assert {"relay: source writes", "relay: target reads", "relay_q: source writes",
            "direct: alignment + translator + assemble"} <= set(stages.columns)
    paired = pd.read_csv(out / "paired.csv").set_index(["a", "b"])
    assert {("mot", "relay"), ("mot", "relay_q"), ("mot", "direct")} <= set(paired.index)
    md = (out / "summary.md").read_text()
    assert "--direct" in md and "--relay_tokens 5" in md and "handed over" in md

    computed = []
    real = long_context.document_rows
    monkeypatch.setattr(long_context, "document_rows", lambda *a, **k: computed.append(a[4].example.id) or real(*a, **k))
    long_context.run(long_settings(checkpoints, n=2), out, resume=True, progress=False)
    both = pd.read_csv(out / "examples.csv", dtype={"message": str}, keep_default_na=False, na_values=[""])
    assert len(computed) == 1 and both["id"].nunique() == 2
    pd.testing.assert_frame_equal(both[both["id"].isin(rows["id"])].reset_index(drop=True), rows)
    with pytest.raises(ConfigError, match="relay_tokens differ"):
        long_context.run(long_settings(checkpoints, n=2, relay_tokens=6), out, resume=True, progress=False)


def test_long_context_kvcomm_on_a_pair_of_one_architecture(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(long_context, "load_model", load)
    out = tmp_path / "kvcomm"
    long_context.run(long_settings(checkpoints, checkpoint=str(checkpoints["same"]), direct=None,
                                   conditions=("native", "mot", "kvcomm"), kvcomm_fraction=0.5), out, progress=False)
    rows = pd.read_csv(out / "examples.csv").set_index("condition")
    meta = json.loads((out / "summary.json").read_text())
    layers = meta["settings"]["kvcomm_layers"]
    source = load("source6").spec
    assert len(layers) == 3 and rows.loc["kvcomm", "target_work"] == "none"  # half of the source's 6 layers
    assert rows.loc["kvcomm", "handed_bytes"] == rows.loc["kvcomm", "context_tokens"] * 3 * 2 * source.kv_hidden * 2


@pytest.mark.parametrize("change, message", [
    (dict(relay_tokens=0), "--relay_tokens must be at least 1"),
    (dict(direct=None), "the 'direct' condition needs --direct CHECKPOINT"),
    (dict(conditions=("native", "kvcomm"), direct=None), "The kvcomm condition"),
    (dict(conditions=("native", "direct"), direct="LINEAR"), "needs a full-depth map without replay"),
])
def test_long_context_refuses_bad_sharing_input_in_one_line(checkpoints, tmp_path, capsys, monkeypatch, change,
                                                            message):
    monkeypatch.setattr(long_context, "load_model", lambda name: pytest.fail("a model was loaded"))
    s = long_settings(checkpoints, **change)
    argv = ["--checkpoint", s.checkpoint, "--budgets", "300", "--n", "1", "--conditions", *s.conditions,
            "--relay_tokens", str(s.relay_tokens), "--out", str(tmp_path / "out")]
    direct = {"LINEAR": str(checkpoints["linear"])}.get(s.direct, s.direct)
    argv += ["--direct", direct] if direct else []
    assert long_context.main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
