"""The Evaluations page driven by AppTest on the shipped results folders: what it shows is checked against
mot_viz.analysis.eval_runs and scripts/paired_runs.py. The page loads no model, so it runs on its own (its file, no
navigation: the sidebar is drawn but nothing is translated) with the real checkpoint list, which its links name."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app_helpers import open_view, restored
from mot_viz.analysis import eval_runs, layer_separation
from mot_viz.app.settings import EXAMPLES_PER_DATASET
from mot_viz.data.eval_data import load_dataset
from tolerance import assert_close

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "views/11_evaluations.py")
MID = "results/eval/smollm2-to-gemma3-mid-squad300"
LINEAR = "results/eval/smollm2-to-gemma3-mid-linear-squad300"
NUMBERS = ["n", "mean", "ci_low", "ci_high", "retention", "retention_ci_low", "retention_ci_high"]


pytestmark = pytest.mark.usefixtures("shipped_env")  # the shipped results, with the checkpoints they name


def frame(at: AppTest, key: str) -> pd.DataFrame:
    """A table of the page, named by the columns only it has (AppTest does not give a dataframe's key); "wins a" /
    "wins b": the examples the first / second run wins (its difference positive / negative)."""
    if key.startswith("wins"):
        sign = 1 if key == "wins a" else -1
        return next(d.value for d in at.dataframe if {"diff", "question"} <= set(d.value.columns)
                    and len(d.value) and (d.value["diff"] * sign > 0).all())
    signature = {"table": {"example", "app", "question"}, "slice": {"group", "retention", "ci_low"},
                 "paired": {"a_better", "b_better"}}[key]
    return next(d.value for d in at.dataframe if signature <= set(d.value.columns))


def test_the_mid_squad_run_filtered_to_its_lost_answers_matches_the_library():
    at = open_view(PAGE)
    assert at.title[0].value == "Evaluations" and not at.error
    run = eval_runs.open_run(ROOT / MID)
    assert any(c.value == f"python -m mot_viz.eval.evaluate --checkpoint pretrained/smollm2-to-gemma3-mid --datasets "
                           f"squad --n 300 --seed 0 --conditions native mot random --max_new_tokens 24 "
                           f"--max_context_tokens 448 --out {ROOT / MID}" for c in at.code)
    whole = frame(at, "slice")
    assert_close(whole[NUMBERS].to_numpy(float), eval_runs.stated_summary(run)[NUMBERS].to_numpy(float), rtol=1e-12)

    at.checkbox(key="pg.evals.lost").check().run()
    assert not at.exception
    table = frame(at, "table")
    expected = eval_runs.select(eval_runs.wide_table(run), "mot", lost=True)
    assert table["example"].tolist() == expected["example"].tolist() and len(table) > 0
    assert_close(frame(at, "slice")[NUMBERS].to_numpy(float),
                 eval_runs.slice_summary(run, expected["example"])[NUMBERS].to_numpy(float), rtol=1e-12)
    assert at.query_params.get("evals.lost") == "true"

    # every row opens the Answers page on that example: the sidebar's dataset and its index there
    offered = [e.id for e in load_dataset("squad", n=EXAMPLES_PER_DATASET, seed=0)]
    links = table.dropna(subset=["app"])
    assert len(links) == len(table)
    for row in links.itertuples():
        assert row.app == (f"./answers?src=smollm2-135m&tgt=gemma3-270m&ckpt=smollm2-to-gemma3-mid&ds=squad"
                           f"&ex={offered.index(row.id)}")
        sidebar = restored(row.app).sidebar
        assert (sidebar.dataset, sidebar.example, sidebar.checkpoint) == ("squad", offered.index(row.id),
                                                                         "smollm2-to-gemma3-mid")

    # the button under the table opens the example chosen beside it (the first shown, then another)
    chooser = at.selectbox(key="pg.evals.open")
    assert chooser.value == table["example"].iloc[0] and len(chooser.options) == len(table)
    assert at.get("link_button")[0].proto.url == table["app"].iloc[0]
    at.selectbox(key="pg.evals.open").set_value(table["example"].iloc[-1]).run()
    assert at.get("link_button")[0].proto.url == table["app"].iloc[-1]

    at.text_input(key="pg.evals.search").input("what").run()
    searched = frame(at, "table")
    assert searched["question"].str.lower().str.contains("what").all() and len(searched) < len(table)
    assert frame(at, "slice")["n"].tolist() == [len(searched)] * 3


def test_two_runs_side_by_side_match_scripts_paired_runs():
    from scripts.paired_runs import paired_runs

    at = open_view(PAGE)
    at.selectbox(key="pg.evals.second").set_value(LINEAR).run()
    assert not at.exception and not at.error
    a, b = Path(MID).name, Path(LINEAR).name
    script = paired_runs([f"{ROOT / MID}:mot={a}", f"{ROOT / LINEAR}:mot={b}"], [f"{a}:{b}"])
    shown = frame(at, "paired")
    assert shown[["n", "a_better", "b_better"]].to_numpy().tolist() == \
        script[["n", "a_better", "b_better"]].to_numpy().tolist()
    assert_close(shown[["diff", "ci_low", "ci_high"]].to_numpy(float),
                 script[["diff", "ci_low", "ci_high"]].to_numpy(float), rtol=1e-12)
    wins = frame(at, "wins a")
    assert len(wins) == int(script["a_better"].iloc[0]) and (wins[f"score in {a}"] > wins[f"score in {b}"]).all()

    # the slice's paired difference: the same code over the examples the filters keep
    at.number_input(key="pg.evals.low").set_value(0.5).run()
    kept = frame(at, "table")
    sliced = eval_runs.compare_runs(eval_runs.open_run(ROOT / MID), eval_runs.open_run(ROOT / LINEAR),
                                    examples=kept["example"])
    shown = frame(at, "paired")
    assert int(shown["n"].iloc[0]) == len(kept) < 300
    assert_close(shown[["diff", "ci_low", "ci_high"]].to_numpy(float),
                 sliced.paired[["diff", "ci_low", "ci_high"]].to_numpy(float), rtol=1e-12)


def test_a_folder_that_is_not_a_results_folder_is_one_message(tmp_path):
    at = open_view(PAGE)
    at.selectbox(key="pg.evals.folder").set_value("other folder (type its path below)").run()
    at.text_input(key="pg.evals.path").input(str(tmp_path)).run()
    assert not at.exception
    assert len(at.error) == 1 and "not a results folder" in at.error[0].value
    at.text_input(key="pg.evals.path").input(str(tmp_path / "nowhere")).run()
    assert len(at.error) == 1 and "There is no folder" in at.error[0].value


def test_a_long_context_run_links_each_document_on_the_long_context_page():
    at = open_view(PAGE)
    at.selectbox(key="pg.evals.folder").set_value("results/long/smollm2-to-gemma3-mid-stacks").run()
    assert not at.exception and not at.error
    table = frame(at, "table")
    first = table[table["group"] == "stacks 1024 tokens"].iloc[0]
    assert first["app"] == ("./long_context?src=smollm2-135m&tgt=gemma3-270m&ckpt=smollm2-to-gemma3-mid"
                            "&long.budget=1024&long.doc=0&long.source=stacks")
    assert restored(first["app"]).page == {"pg.long.budget": 1024, "pg.long.doc": 0, "pg.long.source": "stacks"}
    assert at.radio(key="pg.evals.x").options == ["context length (target tokens)",
                                                  "evidence depth (share of the document before the evidence)"]


def shown_figure(at: AppTest, trace: str) -> list[float]:
    """The y values of one trace of the layer-separation figure, as the page sends it to the browser."""
    from plotly_figures import figures

    return next(t["y"] for f in figures(at) for t in f["data"] if t.get("name", "").startswith(trace))


def test_the_layers_that_separate_lost_answers_match_the_library():
    at = open_view(PAGE)
    run = eval_runs.open_run(ROOT / MID)
    errors = layer_separation.run_layer_errors(run)
    assert errors is not None and errors["example"].nunique() == 300
    expected = layer_separation.layer_separation(errors, frame(at, "table"), "mot", "K_rel_l2")
    text = layer_separation.separation_text(expected, "K_rel_l2")
    assert any(m.value.endswith(text) for m in at.markdown)
    assert_close(shown_figure(at, "lost − kept"), expected["diff"].to_numpy(float), rtol=1e-12)
    assert_close(shown_figure(at, "lost (n="), expected["lost_mean"].to_numpy(float), rtol=1e-12)

    at.radio(key="pg.evals.layer_metric").set_value("V_cosine").run()
    expected = layer_separation.layer_separation(errors, frame(at, "table"), "mot", "V_cosine")
    assert_close(shown_figure(at, "kept (n="), expected["kept_mean"].to_numpy(float), rtol=1e-12)
    at.number_input(key="pg.evals.low").set_value(0.5).run()  # a slice where MoT is right: nothing lost
    assert not at.exception
    assert any(m.value.endswith("0 lost (native right, MoT wrong) and "
                                f"{int(expected['n_kept'].max())} kept (both right) examples with a recorded error. "
                                "Both groups are needed to compare them: widen the slice.") for m in at.markdown)


def test_a_folder_without_layer_errors_names_the_command_that_records_them():
    at = open_view(PAGE)
    folder = "results/eval/smollm2-to-smollm2-squad300"
    at.selectbox(key="pg.evals.folder").set_value(folder).run()
    assert not at.exception and not at.error
    assert any(f"python -m mot_viz.eval.layer_error {ROOT / folder}" in c.value for c in at.caption)


def test_a_live_run_from_the_page_opens_its_folder_above(local_pair_checkpoint, monkeypatch):
    """The real evaluate command, on a tiny pair the sidebar's checkpoint names; the test waits on its process."""
    from mot_viz.app.live_run import runs_dir

    monkeypatch.setenv("MOT_VIZ_PRETRAINED", str(local_pair_checkpoint.parent))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    at = open_view(PAGE, params={"ckpt": local_pair_checkpoint.name})
    assert at.session_state["applied"].checkpoint == str(local_pair_checkpoint)
    at.number_input(key="pg.evals.live_n").set_value(2)
    at.multiselect(key="pg.evals.live_conditions").set_value(["mot"])
    at.button(key="evals.live_run").click().run()
    assert not at.exception and not at.error
    live = at.session_state["evals.live"]
    assert live.folder.parent == runs_dir() and live.command in [c.value for c in at.code]
    assert live.command.startswith(f"python -m mot_viz.eval.evaluate --checkpoint {local_pair_checkpoint} --datasets "
                                   "squad --n 2 --seed 0 --conditions native mot")
    assert live.wait() == 0, live.log.read_text()
    at.run()  # the page sees the end: the folder opens in the explorer above, with the command that reproduces it
    assert not at.exception and not at.error
    assert (at.session_state["pg.evals.folder"], at.session_state["pg.evals.path"]) == (
        "other folder (type its path below)", str(live.folder))
    assert sorted(frame(at, "table")["id"]) == sorted(e.id for e in load_dataset("squad", n=2, seed=0))
    assert any("Evaluated 2 examples" in s.value for s in at.success)
    assert live.command in [c.value for c in at.code]


OTHER = "other folder (type its path below)"


def test_a_path_too_long_a_huge_table_and_a_binary_one_are_one_short_message(tmp_path):
    at = open_view(PAGE)
    at.selectbox(key="pg.evals.folder").set_value(OTHER).run()
    at.text_input(key="pg.evals.path").input("/tmp/" + "x" * 5000).run()
    assert not at.exception and len(at.error) == 1
    message = at.error[0].value.replace("\\", "")  # as shown (Markdown's escapes dropped)
    assert "cannot be a folder's path (File name too long)" in message and "Unexpected" not in message
    assert len(message) < 600 and "5,005 characters" in message  # the path cut short, its length said
    folder = tmp_path / "huge"
    folder.mkdir()
    (folder / "summary.json").write_text("{}")
    with open(folder / "examples.csv", "wb") as handle:  # sparse: takes no disk
        handle.truncate(eval_runs.MAX_TABLE_BYTES + 1)
    at.text_input(key="pg.evals.path").input(str(folder)).run()
    assert not at.exception and len(at.error) == 1
    assert f"results tables are read up to {eval_runs.MAX_TABLE_BYTES // 2**20} MiB" in at.error[0].value.replace(
        "\\", "")
    (folder / "examples.csv").write_bytes(b"\x00" * 1000 + b"id,condition\n")
    at.text_input(key="pg.evals.path").input(f"{folder}/").run()  # another path: the page reads it anew
    assert not at.exception and len(at.error) == 1
    assert "holds a binary examples.csv" in at.error[0].value.replace("\\", "")


def test_a_folder_whose_answers_hold_nul_opens(tmp_path, checkpoints, monkeypatch):
    """A NUL in a text field (a user's gold answer "Paris\\u0000") is text: the folder opens, as earlier versions
    wrote it (with the NUL itself) and as evaluations write it now (U+FFFD)."""
    import json

    from mot_viz.engine.testing import CORPUS, load_test_model
    from mot_viz.eval import evaluate

    monkeypatch.setattr(evaluate, "load_model", load_test_model)
    data = tmp_path / "nul.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "context": CORPUS[i], "question": "Which city?",
                                        "answers": ["Paris\u0000"]}) + "\n" for i in range(2)))
    out = tmp_path / "nul-run"
    assert evaluate.main(["--checkpoint", str(checkpoints["smollm2-to-gemma3"]), "--datasets", str(data), "--n", "2",
                          "--max_new_tokens", "2", "--bootstrap", "20", "--out", str(out)]) == 0
    at = open_view(PAGE)
    at.selectbox(key="pg.evals.folder").set_value(OTHER).run()
    for nul in ("\ufffd", "\x00"):
        table = out / "examples.csv"
        table.write_bytes(table.read_bytes().replace("\ufffd".encode(), nul.encode()))
        at.text_input(key="pg.evals.path").input(str(out) + "/" * (nul == "\x00")).run()
        assert not at.exception and not at.error, at.error
        assert set(frame(at, "table")["gold"]) == {f"Paris{nul}"}


@pytest.mark.parametrize("n", [0, 500])
def test_an_out_of_range_number_of_examples_is_refused_not_clamped(n):
    at = open_view(PAGE)
    at.number_input(key="pg.evals.live_n").set_value(n).run()
    assert at.number_input(key="pg.evals.live_n").value == n  # kept as typed, never silently 1
    at.button(key="evals.live_run").click().run()
    assert not at.exception and len(at.error) == 1 and "evals.live" not in at.session_state
    assert "a live run evaluates 1 to 50 examples, got " + str(n) in at.error[0].value.replace("\\", "")
