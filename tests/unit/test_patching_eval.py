"""python -m mot_viz.eval.patching: the scan per example of a results folder, on the tiny test pair — the rows the
library computes, kept across --resume, and the same rows from two processes (torchrun, gloo) as from one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import CORPUS
from mot_viz.data.eval_data import load_dataset
from mot_viz.data.long_context import DEPTHS, long_examples
from mot_viz.engine import hf
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.mot import translate
from mot_viz.engine.patching import layer_groups, patch
from mot_viz.engine.prompts import build_prompt
from mot_viz.engine.testing import load_test_model
from mot_viz.eval import evaluate, long_context, patching
from mot_viz.sharing.linear import linear_cache
from mot_viz.eval.long_settings import LongSettings
from mot_viz.eval.results_folder import check_results_folder
from mot_viz.errors import CheckpointError, ConfigError
from tolerance import close

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"id": f"e{i}", "context": CORPUS[i % 3], "question": "What is it?", "answers": [CORPUS[i % 3].split()[3]]}
        for i in range(4)]
WORKER = """
import sys
from mot_viz.engine.testing import load_test_model
from mot_viz.eval import patching
patching.load_model = load_test_model
sys.exit(patching.main(sys.argv[1:]))
"""


@pytest.fixture()
def folder(checkpoints, toy_jsonl, tmp_path, monkeypatch) -> Path:
    """An evaluate results folder of 4 extractive toy examples on the tiny pair."""
    monkeypatch.setattr(evaluate, "load_model", load_test_model)
    monkeypatch.setattr(patching, "load_model", load_test_model)
    data = toy_jsonl(ROWS)
    out = tmp_path / "run"
    assert evaluate.main(["--checkpoint", str(checkpoints["smollm2-to-gemma3"]), "--datasets", str(data), "--n", "4",
                          "--conditions", "native", "mot", "--max_new_tokens", "2", "--bootstrap", "20", "--out",
                          str(out)]) == 0
    return out


def args(folder: Path, checkpoints, *extra: str) -> list[str]:
    return [str(folder), "--methods", "mot", "linear", "--linear", str(checkpoints["smollm2-to-gemma3-linear"]),
            *extra]


def written(folder: Path) -> pd.DataFrame:
    return pd.read_csv(folder / patching.PATCHING_FILE, dtype=str, keep_default_na=False)


def one_process(argv: list[str]) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun process (OMP_NUM_THREADS=1): float sums in the same order
    try:
        assert patching.main(argv) == 0
    finally:
        torch.set_num_threads(threads)


def test_the_rows_are_the_librarys_scan_of_each_example(folder, checkpoints):
    one_process(args(folder, checkpoints, "--n", "2"))
    table = pd.read_csv(folder / patching.PATCHING_FILE, dtype={"id": str})
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    examples = load_dataset(str(folder.parent / "toy.jsonl"), n=4)  # the evaluation's order: the first two scanned
    assert list(table.id.unique()) == [e.id for e in examples[:2]] and set(table.method) == {"mot", "linear"}
    layers = target.spec.num_layers
    groups = layer_groups(target.spec, load_checkpoint(checkpoints["smollm2-to-gemma3"], source,
                                                                 target)[0].channels.target_layers)
    assert len(table) == 2 * 2 * 2 * (layers + len(groups))  # examples × methods × directions × (layers + groups)
    mot = load_checkpoint(checkpoints["smollm2-to-gemma3"], source, target)[0]
    linear = load_checkpoint(checkpoints["smollm2-to-gemma3-linear"], source, target)[0]
    example = examples[1]
    translation = translate(mot, source, target, build_prompt(example, target.chat_frame).context_text)
    question, answer = patching.gold_question(target, example)
    kv = linear_cache(mot, linear, source, target, translation)
    mine = table[(table.id == example.id) & (table.method == "linear")].set_index(["direction", "target"])
    assert close(mine.translated.iloc[0], hf.continuation_logprob(target.model, kv, question, answer), rtol=1e-5)
    restored = patch(kv, translation.native_kv, [3])
    assert close(mine.loc[("restore", "layer 3"), "logprob"],
                 hf.continuation_logprob(target.model, restored, question, answer), rtol=1e-5)
    # each layer's row carries that layer's K/V error; below the window the linear map's replay is the MoT's
    assert mine.loc[("restore", "layer 3"), "K_rel_l2"] > 1e-3 and pd.isna(mine.loc[("restore", "window"), "K_rel_l2"])


def test_resume_keeps_the_examples_done_and_equals_a_whole_run(folder, checkpoints, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    import shutil

    shutil.copytree(folder, whole)
    one_process(args(whole, checkpoints))
    calls = []
    scan = patching.scan_example

    def interrupted(*a, **k):
        calls.append(a[3].id)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return scan(*a, **k)

    monkeypatch.setattr(patching, "scan_example", interrupted)
    assert patching.main(args(folder, checkpoints)) == 130
    assert written(folder).id.nunique() == 2
    with pytest.raises(ConfigError, match="pass --resume to continue it"):
        patching.record(folder, ["mot", "linear"], options={"linear": str(checkpoints["smollm2-to-gemma3-linear"])})
    with pytest.raises(ConfigError, match="pass the same options to --resume"):
        patching.record(folder, ["mot"], resume=True)
    calls.clear()
    monkeypatch.setattr(patching, "scan_example", scan)
    one_process(args(folder, checkpoints, "--resume"))
    pd.testing.assert_frame_equal(written(folder), written(whole))


def test_two_processes_write_the_rows_of_one(folder, checkpoints, tmp_path):
    two = tmp_path / "two"
    import shutil

    shutil.copytree(folder, two)
    one_process(args(folder, checkpoints))
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("MOT_VIZ_DEVICE", None)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          str(worker), "--", *args(two, checkpoints)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    pd.testing.assert_frame_equal(written(two), written(folder))
    assert not (two / ".parts").exists()


def test_bad_input_is_one_line_before_any_model_loads(folder, tmp_path, checkpoints):
    with pytest.raises(ConfigError, match="'relay' has no cache of the context to patch"):
        patching.record(folder, ["mot", "relay"])
    with pytest.raises(ConfigError, match="the 'direct' condition needs --direct CHECKPOINT"):
        patching.record(folder, ["direct"])
    with pytest.raises(ConfigError, match="--direct elsewhere is read by direct, which this run does not answer "
                                          "under: add direct to --methods"):
        patching.record(folder, ["mot"], options={"direct": "elsewhere"})
    assert patching.check_methods(["mot", "linear", "mot"]) == ("mot", "linear")  # each method scanned once
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(ConfigError, match="is not a results folder"):
        patching.record(bare)
    (folder / "summary.json").write_text("{}")
    with pytest.raises(ConfigError, match="no readable caches' settings"):
        patching.record(folder)


def test_direct_and_kvcomm_caches_restore_to_native_and_break_to_themselves(private_cache):
    from mot_viz.engine.prompts import QAExample
    from mot_viz.sharing.kvcomm import kvcomm_selection
    from mot_viz.train.quickfit import QuickFitConfig, fit_pair
    from tolerance import assert_close

    from conftest import tiny_model

    # a direct map needs a source at least as deep as the target
    source, target = tiny_model("llama", vocab_size=280, layers=6, seed=1), load_test_model("gemma3-270m")
    with torch.no_grad():  # a random tiny model is near-uniform: a sharper readout makes cache errors cost nats
        target.model.get_output_embeddings().weight.mul_(30)
    config = QuickFitConfig(tokens=256, min_context_tokens=16, max_context_tokens=48, direct=True,
                            direct_recipe="top_k", top_k=4)
    direct = load_checkpoint(fit_pair(source, target, config), source, target)[0]
    example = QAExample("x", "toy", CORPUS[1], "Who designed it?", ("Gustave Eiffel",))
    translation = translate(direct, source, target, build_prompt(example, target.chat_frame).context_text)
    question, answer = patching.gold_question(target, example)
    every = {"every": range(target.spec.num_layers)}
    # KVComm needs a pair of one architecture: the target as its own sender
    for method, sender, extra in (("direct", source, {"direct": direct}),
                                  ("kvcomm", target, {"kvcomm": kvcomm_selection(target, target, [example], 0.5)})):
        cache = patching.method_cache(method, direct, sender, target, translation, extra[method])
        scan = patching.patching_scan(target.model, translation.native_kv, cache.kv, question, answer, every,
                                      hidden=cache.hidden)
        assert (cache.hidden is not None) == (method == "kvcomm")
        assert abs(scan.gap) > 0.005, method  # 30x the tolerance below at least: the identities say something
        plan = None if cache.hidden is None else hf.AttentionPlan(hide=cache.hidden)
        assert_close(scan.translated, hf.continuation_logprob(target.model, cache.kv, question, answer, plan),
                     rtol=1e-5)
        reading = {(r.direction, r.target): r.logprob for r in scan.readings}
        assert_close(reading[("restore", "every")], scan.native, rtol=1e-5, what=method)
        assert_close(reading[("break", "every")], scan.translated, rtol=1e-5, what=method)


def test_a_long_context_folder_is_scanned_at_one_budget(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(long_context, "load_model", load_test_model)
    monkeypatch.setattr(patching, "load_model", load_test_model)
    out = tmp_path / "long"
    settings = LongSettings(checkpoint=str(checkpoints["smollm2-to-gemma3"]), source="stacks",
                            budgets=(900, 950), n=1, seed=0, max_new_tokens=2, bootstrap=20,
                            conditions=("native", "mot"))
    long_context.run(settings, out, progress=False)
    with pytest.raises(ConfigError, match=r"holds the budgets 900, 950: pass --budget with one of them"):
        patching.record(out)
    with pytest.raises(ConfigError, match=r"no documents at the budget 1024: pass --budget with one of 900, 950"):
        patching.record(out, budget=1024)
    one_process([str(out), "--budget", "950"])
    table = pd.read_csv(out / patching.PATCHING_FILE, dtype={"id": str})
    assert json.loads((out / patching.PATCHING_SETTINGS).read_text())["budget"] == 950
    check_results_folder(out, settings, long_context.RESULT_FILES, resume=True)  # the run's --resume keeps them
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    doc = long_examples("stacks", target.tokenizer, 950, 1, 0)[0].example
    assert list(table.id.unique()) == [doc.id] and doc.id.endswith(tuple(f"-950-{d}" for d in DEPTHS))
    mot = load_checkpoint(checkpoints["smollm2-to-gemma3"], source, target)[0]
    translation = translate(mot, source, target, build_prompt(doc, target.chat_frame).context_text)
    assert translation.target_ids.shape[1] > 800  # the document at its budget, not a short context
    question, answer = patching.gold_question(target, doc)
    mine = table.set_index(["direction", "target"])
    assert close(mine.native.iloc[0], hf.continuation_logprob(target.model, translation.native_kv, question, answer),
                 rtol=1e-5)
    assert close(mine.loc[("break", "layer 3"), "logprob"], hf.continuation_logprob(
        target.model, patch(translation.native_kv, translation.mixed_kv, [3]), question, answer), rtol=1e-5)


def _no_model(name, *args, **kwargs):
    raise AssertionError(f"a model loaded ({name}) before the input was refused")


def test_a_foreign_folder_and_a_map_that_is_no_checkpoint_are_one_line_before_any_model_loads(folder, checkpoints,
                                                                                              monkeypatch):
    monkeypatch.setattr(patching, "load_model", _no_model)
    with pytest.raises(CheckpointError, match="not a MoT checkpoint folder"):  # never a FileNotFoundError of its hash
        patching.record(folder, ["mot", "linear"], options={"linear": "/etc"})
    (folder / "examples.csv").write_text("question,answer\nWhat?,Paris\n")  # another tool's table, same name
    with pytest.raises(ConfigError, match=r"no column dataset, id, condition .* not the table evaluate writes"):
        patching.record(folder)


def test_a_torn_patching_csv_is_computed_again_and_a_broken_settings_file_refused(folder, checkpoints, tmp_path,
                                                                                  monkeypatch):
    import shutil

    whole = tmp_path / "whole"
    shutil.copytree(folder, whole)
    one_process(args(whole, checkpoints, "--n", "2"))
    one_process(args(folder, checkpoints, "--n", "2"))
    table = folder / patching.PATCHING_FILE
    text = table.read_text()
    first = text.split("\n")[1].split(",")[1]
    # a row of the first example damaged (a quote opened and never closed: pandas' ParserError) and the file cut
    damaged = text.replace(f",{first},", f',"{first},', 1)
    table.write_text(damaged[: len(damaged) - 40])
    kept = patching.read_patching(table)
    assert set(kept.id) <= {written(whole).id.unique()[1]}  # the damaged examples left out, whole rows only
    scanned = []
    scan = patching.scan_example
    monkeypatch.setattr(patching, "scan_example", lambda *a, **k: scanned.append(a[3].id) or scan(*a, **k))
    one_process(args(folder, checkpoints, "--n", "2", "--resume"))
    assert first in scanned
    pd.testing.assert_frame_equal(written(folder), written(whole))
    (folder / patching.PATCHING_SETTINGS).write_text('{"methods": ["mot", "lin')  # cut short
    monkeypatch.setattr(patching, "load_model", _no_model)
    with pytest.raises(ConfigError, match="does not read as the settings of its patching.csv") as refused:
        patching.record(folder, ["mot", "linear"], options={"linear": str(checkpoints["smollm2-to-gemma3-linear"])}, resume=True)
    assert "\n" not in str(refused.value)


def test_a_folder_copied_out_of_the_checkout_finds_its_checkpoint_there(folder, checkpoints, tmp_path, monkeypatch):
    """summary.json names the checkpoint relative to the checkout (pretrained/…); the folder copied anywhere and the
    command run from anywhere reads it from the checkout."""
    import shutil

    from mot_viz import fsutil

    checkout = Path(checkpoints["smollm2-to-gemma3"]).parents[1]
    monkeypatch.setattr(fsutil, "CHECKOUT", checkout)
    copied = tmp_path / "elsewhere" / "run"
    shutil.copytree(folder, copied)
    summary = json.loads((copied / "summary.json").read_text())
    summary["settings"]["checkpoint"] = str(Path(checkpoints["smollm2-to-gemma3"]).relative_to(checkout))
    (copied / "summary.json").write_text(json.dumps(summary))
    monkeypatch.chdir(tmp_path)
    one_process([str(copied), "--n", "1"])
    assert written(copied).id.nunique() == 1
