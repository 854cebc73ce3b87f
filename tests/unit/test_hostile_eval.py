"""Hostile inputs to the evaluator: bad flags and folders fail before a model loads, a bad example is a counted
skip, an interrupted or shorter run resumes to the same rows, and contexts too long for either model fail clearly."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import CORPUS, TOY_ROWS, tiny_model, write_jsonl
from mot_viz.data.eval_data import load_dataset, load_jsonl
from mot_viz.engine.channels import Channels
from mot_viz.engine.mot import MoT, native_cache, target_context_ids, translate
from mot_viz.engine.prompts import QAExample
from mot_viz.engine.testing import load_test_model
from mot_viz.errors import ContextError, DataFormatError, DataUnavailableError, ModelLoadError
from mot_viz.eval import conversation, evaluate, long_context, results_folder, shards
from mot_viz.eval.answers import answer_from_cache


@pytest.fixture()
def no_models(monkeypatch):
    def load_model(name):
        raise AssertionError(f"a model ({name}) was loaded before the arguments were checked")

    monkeypatch.setattr(evaluate, "load_model", load_model)


@pytest.fixture()
def test_models(monkeypatch):
    monkeypatch.setattr(evaluate, "load_model", load_test_model)


def cli_error(capsys, checkpoints, data, out, *extra) -> str:
    """main()'s one-line message for arguments that must fail with exit status 2 and no traceback."""
    argv = ["--checkpoint", str(checkpoints["smollm2-to-gemma3"]), "--datasets", str(data), "--out", str(out), *extra]
    assert evaluate.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    return err


def eval_argv(checkpoints, data, out, n, *extra) -> list[str]:
    return ["--checkpoint", str(checkpoints["smollm2-to-gemma3"]), "--datasets", str(data), "--n", str(n),
            "--max_new_tokens", "2", "--bootstrap", "20", "--out", str(out), *extra]


def rows(out) -> pd.DataFrame:
    """examples.csv exactly as written (every field a string), without the timings (every "…seconds" column)."""
    table = pd.read_csv(out / "examples.csv", dtype=str, keep_default_na=False)
    return table.drop(columns=[c for c in table if c.endswith("seconds")])


@pytest.mark.parametrize("flag, value, least", [("--n", 0, 1), ("--n", -5, 1), ("--bootstrap", 0, 1),
                                                ("--max_new_tokens", 0, 1), ("--max_context_tokens", 3, 16)])
def test_out_of_range_flags_fail_before_loading(capsys, checkpoints, data, tmp_path, no_models, flag, value, least):
    err = cli_error(capsys, checkpoints, data, tmp_path / "out", flag, str(value))
    assert err.startswith(f"error: ConfigError: {flag} must be at least {least}, got {value}. Pass {flag} {least} or more.")


def test_out_that_is_a_file_fails(capsys, checkpoints, data, tmp_path, no_models):
    out = tmp_path / "results.txt"
    out.write_text("not a folder")
    err = cli_error(capsys, checkpoints, data, out)
    assert err.startswith(f"error: ConfigError: --out {out} is a file. Pass a folder")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders, so chmod cannot make one")
def test_read_only_out_fails(capsys, checkpoints, data, tmp_path, no_models):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        err = cli_error(capsys, checkpoints, data, locked / "out")
    finally:
        locked.chmod(0o700)
    assert err.startswith("error: ConfigError: Cannot write into --out") and "Pass a folder you can write to" in err


def test_unreadable_checkpoints_fail(capsys, checkpoints, data, tmp_path, no_models):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    err = cli_error(capsys, {"smollm2-to-gemma3": broken}, data, tmp_path / "out")
    assert err.startswith(f"error: CheckpointError: --checkpoint {broken}: ") and "not valid JSON" in err
    assert "Pass a checkpoint folder written by MoT Viz" in err
    err = cli_error(capsys, checkpoints, data, tmp_path / "out", "--second", str(checkpoints["gemma3-to-smollm2"]))
    assert err.startswith("error: CheckpointError: --second") and "Pass a second checkpoint of the same pair" in err


def test_unknown_dataset_and_folder_named_jsonl_fail_before_loading(capsys, checkpoints, tmp_path, no_models):
    err = cli_error(capsys, checkpoints, "no-such-dataset", tmp_path / "out")
    assert err.startswith("error: DataUnavailableError: Unknown dataset 'no-such-dataset'") and "Built-in" in err
    folder = tmp_path / "x.jsonl"
    folder.mkdir()
    err = cli_error(capsys, checkpoints, folder, tmp_path / "out")
    assert err.startswith(f"error: DataFormatError: {folder} is a folder, not a JSONL file. Pass the path of a .jsonl file")
    with pytest.raises(DataFormatError, match="is a folder"):
        load_jsonl(folder)
    with pytest.raises(DataUnavailableError, match="does not exist"):  # a missing file is still reported as missing
        load_jsonl(tmp_path / "absent.jsonl")


