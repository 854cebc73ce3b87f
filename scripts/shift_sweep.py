"""Injection-start sweep with the propagated-shift trace (method.md §9.1 + §9.2), written to results/shift/<name>/.

    # training-free, seconds per start on a CPU (what results/shift ships):
    python scripts/shift_sweep.py --mode perturbation --n 20 --window 4 --size 0.5
    # training-free with a checkpoint's own per-(token, layer) error profile moved to every start:
    python scripts/shift_sweep.py --mode checkpoint-error-profile --checkpoint pretrained/smollm2-to-gemma3
    # one translator trained per start (cached under runs/shift/; for people with time or a GPU):
    python scripts/shift_sweep.py --mode trained --train_steps 200 --starts 0,4,8,12

Outputs: meta.json (what was run: pair, dataset, split, n, seeds, mode, timings) and summary.csv (one row
per start), tokens.csv (one row per start × condition × example × answer token), trajectories.csv
(ρ_k, α_k, β_k, cos per start × condition × answer-token index × k) and per_example.csv.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

from mot_viz.analysis import shift
from mot_viz.data.eval_data import load_dataset
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.models import load_model
from mot_viz.engine.mot import native_cache
from mot_viz.eval.answers import answer_from_cache
from mot_viz.analysis.shift.start_sweep import SWEEP_FILES
from mot_viz.cli import run_cli
from mot_viz.fsutil import check_out_place
from mot_viz.train import runs


def log(msg: str) -> None:
    print(f"[shift_sweep {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=shift.MODES, default="perturbation", help="what is injected at each start (method.md §9.1)")
    p.add_argument("--source", default="smollm2-135m", help="source model: bundled name, Hub id, folder or .gguf")
    p.add_argument("--target", default="gemma3-270m", help="target model: bundled name, Hub id, folder or .gguf")
    p.add_argument("--dataset", default="squad", help="evaluation dataset the contexts come from (mot_viz.data.eval_data)")
    p.add_argument("--split", default=None, help="dataset split (default: its evaluation split)")
    p.add_argument("--n", type=int, default=20, help="examples")
    p.add_argument("--data_seed", type=int, default=0, help="which n examples (load_dataset shuffle seed)")
    p.add_argument("--window", type=int, default=4, help="W, target layers per injection window")
    p.add_argument("--starts", default=None, help="comma-separated starts (default: every valid start)")
    p.add_argument("--size", type=float, default=0.5, help="perturbation mode: relative size ‖δ‖/‖N‖")
    p.add_argument("--seed", type=int, default=0, help="random directions (perturbation, random control)")
    p.add_argument("--no_controls", action="store_true", help="skip the dir_only / mag_only replays")
    p.add_argument("--task_metric", action="store_true",
                   help="greedy answers per start and condition (F1 / accuracy); slow: ~3 s per answer on a CPU")
    p.add_argument("--max_new_tokens", type=int, default=16, help="longest generated answer (tokens)")
    p.add_argument("--checkpoint", default=None, help="checkpoint-error-profile mode: the checkpoint folder")
    p.add_argument("--base_config", default=str(ROOT / "configs" / "smollm2-to-gemma3.json"),
                   help="trained mode: TrainConfig JSON whose translator/optimiser settings every start uses")
    p.add_argument("--train_steps", type=int, default=60, help="trained mode: optimiser steps per start")
    p.add_argument("--sparse", action="store_true", help="trained mode: train/replay with sparse attention (default dense, §9.1)")
    p.add_argument("--runs_dir", default=str(ROOT / "runs" / "shift"), help="trained mode: where per-start runs are cached")
    p.add_argument("--out", default=None, help="output folder (default results/shift/<source>-to-<target>-<mode>)")
    p.add_argument("--overwrite", action="store_true", help="write into an --out folder holding other files")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is fastest on a busy machine)")
    return p.parse_args(argv)


def trained_mot_factory(args, source, target):
    """A function start -> MoT that trains (or reuses) one translator per injection start."""
    from mot_viz.data.corpus import training_sequences
    from mot_viz.train.train import train

    base = json.loads(Path(args.base_config).read_text())
    tag = f"{args.source}-to-{args.target}-w{args.window}-{'sparse' if args.sparse else 'dense'}-{args.train_steps}steps"
    bank_cache: dict = {}

    @functools.lru_cache(maxsize=None)  # each start's translator is trained or loaded once
    def mot_for_start(start: int):
        cfg = shift_train_config(base, args, start, Path(args.runs_dir) / tag / f"start-{start}")
        run_dir = Path(cfg.output_dir)
        unit = runs.recover_checkpoint(run_dir) if run_dir.is_dir() else None
        if not (unit and json.loads((unit / runs.STATE_FILE).read_text())["step"] >= cfg.max_steps):
            if "bank" not in bank_cache:  # the first rows of the stream are the same whatever its length
                rows = cfg.max_steps * cfg.batch_size * cfg.grad_accum_steps
                bank_cache["bank"] = training_sequences(target.tokenizer, cfg.total_tokens, n_sequences=rows, seed=cfg.seed)
            log(f"training start {start} for {cfg.max_steps} steps -> {run_dir}")
            resume = (run_dir / runs.CONFIG_FILE).is_file()  # continue an unfinished start, else begin it
            train(cfg, resume=resume, overwrite=not resume, source=source, target=target, bank=bank_cache["bank"],
                  progress=False)
        mot, _ = load_checkpoint(run_dir / "checkpoint", source, target)
        return mot

    return mot_for_start, tag


def shift_train_config(base: dict, args, start: int, out_dir: Path):
    from mot_viz.train.train import TrainConfig

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    data = {k: v for k, v in base.items() if k in fields}
    data.update(source=args.source, target=args.target, output_dir=str(out_dir), layer_alignment="injection",
                injection_layer_start_idx=start, injection_window_size=args.window, max_steps=args.train_steps,
                warmup_steps=min(data.get("warmup_steps", 20), max(1, args.train_steps // 5)),
                save_every=args.train_steps, topk_sparse_attn=data.get("topk_sparse_attn", 32) if args.sparse else None)
    return TrainConfig(**data)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out) if args.out else ROOT / "results" / "shift" / f"{args.source}-to-{args.target}-{args.mode}"
    check_out_place(out, ours=lambda path: path.name in SWEEP_FILES, overwrite=args.overwrite)  # before any model loads
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    target = load_model(args.target)
    source = load_model(args.source)  # its depth fixes the valid starts (method.md §3); its KV feeds the translators
    examples = load_dataset(args.dataset, n=args.n, seed=args.data_seed, split=args.split)
    cases = [shift.case_from_example(target, e) for e in examples]
    starts = tuple(int(s) for s in args.starts.split(",")) if args.starts else None
    cfg = shift.SweepConfig(mode=args.mode, window=args.window, starts=starts, perturbation_size=args.size,
                            seed=args.seed, controls=not args.no_controls, task_metric=args.task_metric,
                            max_new_tokens=args.max_new_tokens)
    meta = {
        "source": args.source, "target": args.target, "dataset": args.dataset,
        "split": args.split or examples[0].dataset.split("/", 1)[-1], "n": len(examples), "data_seed": args.data_seed,
        "example_ids": [e.id for e in examples], "command": " ".join(["python", "scripts/shift_sweep.py", *(argv or sys.argv[1:])]),
        "torch": torch.__version__, "python": platform.python_version(), "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    kwargs: dict = {"source": source, "meta": meta}
    if args.mode == "checkpoint-error-profile":
        if not args.checkpoint:
            raise SystemExit("--checkpoint is required for --mode checkpoint-error-profile")
        kwargs["profile_mot"], _ = load_checkpoint(args.checkpoint, source, target)
        meta["checkpoint"] = args.checkpoint
    elif args.mode == "trained":
        kwargs["mot_for_start"], meta["trained_runs"] = trained_mot_factory(args, source, target)
        meta["train_steps"] = args.train_steps
        meta["replay"] = "sparse" if args.sparse else "dense"
    if not args.task_metric:  # the native answer quality still goes on record, once per example
        scores = []
        for e, c in zip(examples, cases):
            kv = native_cache(target, c.target_ids)  # with the target's BOS prefix, as every cache
            scores.append(answer_from_cache(target, kv, e, "native", args.max_new_tokens).score)
        meta["native_task_metric_only"] = sum(scores) / len(scores)
        log(f"native task metric over {len(scores)} examples: {meta['native_task_metric_only']:.3f}")
    last = [time.time()]

    def progress(frac: float, what: str) -> None:
        if time.time() - last[0] > 30 or frac >= 1:
            last[0] = time.time()
            log(f"{100 * frac:5.1f}%  {what}  ({time.time() - t0:.0f} s)")

    result = shift.sweep(target, cases, cfg, progress=progress, **kwargs)
    result.meta["total_seconds"] = round(time.time() - t0, 1)
    result.save(out)
    log(f"wrote {out} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
