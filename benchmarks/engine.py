"""Benchmark of the MoT engine on the bundled pair (a measurement, not a test).

    .venv/bin/python benchmarks/engine.py [--lengths 128 256 512 1024 2048 4096 8000] [--repeats 3]
        [--checkpoint pretrained/smollm2-to-gemma3] [--label "what changed"] [--chunks 0 32 64 128 256] [--split]
        [--out benchmarks/engine.md]

For each context length (target tokens) it times, on the machine it runs on: source prefill, token
alignment, translator, replay into the target, and the target's own (native) prefill; it reports the
ratios translator ÷ native prefill and (translate + replay) ÷ native prefill, measured in the same run,
the process's peak resident memory after each length, and how each stage's time grows from one length to
the next beside the tokens' growth. Medians over --repeats runs after one warm-up. A length the source
model cannot hold is skipped with its reason. The table goes to --out under --label (git keeps earlier
runs; an A/B is measured in one run, e.g. --chunks).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch


from mot_viz.engine import hf
from mot_viz.engine.alignment import encode
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.models import DEFAULT_SOURCE, DEFAULT_TARGET, load_model
from mot_viz.errors import ContextError
from mot_viz.engine.mot import native_cache, prepare_source, replay, translate
from mot_viz.fsutil import write_text_atomic

PASSAGE = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region in "
    "France. They were descended from Norse raiders and pirates from Denmark, Iceland and Norway who, under "
    "their leader Rollo, agreed to swear fealty to King Charles III of West Francia. Through generations of "
    "assimilation and mixing with the native Frankish and Roman-Gaulish populations, their descendants would "
    "gradually merge with the Carolingian-based cultures of West Francia. "
)


DIRECT_STAGES = ("source_prefill", "alignment", "translator", "assemble")  # a direct map's cache, stage by stage
STAGE_NAMES = {"source_prefill": "source prefill", "alignment": "alignment", "translator": "translator",
               "replay": "replay", "native_prefill": "native prefill", "stock_native": "stock native prefill"}


def context_of(target, n_tokens: int) -> str:
    ids = encode(target.tokenizer, PASSAGE * (n_tokens // 60 + 2))[:n_tokens]
    return target.tokenizer.decode(ids)


@contextlib.contextmanager
def attention_seconds():
    """Seconds spent in the attention kernels the registered attention function calls (SDPA and both sparse paths)
    inside the block: a list whose one entry grows; everything else a layer does is the rest of its time."""
    spent, names = [0.0], ("sdpa_attention_forward", "windowed_attention", "sparse_attention", "sparse_mask_attention")
    originals = {name: getattr(hf.attention, name) for name in names}

    def timed(kernel):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return kernel(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t0
        return call

    for name, kernel in originals.items():
        setattr(hf.attention, name, timed(kernel))
    try:
        yield spent
    finally:
        for name, kernel in originals.items():
            setattr(hf.attention, name, kernel)


@contextlib.contextmanager
def stock_attention():
    """Every dense layer under the model's own SDPA and [N, N] mask, the windowed kernel off: the target's prefill
    as transformers runs it."""
    shipped = hf.attention.WINDOWED_MIN_WINDOWS
    hf.attention.WINDOWED_MIN_WINDOWS = float("inf")
    try:
        yield
    finally:
        hf.attention.WINDOWED_MIN_WINDOWS = shipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096, 8000],
                        help="context lengths in target tokens (8,000: about the longest the source's 8,192 positions "
                             "hold of this text)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per length (the median is reported)")
    parser.add_argument("--checkpoint", default="pretrained/smollm2-to-gemma3", help="the MoT checkpoint timed")
    parser.add_argument("--label", default="the engine as it is", help="heading of the new table (what changed)")
    parser.add_argument("--chunks", type=int, nargs="*", default=[],
                        help="also compare the masked sparse replay's query chunk sizes (0: one SDPA call), "
                             "alternating within each repeat: replay ÷ native prefill per length")
    parser.add_argument("--whole_last_layer", action="store_true",
                        help="also time each translation with the cache-only prefills running their last layer whole "
                             "(hf.whole_last_layer, as the engine did before stopping at its K/V), alternating: what stopping at its K/V saves")
    parser.add_argument("--topk_chunks", type=int, nargs="*", default=[],
                        help="also compare the source prefill under the sparse index selection's query chunk sizes "
                             "(0: the whole probability matrix of a layer at once), alternating within each repeat")
    parser.add_argument("--split", action="store_true",
                        help="also time, per length, where the replay's and the native prefill's time goes (attention "
                             "kernels vs the rest of the layers), the replay with the sparse path chosen by length and "
                             "with the masked path only, and the source prefill without the top-k selection, in turn "
                             "within each repeat")
    parser.add_argument("--direct", default=None,
                        help="also time a full-depth map without replay (a checkpoint of python -m "
                             "mot_viz.train.quickfit --direct, e.g. pretrained/smollm2-to-gemma3-direct) after each "
                             "translation: its map alone and its whole cache ÷ the same run's native prefill")
    parser.add_argument("--out", default="benchmarks/engine.md",
                        help="markdown file the table is written to (the current table; git keeps earlier ones)")
    args = parser.parse_args()

    torch.manual_seed(0)
    load_at_start = os.getloadavg()[0]
    source, target = load_model(DEFAULT_SOURCE), load_model(DEFAULT_TARGET)
    mot, config = load_checkpoint(args.checkpoint, source, target)
    mot.eval()
    direct = load_checkpoint(args.direct, source, target)[0] if args.direct else None
    channels, cfg = mot.channels, mot.translator.config
    paths = f"{cfg.num_experts} experts top-{cfg.top_k}" if cfg.variant == "mot" else cfg.variant
    if cfg.variant != "linear" and cfg.linear_residual:
        paths += " on a linear path"
    replay_kind = (f"sparse replay top-{mot.replay.topk_sparse_attn} from layer {mot.replay.num_bottom_full_attn} up"
                   if mot.replay.topk_sparse_attn else "dense replay")
    stages = ["source_prefill", "alignment", "translator", "replay", "native_prefill"]

    def where_time_goes(tr) -> dict[str, float]:
        """Medians over --repeats of the source prefill without the selection, the replay alone (its indices mapped
        already) with the shipped path choice and with the masked path only, and the native prefill, the last three
        with the seconds their attention kernels took."""
        shipped, measured = hf.attention.SPARSE_GATHER_RATIO, {}
        layers, keys, values = mot.channels.target_layers, tr.translated.keys, tr.translated.values
        for _ in range(args.repeats):
            timings = {}
            prepare_source(mot, source, target, tr.target_ids, timings, with_attention=False)
            measured.setdefault("source_prefill_no_selection", []).append(timings["source_prefill"])
            for path, ratio in (("replay", shipped), ("replay_masked", float("inf"))):  # inf: no span pays for gather
                hf.attention.SPARSE_GATHER_RATIO = ratio
                with attention_seconds() as spent:
                    t0 = time.perf_counter()
                    replay(target, tr.target_ids, layers, keys, values, tr.sparse_indices)
                    measured.setdefault(path, []).append(time.perf_counter() - t0)
                measured.setdefault(path + "_attention", []).append(spent[0])
            hf.attention.SPARSE_GATHER_RATIO = shipped
            with attention_seconds() as spent:
                t0 = time.perf_counter()
                native_cache(target, tr.target_ids)
                measured.setdefault("native", []).append(time.perf_counter() - t0)
            measured.setdefault("native_attention", []).append(spent[0])
        return {key: statistics.median(r) for key, r in measured.items()}

    rows, split_rows, skipped, lengths, direct_rows = [], [], [], [], []
    for n in args.lengths:
        text = context_of(target, n)
        try:
            translate(mot, source, target, text)  # warm-up
        except ContextError as exc:  # longer than the source holds: the other lengths still run
            skipped.append(f"{n}: {exc}")
            print(f"{n} tokens skipped: {exc}", flush=True)
            continue
        lengths.append(n)
        translations, stock, direct_runs = [], [], []
        for _ in range(args.repeats):  # each translation, then the stock native prefill of the same ids
            translations.append(translate(mot, source, target, text))
            if direct is not None:  # the full-depth map's cache of the same text (the target never reads it)
                direct_runs.append(translate(direct, source, target, text, with_native=False).timings)
            with stock_attention():
                t0 = time.perf_counter()
                native_cache(target, translations[-1].target_ids)
                stock.append(time.perf_counter() - t0)
        med = {s: statistics.median(t.timings[s] for t in translations) for s in stages}
        med["stock_native"] = statistics.median(stock)
        n_t = len(encode(target.tokenizer, text))
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rows.append((n_t, med, peak_mb))
        if direct_runs:
            direct_rows.append((n_t, {s: statistics.median(r[s] for r in direct_runs) for s in DIRECT_STAGES},
                                med["native_prefill"]))
        print(f"{n_t} tokens: " + ", ".join(f"{s} {med[s]*1000:.0f} ms" for s in [*stages, "stock_native"]), flush=True)
        if args.split:
            split_rows.append((n_t, med["translator"], where_time_goes(translations[-1])))
            print(f"{n_t} tokens, split: {split_rows[-1][2]}", flush=True)
        del translations

    def alternating(setting: str, values: list[int], measure, with_native: bool,
                    value_of=lambda v: v) -> list[tuple[int, dict[int, float]]]:
        """Per length: the median of measure(timings) over --repeats translations that take each value of the
        attention module's `setting` (set to value_of(value)) in turn, the shipped value restored after."""
        shipped, out = getattr(hf.attention, setting), []
        for n in lengths:
            text = context_of(target, n)
            measured: dict[int, list[float]] = {v: [] for v in values}
            for _ in range(args.repeats):
                for v in values:
                    setattr(hf.attention, setting, value_of(v))
                    measured[v].append(measure(translate(mot, source, target, text, with_native=with_native).timings))
            setattr(hf.attention, setting, shipped)
            out.append((len(encode(target.tokenizer, text)), {v: statistics.median(r) for v, r in measured.items()}))
            print(f"{out[-1][0]} tokens, {setting}: {out[-1][1]}", flush=True)
        return out

    # the masked sparse replay's query chunks (replay ÷ native), and the sparse index selection's (source prefill)
    chunk_rows = alternating("SPARSE_QUERY_CHUNK", args.chunks, lambda t: t["replay"] / t["native_prefill"],
                             with_native=True) if args.chunks else []
    topk_rows = alternating("TOPK_QUERY_CHUNK", args.topk_chunks, lambda t: t["source_prefill"], with_native=False,
                            value_of=lambda v: v if v > 0 else 1 << 30) if args.topk_chunks else []  # 0: whole matrix

    stop_rows = []
    if args.whole_last_layer:  # the same translation with and without the cache-only stop, in turn within each repeat
        compared = ("source_prefill", "replay", "native_prefill")
        for n in lengths:
            text = context_of(target, n)
            runs_by = {False: [], True: []}
            for _ in range(args.repeats):
                for whole in (False, True):
                    with hf.whole_last_layer() if whole else contextlib.nullcontext():
                        runs_by[whole].append(translate(mot, source, target, text).timings)
            med = {whole: {s: statistics.median(r[s] for r in runs) for s in stages} for whole, runs in runs_by.items()}
            engine = {whole: statistics.median((r["translator"] + r["replay"]) / r["native_prefill"] for r in runs)
                      for whole, runs in runs_by.items()}
            stop_rows.append((len(encode(target.tokenizer, text)),
                              [med[False][s] / med[True][s] for s in compared], engine))
            print(f"{stop_rows[-1][0]} tokens, stopped ÷ whole: {stop_rows[-1][1]}, engine ratio {engine}", flush=True)

    threads = torch.get_num_threads()
    title = "# Engine benchmark: SmolLM2-135M → Gemma-3-270m"
    lines = [
        title,
        "",
        f"## {datetime.date.today()}: {args.label}",
        "",
        f"Measured on {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} with {threads} "
        f"thread(s), float32; `python benchmarks/engine.py --checkpoint {args.checkpoint}` "
        f"(window {list(channels.target_layers)}, W={channels.window}, {cfg.key_space.replace('_', '-')} keys, "
        f"dim {cfg.dim}, {paths}; {replay_kind}). The source prefill chooses the top-k source positions of the "
        "sparse replay as it runs (its column includes that); the replay column includes mapping them to the target "
        f"grid. Median of {args.repeats} runs after a warm-up. Timings on shared "
        "2-core machines are noisy: read the ratios, which come from the same run (1-minute load average "
        f"{load_at_start:.1f} when it started, {os.getloadavg()[0]:.1f} when it ended, on {os.cpu_count()} cores: "
        "above the cores, other processes shared the machine). Two native prefills: the "
        "engine's (its sliding-window layers attend over only the keys a query may see: hf.windowed_attention, "
        "as the replay's dense layers do) and the stock one (transformers' SDPA under the model's [N, N] mask on "
        "every layer, how the target prefills a text without MoT Viz), timed after each translation.",
        "",
        "| target tokens | source prefill (ms) | alignment (ms) | translator (ms) | replay (ms) | native prefill (ms) "
        "| stock native prefill (ms) | translator ÷ native | (translator + replay) ÷ native "
        "| (translator + replay) ÷ stock native | peak RSS (MB) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n_t, med, peak in rows:
        native = med["native_prefill"]
        lines.append(
            f"| {n_t} | {med['source_prefill']*1e3:.0f} | {med['alignment']*1e3:.0f} | {med['translator']*1e3:.0f} "
            f"| {med['replay']*1e3:.0f} | {native*1e3:.0f} | {med['stock_native']*1e3:.0f} "
            f"| {med['translator']/native:.2f} | {(med['translator'] + med['replay'])/native:.2f} "
            f"| {(med['translator'] + med['replay'])/med['stock_native']:.2f} | {peak:.0f} |"
        )
    lines += ["", "Peak RSS is the whole process (both models loaded) after that length, so it only grows down the table."]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(skipped)]
    if len(rows) > 1:  # a stage linear in N grows by the tokens' ratio; faster than that is super-linear
        growth = [*stages, "stock_native"]
        lines += ["", "Growth from the row above: each stage's time ÷ its time at the previous length, beside the "
                  "tokens' ratio (a stage linear in the length grows by the tokens' ratio):", "",
                  "| target tokens | tokens × | " + " | ".join(STAGE_NAMES[s] + " ×" for s in growth) + " |",
                  "|---:|---:|" + "---:|" * len(growth)]
        for (n0, m0, _), (n1, m1, _) in zip(rows, rows[1:]):
            lines.append(f"| {n1} | {n1 / n0:.2f} | " + " | ".join(f"{m1[s] / m0[s]:.2f}" for s in growth) + " |")
    if split_rows:
        lines += ["", "Where the time goes (`--split`): the replay alone (indices mapped already) and the native "
                  "prefill again, each split into its attention kernels and the rest of its layers (projections, "
                  "MLPs, norms, RoPE, which both run on every position), the replay also with the masked sparse path "
                  "only; the source prefill without the top-k selection; medians of "
                  f"{args.repeats} runs taking these in turn. "
                  "The bound is the engine ratio if the replay's attention took no time:", "",
                  "| target tokens | source prefill without selection (ms) | replay attention (ms) | replay rest (ms) "
                  "| replay attention, masked path only (ms) | native attention (ms) | native rest (ms) "
                  "| (translator + replay) ÷ native | the same, masked path only | bound: (translator + replay rest) "
                  "÷ native |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for n_t, translator, m in split_rows:
            rest, native = m["replay"] - m["replay_attention"], m["native"]
            lines.append(
                f"| {n_t} | {m['source_prefill_no_selection']*1e3:.0f} | {m['replay_attention']*1e3:.0f} "
                f"| {rest*1e3:.0f} | {m['replay_masked_attention']*1e3:.0f} | {m['native_attention']*1e3:.0f} "
                f"| {(native - m['native_attention'])*1e3:.0f} | {(translator + m['replay'])/native:.2f} "
                f"| {(translator + m['replay_masked'])/native:.2f} | {(translator + rest)/native:.2f} |")
    if direct_rows:
        lines += ["", f"Full-depth map without replay (`--direct {args.direct}`: every target layer's K/V mapped from "
                  "its source layer and used as the cache, the target never reading the context), timed after each "
                  f"translation on the same text; median of {args.repeats}. Map = the per-layer ridge maps and the "
                  "target's RoPE; assemble = the target's BOS prefix and the concatenation; the native prefill is the "
                  "same run's (engine's):", "",
                  "| target tokens | source prefill (ms) | alignment (ms) | map (ms) | assemble (ms) | native prefill (ms) "
                  "| map ÷ native | (map + assemble) ÷ native | whole direct cache ÷ native |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for n_t, d, native in direct_rows:
            whole = sum(d.values())
            lines.append(f"| {n_t} | {d['source_prefill']*1e3:.0f} | {d['alignment']*1e3:.0f} "
                         f"| {d['translator']*1e3:.0f} | {d['assemble']*1e3:.0f} | {native*1e3:.0f} "
                         f"| {d['translator']/native:.3f} | {(d['translator'] + d['assemble'])/native:.3f} "
                         f"| {whole/native:.2f} |")
    if chunk_rows:
        label = lambda c: "one SDPA call" if c <= 0 else f"chunks of {c}"
        lines += ["", f"Replay ÷ native prefill by the masked sparse replay's query chunk size (`--chunks "
                  f"{' '.join(map(str, args.chunks))}`; shipped: {hf.attention.SPARSE_QUERY_CHUNK}), each the median of "
                  f"{args.repeats} translations that take the chunk sizes in turn:", "",
                  "| target tokens | " + " | ".join(label(c) for c in args.chunks) + " |",
                  "|---:|" + "---:|" * len(args.chunks)]
        lines += [f"| {n_t} | " + " | ".join(f"{r[c]:.2f}" for c in args.chunks) + " |" for n_t, r in chunk_rows]
    if topk_rows:
        label = lambda c: "whole matrix" if c <= 0 else f"chunks of {c}"  # noqa: E731
        lines += ["", f"Source prefill (s) by the sparse index selection's query chunk (`--topk_chunks "
                  f"{' '.join(map(str, args.topk_chunks))}`; shipped: {hf.attention.TOPK_QUERY_CHUNK}), each the "
                  f"median of {args.repeats} translations that take the chunk sizes in turn:", "",
                  "| target tokens | " + " | ".join(label(c) for c in args.topk_chunks) + " |",
                  "|---:|" + "---:|" * len(args.topk_chunks)]
        lines += [f"| {n_t} | " + " | ".join(f"{r[c]:.1f}" for c in args.topk_chunks) + " |" for n_t, r in topk_rows]
    if stop_rows:
        lines += ["", f"Cache-only prefills stopped at the last layer's K/V (the shipped engine) against the same "
                  f"prefills running that layer whole (`--whole_last_layer`), each the median of {args.repeats} "
                  "translations that take both in turn:", "",
                  "| target tokens | source prefill: stopped ÷ whole | replay: stopped ÷ whole | native prefill: "
                  "stopped ÷ whole | (translator + replay) ÷ native, stopped | the same, whole |",
                  "|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {n_t} | " + " | ".join(f"{x:.3f}" for x in ratios) + f" | {engine[False]:.2f} | {engine[True]:.2f} |"
                  for n_t, ratios, engine in stop_rows]
    write_text_atomic(Path(args.out), title + "\n\n" + "\n".join(lines[1:]).strip() + "\n")  # git keeps earlier runs
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
