"""What a results folder's kind says it can show (eval_runs.RunKind.layer_errors, .patching, .patching_per_budget)
agrees with what the commands that add to a folder accept, and the patching command the Evaluations page names
(mot_viz.analysis.patching.command) is one the patching command reads, for the folder's own examples or budget."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from mot_viz.analysis import patching
from mot_viz.analysis.eval_runs import KINDS, kinds_text, open_run, shipped_runs
from mot_viz.errors import ConfigError
from mot_viz.eval.layer_error_file import UNITS
from mot_viz.eval.patching import record
from mot_viz.eval.patching_long import is_long_folder, long_settings

ROOT = Path(__file__).resolve().parents[2]
MID = ROOT / "results/eval/smollm2-to-gemma3-mid-squad300"
STACKS = ROOT / "results/long/smollm2-to-gemma3-mid-stacks"  # budgets 512, 1024, 2048, 4096
CONVERSATION = ROOT / "results/conversation/smollm2-to-gemma3-mid-coqa"


def test_the_kinds_with_layer_errors_are_those_the_layer_error_command_records():
    assert {k.name for k in KINDS if k.layer_errors} == set(UNITS)


@pytest.mark.parametrize("folder", shipped_runs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_kind_the_patching_command_does_not_scan_is_refused_by_it_before_any_model_loads(folder):
    kind = open_run(folder).kind
    assert is_long_folder(folder) == kind.patching_per_budget
    if not kind.patching:
        with pytest.raises(ConfigError, match="not of evaluate or long_context"):
            record(folder, n=1, progress=False)


def _arguments(command: str) -> dict[str, str]:
    words = shlex.split(command.replace("<a full-depth map>", "MAP"))
    assert words[:4] == ["python", "-m", "mot_viz.eval.patching", words[3]]
    return {flag: value for flag, value in zip(words[4:], words[5:]) if flag.startswith("--")}


def test_an_evaluations_folder_is_scanned_over_its_first_examples_with_the_mot_and_a_direct_map():
    run = open_run(MID)
    command = patching.command(run)
    assert command == (f"python -m mot_viz.eval.patching {MID} --n {patching.SCAN_EXAMPLES} --methods mot direct "
                       "--direct <a full-depth map>")
    assert "--budget" not in _arguments(command)


def test_a_long_context_folders_scan_is_of_one_budget_it_holds():
    run = open_run(STACKS)
    arguments = _arguments(patching.command(run))
    assert arguments["--budget"] == str(patching.SCAN_BUDGET) and arguments["--n"] == str(patching.SCAN_DOCUMENTS)
    assert long_settings(STACKS, int(arguments["--budget"]))[1] == patching.SCAN_BUDGET
    # a folder without that budget: its first one, which the command accepts
    longer = replace(run, rows=run.rows[run.rows["budget"].astype(int) != patching.SCAN_BUDGET])
    budget = int(_arguments(patching.command(longer))["--budget"])
    assert budget == 512 and long_settings(STACKS, budget)[1] == 512


def test_a_folder_of_a_kind_that_is_not_scanned_has_no_command():
    assert patching.command(open_run(CONVERSATION)) is None


def test_the_kinds_are_named_as_a_caption_lists_them():
    assert kinds_text(lambda k: k.patching) == "`evaluate` and `long_context`"
    assert kinds_text(lambda k: True) == "`evaluate`, `long_context`, `conversation` and `shards`"
    assert kinds_text(lambda k: k.name == "shards") == "`shards`"
    assert kinds_text(lambda k: False) == ""


def test_the_window_is_read_from_the_scans_window_group():
    frame = pd.DataFrame({"target": ["layer 3", "window", "global"], "layers": ["3", "5 4 6", "2 8"]})
    assert patching.window_layers(frame) == [4, 5, 6]
    shipped = pd.read_csv(MID / "patching.csv", usecols=["target", "layers"], dtype=str)
    window = patching.window_layers(shipped)
    layers = shipped.loc[shipped["target"].str.startswith("layer "), "target"].str.split().str[1].astype(int)
    assert window == sorted(set(window)) and set(window) <= set(layers)
