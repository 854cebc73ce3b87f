"""Hostile inputs and injected faults against training runs and checkpoints: nothing is lost, nothing
non-finite gets through, and every mistake gives one typed error whose message names the fix."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import TINY_RECIPE, tiny_model
from mot_viz.engine import checkpoint as checkpoint_mod
from mot_viz.engine.channels import terminal_channels
from mot_viz.engine.checkpoint import load_checkpoint, save_checkpoint
from mot_viz.engine.mot import MoT, translate
from mot_viz.errors import CheckpointError, ConfigError, TranslationError
from mot_viz.fsutil import remove_stale_temporaries
from mot_viz.train import export as export_mod
from mot_viz.train import runs
from mot_viz.train import train as train_mod
from mot_viz.train.train import TrainConfig, train


def _pair():
    return tiny_model("gpt2", vocab_size=280, layers=4, seed=1), tiny_model("llama", layers=4)


def _bank(n=12, length=24, seed=0):
    return torch.randint(2, 250, (n, length), generator=torch.Generator().manual_seed(seed))


def _cfg(folder: Path, **kw) -> TrainConfig:
    base = dict(output_dir=str(folder / "run"), max_steps=4, batch_size=2, grad_accum_steps=1, total_tokens=24,
                prefix_tokens=12, learning_rate=1e-2, warmup_steps=1, translator_dim=16, translator_heads=2,
                mot_num_translators=2, mot_top_k=1, layer_alignment="terminal", max_window_size_ratio=0.5,
                topk_sparse_attn=4, num_bottom_full_attn=1, log_every=1, save_every=2)
    return TrainConfig(**{**TINY_RECIPE, **base, **kw})


def _weights(run_dir: Path) -> dict:
    return load_file(str(Path(run_dir) / "checkpoint" / "translator.safetensors"))


def _mot(source, target):
    torch.manual_seed(0)
    return MoT.build(source.spec, target.spec, terminal_channels(4, 4, 0.5), dim=16, heads=2, num_experts=2, top_k=1)


class _Kill(BaseException):
    """A kill -9 stand-in: nothing in the code under test may catch it."""


# ----- run folders: never replaced silently ------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("finished")
    source, target = _pair()
    run_dir = train(_cfg(folder), source=source, target=target, bank=_bank(), progress=False)
    return run_dir, {p.name: p.read_bytes() for p in [run_dir / "log.jsonl", run_dir / "checkpoint" / "translator.safetensors"]}


def test_training_into_a_finished_run_without_resume_or_overwrite_is_refused(finished_run):
    run_dir, before = finished_run
    source, target = _pair()
    cfg = TrainConfig(**{**json.loads((run_dir / "train_config.json").read_text()), "max_steps": 2})
    with pytest.raises(ConfigError, match="--resume.*--overwrite"):
        train(cfg, source=source, target=target, bank=_bank(), progress=False)
    assert (run_dir / "log.jsonl").read_bytes() == before["log.jsonl"]
    assert (run_dir / "checkpoint" / "translator.safetensors").read_bytes() == before["translator.safetensors"]


def test_overwrite_replaces_the_run_and_excludes_resume(tmp_path):
    source, target = _pair()
    cfg = _cfg(tmp_path, max_steps=2)
    train(cfg, source=source, target=target, bank=_bank(), progress=False)
    with pytest.raises(ConfigError, match="exclude each other"):
        train(cfg, resume=True, overwrite=True, source=source, target=target, bank=_bank(), progress=False)
    run_dir = train(cfg, overwrite=True, source=source, target=target, bank=_bank(), progress=False)
    assert [r["step"] for r in runs.read_log(run_dir / "log.jsonl")] == [1, 2]


def test_resume_with_nothing_to_resume_is_refused(tmp_path):
    source, target = _pair()
    with pytest.raises(ConfigError, match="Nothing to resume.*without --resume"):
        train(_cfg(tmp_path), resume=True, source=source, target=target, bank=_bank(), progress=False)
    assert not (tmp_path / "run" / "log.jsonl").exists()


def test_output_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "run").write_text("not a folder")
    source, target = _pair()
    with pytest.raises(ConfigError, match="is a file"):
        train(_cfg(tmp_path), source=source, target=target, bank=_bank(), progress=False)


# ----- a kill at every step of a checkpoint save, and Ctrl-C ---------------------------------------------

# top-1 of 4 experts: the router leaves some experts without a gradient on some steps, so their Adam step lags
SKIPPING = dict(max_steps=6, mot_num_translators=4, mot_top_k=1)


def _state(run_dir: Path) -> tuple[dict, dict, dict]:
    """The final unit, bit for bit: translator weights, the optimiser's tensors, its train_state.json."""
    unit = Path(run_dir) / "checkpoint"
    return _weights(run_dir), load_file(str(unit / "optimizer.safetensors")), json.loads((unit / "train_state.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    source, target = _pair()
    run_dir = train(_cfg(tmp_path_factory.mktemp("full"), **SKIPPING), source=source, target=target, bank=_bank(),
                    progress=False)
    return _state(run_dir), runs.read_log(run_dir / "log.jsonl")


# runs.save_state's disk operations, in order: rmtree(tmp), save_file(weights), save_file(optimizer),
# replace(train_state.json's temporary), rmtree(stale .old), replace(checkpoint -> .old), replace(tmp -> checkpoint),
# rmtree(.old); a kill before each. "ctrl-c": a Ctrl-C in the middle of step 4, saved by the handler as step 3.
@pytest.mark.parametrize("kill_at", [*range(1, 9), "ctrl-c"])
def test_a_kill_at_any_point_of_a_save_resumes_exactly(tmp_path, monkeypatch, uninterrupted, kill_at):
    """Kill during the second save (step 4), at each of its disk operations, or press Ctrl-C; --resume must end
    where an uninterrupted run ends, bit for bit (weights and optimiser state), with each step logged once."""
    source, target = _pair()
    cfg = _cfg(tmp_path, **SKIPPING)
    counter = {"armed": False, "n": 0}
    lagging = {}  # step of each save -> whether some parameter's own Adam step is behind it

    def tick():
        if counter["armed"]:
            counter["n"] += 1
            if counter["n"] == kill_at:
                raise _Kill

    def wrap(fn):
        def inner(*a, **k):
            tick()
            return fn(*a, **k)
        return inner

    real_save_state = runs.save_state

    def save_state(run_dir, mot, optimizer, step, *a, **k):
        lagging[step] = min(float(s["step"]) for s in optimizer.state.values()) < step
        counter["armed"] = step == 4
        try:
            return real_save_state(run_dir, mot, optimizer, step, *a, **k)
        finally:
            counter["armed"] = False

    monkeypatch.setattr(runs, "save_state", save_state)
    if kill_at == "ctrl-c":
        real_row_loss, calls = train_mod.row_loss, {"n": 0}

        def row_loss(*a, **k):  # each step has 2 rows: the 7th is step 4's first
            calls["n"] += 1
            if calls["n"] == 7:
                raise KeyboardInterrupt
            return real_row_loss(*a, **k)

        monkeypatch.setattr(train_mod, "row_loss", row_loss)
    else:
        monkeypatch.setattr(runs, "save_file", wrap(runs.save_file))
        monkeypatch.setattr(checkpoint_mod, "save_file", wrap(checkpoint_mod.save_file))
        monkeypatch.setattr(checkpoint_mod.os, "replace", wrap(os.replace))
        monkeypatch.setattr(checkpoint_mod.shutil, "rmtree", wrap(checkpoint_mod.shutil.rmtree))
    with pytest.raises(KeyboardInterrupt if kill_at == "ctrl-c" else _Kill):
        train(cfg, source=source, target=target, bank=_bank(), progress=False)
    monkeypatch.undo()
    assert lagging == ({2: True, 3: True} if kill_at == "ctrl-c" else {2: True, 4: True})  # what resume must restore
    run_dir = train(cfg, resume=True, source=source, target=target, bank=_bank(), progress=False)
    (weights, moments, state), log = uninterrupted
    resumed_weights, resumed_moments, resumed_state = _state(run_dir)
    assert weights.keys() == resumed_weights.keys() and moments.keys() == resumed_moments.keys()
    assert all(torch.equal(weights[k], resumed_weights[k]) for k in weights)
    assert all(torch.equal(moments[k], resumed_moments[k]) for k in moments)
    assert resumed_state == state
    assert [r["step"] for r in runs.read_log(run_dir / "log.jsonl")] == [r["step"] for r in log]
    assert not [p.name for p in run_dir.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_a_unit_with_one_adam_step_for_all_parameters_still_resumes(tmp_path, caplog):
    """A state unit written before the full optimiser state (moments + one shared step) resumes, and says it is
    not exact for a mixture, naming the fix."""
    source, target = _pair()
    cfg = _cfg(tmp_path, max_steps=2)
    run_dir = train(cfg, source=source, target=target, bank=_bank(), progress=False)
    unit = run_dir / "checkpoint"
    tensors = load_file(str(unit / "optimizer.safetensors"))
    save_file({k: v for k, v in tensors.items() if k.endswith(("::exp_avg", "::exp_avg_sq"))},
              str(unit / "optimizer.safetensors"))
    (unit / "train_state.json").write_text(json.dumps({"step": 2, "adam_step": 2.0}))
    mot_viz_logger = logging.getLogger("mot_viz")  # prints on stderr and does not propagate to caplog's root handler
    mot_viz_logger.addHandler(caplog.handler)
    try:
        train(TrainConfig(**{**json.loads((run_dir / "train_config.json").read_text()), "max_steps": 3}),
              resume=True, source=source, target=target, bank=_bank(), progress=False)
    finally:
        mot_viz_logger.removeHandler(caplog.handler)
    assert "one Adam step for all parameters" in caplog.text and "--overwrite" in caplog.text
    assert [r["step"] for r in runs.read_log(run_dir / "log.jsonl")] == [1, 2, 3]


def test_a_checkpoint_unit_without_its_step_counter_is_never_used(tmp_path):
    """A unit whose train_state.json was not written is incomplete: recovery picks the complete one."""
    source, target = _pair()
    run_dir = train(_cfg(tmp_path, max_steps=2), source=source, target=target, bank=_bank(), progress=False)
    broken = run_dir / f"checkpoint.tmp-{os.getpid()}"
    save_checkpoint(_mot(source, target), broken)  # weights but no optimizer state or step counter
    assert runs.recover_checkpoint(run_dir) == run_dir / "checkpoint"
    assert json.loads((run_dir / "checkpoint" / "train_state.json").read_text())["step"] == 2
    assert not broken.exists()


def test_resume_drops_a_torn_log_line_and_logs_each_step_once(tmp_path):
    source, target = _pair()
    cfg = _cfg(tmp_path, max_steps=4, save_every=2)
    run_dir = train(cfg, source=source, target=target, bank=_bank(), progress=False)
    with open(run_dir / "log.jsonl", "a") as f:
        f.write('{"step": 5, "loss": 1.')  # an interrupted append
    cfg6 = TrainConfig(**{**json.loads((run_dir / "train_config.json").read_text()), "max_steps": 6})
    train(cfg6, resume=True, source=source, target=target, bank=_bank(), progress=False)
    assert [r["step"] for r in runs.read_log(run_dir / "log.jsonl")] == [1, 2, 3, 4, 5, 6]
    changed = TrainConfig(**{**json.loads((run_dir / "train_config.json").read_text()), "learning_rate": 0.5})
    with pytest.raises(ConfigError, match=r"other settings \(learning_rate .* -> 0.5\).*--overwrite"):
        train(changed, resume=True, source=source, target=target, bank=_bank(), progress=False)


def test_stale_temporaries_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    dead = tmp_path / "model.tmp-999999999"
    dead.mkdir()
    (tmp_path / "log.jsonl.tmp-999999998").write_text("x")
    mine = tmp_path / f"model.tmp-{os.getpid()}"
    mine.mkdir()
    parent = tmp_path / f"model.work-{os.getppid()}"
    parent.mkdir()
    removed = remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == ["log.jsonl.tmp-999999998", "model.tmp-999999999"]
    assert mine.exists() and parent.exists() and not dead.exists()


# ----- non-finite weights and translations --------------------------------------------------------------


def test_a_checkpoint_with_one_nan_is_refused_at_load(tmp_path):
    source, target = _pair()
    path = save_checkpoint(_mot(source, target), tmp_path / "ckpt")
    state = load_file(str(path / "translator.safetensors"))
    name = sorted(state)[3]
    state[name].view(-1)[0] = float("nan")
    save_file(state, str(path / "translator.safetensors"))
    with pytest.raises(CheckpointError, match="NaN or Inf.*earlier checkpoint or retrain"):
        load_checkpoint(path)


def test_saving_weights_beyond_fp16_range_is_refused(tmp_path):
    source, target = _pair()
    mot = _mot(source, target)
    with torch.no_grad():
        next(mot.translator.parameters()).view(-1)[0] = 1e6  # Inf in fp16
    with pytest.raises(CheckpointError, match="NaN/Inf.*dtype's range"):
        save_checkpoint(mot, tmp_path / "ckpt", dtype=torch.float16)
    assert not any(tmp_path.iterdir())


def test_a_translation_with_non_finite_output_raises_instead_of_reaching_a_page():
    source, target = _pair()
    mot = _mot(source, target)
    with torch.no_grad():
        for p in mot.translator.parameters():
            p.fill_(float("inf"))
    with pytest.raises(TranslationError, match="NaN or Inf.*float32"):
        translate(mot, source, target, "the cat sat on the mat and looked at the dog")


# ----- the CLI: one message, before any model is loaded -------------------------------------------------


@pytest.fixture
def no_models(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(train_mod, "load_model", refuse)


@pytest.mark.parametrize("args, config, fix", [
    (["--config", "missing.json"], None, "cannot be read.*JSON config file"),
    (["--config", "{cfg}"], "{not json", "not valid JSON.*configs/"),
    (["--config", "{cfg}"], "[1, 2]", "JSON object of TrainConfig fields"),
    (["--config", "{cfg}"], '{"max_stepz": 3}', "unknown training config keys.*--help"),
    (["--max_steps", "abc"], None, "--max_steps 'abc' is not a number"),
    (["--learning_rate", "nan"], None, "learning_rate must be a finite number > 0"),
    (["--learning_rate", "-0.001"], None, "learning_rate must be a finite number > 0"),
    (["--weight_decay", "inf"], None, "weight_decay must be a finite number >= 0"),
    (["--max_steps", "0", "--bank_steps", "0"], None, "nothing to train.*bank_steps"),
    (["--save_every", "0"], None, "save_every must be >= 1"),
    (["--config", "{cfg}"], '{"max_steps": "ten"}', "invalid training config"),
    (["--resume", "--output_dir", "{dir}/empty"], None, "Nothing to resume"),
    (["--device", "gpu"], None, "not a torch device: use cpu, cuda or cuda:N"),
    (["--autocast", "fp8"], None, "autocast must be one of"),
])
def test_train_cli_mistakes_give_one_message_before_loading_models(tmp_path, capsys, no_models, args, config, fix):
    cfg = tmp_path / "c.json"
    if config is not None:
        cfg.write_text(config)
    args = [a.replace("{cfg}", str(cfg)).replace("{dir}", str(tmp_path)) for a in args]
    if "--output_dir" not in args:
        args += ["--output_dir", str(tmp_path / "run")]
    assert train_mod.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert __import__("re").search(fix, err), err
    assert not (tmp_path / "run").exists()  # nothing half-made


def test_none_on_the_command_line_is_a_value_for_text_fields_and_off_for_optional_ones():
    """`--output_activation none` and `--bank_layer_weighting none` name a choice; `--topk_sparse_attn none` turns
    sparse replay off (the only fields whose type admits None)."""
    from mot_viz.train.config import parse_args

    cfg, _, _ = parse_args(["--output_activation", "none", "--bank_layer_weighting", "none", "--topk_sparse_attn",
                            "none"])
    assert (cfg.output_activation, cfg.bank_layer_weighting, cfg.topk_sparse_attn) == ("none", "none", None)


def test_train_cli_refuses_a_finished_run_without_touching_it(finished_run, capsys, no_models):
    run_dir, before = finished_run
    assert train_mod.main(["--output_dir", str(run_dir), "--max_steps", "2"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (run_dir / "log.jsonl").read_bytes() == before["log.jsonl"]


def test_train_with_a_missing_source_model_leaves_no_run_folder(tmp_path, capsys):
    out = tmp_path / "runs" / "x"
    assert train_mod.main(["--source", str(tmp_path / "missing"), "--output_dir", str(out), "--max_steps", "2"]) == 2
    assert "ModelLoadError" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_every_train_flag_has_its_config_fields_comment_as_help(capsys):
    import dataclasses

    from mot_viz.train.config import TrainConfig, field_help, parse_args

    helps = field_help()
    assert all(helps[f.name] != f.name.replace("_", " ") for f in dataclasses.fields(TrainConfig))  # every field
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "experts per K/V path (mot) (default 4)" in out and "override" not in out


# ----- export: never deletes what it was not asked to replace -------------------------------------------


@pytest.fixture
def small_run(tmp_path):
    source, target = _pair()
    run_dir = train(_cfg(tmp_path, max_steps=2), source=source, target=target, bank=_bank(), progress=False)
    return run_dir, {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_export_into_a_folder_with_files_needs_overwrite_which_replaces_an_earlier_export(small_run, tmp_path, capsys):
    run_dir, _ = small_run
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert export_mod.main([str(run_dir), str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ConfigError: ") and "already holds files" in err and "--overwrite" in err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep me"
    out = tmp_path / "shipped"
    assert export_mod.main([str(run_dir), str(out)]) == 0
    (out / "stale.txt").write_text("from the earlier export")
    assert export_mod.main([str(run_dir), str(out)]) == 2
    assert (out / "stale.txt").exists()
    assert export_mod.main([str(run_dir), str(out), "--overwrite"]) == 0
    assert not (out / "stale.txt").exists() and load_checkpoint(out)[1]["training"]["steps_done"] == 2


@pytest.mark.parametrize("out", ["{run}", "{run}/checkpoint", "{run}/export", "{tmp}", "{link}", "{run}/checkpoint:src"])
@pytest.mark.parametrize("overwrite", [False, True], ids=["", "overwrite"])
def test_export_never_writes_the_run_itself_inside_it_or_around_it(small_run, tmp_path, capsys, out, overwrite):
    """The run, a folder inside it, one holding it, a symlink to it, and its state unit re-saved onto itself."""
    run_dir, before = small_run
    (tmp_path / "link").symlink_to(run_dir, target_is_directory=True)
    out, _, as_source = out.partition(":")
    out = out.format(run=run_dir, tmp=tmp_path, link=tmp_path / "link")
    source = run_dir / "checkpoint" if as_source else run_dir
    assert export_mod.main([str(source), out, *(["--overwrite"] if overwrite else [])]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ConfigError: ") and "Choose an output folder outside the source and any run" in err
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before  # config, optimiser state, all
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "run"]


def test_a_refused_export_leaves_no_output_folder(tmp_path, capsys):
    source, target = _pair()
    mot = _mot(source, target)
    with torch.no_grad():
        next(mot.translator.parameters()).view(-1)[0] = 1e6  # finite in float32, Inf in the export's fp16
    ckpt = save_checkpoint(mot, tmp_path / "ckpt")
    assert export_mod.main([str(ckpt), str(tmp_path / "new" / "deep" / "out")]) == 2
    assert "NaN/Inf" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


# ----- settings the pair refuses: refused before the bank, and nothing left behind ------------------------------


def test_a_bank_longer_than_a_model_allows_is_refused_before_the_bank_and_leaves_no_folder(tmp_path, private_cache):
    source, target = _pair()  # both allow 256 positions; the recipe's bank reaches 448 target tokens
    cfg = _cfg(tmp_path, init="linear", bank_tokens=400, bank_min_tokens=32, bank_max_tokens=448, max_steps=1)
    with pytest.raises(ConfigError, match=r"bank_max_tokens 448 .*allows \(256 tokens\).*--bank_max_tokens to at most"):
        train(cfg, source=source, target=target, bank=_bank(), progress=False)
    assert not (tmp_path / "run").exists() and not private_cache.exists()  # no run folder, no bank begun


def test_a_bank_context_the_source_tokenizes_longer_than_it_allows_names_this_commands_flag(tmp_path, private_cache):
    """Within the target's limit but re-tokenized longer than the source's: found while the bank is built; the
    message names --bank_max_tokens (not another command's flag) and the run folder is removed, so the corrected
    config reruns without --overwrite."""
    source = tiny_model("gpt2", vocab_size=280, layers=4, seed=1, max_positions=60)  # ~7% more tokens than the target
    target = tiny_model("llama", layers=4)
    cfg = _cfg(tmp_path, init="linear", bank_tokens=600, bank_min_tokens=58, bank_max_tokens=60, max_steps=1)
    with pytest.raises(ConfigError, match="too long for the source model once re-tokenized.*lower --bank_max_tokens") as e:
        train(cfg, source=source, target=target, bank=_bank(), progress=False)
    assert "max_context_tokens" not in str(e.value)
    assert not (tmp_path / "run").exists()
    fixed = _cfg(tmp_path, init="linear", bank_tokens=160, bank_min_tokens=16, bank_max_tokens=32, max_steps=1,
                 linear_previous=0)
    assert (train(fixed, source=source, target=target, bank=_bank(), progress=False) / "checkpoint").is_dir()


def test_linear_previous_dims_wider_than_the_pairs_token_features_is_refused_before_the_bank(tmp_path, private_cache):
    source, target = _pair()  # 2 window layers × (K + V) × 32 = 128 features per source token
    cfg = _cfg(tmp_path, init="linear", bank_tokens=160, bank_min_tokens=16, bank_max_tokens=32, linear_previous=1,
               linear_previous_dims=256)
    with pytest.raises(ConfigError, match="linear_previous_dims 256 is more than the 128 .*--linear_previous_dims to at "
                                          "most 128"):
        train(cfg, source=source, target=target, bank=_bank(), progress=False)
    assert not (tmp_path / "run").exists() and not private_cache.exists()
    ok = _cfg(tmp_path, init="linear", bank_tokens=160, bank_min_tokens=16, bank_max_tokens=32, linear_previous=1,
              linear_previous_dims=128, max_steps=1)
    assert (train(ok, source=source, target=target, bank=_bank(), progress=False) / "checkpoint").is_dir()


def test_a_save_killed_between_its_renames_says_resume_recovers_it(tmp_path, capsys):
    """A kill between swap_into_place's renames leaves checkpoint.old-PID and checkpoint.tmp-PID, no checkpoint/:
    export and load_checkpoint name --resume, which recovers the run."""
    source, target = _pair()
    run_dir = train(_cfg(tmp_path, max_steps=2), source=source, target=target, bank=_bank(), progress=False)
    dead = 999999999
    shutil.copytree(run_dir / "checkpoint", run_dir / f"checkpoint.tmp-{dead}")
    os.replace(run_dir / "checkpoint", run_dir / f"checkpoint.old-{dead}")
    with pytest.raises(CheckpointError, match=r"interrupted between its two renames.*--resume` recovers it"):
        load_checkpoint(run_dir / "checkpoint")
    assert export_mod.main([str(run_dir), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: CheckpointError: ") and f"--output_dir {run_dir} --resume" in err
    train(_cfg(tmp_path, max_steps=2), resume=True, source=source, target=target, bank=_bank(), progress=False)
    assert load_checkpoint(run_dir / "checkpoint")[1]["training"]["steps_done"] == 2
    assert export_mod.main([str(run_dir), str(tmp_path / "out")]) == 0


def test_a_gpu_without_room_for_the_bank_is_refused_naming_the_fix(monkeypatch):
    from mot_viz.train.devices import check_fits

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 * 2**30, 80 * 2**30))
    check_fits(torch.device("cuda", 0), 2**30, "the training bank", "lower --bank_tokens")  # 1 GiB beside 3 free
    with pytest.raises(ConfigError, match=r"the training bank \(2\.0 GiB\) does not fit on cuda:0 .*3\.0 GiB free\): "
                                          "lower --bank_tokens"):
        check_fits(torch.device("cuda", 0), 2 * 2**30, "the training bank", "lower --bank_tokens")
    check_fits(torch.device("cpu"), 2**40, "the training bank", "lower --bank_tokens")  # the CPU's memory: the OS's


def test_a_run_resumed_on_another_device_says_it_continues_to_rounding_only(tmp_path, caplog):
    """The state unit records the device it was saved on; resuming it elsewhere still works (the optimiser state
    follows the parameters) and the log says the steps match an uninterrupted run to rounding, not bit for bit."""
    source, target = _pair()
    run_dir = train(_cfg(tmp_path, max_steps=2), source=source, target=target, bank=_bank(), progress=False)
    state_file = run_dir / "checkpoint" / "train_state.json"
    state = json.loads(state_file.read_text())
    assert state["device"] == "cpu"
    state_file.write_text(json.dumps({**state, "device": "cuda:0"}))  # as a GPU run would have saved it
    mot_viz_logger = logging.getLogger("mot_viz")  # prints on stderr and does not propagate to caplog's root handler
    mot_viz_logger.addHandler(caplog.handler)
    try:
        train(_cfg(tmp_path, max_steps=3), resume=True, source=source, target=target, bank=_bank(), progress=False)
    finally:
        mot_viz_logger.removeHandler(caplog.handler)
    assert "resumed on cpu, but it was saved on cuda:0" in caplog.text and "to rounding, not bit for bit" in caplog.text
    assert json.loads(state_file.read_text())["device"] == "cpu"
    assert [r["step"] for r in runs.read_log(run_dir / "log.jsonl")] == [1, 2, 3]
