"""Benchmark of the MoT engine on the bundled pair, or on a synthetic pair of any size (a measurement, not a test).

    .venv/bin/python benchmarks/engine.py [--lengths 128 256 512 1024 2048 4096 8000] [--repeats 3]
        [--checkpoint pretrained/smollm2-to-gemma3] [--label "what changed"] [--chunks 0 32 64 128 256] [--split]
        [--dense] [--out benchmarks/engine.md]
    .venv/bin/python benchmarks/engine.py --source synthetic:llama3.2-1b --target synthetic:qwen2.5-1.5b
        [--recipe configs/smollm2-to-gemma3.json] [--direct synthetic] ...

A synthetic pair (mot_viz.engine.synthetic: seeded random weights of a real architecture) is translated by a
translator of the recipe's shape with seeded random weights (testing.synthetic_mot) over contexts of the shared id
stream; `--direct synthetic` adds a random full-depth map of the shipped direct map's shape. Its times are the
engine's cost at that size; nothing it computes measures quality.

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
from mot_viz.engine.models import DEFAULT_SOURCE, DEFAULT_TARGET, load_model, model_device
from mot_viz.engine.mot import MoT, native_cache, prepare_source, replay, translate
from mot_viz.engine.replay_config import ReplayConfig, replay_mode
from mot_viz.engine.synthetic import (NO_QUALITY, SYNTHETIC_ALIGNMENT, check_fits, is_synthetic, shared_vocab,
                                      synthetic_text)
from mot_viz.engine.testing import randomize_linear_path, synthetic_mot
from mot_viz.errors import ConfigError, ContextError
from mot_viz.fsutil import write_text_atomic
from mot_viz.train.config import parse_args
from mot_viz.train.quickfit import QuickFitConfig, quickfit_channels

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


def context_of(target, n_tokens: int, source=None) -> str:
    """A context of n_tokens target tokens: the passage repeated, or for a synthetic pair the shared id stream."""
    if is_synthetic(target.spec.name):
        return synthetic_text(n_tokens, shared_vocab(target.spec.vocab_size, source.spec.vocab_size))
    ids = encode(target.tokenizer, PASSAGE * (n_tokens // 60 + 2))[:n_tokens]
    return target.tokenizer.decode(ids)


def synthetic_direct(source, target) -> MoT:
    """A full-depth map without replay of the shipped direct map's shape (one linear map per target layer from the
    depth-matched source layer), with seeded random weights; ConfigError when the source has fewer layers."""
    channels = quickfit_channels(source, target, QuickFitConfig(direct=True))
    torch.manual_seed(0)
    mot = MoT.build(source.spec, target.spec, channels, replay_mode(ReplayConfig(), "none"), variant="linear",
                    key_space="pre_rope", linear_per_layer=True)
    randomize_linear_path(mot)
    return mot.to(target.device).eval()


def peak_device_mb(device: torch.device) -> float | None:
    """The device's peak allocated memory (MB) since the last reset; None on the CPU (peak RSS says it there)."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


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
    parser.add_argument("--source", default=DEFAULT_SOURCE, help="source model (e.g. synthetic:llama3.2-1b)")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="target model (e.g. synthetic:qwen2.5-1.5b)")
    parser.add_argument("--recipe", default="configs/smollm2-to-gemma3.json",
                        help="a synthetic pair's translator: this training recipe's shape with seeded random weights")
    parser.add_argument("--fused", action="store_true",
                        help="also compare the sparse replay's gather path with its attention fused into one SDPA call "
                             "per chunk (shipped) and unfused (two einsums and a softmax), alternating within each "
                             "repeat: the replay's milliseconds per length")
    parser.add_argument("--dense", action="store_true",
                        help="also time the dense replay (every layer attending over every key) of each translation")
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
                             "mot_viz.train.quickfit --direct, e.g. pretrained/smollm2-to-gemma3-direct; 'synthetic': a "
                             "random one of its shape, for a synthetic pair) after each translation: its map alone and "
                             "its whole cache ÷ the same run's native prefill")
    parser.add_argument("--out", default="benchmarks/engine.md",
                        help="markdown file the table is written to (the current table; git keeps earlier ones)")
    args = parser.parse_args()

    torch.manual_seed(0)
    load_at_start = os.getloadavg()[0]
    device = model_device()
    synthetic = is_synthetic(args.source) and is_synthetic(args.target)
    if is_synthetic(args.source) != is_synthetic(args.target):
        raise ConfigError("--source and --target are both synthetic models or neither: a synthetic model has no "
                          "tokenizer to align with a real one.")
    check_fits([args.source, args.target], device)  # a pair too large for the device: said before loading
    source, target = load_model(args.source), load_model(args.target)
    if synthetic:
        mot = synthetic_mot(source, target, parse_args(["--config", args.recipe])[0])
        direct_note = ""
        try:
            direct = synthetic_direct(source, target) if args.direct else None
        except ConfigError as exc:
            direct, direct_note = None, str(exc)
            print(f"no direct map: {exc}", flush=True)
    else:
        mot = load_checkpoint(args.checkpoint, source, target)[0]
        direct = load_checkpoint(args.direct, source, target)[0] if args.direct else None
    mot.eval()
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

    rows, split_rows, skipped, lengths, direct_rows, dense_rows = [], [], [], [], [], []
    for n in args.lengths:
        text = context_of(target, n, source)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            translate(mot, source, target, text)  # warm-up
        except ContextError as exc:  # longer than the source holds: the other lengths still run
            skipped.append(f"{n}: {exc}")
            print(f"{n} tokens skipped: {exc}", flush=True)
            continue
        lengths.append(n)
        translations, stock, direct_runs, dense = [], [], [], []
        for _ in range(args.repeats):  # each translation, then the stock native prefill of the same ids
            translations.append(translate(mot, source, target, text))
            if args.dense:  # the same translated window replayed with every layer attending over every key
                tr = translations[-1]
                t0 = time.perf_counter()
                replay(target, tr.target_ids, mot.channels.target_layers, tr.translated.keys, tr.translated.values, None)
                dense.append(time.perf_counter() - t0)
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
        rows.append((n_t, med, peak_mb, peak_device_mb(device)))
        if dense:
            dense_rows.append((n_t, med, statistics.median(dense)))
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
            text = context_of(target, n, source)
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
    fused_rows = alternating("SPARSE_GATHER_FUSED", [1, 0], lambda t: t["replay"], with_native=False,
                             value_of=bool) if args.fused else []
    topk_rows = alternating("TOPK_QUERY_CHUNK", args.topk_chunks, lambda t: t["source_prefill"], with_native=False,
                            value_of=lambda v: v if v > 0 else 1 << 30) if args.topk_chunks else []  # 0: whole matrix

    stop_rows = []
    if args.whole_last_layer:  # the same translation with and without the cache-only stop, in turn within each repeat
        compared = ("source_prefill", "replay", "native_prefill")
        for n in lengths:
            text = context_of(target, n, source)
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
    on_device = device.type == "cuda"
    title = f"# Engine benchmark: {args.source} → {args.target}" if synthetic else \
        "# Engine benchmark: SmolLM2-135M → Gemma-3-270m"
    command = (f"--source {args.source} --target {args.target} --recipe {args.recipe}" if synthetic
               else f"--checkpoint {args.checkpoint}")
    on = (f"{torch.cuda.get_device_name(device)} ({device})" if device.type == "cuda" else
          f"{platform.machine()}, {os.cpu_count()} CPU cores")
    lines = [
        title,
        "",
        f"## {datetime.date.today()}: {args.label}",
        "",
        *([f"**{NO_QUALITY.capitalize()}**: {args.source} → {args.target}, a translator of the recipe's shape with "
           f"seeded random weights; {SYNTHETIC_ALIGNMENT}.", ""] if synthetic else []),
        f"Measured on {on}, torch {torch.__version__} with {threads} "
        f"thread(s), float32; `python benchmarks/engine.py {command}` "
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
        "| (translator + replay) ÷ stock native | peak RSS (MB) |" + (" peak device memory (MB) |" if on_device else ""),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if on_device else ""),
    ]
    for n_t, med, peak, peak_device in rows:
        native = med["native_prefill"]
        lines.append(
            f"| {n_t} | {med['source_prefill']*1e3:.0f} | {med['alignment']*1e3:.0f} | {med['translator']*1e3:.0f} "
            f"| {med['replay']*1e3:.0f} | {native*1e3:.0f} | {med['stock_native']*1e3:.0f} "
            f"| {med['translator']/native:.2f} | {(med['translator'] + med['replay'])/native:.2f} "
            f"| {(med['translator'] + med['replay'])/med['stock_native']:.2f} | {peak:.0f} |"
            + (f" {peak_device:.0f} |" if on_device else "")
        )
    lines += ["", "Peak RSS is the whole process (both models loaded) after that length, so it only grows down the table."
              + (" Peak device memory is the most the device held during that length's runs (both models' weights "
                 "included)." if on_device else "")]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(skipped)]
    if len(rows) > 1:  # a stage linear in N grows by the tokens' ratio; faster than that is super-linear
        growth = [*stages, "stock_native"]
        lines += ["", "Growth from the row above: each stage's time ÷ its time at the previous length, beside the "
                  "tokens' ratio (a stage linear in the length grows by the tokens' ratio):", "",
                  "| target tokens | tokens × | " + " | ".join(STAGE_NAMES[s] + " ×" for s in growth) + " |",
                  "|---:|---:|" + "---:|" * len(growth)]
        for (n0, m0, *_), (n1, m1, *_) in zip(rows, rows[1:]):
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
    if dense_rows:
        lines += ["", f"Dense replay (`--dense`): the same translated window replayed with every layer attending over "
                  f"every key (no sparse indices), after each translation; median of {args.repeats}:", "",
                  "| target tokens | sparse replay (ms) | dense replay (ms) | native prefill (ms) "
                  "| (translator + sparse replay) ÷ native | (translator + dense replay) ÷ native |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for n_t, med, dense_s in dense_rows:
            native = med["native_prefill"]
            lines.append(f"| {n_t} | {med['replay']*1e3:.0f} | {dense_s*1e3:.0f} | {native*1e3:.0f} "
                         f"| {(med['translator'] + med['replay'])/native:.2f} "
                         f"| {(med['translator'] + dense_s)/native:.2f} |")
    if synthetic and args.direct and direct is None:
        lines += ["", f"No full-depth map: {direct_note}"]
    if chunk_rows:
        label = lambda c: "one SDPA call" if c <= 0 else f"chunks of {c}"
        lines += ["", f"Replay ÷ native prefill by the masked sparse replay's query chunk size (`--chunks "
                  f"{' '.join(map(str, args.chunks))}`; shipped: {hf.attention.SPARSE_QUERY_CHUNK}), each the median of "
                  f"{args.repeats} translations that take the chunk sizes in turn:", "",
                  "| target tokens | " + " | ".join(label(c) for c in args.chunks) + " |",
                  "|---:|" + "---:|" * len(args.chunks)]
        lines += [f"| {n_t} | " + " | ".join(f"{r[c]:.2f}" for c in args.chunks) + " |" for n_t, r in chunk_rows]
    if fused_rows:
        lines += ["", "The sparse replay's gather path with its attention fused (`--fused`: one "
                  "scaled_dot_product_attention call per chunk of queries, each query a batch of its own over its k "
                  "gathered keys; shipped) and unfused (two einsums and a float32 softmax, the previous code), each the "
                  f"median of {args.repeats} translations that take both in turn:", "",
                  "| target tokens | replay, fused (ms) | replay, unfused (ms) | fused ÷ unfused |", "|---:|---:|---:|---:|"]
        lines += [f"| {n_t} | {r[1]*1e3:.0f} | {r[0]*1e3:.0f} | {r[1]/r[0]:.2f} |" for n_t, r in fused_rows]
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
