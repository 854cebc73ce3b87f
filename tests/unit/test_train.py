"""Training (method.md §7): the loss against a hand computation, the schedule, resume, two processes."""

from __future__ import annotations

import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import DynamicCache

from conftest import TINY_RECIPE, tiny_model
from mot_viz.engine.channels import Channels
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.mot import MoT, ReplayConfig, native_cache, prepare_source, replay, sparse_indices, translate_window
from mot_viz.train import train as train_mod
from mot_viz.train.train import TrainConfig, lr_at, row_loss, train

ROOT = Path(__file__).resolve().parents[2]


def _pair():
    return tiny_model("gpt2", vocab_size=280, layers=4, seed=1), tiny_model("llama", layers=4)


def _bank(n=12, length=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 250, (n, length), generator=g)


def _cfg(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "run"), max_steps=4, batch_size=2, grad_accum_steps=1, total_tokens=24,
                prefix_tokens=12, learning_rate=1e-2, warmup_steps=1, translator_dim=16, translator_heads=2,
                mot_num_translators=2, mot_top_k=1, layer_alignment="terminal", max_window_size_ratio=0.5,
                topk_sparse_attn=4, num_bottom_full_attn=1, log_every=1, save_every=1)
    return TrainConfig(**{**TINY_RECIPE, **base, **kw})


def test_loss_terms_match_a_hand_computation():
    source, target = _pair()
    torch.manual_seed(0)
    mot = MoT.build(source.spec, target.spec, Channels((2, 3), (2, 3)), ReplayConfig(4, 1), dim=16, heads=2)
    row = _bank(1, 24)[0]
    terms = row_loss(mot, source, target, row, prefix_tokens=12, mse_weight=0.5)
    # by hand: context = 11 tokens, prompt = the next 12, labels shifted by one
    context, prompt, labels = row[None, :11], row[None, 11:23], row[12:]
    src = prepare_source(mot, source, target, context)
    out = translate_window(mot, src, source, target)
    mixed = replay(target, context, (2, 3), out.keys, out.values, sparse_indices(mot, src))
    cache = DynamicCache()
    for i, (k, v) in enumerate(mixed):
        cache.update(k, v, i)
    logits = target.model(input_ids=prompt, past_key_values=cache).logits[0]
    ce = -logits.log_softmax(-1).gather(1, labels[:, None]).mean()
    native = native_cache(target, context)
    upper = range(2, 4)  # from the window start to the top, one mean over all elements together
    mse_k = torch.cat([(mixed[l][0] - native[l][0]).flatten() for l in upper]).pow(2).mean()
    mse_v = torch.cat([(mixed[l][1] - native[l][1]).flatten() for l in upper]).pow(2).mean()
    assert terms.ce == pytest.approx(ce.item(), rel=1e-5)
    assert terms.mse_k == pytest.approx(mse_k.item(), rel=1e-5) and terms.mse_v == pytest.approx(mse_v.item(), rel=1e-5)
    assert terms.total.item() == pytest.approx(ce.item() + 0.5 * (mse_k + mse_v).item(), rel=1e-5)
    assert mse_k > 0 and mse_v > 0  # a random translator does not reproduce the native cache


def test_schedule_warms_up_then_follows_a_cosine_to_zero():
    cfg = TrainConfig(max_steps=110, warmup_steps=10, learning_rate=1e-3)
    assert lr_at(cfg, 1) == pytest.approx(1e-4)  # the first step is not at full LR (method.md §12)
    assert lr_at(cfg, 10) == pytest.approx(1e-3)
    assert lr_at(cfg, 60) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(cfg, 110) == pytest.approx(0.0, abs=1e-12)
    assert all(lr_at(cfg, s) >= lr_at(cfg, s + 1) for s in range(10, 110))


