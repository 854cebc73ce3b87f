"""Benchmark of the Layer patching page's scan for one context, once its caches exist (a measurement, not a test).

    .venv/bin/python benchmarks/patching.py [--checkpoint pretrained/smollm2-to-gemma3-mid]
        [--direct pretrained/smollm2-to-gemma3-direct-depth-matched] [--examples 3] [--threads 2] [--repeats 1]
        [--against REV] [--label "what changed"] [--out benchmarks/patching.md]

On the bundled pair, for the first SQuAD validation examples the app offers (seed 0, as its sidebar samples them),
the translation and the direct map's cache are built first (the page finds them cached), then the page's scan is
timed: every target layer and the default groups (window, global, sliding), restoring and breaking, read as the gold
answer's log-probability (mot_viz.engine.patching.patching_scan), for the MoT's cache and for the direct map's; and
the MoT's scan with the answer's-sentence buckets; and, in the same run, the MoT's scan with every reading running every
layer (patching.REUSE_LOWER_LAYERS off: the plain path the page's scan, which starts each patched reading at its
lowest patched layer, is measured against); with --against REV, also the MoT's scan as it was at git revision REV (its
mot_viz/engine/patching.py and mot_viz/engine/hf/forward.py loaded from git into this process), so old and new code
run alternately under the same load. Medians over --repeats after a warm-up, as wall seconds and as the process's CPU
seconds (with one thread, about what an idle core takes, whatever the load); the load average before and after
the run is written beside them (the machine may be shared). It writes the current table to --out.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

from mot_viz.app.settings import EXAMPLES_PER_DATASET
from mot_viz.data.eval_data import load_dataset
from mot_viz.engine import hf
from mot_viz.engine.checkpoint import load_checkpoint, read_config
from mot_viz.engine.models import load_model
from mot_viz.engine.mot import translate
from mot_viz.engine import patching
from mot_viz.engine.patching import layer_groups, patching_scan
from mot_viz.engine.prompts import build_prompt
from mot_viz.eval.patching import gold_buckets, gold_question, method_cache
from mot_viz.fsutil import write_text_atomic

PLAIN = "mot scan, every layer run"
STAGES = ("mot scan", "direct scan", "mot scan with buckets", PLAIN)
AGAINST = "mot scan at {rev}"


def patching_at(rev: str) -> types.ModuleType:
    """mot_viz.engine.patching as it was at git revision `rev`, reading through that revision's hf forward passes
    (mot_viz/engine/hf/forward.py at `rev`; the attention module is today's)."""
    def module(path: str, name: str) -> types.ModuleType:
        source = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout
        mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
        mod.__package__ = name.rsplit(".", 1)[0]
        sys.modules[name] = mod
        exec(compile(source, f"{rev}:{path}", "exec"), mod.__dict__)
        return mod

    forward = module("mot_viz/engine/hf/forward.py", f"mot_viz.engine.hf._forward_at_{rev}")
    old = module("mot_viz/engine/patching.py", f"mot_viz.engine._patching_at_{rev}")
    old.hf = types.SimpleNamespace(**{**{n: getattr(hf, n) for n in hf.__all__},
                                      **{n: getattr(forward, n) for n in hf.__all__ if hasattr(forward, n)}})
    return old


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="pretrained/smollm2-to-gemma3-mid")
    parser.add_argument("--direct", default="pretrained/smollm2-to-gemma3-direct-depth-matched")
    parser.add_argument("--examples", type=int, default=3, help="SQuAD examples (the app's first ones)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per example (the median is reported)")
    parser.add_argument("--against", default=None, help="also time the MoT's scan as it was at this git revision")
    parser.add_argument("--label", default="the layer patching scan as it is", help="heading of the table")
    parser.add_argument("--out", default="benchmarks/patching.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    old = patching_at(args.against) if args.against else None
    stages = STAGES + ((AGAINST.format(rev=args.against),) if old else ())
    config = read_config(args.checkpoint)
    source, target = load_model(config["source"]["name"]), load_model(config["target"]["name"])
    mot, _ = load_checkpoint(args.checkpoint, source, target)
    direct, _ = load_checkpoint(args.direct, source, target)
    groups = layer_groups(target.spec, mot.channels.target_layers)
    rows = []
    load_before = os.getloadavg()
    for example in load_dataset("squad", n=EXAMPLES_PER_DATASET, seed=0)[: args.examples]:
        translation = translate(mot, source, target, build_prompt(example, target.chat_frame).context_text)
        direct_kv = method_cache("direct", mot, source, target, translation, direct=direct).kv
        question, answer = gold_question(target, example)
        buckets = gold_buckets(target, example, translation.prefix_len)
        runs = []
        for repeat in range(args.repeats + 1):  # the first is a warm-up
            t = {}
            for stage, kv, positions in (("mot scan", translation.mixed_kv, None), ("direct scan", direct_kv, None),
                                         ("mot scan with buckets", translation.mixed_kv, buckets),
                                         *((s, translation.mixed_kv, None) for s in stages[3:])):
                patching.REUSE_LOWER_LAYERS = stage != PLAIN
                scan_of = old.patching_scan if stage not in STAGES else patching_scan
                start, cpu = time.perf_counter(), time.process_time()
                scan = scan_of(target.model, translation.native_kv, kv, question, answer, groups, positions)
                t[stage], t[f"{stage} cpu"] = time.perf_counter() - start, time.process_time() - cpu
                t[f"{stage} readings"] = len(scan.readings) + 2
            if repeat:
                runs.append(t)
        medians = {stage: statistics.median(r[stage] for r in runs) for stage in (
            *stages, *(f"{s} cpu" for s in stages))}
        rows.append({"id": example.id, "tokens": int(translation.target_ids.shape[1]), "question": question.shape[1],
                     "answer": len(answer), "readings": runs[0]["mot scan readings"],
                     "bucket readings": runs[0]["mot scan with buckets readings"], **medians})
        print(f"{example.id}: {rows[-1]['tokens']} tokens, mot scan {medians['mot scan']:.2f} s, every layer run "
              f"{medians[PLAIN]:.2f} s", flush=True)
    load_after = os.getloadavg()
    cpu_stages = ("mot scan", *stages[len(STAGES):])
    title = "# Layer patching benchmark: the Layer patching page's scan of one context, its caches built"
    lines = [f"## {datetime.date.today()}: {args.label}", "",
             f"`python benchmarks/patching.py --checkpoint {args.checkpoint} --direct {args.direct} --threads "
             f"{args.threads}` on {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} with "
             f"{args.threads} thread(s), float32; the app's first {args.examples} SQuAD examples; median of "
             f"{args.repeats} run(s) per example after a warm-up; load average (1 min) {load_before[0]:.1f} before "
             f"the run, {load_after[0]:.1f} after. Seconds; readings: patched caches read (every layer "
             "and the window, global and sliding groups, both ways, and the two ends), each the question and the "
             "gold answer over one cache.", "",
             "| example | target tokens | question tokens | answer tokens | readings | " + " | ".join(stages)
             + " | " + " | ".join(f"{s}, CPU s" for s in cpu_stages) + " | readings with buckets |",
             "|---|---:|---:|---:|---:|" + "---:|" * (len(stages) + len(cpu_stages) + 1)]
    for r in rows:
        lines.append(f"| {r['id']} | {r['tokens']} | {r['question']} | {r['answer']} | {r['readings']} | "
                     + " | ".join(f"{r[s]:.2f}" for s in stages) + " | "
                     + " | ".join(f"{r[f'{s} cpu']:.2f}" for s in cpu_stages) + f" | {r['bucket readings']} |")
    fast, plain = statistics.median(r["mot scan"] for r in rows), statistics.median(r[PLAIN] for r in rows)
    lines += ["", f"The page's default scan (MoT, all positions): median {fast:.2f} s (max "
                  f"{max(r['mot scan'] for r in rows):.2f} s), "
                  f"{statistics.median(r['mot scan cpu'] for r in rows):.2f} CPU s; with every reading running every "
                  f"layer {plain:.2f} s (fast ÷ plain {fast / plain:.2f}, per example "
                  + ", ".join(f"{r['mot scan'] / r[PLAIN]:.2f}" for r in rows) + ")."]
    if old:
        was = stages[-1]
        lines += ["", f"Against the scan at {args.against} in the same process: now ÷ then, wall "
                      + ", ".join(f"{r['mot scan'] / r[was]:.2f}" for r in rows) + "; CPU "
                      + ", ".join(f"{r['mot scan cpu'] / r[f'{was} cpu']:.2f}" for r in rows)
                      + f" (per example; medians then {statistics.median(r[was] for r in rows):.2f} s, "
                      f"{statistics.median(r[f'{was} cpu'] for r in rows):.2f} CPU s)."]
    write_text_atomic(Path(args.out), title + "\n\n" + "\n".join(lines).strip() + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
