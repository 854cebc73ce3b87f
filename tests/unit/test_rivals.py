"""The other ways of sharing trained here (method.md §15: C2C's projection path, LSC's shared latent space,
Interlat's latent hand-off): each trains with one command (resumable, the same weights either way), is refused with
a wrong pair before any model loads, and answers in every evaluation from its exported checkpoint, with its own
costs; on the tiny random pair."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from mot_viz.engine.mot import translate
from mot_viz.engine.testing import load_test_model
from mot_viz.errors import ConfigError
from mot_viz.eval import conversation, evaluate, long_context, patching
from mot_viz.eval import shards as shard_eval
from mot_viz.sharing import registry
from mot_viz.sharing.method import Inputs
from mot_viz.sharing.trained import shipped_beside
from mot_viz.train.rival_checkpoint import load_trained
from mot_viz.train import rival
from rival_networks import RIVALS, tiny_config, trained_networks

ROWS = [{"id": f"e{i}", "context": text, "question": "What is it?", "answers": [text.split()[3]]}
        for i, text in enumerate(("The Eiffel Tower stands in Paris and was finished in 1889.",
                                  "The quick brown fox jumps over the lazy dog near the river."))]


@pytest.fixture(scope="module")
def pair():
    return load_test_model("smollm2-135m"), load_test_model("gemma3-270m")


@pytest.fixture(scope="module")
def trained(pair, checkpoints, tmp_path_factory):
    """Each rival trained for two steps and exported beside the tiny MoT checkpoint, as pretrained/ ships them."""
    return trained_networks(*pair, tmp_path_factory.mktemp("rivals"), checkpoints["smollm2-to-gemma3"].parent,
                            "smollm2-to-gemma3")


def test_each_trains_resumably_and_records_its_held_out_score(pair, tmp_path):
    """A run stopped after two of four steps and resumed gives the weights four steps in one run give (interlat's
    dropout, the fuser's gate noise and the shuffled rows are seeded by the step), and a finished run scores held-out
    rows against native and no context."""
    for method in RIVALS:
        whole = rival.train(tiny_config(method, tmp_path / f"{method}-whole", steps=4), models=pair, progress=False)
        rival.train(tiny_config(method, tmp_path / f"{method}-split", steps=4), models=pair, progress=False, until=2)
        assert not (tmp_path / f"{method}-split" / "log.jsonl").read_text().count('"step": 3')
        rival.train(tiny_config(method, tmp_path / f"{method}-split", steps=4), resume=True, models=pair,
                    progress=False)
        a = load_trained(whole / "checkpoint").net.state_dict()
        b = load_trained(tmp_path / f"{method}-split" / "checkpoint").net.state_dict()
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=0, msg=f"{method} {name}")
        held = json.loads((whole / "checkpoint" / "config.json").read_text())["metrics"]["held_out"]
        assert held["rows"] == 2 and held["ce"] > 0 and held["native_ce"] > 0 and held["no_context_ce"] > 0
        steps = [json.loads(line)["step"] for line in (whole / "log.jsonl").read_text().splitlines()]
        assert steps == [1, 2, 3, 4]


def test_the_command_stops_where_asked_and_resumes_to_a_shorter_plan(tmp_path, monkeypatch):
    """`--stop_after` saves and stops as Ctrl-C would; `--resume --max_steps` continues with the run's own settings."""
    monkeypatch.setattr(rival, "load_model", load_test_model)
    flags = ["--method", "lsc", "--output_dir", str(tmp_path / "run"), "--batch_size", "1", "--corpus", "lambada",
             "--corpus_tokens", "1500", "--min_context", "8", "--max_context", "24", "--held_out", "2"]
    assert rival.main([*flags, "--max_steps", "6", "--stop_after", "2"]) == 0
    state = json.loads((tmp_path / "run" / "checkpoint" / "train_state.json").read_text())
    assert state["step"] == 2 and "held_out" not in json.loads((tmp_path / "run" / "checkpoint" / "config.json")
                                                              .read_text())["metrics"]
    export = tmp_path / "shipped"
    assert rival.main(["--output_dir", str(tmp_path / "run"), "--resume", "--max_steps", "3", "--export",
                       str(export)]) == 0
    config = json.loads((export / "config.json").read_text())
    assert config["training"]["steps_done"] == 3 and config["training"]["max_steps"] == 3
    assert config["training"]["min_context"] == 8 and config["metrics"]["held_out"]["rows"] == 2


def test_a_run_is_never_replaced_silently_and_resumes_with_its_own_settings(pair, tmp_path):
    rival.train(tiny_config("c2c-pr", tmp_path / "run", steps=1), models=pair, progress=False)
    with pytest.raises(ConfigError, match="already holds a training run"):
        rival.train(tiny_config("c2c-pr", tmp_path / "run", steps=1), models=pair, progress=False)
    with pytest.raises(ConfigError, match="other settings"):
        rival.train(tiny_config("c2c-pr", tmp_path / "run", steps=1, learning_rate=1e-3), resume=True, models=pair,
                    progress=False)
    with pytest.raises(ConfigError, match="no architecture setting width"):
        rival.RivalConfig(method="lsc", architecture={"width": 3})


def test_each_builds_the_cache_its_recipe_says(pair, trained, checkpoints):
    """c2c-pr and lsc: a cache of every target layer at the target's positions, with no target prefill; interlat: the
    target's forward over one latent per source token, behind its BOS."""
    source, target = pair
    from mot_viz.engine.checkpoint import load_checkpoint
    mot = load_checkpoint(checkpoints["smollm2-to-gemma3"], source, target)[0]
    t = translate(mot, source, target, ROWS[0]["context"])
    native_len = t.native_kv[0][0].shape[2]
    for method in RIVALS:
        way = registry.method(method)
        ckpt = load_trained(trained[method], source.spec, target.spec, method)
        built = way.build(Inputs(mot, source, target, t, options={}, artifact=ckpt))
        assert len(built.kv) == target.spec.num_layers and torch.isfinite(built.kv[-1][0]).all()
        if method == "interlat":
            assert built.kv[0][0].shape[2] == 1 + t.source.source_ids.shape[1]  # BOS + one latent per source token
            assert way.target_work(built, 99) == ("prefill", t.source.source_ids.shape[1])
            assert way.carries(mot, ckpt) is None and not way.comparable
        else:
            assert built.kv[0][0].shape[2] == native_len
            every = tuple(range(target.spec.num_layers))
            assert way.carries(mot, ckpt) == (every if method == "lsc" else every[2:]) and way.patchable
        assert way.handed_bytes(built, 10, target.spec, 3, source.spec) > 0 and built.seconds >= built.ahead > 0
        if method == "lsc":
            assert way.target_work(built, 99) == ("none", 0)
        if method == "c2c":  # the target's own prefill, its top 4 layers enriched by the gated residual
            assert way.target_work(built, 99) == ("prefill", t.target_ids.shape[1])
            torch.testing.assert_close(built.kv[1][0], t.native_kv[1][0], rtol=1e-5, atol=0)
            gates = (ckpt.net.gate_logits > 0).tolist()
            for i, layer in enumerate(ckpt.net.target_layers):  # a closed gate leaves the layer native
                assert torch.equal(built.kv[layer][1], t.native_kv[layer][1]) != gates[i]
        if method == "c2c-pr":  # 4 source layers, 6 target layers: the top 4 projected, the bottom 2 the target's own
            assert ckpt.net.target_layers == (2, 3, 4, 5) and ckpt.net.source_layers == (0, 1, 2, 3)
            assert way.target_work(built, 99) == ("prefill", t.target_ids.shape[1])
            for layer in (0, 1):
                torch.testing.assert_close(built.kv[layer][0], t.native_kv[layer][0], rtol=1e-5, atol=0)
            assert not torch.allclose(built.kv[2][0], t.native_kv[2][0])


def test_a_projection_path_onto_a_shallower_target_replaces_its_every_layer_and_runs_no_prefill(pair):
    from mot_viz.train.c2c import ProjectionPath, projected_cache
    from mot_viz.engine.mot import prepare_source, target_context_ids
    deep, shallow = pair[1], pair[0]  # 6 layers -> 4 layers: N = L_T
    net = ProjectionPath(deep.spec, shallow.spec, {"dim": 16, "depth": 2, "mlp_ratio": 2, "key_space": "pre_rope"})
    assert net.target_layers == (0, 1, 2, 3) and net.source_layers == (2, 3, 4, 5)  # the last aligned to the last
    src = prepare_source(None, deep, shallow, target_context_ids(shallow, ROWS[1]["context"]), with_attention=False)
    kv = projected_cache(net, src, deep, shallow, native=[])  # a native cache is never read
    assert len(kv) == 4 and kv[0][0].shape[2] == len(shallow.prefix_ids) + src.target_ids.shape[1]


def test_the_shipped_network_is_found_beside_the_checkpoint_and_a_wrong_one_refused(trained, checkpoints, tmp_path,
                                                                                     toy_jsonl, monkeypatch, capsys):
    checkpoint = str(checkpoints["smollm2-to-gemma3"])
    for method in RIVALS:
        assert Path(shipped_beside(method)(checkpoint)).name == f"smollm2-to-gemma3-{method}"
    assert shipped_beside("lsc")(str(checkpoints["gemma3-to-smollm2"])) is None  # another pair's is not taken
    monkeypatch.setattr(evaluate, "load_model", lambda name: pytest.fail("a model was loaded"))
    base = ["--checkpoint", checkpoint, "--datasets", str(toy_jsonl(ROWS)), "--n", "1", "--out", str(tmp_path / "o")]
    for argv, said in ((["--conditions", "native", "lsc", "--lsc", str(trained["c2c-pr"])], "holds a c2c-pr network"),
                       (["--conditions", "native", "lsc", "--lsc", checkpoint], "is not a trained way of sharing"),
                       (["--lsc", str(trained["lsc"])], "--lsc " + str(trained["lsc"]) + " is read by lsc")):
        assert evaluate.main([*base, *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
    gemma = ["--checkpoint", str(checkpoints["gemma3-to-smollm2"]), *base[2:]]
    assert evaluate.main([*gemma, "--conditions", "native", "lsc", "--lsc", str(trained["lsc"])]) == 2
    assert "another model pair" in capsys.readouterr().err


def test_each_answers_in_every_evaluation_from_its_checkpoint(trained, checkpoints, tmp_path, toy_jsonl, monkeypatch):
    for module in (evaluate, long_context, conversation, shard_eval, patching):
        monkeypatch.setattr(module, "load_model", load_test_model)
    common = ["--checkpoint", str(checkpoints["smollm2-to-gemma3"]), "--max_new_tokens", "2", "--bootstrap", "20"]

    out = tmp_path / "evaluate"  # the shipped networks are found beside --checkpoint: no flag needed
    assert evaluate.main([*common, "--datasets", str(toy_jsonl(ROWS)), "--n", "2", "--conditions", "native", "mot",
                          *RIVALS, "--out", str(out)]) == 0
    rows = pd.read_csv(out / "examples.csv", keep_default_na=False, na_values=[""])
    assert list(rows["condition"]) == ["native", "mot", *RIVALS] * 2
    by = rows.set_index("condition")
    assert (by.loc["interlat", "target_work"] == "prefill").all()
    assert (by.loc["c2c-pr", "target_work"] == "prefill").all()  # the tiny target is deeper than its source
    assert (by.loc["c2c", "target_work"] == "prefill").all()
    assert (by.loc["lsc", "target_work"] == "none").all()
    assert (rows["handed_bytes"] > 0).all()
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert settings["lsc"] == str(trained["lsc"])  # the network a run read is recorded (and rerun by its command)
    assert f"--lsc {trained['lsc']}" in (out / "summary.md").read_text()
    paired = pd.read_csv(out / "paired.csv")
    assert {("mot", m) for m in RIVALS} <= set(zip(paired["a"], paired["b"]))  # each against the MoT

    out = tmp_path / "long"
    assert long_context.main([*common, "--budgets", "300", "--n", "1", "--conditions", "native", *RIVALS,
                              "--out", str(out)]) == 0
    assert set(RIVALS) <= set(pd.read_csv(out / "examples.csv")["condition"])

    out = tmp_path / "conversation"
    assert conversation.main([*common, "--n", "1", "--turns", "2", "--max_story_tokens", "3000", "--conditions",
                              *RIVALS, "--out", str(out)]) == 0
    assert set(RIVALS) <= set(pd.read_csv(out / "examples.csv")["condition"])

    out = tmp_path / "shards"
    assert shard_eval.main([*common, "--budget", "400", "--shards", "2", "--n", "1", "--conditions", *RIVALS,
                            "--out", str(out)]) == 0
    counts = pd.read_csv(out / "examples.csv")["condition"].value_counts()
    assert all(counts[m] == 1 for m in RIVALS)  # one reader each

    assert patching.main([str(tmp_path / "evaluate"), "--methods", "mot", "c2c-pr", "lsc"]) == 0
    scans = pd.read_csv(tmp_path / "evaluate" / patching.PATCHING_FILE, dtype={"id": str})
    assert {"c2c-pr", "lsc"} <= set(scans["method"])


def test_the_methods_page_offers_each_with_its_shipped_network_and_the_sidebar_lists_none(trained, pages_env):
    """The networks shipped beside the MoT checkpoints are offered on the Methods page, each answering from its own
    cache (the library's answer on the same context), and are not MoT checkpoints the sidebar could pick."""
    from streamlit.testing.v1 import AppTest

    from mot_viz.analysis.methods import method_labels
    from mot_viz.app.loaders import available_checkpoints

    assert not {f"smollm2-to-gemma3-{m}" for m in RIVALS} & set(available_checkpoints())
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"), default_timeout=300)
    at.run()
    at.switch_page("views/12_methods.py").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    answers = at.dataframe[0].value.set_index("method")
    sizes = at.dataframe[1].value.set_index("method")
    for method in RIVALS:
        short = registry.method(method).short
        assert short in answers.index and sizes.loc[short, "bytes"] > 0
    captions = " ".join(c.value for c in at.caption)
    assert not any(f"**{method_labels()[m]}** is not offered" in captions for m in RIVALS)
