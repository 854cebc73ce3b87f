"""The Evaluations page's layer patching section, driven by AppTest on the shipped mid SQuAD folder's patching.csv:
its bars and bands are mot_viz.analysis.patching's over the examples the folder's lost-answer filter names."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app_helpers import open_view
from mot_viz.analysis import eval_runs
from mot_viz.analysis import patching as patching_analysis
from mot_viz.eval.patching import PATCHING_FILE, read_patching
from plotly_figures import figures
from test_evaluations_page import MID, OTHER, PAGE, ROOT, frame
from tolerance import assert_close

pytestmark = pytest.mark.usefixtures("shipped_env")  # the shipped results, with the checkpoints they name


def _bars(at: AppTest, method: str) -> dict:
    return next(f for f in figures(at) if f["layout"].get("title", {}).get("text", "").startswith(f"{method}: "))


def _expected_bars(at: AppTest, patching: pd.DataFrame, method: str, ids: list[str],
                   run: eval_runs.EvalRun | None = None) -> None:
    run = run or eval_runs.open_run(ROOT / MID)
    expected = patching_analysis.gap_shares(patching, method, ids, n_boot=run.settings["bootstrap"],
                                            seed=run.settings["seed"])
    layers = expected[expected["target"].str.startswith("layer ")].copy()
    layers["layer"] = layers["target"].str.split().str[1].astype(int)
    layers = layers.sort_values("layer")
    bars = _bars(at, method)
    assert bars["layout"]["title"]["text"].startswith(f"{method}: {len(ids)} ")
    assert_close(list(bars["data"][0]["y"]), layers["share"].to_numpy(float), rtol=1e-9)
    assert_close(list(bars["data"][0]["error_y"]["array"]), (layers["high"] - layers["share"]).to_numpy(float),
                 rtol=1e-9)


def test_restoration_shares_of_lost_answers_and_of_every_example_match_the_library():
    at = open_view(PAGE)
    assert not at.error
    patching = read_patching(ROOT / MID / PATCHING_FILE)
    assert list(dict.fromkeys(patching["method"])) == ["mot", "direct"]
    table = frame(at, "table")
    # MoT answered in the evaluation: its lost answers are the page's filter's (native right, MoT wrong)
    right = pd.to_numeric(table["native score"]) >= eval_runs.RIGHT
    wrong = pd.to_numeric(table["mot score"]) < eval_runs.RIGHT
    lost = patching_analysis.lost_examples(patching, table, "mot")
    assert set(lost) == set(table.loc[right & wrong, "id"]) & set(patching["id"])
    at.radio(key="pg.evals.patch_over").set_value("all").run()
    assert not at.exception and not at.error
    _expected_bars(at, patching, "mot", sorted(set(patching["id"])))
    # the direct map did not answer in the evaluation: its lost answers are native's right ones it makes less likely
    at.radio(key="pg.evals.patch_method").set_value("direct").run()
    at.radio(key="pg.evals.patch_over").set_value("lost").run()
    assert not at.exception and not at.error
    lost = patching_analysis.lost_examples(patching, table, "direct")
    assert lost and set(lost) <= set(table.loc[right, "id"])
    _expected_bars(at, patching, "direct", lost)
    assert at.query_params.get("evals.patch_method") == "direct"


LONG = "results/long/smollm2-to-gemma3-mid-stacks"  # its patching.csv: the 1,024-token documents (--budget 1024)


def test_a_long_context_folders_patching_is_drawn_per_budget(tmp_path):
    # a copy of the shipped folder: a background run may still be adding documents to its patching.csv, and the
    # page and this test must read the same rows
    folder = tmp_path / Path(LONG).name
    shutil.copytree(ROOT / LONG, folder)
    at = open_view(PAGE)
    at.selectbox(key="pg.evals.folder").set_value(OTHER).run()
    at.text_input(key="pg.evals.path").input(str(folder)).run()
    assert not at.exception and not at.error
    patching = read_patching(folder / PATCHING_FILE)
    run = eval_runs.open_run(folder)
    assert patching_analysis.scanned_groups(patching, run.rows) == ["stacks 1024 tokens"]
    assert at.radio(key="pg.evals.patch_budget").options == ["stacks 1024 tokens"]
    table = frame(at, "table")
    at.radio(key="pg.evals.patch_over").set_value("all").run()
    assert not at.exception and not at.error
    ids = sorted(set(patching.loc[patching["method"] == "mot", "id"])
                 & set(table.loc[table["group"] == "stacks 1024 tokens", "id"].astype(str)))
    assert ids and all("-1024-" in i for i in ids)
    _expected_bars(at, patching, "mot", ids, run)
    assert f"of {len(ids)} scanned (stacks 1024 tokens)" in _bars(at, "mot")["layout"]["title"]["text"]
    # the direct map never answered in the long-context run: its lost documents are native's right ones it makes
    # less likely (none of another budget)
    at.radio(key="pg.evals.patch_method").set_value("direct").run()
    at.radio(key="pg.evals.patch_over").set_value("lost").run()
    assert not at.exception and not at.error
    lost = patching_analysis.lost_examples(patching, table[table["group"] == "stacks 1024 tokens"], "direct")
    if lost:
        _expected_bars(at, patching, "direct", lost, run)
    else:
        assert any("was lost by direct" in c.value for c in at.caption)
    assert at.query_params.get("evals.patch_method") == "direct"


def test_a_folder_without_a_scan_names_the_command_and_one_the_command_cannot_scan_says_which_it_can():
    at = open_view(PAGE)
    folder = "results/eval/smollm2-to-smollm2-squad300"  # an evaluation's folder without patching.csv
    at.selectbox(key="pg.evals.folder").set_value(folder).run()
    assert not at.exception and not at.error
    command = patching_analysis.command(eval_runs.open_run(ROOT / folder))
    assert command.startswith(f"python -m mot_viz.eval.patching {ROOT / folder} --n ")
    assert any(c.value.endswith(f"Record it (no answer is regenerated) with `{command}`.") for c in at.caption)
    at.selectbox(key="pg.evals.folder").set_value("results/conversation/smollm2-to-gemma3-mid-coqa").run()
    assert not at.exception and not at.error
    assert any(c.value.startswith("`python -m mot_viz.eval.patching` scans the folders of `evaluate` and "
                                  "`long_context`") and c.value.endswith("this one is of `conversation`.")
               for c in at.caption)
    assert not any("patch_method" in str(w.key) for w in at.radio)
