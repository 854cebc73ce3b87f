"""A way of sharing defined here, outside the package, with a flag and an artifact of its own, registered, then run
through every evaluation command, the patching command and the Methods page without any other file changing: what
"a new way of sharing is one module and one registration" promises (mot_viz.sharing.registry).

The method, ``scaled``: the MoT's translated window multiplied by a factor read once per run from a JSON file
(--scaled_file), replayed as the MoT's is. At a factor of 1 its cache is the MoT's, which every check below uses: the
evaluations' rows must say so, so they must have read the flag, loaded the file and built from it.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from mot_viz.analysis.methods import method_labels
from mot_viz.engine.mot import replay_window
from mot_viz.engine.testing import load_test_model
from mot_viz.errors import ConfigError
from mot_viz.eval import conversation, evaluate, long_context, patching
from mot_viz.eval import shards as shard_eval
from mot_viz.sharing import registry
from mot_viz.sharing.method import Built, Inputs, Loading, Method, Option, Request, translated_seconds

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"id": f"e{i}", "context": text, "question": "What is it?", "answers": [text.split()[3]]}
        for i, text in enumerate(("The Eiffel Tower stands in Paris and was finished in 1889.",
                                  "The quick brown fox jumps over the lazy dog near the river."))]


class ScaledWindow(Method):
    """The MoT's translated window times a factor (its artifact, read from --scaled_file), replayed as the MoT's."""

    def check(self, request: Request) -> None:
        path = self.options[0].of(request.options)
        if self.name in request.conditions and not (path and Path(path).is_file()):
            raise ConfigError("the 'scaled' way of sharing reads its factor from a JSON file: pass --scaled_file FILE")

    def load(self, loading: Loading) -> float:
        return float(json.loads(Path(self.options[0].of(loading.options)).read_text())["factor"])

    def record(self, artifact) -> dict:
        return {"scaled_factor": artifact}

    def build(self, inputs: Inputs) -> Built:
        t = inputs.translation
        start = time.perf_counter()
        out = t.translated
        kv = replay_window(inputs.mot, inputs.target, t, out.keys * inputs.artifact, out.values * inputs.artifact)
        return Built(kv, translated_seconds(t) + time.perf_counter() - start, t.timings.get("source_prefill", 0.0))

    def by_agents(self, agents, k: int | None):
        """One reader: the one reader's window scaled, replayed."""
        t, factor = agents.one, agents.artifact(self)
        kv = replay_window(agents.mot, agents.target, t, t.translated.keys * factor, t.translated.values * factor)
        return agents.replayed(kv, self.reads_source)


SCALED_FILE = Option("scaled_file", str, None, "a JSON file holding the factor the 'scaled' window is multiplied by")
SCALED = ScaledWindow("scaled", "Scaled window (the MoT's window times a factor)", (SCALED_FILE,),
                      "its factor: pass --scaled_file FILE", records=("scaled_factor",), patchable=True,
                      one_reader=True, short="scaled window (a test's own)")


@pytest.fixture
def scaled(tmp_path):
    """SCALED registered for one test (then removed), and its factor file: 1, the MoT's own window."""
    factor = tmp_path / "factor.json"
    factor.write_text(json.dumps({"factor": 1.0}))
    registry.register(SCALED)
    yield factor
    registry.unregister(SCALED.name)


@pytest.fixture
def tiny(monkeypatch):
    """Every command loads the tiny test pair."""
    for module in (evaluate, long_context, conversation, shard_eval, patching):
        monkeypatch.setattr(module, "load_model", load_test_model)


def same_as_mot(rows: pd.DataFrame, column: str = "answer", key=("id",)) -> None:
    """The scaled rows answer as the MoT's do (a factor of 1: the same cache), and cost what the MoT's window costs."""
    by = rows.set_index([*key, "condition"])
    for index in rows.loc[rows["condition"] == SCALED.name, list(key)].itertuples(index=False):
        mine, mot = by.loc[(*index, SCALED.name)], by.loc[(*index, "mot")]
        assert mine[column] == mot[column]
        assert mine["handed_bytes"] == mot["handed_bytes"] > 0 and mine["target_work"] == "replay"


