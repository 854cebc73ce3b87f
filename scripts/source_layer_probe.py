"""Which source layers predict a target window best? A closed-form ridge map per candidate set, held-out fidelity.

For one pair and one target window, every candidate set of source layers (as many as the window has layers,
strictly increasing: a channel list of method.md §3) gets its own ridge map (mot_viz.ridge, λ chosen on the
held-out tenth of the bank) from the aligned source K and V of those layers to the target window's K and V,
fitted on a small in-memory bank of `--corpus` text. Each map is scored on held-out passages with the fidelity
metrics of mot_viz.fidelity (window means over layers; keys in the translator's pre-RoPE space, so centered K
reads a little lower than the post-RoPE numbers of docs/RESULTS.md). A probe of the input, not a training run:

    OMP_NUM_THREADS=1 python scripts/source_layer_probe.py --target_layers 5 6 7 8 9 \
        --sets top=17,18,19,20,21 ratio=9,10,12,14,15 spread=9,12,15,18,21
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mot_viz.alignment import apply_alignment  # noqa: E402
from mot_viz.bank import CORPORA, BankConfig, context_ids  # noqa: E402
from mot_viz.channels import Channels  # noqa: E402
from mot_viz.fidelity import heldout_texts, vector_fidelity  # noqa: E402
from mot_viz.layout import window_blocks  # noqa: E402
from mot_viz.models import load_model  # noqa: E402
from mot_viz.mot import MoT, ReplayConfig, native_cache, prepare_source, rotate_block, target_context_ids  # noqa: E402
from mot_viz.ridge import fit_ridge_many  # noqa: E402


def parse_set(text: str) -> tuple[str, tuple[int, ...]]:
    name, layers = text.split("=")
    return name, tuple(int(x) for x in layers.split(","))


@torch.no_grad()
def blocks(mot, source, target, ids, target_layers):
    """(source K, source V) of every source layer aligned to the target grid, (native K, V) of the window:
    [N_t, L_S or W, H] each, keys un-rotated (pre-RoPE)."""
    src = prepare_source(mot, source, target, ids, with_attention=False)
    every = tuple(range(source.spec.num_layers))
    sk, sv = window_blocks(src.source_kv, every)
    sk = rotate_block(source, every, sk, src.source_prefix_len, inverse=True)
    p = len(target.prefix_ids)
    nk, nv = window_blocks(native_cache(target, ids), target_layers, p)
    nk = rotate_block(target, target_layers, nk, p, inverse=True)
    return apply_alignment(sk, src.alignment)[0], apply_alignment(sv, src.alignment)[0], nk[0], nv[0]


def features(sk: torch.Tensor, sv: torch.Tensor, layers) -> torch.Tensor:
    return torch.cat([sk[:, list(layers)].flatten(1), sv[:, list(layers)].flatten(1)], dim=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="smollm2-135m")
    parser.add_argument("--target", default="gemma3-270m")
    parser.add_argument("--target_layers", type=int, nargs="+", required=True)
    parser.add_argument("--sets", nargs="+", required=True, type=parse_set, help="name=s0,s1,... source layers")
    parser.add_argument("--corpus", default="lambada+sotu", choices=sorted(CORPORA), help="the probe bank's text")
    parser.add_argument("--tokens", type=int, default=24000, help="target tokens in the probe bank")
    parser.add_argument("--heldout", nargs="+", default=["squad", "lambada-heldout"], choices=sorted(CORPORA))
    parser.add_argument("--n", type=int, default=30, help="held-out contexts per corpus")
    args = parser.parse_args(argv)
    window = tuple(args.target_layers)
    for name, layers in args.sets:
        Channels(layers, window)  # same length, strictly increasing: a valid channel list
    source, target = load_model(args.source), load_model(args.target)
    for name, layers in args.sets:
        if max(layers) >= source.spec.num_layers:
            parser.error(f"set {name}: the source has {source.spec.num_layers} layers")
    mot = MoT.build(source.spec, target.spec, Channels(args.sets[0][1], window), ReplayConfig(topk_sparse_attn=None),
                    key_space="pre_rope")  # only for prepare_source's checks; its own channels are not used

    t0 = time.perf_counter()
    contexts = context_ids(target, BankConfig(corpus=args.corpus, num_tokens=args.tokens, seed=0))
    n_val = max(1, len(contexts) // 10)
    per_context = [blocks(mot, source, target, target.ids_tensor(ids), window) for ids in contexts]
    train = [torch.cat(parts) for parts in zip(*per_context[:-n_val])]
    val = [torch.cat(parts) for parts in zip(*per_context[-n_val:])]
    heldout = {c: [blocks(mot, source, target, target_context_ids(target, t), window)
                   for t in heldout_texts(target, c, args.n)] for c in args.heldout}
    print(f"probe bank: {sum(map(len, contexts))} tokens of {args.corpus} ({len(contexts) - n_val} contexts to fit, "
          f"{n_val} to choose λ); {args.n} held-out contexts per corpus; {time.perf_counter() - t0:.0f} s", flush=True)

    print("\n| set | source layers | held-out | raw K | centered K | raw V | centered V | centered K per layer |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for name, layers in args.sets:
        fits = fit_ridge_many(features(train[0], train[1], layers), {"k": train[2].flatten(1), "v": train[3].flatten(1)},
                              features(val[0], val[1], layers), {"k": val[2].flatten(1), "v": val[3].flatten(1)})
        for corpus, items in heldout.items():
            scores: dict[tuple[str, str, int], list[float]] = {}
            for sk, sv, nk, nv in items:
                x = features(sk, sv, layers)
                for kv, native in (("k", nk), ("v", nv)):
                    pred = (x @ fits[kv].weight + fits[kv].bias).view_as(native)
                    for w in range(len(window)):
                        for metric, value in vector_fidelity(pred[:, w], native[:, w]).items():
                            scores.setdefault((metric, kv, w), []).append(value)

            def mean(metric: str, kv: str, w: int) -> float:
                return sum(scores[(metric, kv, w)]) / len(scores[(metric, kv, w)])

            def window_mean(metric: str, kv: str) -> float:
                return sum(mean(metric, kv, w) for w in range(len(window))) / len(window)

            per_layer = " / ".join(f"{mean('centered_cos', 'k', w):.3f}" for w in range(len(window)))
            print(f"| {name} | {','.join(map(str, layers))} | {corpus} | {window_mean('raw_cos', 'k'):.3f} | "
                  f"{window_mean('centered_cos', 'k'):.3f} | {window_mean('raw_cos', 'v'):.3f} | "
                  f"{window_mean('centered_cos', 'v'):.3f} | {per_layer} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
