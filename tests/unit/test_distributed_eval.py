"""Every evaluation spread over two real CPU processes (torchrun, gloo) writes, row for row, the files one process
writes (layer_error.csv too), and --resume continues a spread run that was interrupted, with one process or two
(mot_viz.eval.processes).

The processes run the evaluations' own main() on the tiny test models (a worker script swaps load_model for
load_test_model, as the in-process runs' monkeypatch does); only measured seconds and memory differ between runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import CORPUS
from mot_viz.data.eval_data import load_dataset
from mot_viz.engine.testing import load_test_model
from mot_viz.eval import conversation, evaluate, long_context, shards

ROOT = Path(__file__).resolve().parents[2]
MODULES = {"evaluate": evaluate, "long_context": long_context, "conversation": conversation, "shards": shards}
# the worker: the evaluation's main() on the tiny test models; the example whose id is $STOP_AT interrupts its process
WORKER = """
import os, sys
from mot_viz.engine.testing import load_test_model
from mot_viz.eval import evaluate
module = __import__("mot_viz.eval." + sys.argv[1], fromlist=["main"])
module.load_model = load_test_model
rows = evaluate.example_rows
def example_rows(*args, **kwargs):
    if args[3].id == os.environ.get("STOP_AT"):
        raise KeyboardInterrupt
    return rows(*args, **kwargs)
evaluate.example_rows = example_rows
sys.exit(module.main(sys.argv[2:]))
"""
# what differs between any two runs: time and memory measured, and the tables made of them
MEASURED = re.compile(r"seconds|prefill|alignment|translator|replay|rss|RSS|target side")

ROWS = [{"id": f"q{i}", "context": CORPUS[i % 3], "question": "Is it so?", "choices": ["yes", "no"], "label": i % 2}
        for i in range(3)]
ROWS += [{"id": f"e{i}", "context": CORPUS[i % 3], "question": "What is it?", "answers": [CORPUS[i % 3].split()[2]]}
         for i in range(3)]


@pytest.fixture()
def data(toy_jsonl) -> Path:
    return toy_jsonl(ROWS)


def argv(name: str, checkpoints, data: Path | None, out: Path, *extra: str) -> list[str]:
    checkpoint = ["--checkpoint", str(checkpoints["smollm2-to-gemma3"])]
    return [*checkpoint, *{
        "evaluate": ["--datasets", str(data), "--n", "6", "--max_new_tokens", "2", "--layer_error"],
        "long_context": ["--linear", str(checkpoints["smollm2-to-gemma3-linear"]), "--source", "stacks", "--budgets",
                         "900", "--n", "3", "--max_new_tokens", "3", "--layer_error"],
        "conversation": ["--n", "3", "--turns", "2", "--max_new_tokens", "3", "--max_story_tokens", "3000"],
        "shards": ["--budget", "1500", "--shards", "2", "3", "--n", "3", "--max_new_tokens", "3"],
    }[name], "--bootstrap", "20", "--out", str(out), *extra]


def spread(tmp_path: Path, name: str, args: list[str], processes: int = 2,
           stop_at: str = "") -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc_per_node <processes>` of the evaluation's main(), to its end."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "STOP_AT": stop_at}
    env.pop("MOT_VIZ_DEVICE", None)
    # "--" keeps torchrun from reading the evaluation's --n as an abbreviation of one of its own options
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(processes), str(worker), "--", name, *args], env=env, capture_output=True, text=True,
                          timeout=600)


def one_process(name: str, args: list[str], monkeypatch, capsys) -> str:
    """The evaluation's main() in this process, on one thread as each torchrun process (OMP_NUM_THREADS=1): float
    sums then run in the same order, whatever this machine's thread count; returns what it printed."""
    monkeypatch.setattr(MODULES[name], "load_model", load_test_model)
    capsys.readouterr()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert MODULES[name].main(args) == 0
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().out


def table(path: Path) -> pd.DataFrame:
    """A CSV exactly as written (every field a string), without the columns of measured time and memory."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    return df.drop(columns=[c for c in df.columns if MEASURED.search(c)])


def assert_same_results(out: Path, reference: Path) -> None:
    """out holds the files reference holds, equal but for measured time and memory, and no part file."""
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())
    for csv in sorted(reference.glob("*.csv")):
        pd.testing.assert_frame_equal(table(out / csv.name), table(csv), obj=csv.name)
    ours, theirs = (json.loads((folder / "summary.json").read_text()) for folder in (out, reference))
    assert ours["settings"] == theirs["settings"]


@pytest.mark.parametrize("name", list(MODULES))
def test_two_processes_write_the_files_of_one(name, checkpoints, data, tmp_path, monkeypatch, capsys):
    printed = one_process(name, argv(name, checkpoints, data, tmp_path / "one"), monkeypatch, capsys)
    run = spread(tmp_path, name, argv(name, checkpoints, data, tmp_path / "two"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert_same_results(tmp_path / "two", tmp_path / "one")
    # only rank 0 prints the tables: once, as one process does
    assert run.stdout.count("|---") == printed.count("|---") > 0


@pytest.mark.parametrize("processes", [1, 2])
def test_resume_after_an_interrupted_process_equals_a_whole_run(processes, checkpoints, data, tmp_path, monkeypatch,
                                                                capsys):
    one_process("evaluate", argv("evaluate", checkpoints, data, tmp_path / "whole"), monkeypatch, capsys)
    examples = [e.id for e in load_dataset(str(data), n=6, seed=0)]
    out = tmp_path / "part"
    # rank 1's share is the 2nd, 4th and 6th example: it stops at its second, and torchrun stops rank 0
    stopped = spread(tmp_path, "evaluate", argv("evaluate", checkpoints, data, out), stop_at=examples[3])
    assert stopped.returncode != 0 and not (out / "examples.csv").exists()
    parts = {p.name: pd.read_csv(p, dtype=str, keep_default_na=False) for p in (out / ".parts").glob("*.csv")}
    assert list(parts["rank-1-of-2.csv"]["id"].unique()) == [examples[1]]  # whole examples only
    kept = {i for part in parts.values() for i in part["id"]}
    assert kept <= set(examples[0::2]) | {examples[1]}
    if processes == 1:
        computed = []
        real = evaluate.example_rows
        monkeypatch.setattr(evaluate, "example_rows", lambda *a, **k: computed.append(a[3].id) or real(*a, **k))
        one_process("evaluate", argv("evaluate", checkpoints, data, out, "--resume"), monkeypatch, capsys)
        assert sorted(computed) == sorted(set(examples) - kept)  # the parts' examples count as done
    else:
        run = spread(tmp_path, "evaluate", argv("evaluate", checkpoints, data, out, "--resume"))
        assert run.returncode == 0, run.stderr[-3000:]
    assert_same_results(out, tmp_path / "whole")
