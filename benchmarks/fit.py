"""Benchmark of the fidelity pipeline's stages on the bundled pair: bank building, the linear fit, the bank
stage and the replay stage, in one run (seconds and tokens per second), written as a markdown table.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fit.py --tokens 4096 --out benchmarks/fit.md

The bank is built into a fresh temporary folder so that nothing cached is timed; the window is the
terminal one of configs/smollm2-to-gemma3.json (pre-RoPE keys, 4 experts of dim 64).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import torch


from mot_viz.data.corpus import training_sequences
from mot_viz.engine.channels import terminal_channels
from mot_viz.engine.models import load_model
from mot_viz.engine.mot import MoT, ReplayConfig
from mot_viz.train.bank import BankConfig, build_bank
from mot_viz.train.fit import bank_stage, fit_linear
from mot_viz.train.train import row_loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="target tokens in the benchmark bank")
    parser.add_argument("--bank_steps", type=int, default=50, help="bank-stage steps timed (batch 8 × 128 tokens)")
    parser.add_argument("--replay_steps", type=int, default=4, help="replay-stage rows timed (128-token rows)")
    parser.add_argument("--out", help="markdown file to write (printed otherwise)")
    args = parser.parse_args()
    source, target = load_model("smollm2-135m"), load_model("gemma3-270m")
    channels = terminal_channels(source.spec.num_layers, target.spec.num_layers, 0.3)
    torch.manual_seed(0)
    mot = MoT.build(source.spec, target.spec, channels, ReplayConfig(32, 2), dim=64, heads=4, variant="mot",
                    num_experts=4, top_k=2, output_activation="none", key_space="pre_rope", linear_residual=True)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        bank = build_bank(mot, source, target, BankConfig(num_tokens=args.tokens), root=Path(root), progress=False)
        seconds = time.perf_counter() - t0
        tokens = int(bank.lengths.sum())
        rows.append(("bank build (source prefill + alignment + target prefill)", seconds, f"{tokens / seconds:.0f} tokens/s",
                     f"{bank.num_contexts} contexts, {tokens} tokens"))
        t0 = time.perf_counter()
        report = fit_linear(mot, bank)
        seconds = time.perf_counter() - t0
        rows.append(("linear fit (ridge, 6 λ, K and V)", seconds, f"{tokens / seconds:.0f} tokens/s",
                     f"λ_K {report['lambda_k']}, λ_V {report['lambda_v']}"))
        mot.translator.silence_experts()
        t0 = time.perf_counter()
        bank_stage(mot, bank, args.bank_steps, 1e-3, batch=8, crop=128, log_every=args.bank_steps, progress=False)
        seconds = time.perf_counter() - t0
        rows.append((f"bank stage ({args.bank_steps} steps of 8 × ≤128 tokens, incl. one held-out pass)", seconds,
                     f"{args.bank_steps / seconds:.2f} steps/s", "no model forward"))
    sequences = training_sequences(target.tokenizer, 128, n_sequences=args.replay_steps, seed=1)
    mot.train()
    t0 = time.perf_counter()
    for row in sequences:
        row_loss(mot, source, target, row, 64, 1.0, translation_weight=1.0).total.backward()
    seconds = time.perf_counter() - t0
    rows.append((f"replay stage ({args.replay_steps} rows of 63 + 64 tokens, forward + backward)", seconds,
                 f"{args.replay_steps * 127 / seconds:.0f} tokens/s", f"{seconds / args.replay_steps:.2f} s per row"))
    lines = [f"Setup: SmolLM2-135M → Gemma-3-270m, terminal window (5 layers), pre-RoPE keys, MoT 4 × dim 64 with the "
             f"linear path; {platform.processor() or platform.machine()}, torch {torch.__version__}, "
             f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, float32. One run; timings on shared "
             "machines are noisy, compare the ratios.", "",
             "| stage | seconds | throughput | note |", "|---|---:|---:|---|"]
    lines += [f"| {name} | {sec:.1f} | {rate} | {note} |" for name, sec, rate, note in rows]
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text("# Benchmark: bank, linear fit and training stages\n\n"
                                  "`OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fit.py "
                                  f"--tokens {args.tokens} --bank_steps {args.bank_steps} --replay_steps "
                                  f"{args.replay_steps} --out {args.out}`\n\n" + text)
    print(text)


if __name__ == "__main__":
    main()