def test_bom_keeps_the_first_row(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\r\n" for r in TOY_ROWS[:2]).encode())
    loaded = load_jsonl(path)
    assert loaded.errors == [] and [e.id for e in loaded.examples] == ["q0", "q1"]
    assert len(load_dataset(str(path))) == 2


def test_out_of_other_settings_is_refused(capsys, checkpoints, data, tmp_path, test_models, monkeypatch):
    out = tmp_path / "out"
    assert evaluate.main(eval_argv(checkpoints, data, out, 1)) == 0
    capsys.readouterr()
    monkeypatch.setattr(evaluate, "load_model", lambda name: pytest.fail("a model was loaded for a refused --out"))
    for extra in ([], ["--resume"]):
        err = cli_error(capsys, checkpoints, data, out, "--n", "2", "--max_new_tokens", "2", "--seed", "7", *extra)
        assert err.startswith(f"error: ConfigError: --out {out} holds results of other settings (seed differ)")
        assert "--resume cannot continue" in err and "Pass another --out folder" in err
    err = cli_error(capsys, checkpoints, data, out, "--n", "1", "--max_new_tokens", "2")
    assert err.startswith(f"error: ConfigError: --out {out} already holds results of these settings. Add --resume")


def test_resume_computes_only_new_examples_and_equals_one_run(checkpoints, data, tmp_path, test_models, monkeypatch):
    computed = []
    example_rows = evaluate.example_rows
    monkeypatch.setattr(evaluate, "example_rows", lambda *a, **k: computed.append(a[3].id) or example_rows(*a, **k))
    assert evaluate.main(eval_argv(checkpoints, data, tmp_path / "whole", 4)) == 0
    assert evaluate.main(eval_argv(checkpoints, data, tmp_path / "part", 2)) == 0
    computed.clear()
    assert evaluate.main(eval_argv(checkpoints, data, tmp_path / "part", 4, "--resume")) == 0
    assert len(computed) == 2  # the first two examples were kept, not recomputed
    pd.testing.assert_frame_equal(rows(tmp_path / "part"), rows(tmp_path / "whole"))
    assert json.loads((tmp_path / "part" / "summary.json").read_text())["settings"]["n"] == 4


def test_interrupted_run_keeps_its_rows_and_resumes_to_the_same(checkpoints, data, tmp_path, test_models, monkeypatch):
    assert evaluate.main(eval_argv(checkpoints, data, tmp_path / "whole", 3)) == 0
    example_rows = evaluate.example_rows

    def interrupted(*args, **kwargs):
        if args[3].id == load_dataset(str(data), n=3)[1].id:
            raise KeyboardInterrupt
        return example_rows(*args, **kwargs)

    monkeypatch.setattr(evaluate, "example_rows", interrupted)
    assert evaluate.main(eval_argv(checkpoints, data, tmp_path / "part", 3)) == 130  # Ctrl-C: status 130
    assert len(rows(tmp_path / "part")) == 4  # the first example's four conditions were written
    monkeypatch.setattr(evaluate, "example_rows", example_rows)
    assert evaluate.main(eval_argv(checkpoints, data, tmp_path / "part", 3, "--resume")) == 0
    pd.testing.assert_frame_equal(rows(tmp_path / "part"), rows(tmp_path / "whole"))


def test_lone_surrogate_is_a_counted_skip_and_the_run_goes_on(checkpoints, tmp_path, test_models):
    path = tmp_path / "hostile.jsonl"
    bad = {**TOY_ROWS[0], "id": "bad", "context": "Paris \ud800 France"}  # valid JSON text ("\\ud800"), untokenizable
    path.write_text(json.dumps(bad) + "\n" + json.dumps(TOY_ROWS[1]) + "\n")
    assert evaluate.main(eval_argv(checkpoints, path, tmp_path / "out", 2)) == 0
    df = rows(tmp_path / "out")
    assert set(df.loc[df["id"] == "q1", "condition"]) == {"native", "no_context", "mot", "random"}
    skipped = df[df["condition"] == "skipped"]
    reason = "ContextError: The text holds a lone surrogate"  # named, not a TypeError from the tokenizer
    assert list(skipped["id"]) == ["bad"] and skipped["error"].iloc[0].startswith(reason)
    meta = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert meta["skipped"] == 1 and meta["skipped_examples"][0]["id"] == "bad"
    assert "Skipped examples: 1." in (tmp_path / "out" / "summary.md").read_text()
    assert f"* skipped hostile/jsonl bad: {reason}" in (tmp_path / "out" / "summary.md").read_text()


def test_context_past_the_source_limit_names_the_source():
    source = tiny_model("gpt2", vocab_size=280, max_positions=32, name="tiny-gpt2-32")
    target = tiny_model("llama", seed=1, max_positions=1024)
    mot = MoT.build(source.spec, target.spec, Channels((2, 3), (2, 3)), dim=16, heads=2)
    with pytest.raises(ContextError, match=r"source model 'tiny-gpt2-32', which allows at most 32\. Shorten the "
                                           r"context \(python -m mot_viz.eval.evaluate: lower --max_context_tokens\)"):
        translate(mot, source, target, CORPUS[0] + " " + CORPUS[1])


def test_question_past_the_target_limit_names_the_target():
    target = tiny_model("llama", max_positions=64, name="tiny-llama-64")
    example = QAExample("long", "toy", CORPUS[0][:30], " ".join(CORPUS[1:3]), ("x",))
    kv = native_cache(target, target_context_ids(target, example.context))
    for cache in (kv, None):  # the question alone is too long, too
        with pytest.raises(ContextError, match=r"target model 'tiny-llama-64' allows at most 64 tokens\. Shorten "
                                               r"the context or the question .*--max_context_tokens or --max_new_tokens"):
            answer_from_cache(target, cache, example, "native", max_new_tokens=4)
    short = QAExample("short", "toy", example.context, "Where?", ("x",))
    assert answer_from_cache(target, kv, short, "native", max_new_tokens=4).text is not None


# --- torn results, refused runs ----------------------------------------------------------------------------------

def sorted_rows(out) -> pd.DataFrame:
    """rows(out) in one order: an example computed again comes last in the file."""
    return rows(out).sort_values(["dataset", "id", "condition"]).reset_index(drop=True)


@pytest.fixture()
def warnings():
    """What mot_viz.eval.results_folder logs (the mot_viz logger prints on stderr and does not propagate)."""
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger(results_folder.__name__)
    logger.addHandler(handler)
    yield messages
    logger.removeHandler(handler)


def _cut_last_row(text: str) -> str:
    return text[: text.rstrip("\n").rindex("\n") + 30]  # the header and rows before it whole, the last row cut


def _drop_fields(text: str) -> str:
    lines = text.split("\n")
    lines[3] = lines[3].rsplit(",", 4)[0]  # a row in the middle missing its last fields
    return "\n".join(lines)


def _garble_score(text: str) -> str:
    lines = text.split("\n")
    fields = lines[5].split(",")
    fields[3] = "0.9x"  # a non-numeric metric
    lines[5] = ",".join(fields)
    return "\n".join(lines)


@pytest.mark.parametrize("damage", [_cut_last_row, _drop_fields, _garble_score,
                                    lambda text: text[:20], lambda text: ""])  # the header cut, nothing written
def test_resume_computes_again_the_examples_of_a_torn_results_file(checkpoints, data, tmp_path, test_models, warnings,
                                                                    damage):
    assert evaluate.main(eval_argv(checkpoints, data, tmp_path / "whole", 3)) == 0
    assert evaluate.main(eval_argv(checkpoints, data, tmp_path / "part", 3)) == 0
    table = tmp_path / "part" / "examples.csv"
    table.write_text(damage(table.read_text()))  # as a run killed while writing it in place left it
    assert evaluate.main(eval_argv(checkpoints, data, tmp_path / "part", 3, "--resume")) == 0
    pd.testing.assert_frame_equal(sorted_rows(tmp_path / "part"), sorted_rows(tmp_path / "whole"))
    means = [json.loads((tmp_path / out / "summary.json").read_text())["summary"] for out in ("whole", "part")]
    assert [r["mean"] for r in means[0]] == [r["mean"] for r in means[1]]
    assert len(warnings) == 1 and f"{table} was cut short or damaged" in warnings[0]
    assert "computed again" in warnings[0]


@pytest.mark.parametrize("content, problem", [(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\xff", "binary data"),
                                               (b"\xff\xfe\xfa garbage\n", "binary data"),
                                               (b"name,value\nx,1\n", "has the columns name, value")])
def test_resume_refuses_a_results_file_that_is_not_a_results_table(capsys, checkpoints, data, tmp_path, test_models,
                                                                   content, problem):
    out = tmp_path / "out"
    assert evaluate.main(eval_argv(checkpoints, data, out, 1)) == 0
    (out / "examples.csv").write_bytes(content)
    capsys.readouterr()
    err = cli_error(capsys, checkpoints, data, out, "--n", "2", "--max_new_tokens", "2", "--bootstrap", "20",
                    "--resume")
    assert err.startswith(f"error: ConfigError: {out / 'examples.csv'} ") and problem in err
    assert "Move it away (or pass another --out folder) and run again without --resume." in err
    assert (out / "examples.csv").read_bytes() == content  # never overwritten by a refused run


KILLED_WHILE_WRITING = """
import builtins, io, os, signal, sys
from mot_viz.engine.testing import load_test_model
from mot_viz.eval import evaluate

evaluate.load_model = load_test_model
real_open, opened = io.open, []

class Dying:  # writes half of what it is given, then the process is killed (SIGKILL: no cleanup runs)
    def __init__(self, file):
        self.file = file
    def write(self, data):
        self.file.write(data[: len(data) // 2])
        self.file.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    def __getattr__(self, name):
        return getattr(self.file, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.file.close()

def dying_open(file, mode="r", *args, **kwargs):
    handle = real_open(file, mode, *args, **kwargs)
    if "w" in mode and os.path.basename(str(file)).startswith("examples.csv"):
        opened.append(file)
        if len(opened) == 2:  # the second write of the results: the first one is whole on disk
            return Dying(handle)
    return handle

builtins.open = io.open = dying_open
sys.exit(evaluate.main(sys.argv[1:]))
"""


def test_a_run_killed_while_writing_its_results_resumes_to_the_same_rows(checkpoints, data, tmp_path, test_models):
    assert evaluate.main(eval_argv(checkpoints, data, tmp_path / "whole", 3)) == 0
    out = tmp_path / "part"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(evaluate.__file__).parents[2])}
    killed = subprocess.run([sys.executable, "-c", KILLED_WHILE_WRITING, *eval_argv(checkpoints, data, out, 3)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(rows(out)) == 12  # the results written before the kill, whole: 3 examples x 4 conditions
    assert evaluate.main(eval_argv(checkpoints, data, out, 3, "--resume")) == 0
    # the killed run computed on one thread, the whole one on this process's threads: sums may differ in the last bit
    numbers = ["score", "kv_cosine", "context_tokens"]
    kept, whole = rows(out), rows(tmp_path / "whole")
    pd.testing.assert_frame_equal(kept.drop(columns=numbers), whole.drop(columns=numbers))
    pd.testing.assert_frame_equal(kept[numbers].replace("", "nan").astype(float),
                                  whole[numbers].replace("", "nan").astype(float), check_exact=False, rtol=1e-6)
    assert not list(out.glob("*.tmp-*"))  # the killed writer's half-written file was removed


@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_a_run_refused_for_its_device_creates_nothing(capsys, checkpoints, data, tmp_path, no_models, monkeypatch,
                                                      device):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has the CUDA device")
    monkeypatch.setenv("MOT_VIZ_DEVICE", device)
    out = tmp_path / "results" / "out"
    err = cli_error(capsys, checkpoints, data, out)
    assert err.startswith(f"error: ModelLoadError: Device '{device}'")
    assert not (tmp_path / "results").exists()


def test_a_run_refused_for_a_model_that_does_not_load_creates_nothing(capsys, checkpoints, data, tmp_path,
                                                                      test_models):
    moved = tmp_path / "checkpoint"
    shutil.copytree(checkpoints["smollm2-to-gemma3"], moved)
    config = json.loads((moved / "config.json").read_text())
    config["source"]["name"] = "no-such-model"
    (moved / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    err = cli_error(capsys, {"smollm2-to-gemma3": moved}, data, out)
    assert err.startswith("error: ModelLoadError: Cannot load model 'no-such-model'")
    assert not out.exists()


# --- the results folder: every evaluation command --------------------------------------------------------------------


COMMANDS = {  # a quick run of each command: (module, its arguments but --out)
    "evaluate": (evaluate, lambda ck, data: ["--checkpoint", str(ck["smollm2-to-gemma3"]), "--datasets", str(data),
                                             "--n", "1", "--max_new_tokens", "2", "--bootstrap", "20"]),
    "long_context": (long_context, lambda ck, data: ["--checkpoint", str(ck["smollm2-to-gemma3"]), "--linear",
                                                     str(ck["smollm2-to-gemma3-linear"]), "--budgets", "900", "--n", "1",
                                                     "--max_new_tokens", "2", "--bootstrap", "20"]),
    "conversation": (conversation, lambda ck, data: ["--checkpoint", str(ck["smollm2-to-gemma3"]), "--n", "1",
                                                     "--turns", "2", "--max_story_tokens", "3000",
                                                     "--max_new_tokens", "2", "--bootstrap", "20"]),
    "shards": (shards, lambda ck, data: ["--checkpoint", str(ck["smollm2-to-gemma3"]), "--budget", "1500",
                                         "--shards", "2", "--n", "1", "--max_new_tokens", "2", "--bootstrap", "20"]),
}


def _loading_refused(name):
    raise ModelLoadError(f"a model ({name}) was loaded: the folder checks passed")


def command_error(capsys, monkeypatch, command, checkpoints, data, out, *extra) -> str:
    """The one-line error of a command whose arguments are refused (status 2) before any model loads."""
    module, argv = COMMANDS[command]
    monkeypatch.setattr(module, "load_model", _loading_refused)
    assert module.main([*argv(checkpoints, data), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    return err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_refuses_an_out_that_is_a_file_before_loading(capsys, monkeypatch, checkpoints, data, tmp_path,
                                                                    command):
    out = tmp_path / "results.txt"
    out.write_text("not a folder")
    err = command_error(capsys, monkeypatch, command, checkpoints, data, out)
    assert err.startswith(f"error: ConfigError: --out {out} is a file. Pass a folder")
    err = command_error(capsys, monkeypatch, command, checkpoints, data, out / "inside")
    assert f"lies inside the file {out}" in err
    assert out.read_text() == "not a folder" and sorted(p.name for p in tmp_path.iterdir()) == ["results.txt", "toy.jsonl"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders, so chmod cannot make one")
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_refuses_a_read_only_out_before_loading(capsys, monkeypatch, checkpoints, data, tmp_path,
                                                              command):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        err = command_error(capsys, monkeypatch, command, checkpoints, data, locked / "out")
    finally:
        locked.chmod(0o700)
    assert err.startswith("error: ConfigError: Cannot write into --out") and not (locked / "out").exists()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_folder_of_a_users_files_is_written_into_only_with_overwrite(capsys, monkeypatch, checkpoints, data,
                                                                       tmp_path, command):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "examples.csv").write_text("my,own\n1,2\n")
    (out / "summary.md").write_text("my notes\n")
    for extra in ([], ["--resume"]):
        err = command_error(capsys, monkeypatch, command, checkpoints, data, out, *extra)
        assert err.startswith(f"error: ConfigError: --out {out} holds files that are not results of this python -m "
                              f"mot_viz.eval.{command} run (examples.csv, summary.md)")
        assert "Pass a new or empty folder, or --overwrite" in err
    assert (out / "examples.csv").read_text() == "my,own\n1,2\n" and (out / "summary.md").read_text() == "my notes\n"
    err = command_error(capsys, monkeypatch, command, checkpoints, data, out, "--overwrite", "--resume")
    assert "--resume keeps the results --out holds and --overwrite replaces them. Pass one of them." in err
    err = command_error(capsys, monkeypatch, command, checkpoints, data, out, "--overwrite")
    assert "the folder checks passed" in err  # refused by the stand-in loader: --overwrite passed the folder


def test_overwrite_replaces_a_users_results_files(checkpoints, data, tmp_path, test_models):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "examples.csv").write_text("my,own\n1,2\n")
    (out / "notes.txt").write_text("kept\n")
    assert evaluate.main(eval_argv(checkpoints, data, out, 1, "--overwrite")) == 0
    assert len(rows(out)) == 4 and (out / "notes.txt").read_text() == "kept\n"


@pytest.mark.parametrize("command, other", [("long_context", "conversation"), ("shards", "long_context"),
                                            ("conversation", "evaluate"), ("evaluate", "shards")])
def test_resume_into_another_evaluations_folder_says_so(capsys, monkeypatch, checkpoints, data, tmp_path, command,
                                                        other):
    out = tmp_path / "other"
    out.mkdir()
    (out / "examples.csv").write_text("id,condition\nx,native\n")
    (out / "summary.json").write_text(json.dumps({"settings": {"checkpoint": "x", "n": 1}}))
    (out / "summary.md").write_text(f"Command: `python -m mot_viz.eval.{other} --checkpoint x --out {out}`\n")
    for extra in (["--resume"], []):
        err = command_error(capsys, monkeypatch, command, checkpoints, data, out, *extra)
        assert err.startswith(f"error: ConfigError: --out {out} holds the results of another evaluation (python -m "
                              f"mot_viz.eval.{other}), not of python -m mot_viz.eval.{command}")
        assert ("--resume cannot continue them" in err) == bool(extra) and "--overwrite to replace them" in err


@pytest.mark.parametrize("command, flags, message", [
    ("long_context", ["--max_new_tokens", "100000"], "answers of up to 100000 tokens leave no room for a document"),
    ("shards", ["--max_new_tokens", "100000"], "answers of up to 100000 tokens leave no room for a document"),
    ("conversation", ["--max_new_tokens", "100000"], "Lower --max_new_tokens, --max_story_tokens or --turns."),
    ("evaluate", ["--max_new_tokens", "100000"], "--max_new_tokens 100000 with --max_context_tokens 448 leaves no room"),
    ("long_context", ["--budgets", "900", "900"], "--budgets takes distinct numbers of target tokens"),
    ("long_context", ["--budgets", "32"], "of at least 64"),
    ("shards", ["--shards", "1000"], "--shards 1000: a 1500-token document holds far fewer paragraphs"),
])
def test_settings_no_run_can_use_are_refused_in_plain_words(capsys, monkeypatch, checkpoints, data, tmp_path, command,
                                                            flags, message):
    err = command_error(capsys, monkeypatch, command, checkpoints, data, tmp_path / "out", *flags)
    assert err.startswith("error: ConfigError: ") and message in err
    assert not re.search(r"(?<![\w/])-\d", err)  # no negative number of tokens (a name may hold "-2")
    assert not (tmp_path / "out").exists()


def _cut_last_line(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: text.rstrip("\n").rindex("\n") + 25])  # the last row cut short


@pytest.mark.parametrize("command", ["long_context", "conversation", "shards"])
def test_resume_computes_again_a_unit_whose_row_was_cut(monkeypatch, checkpoints, data, tmp_path, warnings, command):
    module, argv = COMMANDS[command]
    monkeypatch.setattr(module, "load_model", load_test_model)
    out = tmp_path / "out"
    assert module.main([*argv(checkpoints, data), "--out", str(out)]) == 0
    whole = pd.read_csv(out / "examples.csv")
    _cut_last_line(out / "examples.csv")
    computed = []
    name = "conversation_rows" if command == "conversation" else "document_rows"
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: computed.append(1) or real(*a, **k))
    assert module.main([*argv(checkpoints, data), "--out", str(out), "--resume"]) == 0
    again = pd.read_csv(out / "examples.csv")
    assert computed == [1] and len(again) == len(whole)  # the one unit, whose last row was cut, computed again
    assert list(again["condition"]) == list(whole["condition"]) and again["id"].nunique() == 1
    assert any("was cut short or damaged" in w for w in warnings)


def long_jsonl(path: Path, contexts: dict[str, str]) -> Path:
    return write_jsonl(path, [{"id": i, "context": c, "question": "Where is the tower?", "answers": ["Paris"]}
                              for i, c in contexts.items()])


def long_argv(checkpoints, source, out, budget=300) -> list[str]:
    return ["--checkpoint", str(checkpoints["smollm2-to-gemma3"]), "--linear", str(checkpoints["smollm2-to-gemma3-linear"]),
            "--source", str(source), "--budgets", str(budget), "--n", "2", "--max_new_tokens", "2", "--bootstrap", "20",
            "--out", str(out)]


def test_a_document_shorter_than_the_budget_is_a_counted_skip_never_filed_under_it(monkeypatch, checkpoints, tmp_path):
    monkeypatch.setattr(long_context, "load_model", load_test_model)
    source = long_jsonl(tmp_path / "docs.jsonl", {"long": " ".join(CORPUS * 6), "short": CORPUS[0]})
    out = tmp_path / "out"
    assert long_context.main(long_argv(checkpoints, source, out)) == 0
    df = pd.read_csv(out / "examples.csv")
    skipped = df[df["condition"] == "skipped"]
    assert list(skipped["id"]) == ["short"] and set(df.loc[df["condition"] != "skipped", "id"]) == {"long"}
    reason = skipped["error"].iloc[0]
    assert re.match(r"ContextError: document short is \d+ target tokens long, shorter than the budget 300", reason)
    meta = json.loads((out / "summary.json").read_text())
    assert [s["id"] for s in meta["skipped"]] == ["short"] and meta["summary"][0]["n"] == 1
    md = (out / "summary.md").read_text()
    assert "Skipped documents: 1." in md and f"* skipped 300 tokens short: {reason}" in md


def test_a_run_whose_every_document_is_skipped_fails_with_the_reason(capsys, monkeypatch, checkpoints, tmp_path):
    monkeypatch.setattr(long_context, "load_model", load_test_model)
    source = long_jsonl(tmp_path / "docs.jsonl", {"short": CORPUS[0]})
    assert long_context.main(long_argv(checkpoints, source, tmp_path / "out")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ContextError: all documents (1) were skipped, so there is nothing to report (the "
                          "first: ContextError: document short is")
    assert (tmp_path / "out" / "summary.md").is_file()  # the skip and its reason are written


def test_a_jsonl_with_bad_rows_gets_advice_that_exists(capsys, monkeypatch, checkpoints, tmp_path):
    monkeypatch.setattr(long_context, "load_model", load_test_model)
    source = long_jsonl(tmp_path / "docs.jsonl", {"long": " ".join(CORPUS * 6)})
    source.write_text(source.read_text() + "{not json\n")
    assert long_context.main(long_argv(checkpoints, source, tmp_path / "out")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: DataFormatError: ") and err.endswith("Fix or delete those lines.")
    assert "strict" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(DataFormatError, match="Fix those lines: no line holds a usable example.$"):
        load_dataset(str(bad))


def test_a_folder_of_an_earlier_version_and_its_derived_files_still_resume(checkpoints, data, tmp_path, test_models):
    out = tmp_path / "out"
    assert evaluate.main(eval_argv(checkpoints, data, out, 1)) == 0
    md = out / "summary.md"
    md.write_text(md.read_text().replace("python -m mot_viz.eval.evaluate", "python -m mot_viz.evaluate", 1))
    (out / "costs.md").write_text("what python -m mot_viz.eval.costs reads from these results\n")
    assert evaluate.main(eval_argv(checkpoints, data, out, 2, "--resume")) == 0
    assert rows(out)["id"].nunique() == 2


def test_a_carriage_return_in_a_text_field_keeps_its_row_whole(tmp_path):
    """A model may write "\\r" in an answer or a message: the results' CSV files keep one row per row, read back by
    pandas and by the --resume reader alike."""
    from mot_viz.fsutil import write_csv_atomic

    frame = pd.DataFrame({"id": ["a", "b", "c"], "answer": ["one\rtwo", "three\r\nfour", None], "score": [0.5, 1.0, 0.0]})
    write_csv_atomic(tmp_path / "examples.csv", frame)
    back = pd.read_csv(tmp_path / "examples.csv")
    assert list(back["id"]) == ["a", "b", "c"] and list(back["score"]) == [0.5, 1.0, 0.0]
    assert list(back["answer"][:2]) == ["one\ntwo", "three\nfour"] and pd.isna(back["answer"][2])
    with open(tmp_path / "examples.csv", newline="") as handle:
        assert len(list(csv.reader(handle))) == 4


def test_ctrl_c_stops_a_command_started_with_sigint_ignored():
    """A command started by a background job of a shell without job control inherits SIGINT ignored (the app's
    Stop button sends SIGINT): run_cli still turns it into exit status 130, and gives the disposition back."""
    from mot_viz.cli import run_cli

    def body():
        signal.raise_signal(signal.SIGINT)  # delivered before the next bytecode runs
        return 0

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert run_cli(body) == 130
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


# --- a NUL character in a text field ----------------------------------------------------------------------------------


def nul_jsonl(path: Path, n: int = 3) -> Path:
    """Open questions whose gold answers hold NUL: valid JSON ("Paris\\u0000"), so a user's file may hold them."""
    return write_jsonl(path, [{"id": f"q{i}", "context": CORPUS[i % 3], "question": "Which city is it?",
                               "answers": ["Paris\u0000", f"city\u0000{i}"]} for i in range(n)])


def test_a_nul_in_the_answers_is_text_through_an_interrupted_run_resume_and_paired_runs(checkpoints, tmp_path,
                                                                                         test_models, monkeypatch,
                                                                                         capsys):
    from scripts.paired_runs import main as paired_runs_main

    from mot_viz.analysis import eval_runs

    data = nul_jsonl(tmp_path / "nul.jsonl")
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert evaluate.main(eval_argv(checkpoints, data, whole, 3)) == 0
    example_rows = evaluate.example_rows
    second = load_dataset(str(data), n=3)[1].id

    def interrupted(*args, **kwargs):
        if args[3].id == second:
            raise KeyboardInterrupt
        return example_rows(*args, **kwargs)

    monkeypatch.setattr(evaluate, "example_rows", interrupted)
    assert evaluate.main(eval_argv(checkpoints, data, part, 3)) == 130
    monkeypatch.setattr(evaluate, "example_rows", example_rows)
    raw = (part / "examples.csv").read_bytes()
    assert b"\x00" not in raw and "Paris\ufffd | city\ufffd" in raw.decode()  # written as text, NUL as U+FFFD
    # a folder an earlier version wrote holds the NUL itself: it is text too, and resumes
    (part / "examples.csv").write_bytes(raw.replace("\ufffd".encode(), b"\x00"))
    assert evaluate.main(eval_argv(checkpoints, data, part, 3, "--resume")) == 0
    pd.testing.assert_frame_equal(rows(part), rows(whole))
    assert b"\x00" not in (part / "examples.csv").read_bytes()

    (whole / "examples.csv").write_bytes((whole / "examples.csv").read_bytes().replace("\ufffd".encode(), b"\x00"))
    for folder, nul in ((part, "\ufffd"), (whole, "\x00")):  # both open as results
        run = eval_runs.open_run(folder)
        assert set(run.rows["gold"]) == {f"Paris{nul} | city{nul}{i}" for i in range(3)}
    capsys.readouterr()
    assert paired_runs_main([f"{part}:mot=resumed", f"{whole}:mot=whole", "--pairs", "resumed:whole"]) == 0
    assert "| nul/jsonl | resumed − whole | 3 |" in capsys.readouterr().out  # the three examples, paired
    assert paired_runs_main([f"{part}:native=resumed", f"{whole}:native=whole", "--against", "whole"]) == 0
    assert "native scores against" in capsys.readouterr().out


def test_only_a_binary_start_makes_a_results_table_binary():
    assert results_folder.binary_start(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert results_folder.binary_start(b"id\x00,condition\nq0,native\n")
    assert not results_folder.binary_start(b"id,answer\nq0,Paris\x00\n")
    assert not results_folder.binary_start("id,réponse".encode()[:-1])  # a character cut at the probe's end
    assert results_folder.table_text(b"id,answer\nq0,Paris\x00\n") == "id,answer\nq0,Paris\x00\n"
    assert results_folder.table_text(b"id,answer\nq0,\xff\xfe\n") is None


def test_a_nul_in_an_id_is_a_malformed_line(tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text(json.dumps({"id": "q\u0000", "context": "c", "question": "q?", "answers": ["a"]}) + "\n"
                    + json.dumps({"id": "q1", "context": "c", "question": "q?", "answers": ["a"]}) + "\n")
    loaded = load_jsonl(path)
    assert [e.id for e in loaded.examples] == ["q1"] and loaded.errors == [(1, "'id' holds a NUL character (\\u0000); "
                                                                               "remove it")]


def test_paired_runs_refuses_runs_of_two_model_pairs_in_one_line(checkpoints, data, tmp_path, test_models, capsys):
    from scripts.paired_runs import main as paired_runs_main

    forward, backward = tmp_path / "forward", tmp_path / "backward"
    assert evaluate.main(eval_argv(checkpoints, data, forward, 2)) == 0
    assert evaluate.main(eval_argv({"smollm2-to-gemma3": checkpoints["gemma3-to-smollm2"]}, data, backward, 2)) == 0
    capsys.readouterr()
    for how in (["--against", "b"], ["--pairs", "a:b"]):
        assert paired_runs_main([f"{forward}:native=a", f"{backward}:native=b", *how]) == 2
        captured = capsys.readouterr()
        assert not captured.out and captured.err.count("\n") == 1
        assert captured.err.startswith("error: ResultsFolderError: These runs are of different model pairs (forward: ")
        assert "Compare runs of one pair" in captured.err


def test_paired_runs_says_first_when_the_runs_hold_different_examples(checkpoints, data, tmp_path, test_models, capsys):
    from scripts.paired_runs import main as paired_runs_main

    two, three = tmp_path / "two", tmp_path / "three"
    assert evaluate.main(eval_argv(checkpoints, data, two, 2)) == 0
    assert evaluate.main(eval_argv(checkpoints, data, three, 3)) == 0
    capsys.readouterr()
    for how in (["--against", "b"], ["--pairs", "a:b"]):
        assert paired_runs_main([f"{two}:mot=a", f"{three}:mot=b", *how]) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert first == ("The runs hold different examples (a 2, b 3): 2 of the 3 are in every one, and the tables are "
                         "over the examples the runs compared share. Runs of the same dataset, n and seed hold the "
                         "same examples.")
    assert paired_runs_main([f"{three}:native=a", f"{three}:mot=b", "--pairs", "a:b"]) == 0
    assert capsys.readouterr().out.startswith("| dataset |")  # the same examples: no note
