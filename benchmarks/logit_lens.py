"""Benchmark of the Logit lens page's computation for one context (a measurement, not a test).

    .venv/bin/python benchmarks/logit_lens.py [--checkpoint pretrained/smollm2-to-gemma3-mid] [--examples 5]
        [--threads 2] [--repeats 3] [--label "what changed"] [--out benchmarks/logit_lens.md]

On the bundled pair, for the first SQuAD validation examples the app offers (seed 0, as its sidebar samples them),
the translation is computed first (the page finds it cached: every page reads the same one), then the page's
default lens is timed stage by stage: the linear map's replayed cache, the traces of every cache over the question
(one batched forward for the caches of the context's length), the lens at the question's last position (every
layer of every cache through the output layer) and the attention shares; then what following the native answer
adds (its greedy decoding, at most mot_viz.analysis.logit_lens.LENS_ANSWER_TOKENS tokens, and the traces over the
question and that answer instead). Medians over --repeats after a warm-up; beside them the translation's own
time, measured in the same run. It writes the current table to --out.
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

from mot_viz.analysis.logit_lens import LENS_ANSWER_TOKENS, attention_shares, lens_trace, logit_lens, native_answer_ids
from mot_viz.app.settings import EXAMPLES_PER_DATASET
from mot_viz.data.eval_data import load_dataset
from mot_viz.engine.alignment import encode
from mot_viz.engine.checkpoint import load_checkpoint, read_config
from mot_viz.engine.models import load_model
from mot_viz.engine.mot import empty_context_cache, translate
from mot_viz.engine.prompts import build_prompt
from mot_viz.sharing.linear import linear_cache
from mot_viz.eval.long_settings import default_linear
from mot_viz.fsutil import write_text_atomic

STAGES = ("linear replay", "traces", "lens", "attention", "total", "native answer", "traces with it", "total following it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="pretrained/smollm2-to-gemma3-mid")
    parser.add_argument("--examples", type=int, default=5, help="SQuAD examples (the app's first ones)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per example (the median is reported)")
    parser.add_argument("--label", default="the logit lens as it is", help="heading of the table")
    parser.add_argument("--out", default="benchmarks/logit_lens.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = read_config(args.checkpoint)
    source, target = load_model(config["source"]["name"]), load_model(config["target"]["name"])
    mot, _ = load_checkpoint(args.checkpoint, source, target)
    linear_path = default_linear(args.checkpoint)
    linear = None if linear_path is None else load_checkpoint(linear_path, source, target)[0]
    rows = []
    for example in load_dataset("squad", n=EXAMPLES_PER_DATASET, seed=0)[: args.examples]:
        prompt = build_prompt(example, target.chat_frame)
        start = time.perf_counter()
        translation = translate(mot, source, target, prompt.context_text)
        translation_seconds = time.perf_counter() - start
        suffix = encode(target.tokenizer, prompt.suffix_text)
        runs = []
        for repeat in range(args.repeats + 1):  # the first is a warm-up
            t = {}
            clock = time.perf_counter()

            def lap(stage: str) -> None:
                nonlocal clock
                now = time.perf_counter()
                t[stage] = now - clock
                clock = now

            with torch.no_grad():
                caches = {"native": translation.native_kv, "mot": translation.mixed_kv}
                if linear is not None:
                    caches["linear"] = linear_cache(mot, linear, source, target, translation)
                caches["no_context"] = empty_context_cache(target)
                lap("linear replay")
                trace = lens_trace(target, caches, suffix, None, translation.prefix_len)  # the page's default
                lap("traces")
                logit_lens(target, trace, 0)
                lap("lens")
                attention_shares(trace, 0)
                lap("attention")
                t["total"] = sum(t.values())
                clock = time.perf_counter()
                answer = native_answer_ids(target, translation.native_kv, suffix)
                lap("native answer")
                lens_trace(target, caches, suffix, answer, translation.prefix_len)
                lap("traces with it")
            t["total following it"] = t["total"] - t["traces"] + t["native answer"] + t["traces with it"]
            if repeat:
                runs.append(t)
        medians = {stage: statistics.median(r[stage] for r in runs) for stage in STAGES}
        rows.append({"id": example.id, "tokens": int(translation.target_ids.shape[1]), "answer": len(answer),
                     "translation": translation_seconds, **medians})
        print(f"{example.id}: {rows[-1]['tokens']} tokens, lens total {medians['total']:.2f} s "
              f"(translation {translation_seconds:.2f} s)", flush=True)
    title = "# Logit lens benchmark: the Logit lens page's computation for one context"
    lines = [f"## {datetime.date.today()}: {args.label}", "",
             f"`python benchmarks/logit_lens.py --checkpoint {args.checkpoint}` on {platform.machine()}, "
             f"{os.cpu_count()} CPU cores, torch {torch.__version__} with {args.threads} thread(s), float32; linear map "
             f"`{linear_path}`; the app's first {args.examples} SQuAD examples; median of {args.repeats} runs per "
             f"example after a warm-up (the answer followed: at most {LENS_ANSWER_TOKENS} tokens). Seconds.", "",
             "| example | target tokens | answer tokens | translation | " + " | ".join(STAGES) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(STAGES)]
    for r in rows:
        lines.append(f"| {r['id']} | {r['tokens']} | {r['answer']} | {r['translation']:.2f} | "
                     + " | ".join(f"{r[s]:.2f}" for s in STAGES) + " |")
    totals = [r["total"] for r in rows]
    lines += ["", f"The page's default (the question's last position): median total {statistics.median(totals):.2f} s "
                  f"(max {max(totals):.2f} s); following the native answer: median "
                  f"{statistics.median(r['total following it'] for r in rows):.2f} s; beside a median translation of "
                  f"{statistics.median(r['translation'] for r in rows):.2f} s."]
    write_text_atomic(Path(args.out), title + "\n\n" + "\n".join(lines).strip() + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
