"""The Evaluations page's layer patching section, driven by AppTest on the shipped mid SQuAD folder's patching.csv:
its bars and bands are mot_viz.analysis.patching's over the examples the folder's lost-answer filter names."""

from __future__ import annotations

import pandas as pd
from streamlit.testing.v1 import AppTest

from mot_viz.analysis import eval_runs
from mot_viz.analysis import patching as patching_analysis
from mot_viz.eval.patching import PATCHING_FILE, read_patching
from plotly_figures import figures
from test_evaluations_page import MID, PAGE, ROOT, frame, test_env  # noqa: F401  (the page's environment)
from tolerance import assert_close


def _bars(at: AppTest, method: str) -> dict:
    return next(f for f in figures(at) if f["layout"].get("title", {}).get("text", "").startswith(f"{method}: "))


def _expected_bars(at: AppTest, patching: pd.DataFrame, method: str, ids: list[str]) -> None:
    run = eval_runs.open_run(ROOT / MID)
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
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.run()
    assert not at.exception and not at.error
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
