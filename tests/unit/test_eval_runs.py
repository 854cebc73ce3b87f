"""mot_viz.analysis.eval_runs on the shipped results folders: a slice's summary is the writer's own (the whole run's
is the folder's summary.json), two runs compare as scripts/paired_runs.py does, and hostile folders are one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mot_viz.analysis import eval_runs
from mot_viz.analysis.eval_run_links import app_views
from mot_viz.analysis.eval_runs import (ResultsFolderError, compare_runs, open_run, select, shipped_runs,
                                        slice_summary, stated_summary, wide_table)
from mot_viz.data.eval_data import load_dataset
from mot_viz.errors import MotVizError
from mot_viz.eval.report import paired_markdown, summarize
from tolerance import assert_close

ROOT = Path(__file__).resolve().parents[2]
MID = ROOT / "results/eval/smollm2-to-gemma3-mid-squad300"
LINEAR = ROOT / "results/eval/smollm2-to-gemma3-mid-linear-squad300"
NUMBERS = ["n", "mean", "ci_low", "ci_high", "retention", "retention_ci_low", "retention_ci_high"]


def test_the_shipped_folders_of_every_kind_are_found():
    kinds = {open_run(folder).kind.name for folder in shipped_runs()}
    assert kinds == {"evaluate", "long_context", "conversation", "shards"}


@pytest.mark.parametrize("folder", shipped_runs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_whole_run_as_a_slice_is_the_folders_own_summary(folder):
    run = open_run(folder)
    ours, stated = slice_summary(run), stated_summary(run)
    assert ours["group"].tolist() == stated["group"].tolist()
    assert ours["condition"].tolist() == stated["condition"].tolist()
    assert_close(ours[NUMBERS].to_numpy(float), stated[NUMBERS].to_numpy(float), rtol=1e-12, equal_nan=True,
                 what=folder.name)


def test_the_wide_table_holds_one_row_per_example_with_its_question_and_mot_minus_native():
    run = open_run(MID)
    table = wide_table(run)
    assert len(table) == 300 == table["example"].nunique()
    assert run.settings["checkpoint"] == "pretrained/smollm2-to-gemma3-mid" and run.conditions == ["native", "mot",
                                                                                                    "random"]
    questions = {e.id: e.question for e in load_dataset("squad", n=300, seed=0)}
    assert table["question"].tolist() == [questions[i] for i in table["id"]]
    row = table.iloc[0]
    raw = run.rows[run.rows["id"] == row["id"]].set_index("condition")
    assert row["mot score"] == raw.loc["mot", "score"] and row["mot answer"] == raw.loc["mot", "answer"]
    assert row["mot − native"] == raw.loc["mot", "score"] - raw.loc["native", "score"]
    assert (table["context_tokens"] > 0).all()


def test_a_slice_is_summarised_as_the_evaluator_summarises_its_rows():
    run = open_run(MID)
    table = wide_table(run)
    lost = select(table, "mot", lost=True)
    assert len(lost) > 0
    assert ((lost["native score"] >= eval_runs.RIGHT) & (lost["mot score"] < eval_runs.RIGHT)).all()
    ours = slice_summary(run, lost["example"])
    direct = summarize(run.rows[run.rows["id"].isin(set(lost["id"]))].drop(columns=["group", "example"]),
                       run.settings["bootstrap"], run.settings["seed"])
    assert ours["n"].tolist() == [len(lost)] * 3
    assert_close(ours[["mean", "ci_low", "ci_high", "retention"]].to_numpy(float),
                 direct[["mean", "ci_low", "ci_high", "retained"]].to_numpy(float), rtol=1e-12)
    assert ours.set_index("condition").loc["mot", "mean"] < ours.set_index("condition").loc["native", "mean"]
    ranged = select(table, "native", 0.5, 1.0)
    assert ranged["native score"].between(0.5, 1.0).all() and len(ranged) == (table["native score"] >= 0.5).sum()
    word = select(table, "native", search="HUGUENOT")
    assert len(word) and word["question"].str.lower().str.contains("huguenot").all()
    assert slice_summary(run, []).empty


def test_two_runs_compare_as_scripts_paired_runs_prints(capsys):
    from scripts.paired_runs import main

    a, b = open_run(MID), open_run(LINEAR)
    comparison = compare_runs(a, b)
    assert main([f"{MID}:mot={a.name}", f"{LINEAR}:mot={b.name}", "--pairs", f"{a.name}:{b.name}"]) == 0
    assert capsys.readouterr().out.strip() == paired_markdown(comparison.paired).strip()
    r = comparison.paired.iloc[0]
    assert (r["n"], r["a_better"], r["b_better"]) == (300, len(comparison.a_wins), len(comparison.b_wins))
    assert_close(r["diff"], comparison.pairs["diff"].mean(), rtol=1e-12)
    assert (comparison.a_wins["score_a"] > comparison.a_wins["score_b"]).all()
    # a slice: the same code over the chosen examples only
    chosen = comparison.pairs["example"].iloc[:40]
    sliced = compare_runs(a, b, examples=chosen)
    assert sliced.paired.iloc[0]["n"] == 40 and set(sliced.pairs["example"]) == set(chosen)


def test_long_context_runs_compare_per_length_as_the_script_does(capsys):
    from scripts.paired_runs import main

    mid, terminal = ROOT / "results/long/smollm2-to-gemma3-mid-stacks", ROOT / "results/long/smollm2-to-gemma3-stacks"
    comparison = compare_runs(open_run(mid), open_run(terminal))
    assert main([f"{mid}:mot={mid.name}", f"{terminal}:mot={terminal.name}", "--pairs",
                 f"{mid.name}:{terminal.name}"]) == 0
    note, table = capsys.readouterr().out.strip().split("\n\n", 1)
    assert table == paired_markdown(comparison.paired).strip()
    # the terminal run holds fewer documents per length: said first, with the counts
    assert note.startswith(f"The runs hold different examples ({mid.name} 204, {terminal.name} 36): 36 of the 204 are "
                           "in every one")
    assert comparison.paired["dataset"].str.endswith("tokens").all() and len(comparison.paired) >= 3


def test_methods_from_several_runs_are_tabled_against_one_on_the_examples_all_ran(tmp_path, capsys):
    from scripts.paired_runs import against_table, main, native_agreement

    direct = ROOT / "results/direct/smollm2-to-gemma3-depth-matched-squad"
    runs = [f"{MID}:native=native", f"{MID}:mot=MoT", f"{LINEAR}:mot=linear", f"{direct}:direct=direct"]
    table = against_table(runs, "MoT").set_index("label")
    assert table["n"].tolist() == [300] * 4 and list(table.index) == ["native", "MoT", "linear", "direct"]
    stated = open_run(MID).summary.set_index("condition")
    assert_close(table.loc["MoT", ["mean", "ci_low", "ci_high"]].to_numpy(float),
                 stated.loc["mot", ["mean", "ci_low", "ci_high"]].to_numpy(float), rtol=1e-12)
    assert table.loc["native", "retained"] == 1.0 and np.isnan(table.loc["MoT", "diff"])
    comparison = compare_runs(open_run(direct), open_run(MID), "direct", "mot")
    assert_close(table.loc["direct", "diff"], comparison.pairs["diff"].mean(), rtol=1e-12)
    assert table.loc["direct", "better"] == f"{len(comparison.a_wins)} / {len(comparison.b_wins)}"
    assert table.loc["direct", "diff_high"] < 0 < table.loc["MoT", "mean"]  # the direct map loses, firmly
    assert table.loc["direct", "run"] == "direct/" + direct.name
    assert_close(table.loc["MoT", "seconds"], open_run(MID).rows.query("condition == 'mot'")["seconds"].mean(),
                 rtol=1e-12)
    # gap closed, the share of the context's gain captured: 0 at no context, 1 at native, with a paired interval
    relay = ROOT / "results/relay/smollm2-to-gemma3-mid-squad"  # the same 300 examples, with no context
    floored = against_table([*runs, f"{relay}:no_context=no context"], "MoT").set_index("label")
    means = floored["mean"]
    assert floored.loc["no context", "gap_closed"] == 0.0 and floored.loc["native", "gap_closed"] == 1.0
    assert_close(floored.loc["direct", "gap_closed"],
                 (means["direct"] - means["no context"]) / (means["native"] - means["no context"]), rtol=1e-12)
    assert floored.loc["direct", "gap_closed_ci_low"] < floored.loc["direct", "gap_closed"] \
        < floored.loc["direct", "gap_closed_ci_high"]
    assert floored.loc["direct", "gap_closed"] < floored.loc["direct", "retained"]  # the floor taken off
    assert np.isnan(table.loc["MoT", "gap_closed"])  # no label "no context": no floor
    # relay's writing needs no question: its seconds run from the question's arrival, its writing is done ahead
    # (these rows predate ahead_seconds, so the writing is taken from message_generate_seconds)
    relayed = against_table([f"{relay}:native=native", f"{relay}:relay=relay", f"{relay}:relay_q=relay_q"],
                            "native").set_index("label")
    rows = open_run(relay).rows
    own = rows[rows["condition"] == "relay"]
    assert_close(relayed.loc["relay", "seconds"], (own["seconds"] - own["message_generate_seconds"]).mean(), rtol=1e-9)
    assert_close(relayed.loc["relay", "ahead"], own["message_generate_seconds"].mean(), rtol=1e-9)
    assert_close(relayed.loc["relay_q", "seconds"], rows.query("condition == 'relay_q'")["seconds"].mean(), rtol=1e-9)
    assert np.isnan(relayed.loc["relay_q", "ahead"])
    assert native_agreement(runs) == (f"native scores against {MID}'s, example for example: {LINEAR}: 300 of 300 "
                                      f"the same; {direct}: 300 of 300 the same.")
    # only the lengths every label ran: the shards hub's documents are the long-context run's at 1,024 tokens
    stacks, hub = ROOT / "results/long/smollm2-to-gemma3-mid-stacks", ROOT / "results/shards/smollm2-to-gemma3-mid-stacks"
    lengths = against_table([f"{stacks}:mot=MoT", f"{stacks}:linear=linear", f"{hub}:shards_4=4 shards"], "MoT")
    assert set(lengths["group"]) == {"stacks 1024 tokens"} and lengths["n"].tolist() == [50] * 3
    # a run whose native answers differ is said to differ
    changed = tmp_path / "changed"
    shutil.copytree(direct, changed)
    rows = pd.read_csv(changed / "examples.csv", dtype=str, keep_default_na=False)
    first = rows.index[rows["condition"] == "native"][0]
    rows.loc[first, "score"] = "0.123"
    rows.to_csv(changed / "examples.csv", index=False)
    assert "299 of 300 the same" in native_agreement([f"{MID}:native=native", f"{changed}:direct=direct"])
    assert main([*runs, "--against", "MoT"]) == 0
    printed = capsys.readouterr().out
    assert "squad/validation (n = 300)" in printed and "| direct | 0.090 [" in printed
    # bad input is one line
    assert main([*runs, "--against", "nobody"]) == 2
    assert main([f"{MID}:mot=MoT", f"{LINEAR}:mot=MoT", "--against", "MoT"]) == 2
    assert "same LABEL" in capsys.readouterr().err


def test_the_first_examples_of_a_dataset_open_in_the_sidebar():
    run = open_run(MID)
    table = wide_table(run)
    views = app_views(run, table, checkpoints=["smollm2-to-gemma3-mid"], examples_per_dataset=50, long_documents=48,
                      conversations=30, shard_documents=50)
    offered = [e.id for e in load_dataset("squad", n=50, seed=0)]
    linked = [(row.id, v) for row, v in zip(table.itertuples(), views) if v.page is not None]
    assert [i for i, _ in linked] == [i for i in table["id"] if i in offered] and len(linked) == 50
    for example_id, view in linked:
        assert (view.page, view.dataset, view.checkpoint) == ("1_answers", "squad", "smollm2-to-gemma3-mid")
        assert offered[view.example] == example_id
        assert (view.source, view.target) == ("smollm2-135m", "gemma3-270m")
    assert all("first 50" in v.reason for v in views if v.page is None)
    elsewhere = app_views(run, table, checkpoints=["smollm2-to-gemma3"], examples_per_dataset=50, long_documents=48,
                          conversations=30, shard_documents=50)
    # a run whose checkpoint is not here: its examples open under the sidebar's own pair and checkpoint, said so
    assert [(v.page, v.dataset, v.example) for v in elsewhere] == [(v.page, v.dataset, v.example) for v in views]
    assert all(v.checkpoint is None and v.source is None and "not among the app's checkpoints" in v.note
               for v in elsewhere if v.page is not None)


def test_documents_and_conversations_open_on_their_pages_by_number():
    stacks = open_run(ROOT / "results/long/smollm2-to-gemma3-mid-stacks")
    table = wide_table(stacks)
    limits = dict(checkpoints=["smollm2-to-gemma3-mid"], examples_per_dataset=50, long_documents=48,
                  conversations=30, shard_documents=50)
    views = app_views(stacks, table, **limits)
    at_512 = [v for row, v in zip(table.itertuples(), views) if row.group == "stacks 512 tokens"]
    assert [v.options["pg.long.doc"] for v in at_512[:48]] == list(range(48))
    assert all(v.options["pg.long.budget"] == 512 and v.page == "8_long_context" for v in at_512[:48])
    assert all(v.page is None for v in at_512[48:])
    talk = open_run(ROOT / "results/conversation/smollm2-to-gemma3-mid-coqa")
    table = wide_table(talk)
    views = app_views(talk, table, **limits)
    assert [v.options["pg.agents.conversation"] for v in views] == [k for k in range(30) for _ in range(5)]
    assert table["turn"].tolist() == [t for _ in range(30) for t in range(1, 6)]


# ----- hostile folders: one line each, with the fix ----------------------------------------------------------------


def _copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(MID, tmp_path / "run"))


def _refused(folder, *words) -> str:
    with pytest.raises(ResultsFolderError) as caught:
        open_run(folder)
    message = str(caught.value)
    assert "\n" not in message and isinstance(caught.value, MotVizError)
    assert all(w in message for w in words), message
    return message


def test_a_missing_folder_or_a_file_is_refused(tmp_path):
    _refused(tmp_path / "nowhere", "There is no folder")
    (tmp_path / "file.csv").write_text("a,b\n")
    _refused(tmp_path / "file.csv", "is a file", "--out")


def test_a_folder_that_is_not_a_results_folder_is_refused(tmp_path):
    _refused(tmp_path, "no examples.csv", "summary.json", "--out")


def test_a_torn_examples_table_names_resume(tmp_path):
    folder = _copy(tmp_path)
    table = folder / "examples.csv"
    table.write_bytes(table.read_bytes()[:-40])
    _refused(folder, "cut short", "--resume", "python -m mot_viz.eval.evaluate")


def test_a_foreign_or_binary_table_is_refused(tmp_path):
    folder = _copy(tmp_path)
    pd.DataFrame({"name": ["x"], "value": [1]}).to_csv(folder / "examples.csv", index=False)
    _refused(folder, "columns name, value", "no evaluation")
    (folder / "examples.csv").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    _refused(folder, "binary")


def test_a_damaged_score_or_summary_is_refused(tmp_path):
    folder = _copy(tmp_path)
    rows = pd.read_csv(folder / "examples.csv", dtype=str, keep_default_na=False)
    rows.loc[3, "score"] = "lots"
    rows.to_csv(folder / "examples.csv", index=False)
    _refused(folder, "without a numeric score", "--resume")
    shutil.copy(MID / "examples.csv", folder / "examples.csv")
    (folder / "summary.json").write_text("{not json")
    _refused(folder, "not JSON")
    (folder / "summary.json").write_text('{"date": "2026-01-01"}')
    _refused(folder, "without the settings")


def test_a_run_with_no_scored_example_is_refused(tmp_path):
    folder = _copy(tmp_path)
    header = (MID / "examples.csv").read_text().split("\n", 1)[0]
    (folder / "examples.csv").write_text(header + "\nsquad/validation,x,skipped,,,,,,,,ContextError: too long\n")
    _refused(folder, "no scored example", "1 skipped", "ContextError: too long", "--resume")


def test_runs_without_a_shared_example_or_condition_are_refused():
    squad, boolq = open_run(MID), open_run(ROOT / "results/eval/smollm2-to-gemma3-mid-boolq300")
    with pytest.raises(ResultsFolderError, match="no example in common"):
        compare_runs(squad, boolq)
    with pytest.raises(ResultsFolderError, match="has no rows of condition 'linear'"):
        compare_runs(squad, squad, condition_a="linear")


def test_the_summary_table_of_a_slice_keeps_its_columns_for_no_rows():
    run = open_run(MID)
    empty = slice_summary(run, ["not an example"])
    assert list(empty.columns) == list(eval_runs.SLICE_COLUMNS) and empty.empty
    assert np.isnan(stated_summary(open_run(ROOT / "results/long/smollm2-to-gemma3-mid-stacks"))
                    .set_index(["group", "condition"]).loc[("stacks 512 tokens", "native"), "retention"])
