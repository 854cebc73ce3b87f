"""What the app and its pages open on: each reason a page gives quotes the shipped results of the checkpoint the app
opens on, read back here from the files through the same mapping the Evaluations page links rows with (an example's
row -> the page and option that show it), so a rerun evaluation that changed them fails here."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from mot_viz.analysis.eval_run_links import app_views
from mot_viz.analysis.eval_runs import open_run, wide_table
from mot_viz.app.long_context import LONG_DOCUMENTS
from mot_viz.app.multi_agent import CONVERSATIONS, SHARD_DOCUMENTS
from mot_viz.app.openings import (DEFAULT_CONVERSATION, DEFAULT_EXAMPLE, DEFAULT_LONG_DOCUMENT, WHY_DEFAULT_CONVERSATION,
                                  WHY_DEFAULT_EXAMPLE, WHY_DEFAULT_LONG_DOCUMENT, on_measured_checkpoint, opens_on,
                                  why_default_context)
from mot_viz.app.settings import DEFAULT_CHECKPOINT, EXAMPLES_PER_DATASET, REPO_ROOT
from mot_viz.app.state import Selection

RESULTS = REPO_ROOT / "results"


def rows_by_view(folder: str) -> pd.DataFrame:
    """A shipped folder's wide table (a row per example, a column pair per condition) with the page options that
    open each row in the app."""
    run = open_run(RESULTS / folder)
    table = wide_table(run)
    views = app_views(run, table, checkpoints=[DEFAULT_CHECKPOINT], examples_per_dataset=EXAMPLES_PER_DATASET,
                      long_documents=LONG_DOCUMENTS, conversations=CONVERSATIONS, shard_documents=SHARD_DOCUMENTS)
    return table.assign(example_number=[v.example for v in views],
                        doc=[v.options.get("pg.long.doc") for v in views],
                        budget=[v.options.get("pg.long.budget") for v in views],
                        conversation=[v.options.get("pg.agents.conversation") for v in views])


def test_the_first_example_is_answered_from_the_mots_cache_and_not_from_the_random_control():
    table = rows_by_view("eval/smollm2-to-gemma3-mid-squad300")
    row = table[table.example_number == DEFAULT_EXAMPLE].iloc[0]
    assert row["native answer"] == row["mot answer"] == "Kromme Rijn" == row["gold"]
    assert row["native score"] == row["mot score"] == 1.0
    assert row["random answer"] == "The Rhine" and row["random score"] == 0.0
    assert f"SQuAD #{DEFAULT_EXAMPLE}" in WHY_DEFAULT_EXAMPLE and "“Kromme Rijn”" in WHY_DEFAULT_EXAMPLE
    summary = pd.read_csv(RESULTS / "eval/smollm2-to-gemma3-mid-squad300/summary.csv").set_index("condition")
    assert f"MoT's F1 is {summary.loc['mot', 'mean']:.3f} against the target's own {summary.loc['native', 'mean']:.3f}" \
        in WHY_DEFAULT_EXAMPLE


def test_the_first_long_document_is_answered_by_the_mot_and_by_no_window_without_its_context():
    table = rows_by_view("long/smollm2-to-gemma3-mid-stacks")
    rows = table[table.doc == DEFAULT_LONG_DOCUMENT].set_index("budget")
    for budget in (512, 1024, 2048):
        row = rows.loc[budget]
        assert "Kromme Rijn" in row["mot answer"] and row["mot score"] == 1.0, budget
        for control in ("no_context", "mean"):
            assert "Rhine" in row[f"{control} answer"] and row[f"{control} score"] == 0.0, (budget, control)
    assert rows.loc[4096, "mot score"] == 0.0  # "at 4,096 it misses this one too"
    summary = pd.read_csv(RESULTS / "long/smollm2-to-gemma3-mid-stacks/summary.csv")
    kept = summary[summary.condition == "mot"].set_index("budget")["retention"]
    assert f"keeps {100 * kept.min():.0f}–{100 * kept.max():.0f}% of the target's own F1" in WHY_DEFAULT_LONG_DOCUMENT
    assert f"stack #{DEFAULT_LONG_DOCUMENT}" in WHY_DEFAULT_LONG_DOCUMENT


def test_the_first_conversation_is_answered_from_the_mots_cache_as_from_the_hubs_own_reading():
    table = rows_by_view("conversation/smollm2-to-gemma3-mid-coqa")
    means = table[table.conversation == DEFAULT_CONVERSATION][["native score", "mot score", "no_context score"]].mean()
    assert len(table[table.conversation == DEFAULT_CONVERSATION]) == 5
    assert f"(mean F1 {means['mot score']:.2f} both)" in WHY_DEFAULT_CONVERSATION
    assert means["native score"] == pytest.approx(means["mot score"], rel=1e-9)
    assert f"with no story ({means['no_context score']:.2f})" in WHY_DEFAULT_CONVERSATION
    assert f"CoQA story #{DEFAULT_CONVERSATION}:" in WHY_DEFAULT_CONVERSATION


def test_a_reason_is_given_only_on_the_measured_pair_checkpoint_and_context(monkeypatch):
    monkeypatch.delenv("MOT_VIZ_TEST_MODELS", raising=False)
    sel = Selection("smollm2-135m", "gemma3-270m", str(REPO_ROOT / "pretrained" / DEFAULT_CHECKPOINT), "text", None,
                    None, f"SQuAD #{DEFAULT_EXAMPLE}")
    assert on_measured_checkpoint(sel) and why_default_context(sel) == WHY_DEFAULT_EXAMPLE
    for other in (replace(sel, label="SQuAD #0"), replace(sel, checkpoint="pretrained/smollm2-to-gemma3"),
                  replace(sel, source="gemma3-270m", target="smollm2-135m")):
        assert why_default_context(other) is None
    monkeypatch.setenv("MOT_VIZ_TEST_MODELS", "1")  # tiny stand-ins under the same names: no measured claim holds
    assert why_default_context(sel) is None


def test_a_patching_scan_opens_on_the_direct_map_where_offered():
    assert opens_on(["mot", "linear", "direct"]) == "direct"
    assert opens_on(["mot", "linear"]) == "mot"
