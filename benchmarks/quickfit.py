"""Benchmark of "any pair in seconds" (mot_viz.train.quickfit) on the bundled pair: the seconds from nothing cached to
a saved linear checkpoint, and what a few thousand bank tokens give up against the shipped linear map.

    .venv/bin/python benchmarks/quickfit.py --tokens 4096 --threads 2 --out benchmarks/quickfit.md

The bank and the fit go into a fresh temporary cache, so nothing cached is timed (the models are loaded
before the clock starts, as in the app). Quality: window fidelity on held-out SQuAD passages (method.md §13)
of the quick fit and of pretrained/smollm2-to-gemma3-linear (98k bank tokens), same passages, same run.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import torch


from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.models import load_model
from mot_viz.train.window_fidelity import fidelity_table, summarize_fidelity
from mot_viz.train.mean_vector import heldout_texts, reference_means
from mot_viz.train.quickfit import QuickFitConfig, fit_pair

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "pretrained" / "smollm2-to-gemma3-linear"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096], help="bank sizes to time (target tokens)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--n", type=int, default=10, help="held-out SQuAD passages for the quality check")
    parser.add_argument("--out", help="markdown file to write (printed otherwise)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    source, target = load_model("smollm2-135m"), load_model("gemma3-270m")
    shipped, shipped_config = load_checkpoint(SHIPPED, source, target)
    texts = heldout_texts(target, "squad", args.n)
    lines = [
        "# Benchmark: fit a linear translator for a pair (`mot_viz.train.quickfit`)", "",
        f"Command: `.venv/bin/python benchmarks/quickfit.py --tokens {' '.join(map(str, args.tokens))} "
        f"--threads {args.threads} --n {args.n}`", "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, torch threads "
        f"{args.threads}, float32. Pair: SmolLM2-135M → Gemma-3-270m, terminal window (5 layers), pre-RoPE keys, "
        "LAMBADA bank contexts of 32–256 tokens; nothing cached (fresh temporary cache; models loaded first).", "",
        "| bank tokens | total seconds | bank build (s) | ridge fit (s) | tokens per second |", "|---|---|---|---|---|",
    ]
    fits = {}
    for tokens in args.tokens:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["MOT_VIZ_CACHE"] = cache
            t0 = time.perf_counter()
            path = fit_pair(source, target, QuickFitConfig(tokens=tokens))
            seconds = time.perf_counter() - t0
            mot, config = load_checkpoint(path, source, target)
        training, fit = config["training"], config["metrics"]["linear_fit"]
        fits[tokens] = mot
        used = fit["train_tokens"] + fit["val_tokens"]
        lines.append(f"| {used:,} | {seconds:.1f} | {training['bank_seconds']:.1f} | {fit['seconds']:.1f} | "
                     f"{used / seconds:.0f} |")
        print(lines[-1], flush=True)
    means = reference_means(target, shipped.channels.target_layers)
    lines += ["", f"Held-out window fidelity on {len(texts)} SQuAD passages (window mean; the mean-vector baseline "
              "is 0 centered cosine by construction):", "",
              "| translator | centered K cos | centered V cos | raw K cos | raw V cos | attention-output cos |",
              "|---|---|---|---|---|---|"]
    candidates = {f"quick fit, {t:,}-token bank": m for t, m in fits.items()}
    candidates[f"shipped smollm2-to-gemma3-linear ({shipped_config['metrics']['linear_fit']['train_tokens']:,} "
               "train tokens)"] = shipped
    for label, mot in candidates.items():
        summary = summarize_fidelity(fidelity_table(mot, source, target, texts, means, progress=False))
        row = summary[(summary.layer == "window") & (summary.candidate == "translator")].iloc[0]
        lines.append(f"| {label} | {row.centered_cos_k:.3f} | {row.centered_cos_v:.3f} | {row.raw_cos_k:.3f} | "
                     f"{row.raw_cos_v:.3f} | {row.attn_out_cos:.3f} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
