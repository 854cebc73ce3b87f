"""layer_error.csv: --layer_error of evaluate and long_context writes the Per-layer cache error page's numbers per
example, keeps them across --resume, and `python -m mot_viz.eval.layer_error` records the same rows afterwards."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pandas as pd
import pytest

from mot_viz.analysis.cache_metrics import cache_error_table
from mot_viz.data.eval_data import load_dataset
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.mot import translate
from mot_viz.engine.prompts import build_prompt
from mot_viz.engine.testing import load_test_model
from mot_viz.errors import ConfigError
from mot_viz.eval import evaluate, layer_error, layer_error_file, long_context
from mot_viz.eval.layer_error_file import LAYER_ERROR_FILE, METRICS
from mot_viz.eval.long_settings import LongSettings
from tolerance import close


@pytest.fixture()
def test_models(monkeypatch):
    monkeypatch.setattr(evaluate, "load_model", load_test_model)
    monkeypatch.setattr(long_context, "load_model", load_test_model)
    monkeypatch.setattr(layer_error, "load_model", load_test_model)


def eval_argv(checkpoints, data, out, n, *extra) -> list[str]:
    return ["--checkpoint", str(checkpoints["smollm2-to-gemma3"]), "--datasets", str(data), "--n", str(n),
            "--conditions", "native", "mot", "--max_new_tokens", "2", "--bootstrap", "20", "--out", str(out), *extra]


def table(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / LAYER_ERROR_FILE, dtype={"dataset": str, "id": str})


def test_the_flag_writes_the_cache_error_pages_numbers_per_example_and_layer(checkpoints, data, tmp_path, test_models):
    out = tmp_path / "run"
    assert evaluate.main(eval_argv(checkpoints, data, out, 3, "--layer_error")) == 0
    written = table(out)
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot = load_checkpoint(checkpoints["smollm2-to-gemma3"], source, target)[0]
    layers = target.spec.num_layers
    assert list(written.columns) == ["dataset", "id", "layer", "in_window", *METRICS] and len(written) == 3 * layers
    example = load_dataset(str(data), n=3)[1]
    translation = translate(mot, source, target, build_prompt(example, target.chat_frame).context_text)
    page = cache_error_table(translation, mot.channels)
    page = page[page["comparison"] == "replayed"].pivot(index="layer", columns="kv", values=["rel_l2", "cosine"])
    mine = written[written["id"] == example.id].set_index("layer").sort_index()
    assert mine.index.tolist() == list(range(layers))
    assert mine["in_window"].tolist() == [i in mot.channels.target_layers for i in range(layers)]
    for kv in ("K", "V"):
        assert close(mine[f"{kv}_rel_l2"], page[("rel_l2", kv)].to_numpy())
        assert close(mine[f"{kv}_cosine"], page[("cosine", kv)].to_numpy())
    window = mine[mine["in_window"]]
    assert (window["K_rel_l2"] > 1e-3).all()  # a random translator's window is far from native


def test_resume_keeps_the_rows_of_kept_examples_and_the_command_records_the_same(checkpoints, data, tmp_path,
                                                                                 test_models, monkeypatch, capsys):
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert evaluate.main(eval_argv(checkpoints, data, whole, 3, "--layer_error")) == 0
    assert evaluate.main(eval_argv(checkpoints, data, part, 2, "--layer_error")) == 0
    first = table(part)
    assert first["id"].nunique() == 2
    assert evaluate.main(eval_argv(checkpoints, data, part, 3, "--resume", "--layer_error")) == 0
    resumed = table(part)
    pd.testing.assert_frame_equal(resumed[resumed["id"].isin(first["id"])].reset_index(drop=True), first)
    assert close(resumed[list(METRICS)], table(whole)[list(METRICS)])

    plain = tmp_path / "plain"  # a folder written without the flag: the command records its rows afterwards
    assert evaluate.main(eval_argv(checkpoints, data, plain, 3)) == 0
    assert not (plain / LAYER_ERROR_FILE).exists()
    assert layer_error.main([str(plain)]) == 0
    assert close(table(plain)[list(METRICS)], table(whole)[list(METRICS)])
    assert table(plain)[["id", "layer"]].equals(table(whole)[["id", "layer"]])
    monkeypatch.setattr(layer_error_file, "layer_error_rows", lambda *a, **k: pytest.fail("a done example was redone"))
    assert layer_error.main([str(plain)]) == 0  # every example recorded: nothing to do
    assert evaluate.main(eval_argv(checkpoints, data, plain, 3, "--resume")) == 0  # the file is one of its results


def test_the_command_refuses_a_folder_of_another_kind_in_one_line(tmp_path, capsys):
    shards_like = tmp_path / "hub"
    shards_like.mkdir()
    (shards_like / "summary.md").write_text("Command: `python -m mot_viz.eval.shards --budget 2048`\n")
    (tmp_path / "empty").mkdir()
    for folder, what in ((shards_like, "holds results of python -m mot_viz.eval.shards"),
                         (tmp_path / "empty", "is not a results folder")):
        assert layer_error.main([str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and what in err and "not of evaluate or long_context" in err


def test_long_context_flag_and_command_agree_per_budget_and_document(checkpoints, tmp_path, test_models):
    settings = long_settings(checkpoints)
    out = tmp_path / "long"
    long_context.run(settings, out, progress=False, layer_error=True)
    written = pd.read_csv(out / LAYER_ERROR_FILE, dtype={"id": str})
    assert list(written.columns)[:3] == ["budget", "id", "layer"] and set(written["budget"]) == {900}
    assert written["id"].nunique() == 1 and len(written) == load_test_model("gemma3-270m").spec.num_layers
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / LAYER_ERROR_FILE).unlink()
    assert layer_error.main([str(copy), "--budgets", "900"]) == 0
    again = pd.read_csv(copy / LAYER_ERROR_FILE, dtype={"id": str})
    assert again[["budget", "id", "layer"]].equals(written[["budget", "id", "layer"]])
    assert close(again[list(METRICS)], written[list(METRICS)])
    assert layer_error.main([str(copy), "--budgets", "512"]) == 2  # not a budget of the folder


def long_settings(checkpoints) -> LongSettings:
    return LongSettings(str(checkpoints["smollm2-to-gemma3"]), "stacks", (900,), 1, 0,
                        max_new_tokens=4, bootstrap=20, conditions=("native", "mot"))


def test_the_flag_added_on_resume_is_refused_until_the_kept_examples_are_recorded(checkpoints, data, tmp_path,
                                                                                  test_models, capsys):
    whole, plain = tmp_path / "whole", tmp_path / "plain"
    assert evaluate.main(eval_argv(checkpoints, data, whole, 3, "--layer_error")) == 0
    assert evaluate.main(eval_argv(checkpoints, data, plain, 2)) == 0  # written without the flag
    capsys.readouterr()
    for n in (2, 3):  # the same examples, or more: the kept ones would never get their rows
        assert evaluate.main(eval_argv(checkpoints, data, plain, n, "--resume", "--layer_error")) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: ConfigError: --out {plain} holds 2 example(s) without "
                                                       "their per-layer errors")
        assert f"`python -m mot_viz.eval.layer_error {plain}`, then resume with --layer_error" in err
    assert not (plain / LAYER_ERROR_FILE).exists()  # refused before any work
    assert layer_error.main([str(plain)]) == 0
    assert evaluate.main(eval_argv(checkpoints, data, plain, 3, "--resume", "--layer_error")) == 0
    assert table(plain)[["id", "layer"]].equals(table(whole)[["id", "layer"]])
    assert close(table(plain)[list(METRICS)], table(whole)[list(METRICS)])

    settings = long_settings(checkpoints)
    out = tmp_path / "long"
    long_context.run(settings, out, progress=False)
    with pytest.raises(ConfigError, match=f"python -m mot_viz.eval.layer_error {out}"):
        long_context.run(settings, out, resume=True, progress=False, layer_error=True)


def test_a_cut_layer_error_file_computes_the_cut_example_again(checkpoints, data, tmp_path, test_models):
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger(layer_error_file.__name__).addHandler(handler)  # the mot_viz logger prints and does not propagate
    out = tmp_path / "run"
    assert evaluate.main(eval_argv(checkpoints, data, out, 3, "--layer_error")) == 0
    whole = table(out)
    text = (out / LAYER_ERROR_FILE).read_text()
    (out / LAYER_ERROR_FILE).write_text(text[: text.rstrip("\n").rindex("\n") + 12])  # the last row cut mid-row
    assert layer_error.main([str(out)]) == 0
    again = table(out).sort_values(["id", "layer"]).reset_index(drop=True)
    assert again[["id", "layer"]].equals(whole.sort_values(["id", "layer"]).reset_index(drop=True)[["id", "layer"]])
    logging.getLogger(layer_error_file.__name__).removeHandler(handler)
    assert len(messages) == 1 and "was cut short or damaged: 1 example(s)" in messages[0]

    lines = (out / LAYER_ERROR_FILE).read_text().splitlines(keepends=True)
    (out / LAYER_ERROR_FILE).write_text("".join(lines[:-1]))  # cut at a row's end: one layer fewer than the others
    assert layer_error.main([str(out)]) == 0
    assert len(table(out)) == len(whole) and (table(out).groupby("id").size() == whole.groupby("id").size()).all()


def test_the_command_refuses_a_results_table_of_other_columns_in_one_line(checkpoints, data, tmp_path, test_models,
                                                                         capsys):
    out = tmp_path / "run"
    assert evaluate.main(eval_argv(checkpoints, data, out, 1)) == 0
    (out / "examples.csv").write_text("name,value\nx,1\n")
    capsys.readouterr()
    assert layer_error.main([str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"error: ConfigError: {out / 'examples.csv'} has no column dataset, id, condition (its "
                          "columns: name, value), so it is not the table evaluate writes.")
