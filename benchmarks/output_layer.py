"""Benchmark of the output layer's two kernels for a few positions (a measurement, not a test).

    .venv/bin/python benchmarks/output_layer.py [--rows 1 2 3 4 6 8 9 12 16] [--threads 2 1] [--repeats 15]
        [--label "what changed"] [--out benchmarks/output_layer.md]

A prepared model's output layer (mot_viz.engine.hf.install_output_layer) multiplies 2–hf.FEW_ROWS positions as
weight @ hidden.T instead of the stock hidden @ weight.T. This times both on the bundled target's real output layer
(Gemma-3-270m: 262,144 × 640, tied to the embedding) for each number of rows and thread count, in one process,
the two kernels in turn, and reports medians and their ratio. It writes the current table to --out.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch


from mot_viz.engine import hf
from mot_viz.engine.models import DEFAULT_TARGET, load_model
from mot_viz.fsutil import write_text_atomic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 9, 12, 16])
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--repeats", type=int, default=15, help="timed calls per kernel (the median is reported)")
    parser.add_argument("--label", default="the output layer as it is", help="heading of the new table")
    parser.add_argument("--out", default="benchmarks/output_layer.md")
    args = parser.parse_args(argv)
    head = load_model(DEFAULT_TARGET).model.get_output_embeddings()
    g = torch.Generator().manual_seed(0)

    def seconds(fn, x) -> float:
        fn(x)  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    stock = lambda x: torch.nn.functional.linear(x, head.weight, head.bias)
    ours = lambda x: hf.forward._output_layer_forward(head, x)
    rows_out = []
    with torch.no_grad():
        for threads in args.threads:
            torch.set_num_threads(threads)
            for rows in args.rows:
                x = torch.randn(rows, 1, head.in_features, generator=g)  # one position of `rows` batch rows
                a, b = seconds(stock, x), seconds(ours, x)
                rows_out.append((threads, rows, a, b))
                print(f"{threads} thread(s), {rows} rows: stock {a * 1e3:.1f} ms, installed {b * 1e3:.1f} ms", flush=True)
    title = "# Output layer benchmark: a few positions through Gemma-3-270m's output layer"
    lines = [f"## {datetime.date.today()}: {args.label}", "",
             f"`python benchmarks/output_layer.py` on {platform.machine()}, {os.cpu_count()} CPU cores, torch "
             f"{torch.__version__}, float32; {DEFAULT_TARGET}'s output layer {tuple(head.weight.shape)}; median of "
             f"{args.repeats} calls per kernel after a warm-up. Stock: hidden @ weight.T (torch.nn.functional.linear); "
             f"installed: what a prepared model's output layer runs (weight @ hidden.T for 2–{hf.FEW_ROWS} rows, "
             "the stock product otherwise).", "",
             "| threads | rows | stock (ms) | installed (ms) | stock ÷ installed |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {t} | {r} | {a * 1e3:.1f} | {b * 1e3:.1f} | {a / b:.2f} |" for t, r, a, b in rows_out]
    write_text_atomic(Path(args.out), title + "\n\n" + "\n".join(lines).strip() + "\n")  # git keeps earlier runs
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
