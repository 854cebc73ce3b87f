"""A live evaluation (mot_viz.app.live_run): the real `python -m mot_viz.eval.evaluate` run on a tiny pair saved as
local model folders, its folder opened by the results loader; stopped by SIGINT, the folder it leaves continued by
--resume; the folder naming and the upload check. Every wait is on the process or on what it has written."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from mot_viz.analysis import eval_runs
from mot_viz.app import live_run
from mot_viz.data.eval_data import load_dataset
from mot_viz.errors import ConfigError, DataFormatError

SMALL = dict(max_new_tokens=4, max_context_tokens=96)  # the tiny models read 256 positions


@pytest.fixture(scope="module")
def checkpoint(local_pair_checkpoint) -> str:
    return str(local_pair_checkpoint)


@pytest.fixture
def runs(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MOT_VIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return live_run.runs_dir()


def _examples(folder: Path) -> set[str]:
    run = eval_runs.open_run(folder)
    return set(run.rows["id"])


def test_a_tiny_run_end_to_end_opens_in_the_results_loader(checkpoint, runs):
    settings = live_run.settings_for(checkpoint, "squad", 2, ["mot"], **SMALL)
    folder = live_run.new_folder(checkpoint, "squad", 2)
    assert folder.parent == runs and folder.is_dir() and not any(folder.iterdir())
    run = live_run.start(settings, folder)
    assert run.command == (f"python -m mot_viz.eval.evaluate --checkpoint {checkpoint} --datasets squad --n 2 --seed 0 "
                           f"--conditions native mot --max_new_tokens 4 --max_context_tokens 96 --out {folder}")
    assert run.wait() == 0, run.log.read_text()
    assert run.progress() == live_run.Progress(2, 2, "finished")
    opened = eval_runs.open_run(folder)
    assert opened.kind.name == "evaluate" and set(opened.conditions) == {"native", "mot"}
    assert set(opened.rows["id"]) == {e.id for e in load_dataset("squad", n=2, seed=0)}
    assert opened.command == run.command  # the folder states the command that reproduces it
    # the command's own progress bar, read from the log, reached the total
    assert "2/2" in run.log.read_text() and run.log.parent == runs


def test_stop_writes_what_was_computed_and_resume_continues_it(checkpoint, runs):
    n = 40  # a tiny example takes a fraction of a second: the stop lands long before the last, even on a fast CPU
    settings = live_run.settings_for(checkpoint, "squad", n, ["mot"], **SMALL)
    folder = live_run.new_folder(checkpoint, "squad", n)
    run = live_run.start(settings, folder)
    while run.running() and run.progress().done < 1:  # the first example is done (the bar says so), then Ctrl-C
        time.sleep(0.01)
    run.stop()
    assert run.wait() == 130, run.log.read_text()
    stopped = run.progress()
    assert stopped.phase == "stopped" and 1 <= stopped.done < n
    kept = _examples(folder)
    assert 1 <= len(kept) < n  # the partial run, whole: the results loader reads it

    again = live_run.start(settings, folder, resume=True)
    assert again.wait() == 0, again.log.read_text()
    assert again.progress() == live_run.Progress(n, n, "finished")
    done = _examples(folder)
    assert done == {e.id for e in load_dataset("squad", n=n, seed=0)} and kept < done
    log = again.log.read_text()
    assert f"{n - len(kept)}/{n - len(kept)}" in log  # only the missing examples were computed


def test_folders_never_collide_and_say_what_ran(tmp_path):
    made = [live_run.new_folder("pretrained/smollm2-to-gemma3-mid/", "/x/my data.jsonl", 5, tmp_path)
            for _ in range(3)]
    assert len(set(made)) == 3 and all(p.is_dir() and p.parent == tmp_path for p in made)
    assert all(p.name.split("-n5")[0].endswith("-smollm2-to-gemma3-mid-my-data") for p in made)


def test_settings_are_checked_before_a_run(checkpoint):
    for n in (0, live_run.MAX_EXAMPLES + 1):
        with pytest.raises(ConfigError, match=f"1 to {live_run.MAX_EXAMPLES} examples"):
            live_run.settings_for(checkpoint, "squad", n, ["mot"])
    with pytest.raises(ConfigError, match="not one the command reads offline"):
        live_run.settings_for(checkpoint, "squad_v2", 2, ["mot"])
    with pytest.raises(ConfigError, match="unknown condition"):
        live_run.settings_for(checkpoint, "squad", 2, ["direct"])
    settings = live_run.settings_for(checkpoint, "boolq", 3, ["random", "mot", "mean"], **SMALL)
    assert settings.conditions == ("native", "mot", "random", "mean") and settings.datasets == ("boolq",)
    with pytest.raises(ConfigError, match="--max_context_tokens 448 leaves no room"):  # the command's own check
        live_run.settings_for(checkpoint, "squad", 2, ["mot"], max_context_tokens=448)
    # the command's 448 passage tokens, cut for a target that reads fewer than 896 positions (the tiny one: 256)
    assert live_run.settings_for(checkpoint, "squad", 2, ["mot"]).max_context_tokens == 128
    with pytest.raises(ConfigError, match="space or a quote"):
        live_run.start(settings, Path("/tmp/a folder/run"))


GOOD = [{"context": "The tower is in Paris.", "question": "Where is the tower?", "answers": ["Paris"]},
        {"id": "q2", "context": "Ice is cold.", "question": "Is ice cold?", "choices": ["yes", "no"], "label": 0}]


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_an_upload_in_the_evaluation_format_is_saved_where_a_run_reads_it(tmp_path):
    path = live_run.check_upload("my questions.jsonl", _jsonl(GOOD), tmp_path)
    assert path.suffix == ".jsonl" and path.is_relative_to(tmp_path)
    examples = load_dataset(str(path), n=2, seed=0)
    assert {e.id for e in examples} == {"line-1", "q2"} and examples[0].dataset == "my-questions/jsonl"
    assert live_run.check_upload("my questions.jsonl", _jsonl(GOOD), tmp_path) == path  # the same file, once


@pytest.mark.parametrize("data, words", [
    (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", ("binary file", "one JSON object per line")),
    ("caf\u00e9".encode("latin-1"), ("not UTF-8",)),
    (_jsonl(GOOD) + b'{"context": "x", "question": "y"}\n', ("line(s) 3", "missing key 'answers'", "up.jsonl")),
    (b"not json at all\n", ("invalid JSON", "no line holds a usable example")),
    (b"\n\n", ("holds no example",)),
])
def test_a_bad_upload_is_one_clear_message(tmp_path, data, words):
    with pytest.raises(DataFormatError) as caught:
        live_run.check_upload("up.jsonl", data, tmp_path)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))
    assert str(tmp_path) not in str(caught.value)  # the file is named as the user knows it
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # nothing refused stays on disk


def test_a_huge_upload_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(live_run, "MAX_UPLOAD_BYTES", 100)
    with pytest.raises(DataFormatError, match="at most"):
        live_run.check_upload("big.jsonl", _jsonl(GOOD * 10), tmp_path)
    assert not (tmp_path / "uploads").exists()


def test_a_stopped_run_whose_answers_hold_nul_resumes(checkpoint, runs):
    """A gold answer "Paris\\u0000" (valid JSON) puts a NUL in the results: Resume continues the run all the same, also
    from a folder that holds the NUL itself (as earlier versions wrote it)."""
    rows = [{"id": f"q{i}", "context": "The tower is in Paris.", "question": "Where is the tower?",
             "answers": ["Paris\u0000"]} for i in range(3)]
    data = str(live_run.check_upload("nul.jsonl", _jsonl(rows)))
    settings = live_run.settings_for(checkpoint, data, 3, ["mot"], **SMALL)
    folder = live_run.new_folder(checkpoint, data, 3)
    run = live_run.start(settings, folder)
    assert run.wait() == 0, run.log.read_text()
    table = pd.read_csv(folder / "examples.csv", dtype=str, keep_default_na=False)
    assert set(table["gold"]) == {"Paris\ufffd"}
    # what Stop leaves after the first example, written with the NUL itself
    table[table["id"] == "q0"].replace("\ufffd", "\x00", regex=True).to_csv(folder / "examples.csv", index=False)
    assert b"\x00" in (folder / "examples.csv").read_bytes()
    again = live_run.start(settings, folder, resume=True)
    assert again.wait() == 0, again.log.read_text()
    assert again.progress() == live_run.Progress(3, 3, "finished") and "2/2" in again.log.read_text()
    assert _examples(folder) == {"q0", "q1", "q2"}