def test_config_overrides_and_validation(tmp_path):
    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(json.dumps({"max_steps": 7, "variant": "single"}))
    cfg, resume, overwrite = train_mod.parse_args(["--config", str(cfg_file), "--max_steps", "9", "--learning_rate",
                                                   "0.5", "--topk_sparse_attn", "none", "--resume"])
    assert (cfg.max_steps, cfg.variant, cfg.learning_rate, cfg.topk_sparse_attn, resume, overwrite) == (
        9, "single", 0.5, None, True, False)
    listed, _, _ = train_mod.parse_args(["--linear_extra_layers", "3,12", "--init", "linear"])
    assert listed.linear_extra_layers == [3, 12] and listed.translator_kwargs()["linear_extra_layers"] == (3, 12)
    with pytest.raises(Exception, match="list of numbers"):
        train_mod.parse_args(["--linear_extra_layers", "3,x"])
    with pytest.raises(Exception, match="unknown training config keys"):
        TrainConfig.from_json({"max_stepz": 3})


def test_training_lowers_the_loss_and_writes_logs_and_checkpoints(tmp_path):
    source, target = _pair()
    cfg = _cfg(tmp_path, max_steps=8, warmup_steps=1)
    run_dir = train(cfg, source=source, target=target, bank=_bank(n=2), progress=False)  # the same 2 rows each step
    log = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 9))
    assert {"ce", "mse_k", "mse_v", "loss", "lr", "gate_importance_cv2", "gate_load_cv2", "gate_importance_entropy"} <= set(log[0])
    assert log[-1]["loss"] < log[0]["loss"]
    mot, config = load_checkpoint(run_dir / "checkpoint", source, target)
    assert config["training"]["steps_done"] == 8 and mot.channels.target_layers == (2, 3)


SAFETY_S = 1800  # only a safety net against a hung child: every wait below ends on an event of the child


def _stderr_lines(proc: subprocess.Popen) -> queue.Queue:
    """The child's stderr lines as it writes them (tqdm's carriage returns end lines too), then None once it closes;
    read by a thread, so the pipe never fills while the test waits."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_the_train_command_run_with_dash_m_prints_its_status_lines(tmp_path):
    """`python -m` runs the module as __main__; its lines must still reach stderr: Ctrl-C (a real SIGINT) names
    --resume, and the resumed run says where it resumed and that it is done. Each wait ends on the child's own output
    (a line after its first logged step; its "continue with --resume" line; its exit), never on a clock."""
    source, target = _pair()
    for lm, name in ((source, "src"), (target, "tgt")):
        lm.model.save_pretrained(tmp_path / name)
        lm.tokenizer.save_pretrained(tmp_path / name)
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "mot_viz.train.train", "--source", str(tmp_path / "src"), "--target",
               str(tmp_path / "tgt"), "--output_dir", str(run_dir), "--batch_size", "1", "--grad_accum_steps", "1",
               "--total_tokens", "24", "--prefix_tokens", "12", "--num_sequences", "4", "--translator_dim", "16",
               "--translator_heads", "2", "--mot_num_translators", "2", "--mot_top_k", "1",
               "--max_window_size_ratio", "0.5", "--topk_sparse_attn", "4", "--num_bottom_full_attn", "1",
               "--log_every", "1", "--save_every", "1000", *(f"--{k}={v}" for k, v in TINY_RECIPE.items())]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([*command, "--max_steps", "100000"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    err: list[str] = []
    try:
        lines = _stderr_lines(proc)
        # the progress bar writes a line as steps complete: after each, is a step logged yet?
        while not ((run_dir / "log.jsonl").is_file() and (run_dir / "log.jsonl").read_text()):
            line = lines.get(timeout=SAFETY_S)
            assert line is not None, "training ended before its first step: " + "".join(err)[-3000:]
            err.append(line)
        proc.send_signal(signal.SIGINT)
        while (line := lines.get(timeout=SAFETY_S)) is not None:  # to the child's exit (its stderr closes)
            err.append(line)
        proc.wait(timeout=SAFETY_S)
    finally:
        proc.kill()
    err = "".join(err)
    assert proc.returncode == 130, err[-3000:]
    saved = re.search(r"\[mot_viz\.train\.train\] interrupted: checkpoint of step (\d+) saved in .*"
                      r"\(continue with --resume\)", err)
    assert saved, err[-3000:]
    step = int(saved[1])
    resumed = subprocess.run([*command, "--max_steps", str(step + 1), "--resume"], env=env, capture_output=True,
                             text=True, timeout=SAFETY_S, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"[mot_viz.train.train] resumed from step {step}\n" in resumed.stderr
    assert "[mot_viz.train.train] resumed on cpu, the device it was saved on: the steps continue bit for bit" in (
        resumed.stderr)
    assert f"[mot_viz.train.train] done: {step + 1} steps in " in resumed.stderr


def test_training_through_the_device_argument_equals_the_default_run(tmp_path, private_cache, monkeypatch):
    """--device cpu (and MOT_VIZ_DEVICE=cpu) take the device path — the run loads the models there, the bank is
    loaded there, the map is fitted there in float64, the translator and the optimiser live there — and give the
    default run's checkpoint bit for bit, bank stage and replay stage both."""
    source, target = _pair()
    for lm, name in ((source, "src"), (target, "tgt")):
        lm.model.save_pretrained(tmp_path / name)
        lm.tokenizer.save_pretrained(tmp_path / name)
    common = ["--source", str(tmp_path / "src"), "--target", str(tmp_path / "tgt"), "--max_steps", "2",
              "--batch_size", "1", "--total_tokens", "24", "--prefix_tokens", "12", "--num_sequences", "4",
              "--translator_dim", "16", "--translator_heads", "2", "--mot_num_translators", "2", "--mot_top_k", "1",
              "--max_window_size_ratio", "0.5", "--topk_sparse_attn", "4", "--num_bottom_full_attn", "1",
              *(f"--{k}={v}" for k, v in TINY_RECIPE.items()), "--init", "linear", "--linear_previous", "1",
              "--linear_previous_dims", "8", "--bank_tokens", "160", "--bank_min_tokens", "16",
              "--bank_max_tokens", "32", "--bank_steps", "3", "--bank_batch", "2", "--bank_crop", "12"]
    monkeypatch.delenv("MOT_VIZ_DEVICE", raising=False)
    runs_ = {"default": [], "argument": ["--device", "cpu"], "variable": []}
    for name, extra in runs_.items():
        if name == "variable":
            monkeypatch.setenv("MOT_VIZ_DEVICE", "cpu")
        assert train_mod.main([*common, "--output_dir", str(tmp_path / name), *extra]) == 0
    weights = {name: load_file(str(tmp_path / name / "checkpoint" / "translator.safetensors")) for name in runs_}
    assert weights["default"].keys() == weights["argument"].keys() == weights["variable"].keys()
    for name in ("argument", "variable"):
        assert all(torch.equal(weights["default"][k], weights[name][k]) for k in weights["default"])
    state = json.loads((tmp_path / "argument" / "checkpoint" / "train_state.json").read_text())
    assert state["device"] == "cpu"  # a resume elsewhere can say it continues to rounding only
    fit = json.loads((tmp_path / "argument" / "bank_stage.json").read_text())["linear_fit"]
    assert fit == {**json.loads((tmp_path / "default" / "bank_stage.json").read_text())["linear_fit"],
                   "seconds": fit["seconds"]}