def test_a_way_of_sharing_with_its_own_flag_and_artifact_runs_in_every_evaluation(scaled, tiny, checkpoints, tmp_path,
                                                                                 toy_jsonl, capsys):
    checkpoint = str(checkpoints["smollm2-to-gemma3"])
    flag = ["--scaled_file", str(scaled)]
    common = ["--checkpoint", checkpoint, "--max_new_tokens", "2", "--bootstrap", "20"]

    out = tmp_path / "evaluate"
    assert evaluate.main([*common, "--datasets", str(toy_jsonl(ROWS)), "--n", "2", "--conditions", "native", "mot",
                          "scaled", *flag, "--out", str(out)]) == 0
    rows = pd.read_csv(out / "examples.csv", keep_default_na=False, na_values=[""])
    assert list(rows["condition"]) == ["native", "mot", "scaled"] * 2
    same_as_mot(rows)
    assert rows.loc[rows["condition"] == "scaled", "kv_cosine"].tolist() == pytest.approx(
        rows.loc[rows["condition"] == "mot", "kv_cosine"].tolist(), rel=1e-6)
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert settings["scaled_file"] == str(scaled) and settings["scaled_factor"] == 1.0  # its option and its record
    assert f"--scaled_file {scaled}" in (out / "summary.md").read_text()  # the command that runs it again

    out = tmp_path / "long"
    assert long_context.main([*common, "--budgets", "300", "--n", "1", "--conditions", "native", "mot", "scaled",
                              *flag, "--out", str(out)]) == 0
    same_as_mot(pd.read_csv(out / "examples.csv", keep_default_na=False, na_values=[""]))

    out = tmp_path / "conversation"
    assert conversation.main([*common, "--n", "1", "--turns", "2", "--max_story_tokens", "3000", "--conditions",
                              "scaled", *flag, "--out", str(out)]) == 0
    same_as_mot(pd.read_csv(out / "examples.csv", keep_default_na=False, na_values=[""]), key=("id", "turn"))

    out = tmp_path / "shards"
    assert shard_eval.main([*common, "--budget", "400", "--shards", "2", "--n", "1", "--conditions", "scaled", *flag,
                            "--out", str(out)]) == 0
    rows = pd.read_csv(out / "examples.csv", keep_default_na=False, na_values=[""])
    assert list(rows["condition"]).count("scaled") == 1  # one reader: no shard count changes it
    by = rows.set_index("condition")
    assert by.loc["scaled", "answer"] == by.loc["whole", "answer"]  # the one reader's MoT cache, scaled by 1

    capsys.readouterr()
    assert patching.main([str(tmp_path / "evaluate"), "--methods", "mot", "scaled", *flag]) == 0
    scans = pd.read_csv(tmp_path / "evaluate" / patching.PATCHING_FILE, dtype={"id": str})
    mot, mine = (scans[scans["method"] == m].drop(columns="method").reset_index(drop=True) for m in ("mot", "scaled"))
    pd.testing.assert_frame_equal(mine, mot, rtol=1e-6)  # the same cache patched, layer by layer


def test_its_flag_is_refused_where_it_is_not_asked_and_its_check_runs_before_any_model(scaled, tmp_path, checkpoints,
                                                                                      toy_jsonl, monkeypatch, capsys):
    monkeypatch.setattr(evaluate, "load_model", lambda name: pytest.fail("a model was loaded"))
    base = ["--checkpoint", str(checkpoints["smollm2-to-gemma3"]), "--datasets", str(toy_jsonl(ROWS)), "--n", "1"]
    for argv, said in ((["--scaled_file", str(scaled), "--out", str(tmp_path / "a")],
                        f"--scaled_file {scaled} is read by scaled, which this run does not answer under: add scaled "
                        "to --conditions"),
                       (["--conditions", "native", "scaled", "--out", str(tmp_path / "b")],
                        "reads its factor from a JSON file: pass --scaled_file FILE")):
        assert evaluate.main([*base, *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ConfigError: ") and said in err[0], err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    with pytest.raises(ConfigError, match="registered already"):
        registry.register(SCALED)


def offered_with(finder) -> Method:
    """The way registered again with its option's own finder for the app (Option.find), which finds its file."""
    registry.unregister(SCALED.name)
    option = replace(SCALED_FILE, find=finder, what="factor file",
                     missing="no factor file for this pair (write one beside the checkpoint)")
    way = ScaledWindow(SCALED.name, SCALED.label, (option,), SCALED.loads, records=SCALED.records, patchable=True,
                       one_reader=True, short=SCALED.short)
    registry.register(way)
    return way


def methods_page() -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.run()
    at.switch_page("views/12_methods.py").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    return at


def test_the_methods_page_finds_its_artifact_and_shows_it_beside_the_others(scaled, pages_env):
    found = []
    offered_with(lambda offering: found.append(offering) or str(scaled))
    at = methods_page()
    assert found and found[0].checkpoint == at.session_state["applied"].checkpoint  # asked with the app's checkpoint
    answers = at.dataframe[0].value.set_index("method")
    assert SCALED.short in answers.index
    mot = method_labels()["mot"]
    assert answers.loc[SCALED.short, "answer"] == answers.loc[mot, "answer"]  # a factor of 1: the MoT's cache
    sizes = at.dataframe[1].value.set_index("method")
    assert sizes.loc[SCALED.short, "bytes"] == sizes.loc[mot, "bytes"]


def test_the_methods_page_says_why_it_is_not_offered_where_nothing_is_found(scaled, pages_env):
    offered_with(lambda offering: None)
    at = methods_page()
    assert SCALED.short not in at.dataframe[0].value["method"].tolist()
    assert any(f"**{SCALED.short}** is not offered: no factor file for this pair" in c.value.replace("\\", "")
               for c in at.caption)