@pytest.mark.skipif(torch.cuda.is_available(), reason="refusing a missing GPU needs a machine without one")
def test_a_device_that_is_not_there_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(train_mod, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert train_mod.main(["--device", "cuda", "--output_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ModelLoadError: Device 'cuda' was asked for (from the device argument)")
    assert not (tmp_path / "run").exists()


def test_bf16_autocast_trains_close_to_float32_with_float32_weights(tmp_path):
    """--autocast bf16: the forward passes run in bfloat16 (the losses move by bfloat16's rounding, not more), the
    translator's weights and optimiser state stay float32."""
    source, target = _pair()
    logs, weights = {}, {}
    for mode in ("none", "bf16"):
        run_dir = train(_cfg(tmp_path / mode, max_steps=3, autocast=mode), source=source, target=target,
                        bank=_bank(n=6), progress=False)
        logs[mode] = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
        weights[mode] = load_file(str(run_dir / "checkpoint" / "translator.safetensors"))
    first = {mode: logs[mode][0] for mode in logs}
    for key in ("ce", "mse_k", "mse_v"):  # the first step's terms: same weights, only the forward's precision differs
        assert first["bf16"][key] == pytest.approx(first["none"][key], rel=0.05), key
        assert first["bf16"][key] != first["none"][key]  # bfloat16 did run
    assert all(w.dtype == torch.float32 and torch.isfinite(w).all() for w in weights["bf16"].values())


@pytest.mark.parametrize("extra", ["", ", init='linear', bank_steps=3, bank_batch=2, bank_crop=12, bank_tokens=160, "
                                   "bank_min_tokens=16, bank_max_tokens=32, translation_weight=0.5"],
                         ids=["replay stage", "with bank stage"])
def test_two_processes_keep_identical_translators(tmp_path, extra):
    source, target = _pair()
    for lm, name in ((source, "src"), (target, "tgt")):
        lm.model.save_pretrained(tmp_path / name)
        lm.tokenizer.save_pretrained(tmp_path / name)
    from safetensors.torch import save_file

    save_file({"bank": _bank()}, str(tmp_path / "bank.safetensors"))
    script = tmp_path / "worker.py"
    script.write_text(f"""
import os, sys, torch
from safetensors.torch import load_file, save_file
from mot_viz.engine.models import load_model
from mot_viz.train.train import TrainConfig, train
import mot_viz.train.train as t
cfg = TrainConfig(**{{**{TINY_RECIPE!r}, **dict(
    source={str(tmp_path / 'src')!r}, target={str(tmp_path / 'tgt')!r}, output_dir={str(tmp_path / 'run')!r},
    max_steps=3, batch_size=1, grad_accum_steps=1, total_tokens=24, prefix_tokens=12, learning_rate=1e-2,
    warmup_steps=1, translator_dim=16, translator_heads=2, mot_num_translators=2, mot_top_k=1,
    max_window_size_ratio=0.5, topk_sparse_attn=4, num_bottom_full_attn=1, log_every=1, save_every=1{extra})}})
captured = {{}}
real_build = t.MoT.build
def build(*a, **k):
    captured['mot'] = real_build(*a, **k)
    return captured['mot']
t.MoT.build = build
train(cfg, bank=load_file({str(tmp_path / 'bank.safetensors')!r})['bank'], progress=False)
rank = os.environ['RANK']
save_file({{k: v.contiguous() for k, v in captured['mot'].translator.state_dict().items()}}, {str(tmp_path)!r} + f'/rank{{rank}}.safetensors')
""")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "MOT_VIZ_CACHE": str(tmp_path / "cache")}
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", "29517", str(script)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = load_file(str(tmp_path / "rank0.safetensors"))
    r1 = load_file(str(tmp_path / "rank1.safetensors"))
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    saved = load_file(str(tmp_path / "run" / "checkpoint" / "translator.safetensors"))
    assert all(torch.equal(saved[k], r0[k]) for k in r0)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert len(log) == 3  # only rank 0 logs
    if extra:  # the bank was built once (by rank 0) and the bank stage ran on both ranks in step
        summary = json.loads((tmp_path / "run" / "bank_stage.json").read_text())
        assert summary["bank_stage"]["bank_step"] == 3
        assert len(list((tmp_path / "cache" / "banks").iterdir())) == 1


def test_depth_ratio_search_scores_every_window_and_picks_the_best(tmp_path):
    source = tiny_model("gpt2", vocab_size=280, layers=6, seed=1)
    target = tiny_model("llama", layers=4)
    cfg = _cfg(tmp_path, layer_alignment="depth-ratio", min_window_size_ratio=0.5, max_window_size_ratio=0.75,
               proxy_steps=2, proxy_val_sequences=2, max_steps=1)
    run_dir = train(cfg, source=source, target=target, bank=_bank(n=6), progress=False)
    profile = json.loads((run_dir / "channel_profile.json").read_text())
    scores = {tuple(map(int, k.split(":"))): v for k, v in profile["proxy_scores"].items()}
    # size 2 (= round(4 · 0.5)) at every start 0..2 is probed, then growth to size 3 near the best start
    assert {(s, 2) for s in range(3)} <= set(scores)
    best2 = min(range(3), key=lambda s: (scores[(s, 2)], -s))
    grown = {s for (s, w) in scores if w == 3}
    assert grown and all(abs(s - best2) <= 2 for s in grown) and profile["size"] == 3
    chosen = json.loads((run_dir / "resolved_channels.json").read_text())["edge"]
    assert len(chosen) == 3 and [c["dst_layer_idx"] for c in chosen] == list(range(profile["start"], profile["start"] + 3))
