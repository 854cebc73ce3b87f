"""Which source layers predict a target window best? A closed-form ridge map per candidate set, held-out fidelity.

For one pair and one target window, every candidate set of source layers (as many as the window has layers,
strictly increasing: a channel list of method.md §3) gets its own ridge map (mot_viz.train.ridge, λ chosen on the
held-out tenth of the bank) from the aligned source K and V of those layers to the target window's K and V,
fitted on a small in-memory bank of `--corpus` text. Each map is scored on held-out passages with the fidelity
metrics of mot_viz.train.window_fidelity (window means over layers; keys in the translator's pre-RoPE space, so centered K
reads a little lower than the post-RoPE numbers of docs/results/fidelity.md). A probe of the input, not a training run:

    OMP_NUM_THREADS=1 python research/probes/source_layer_probe.py --target_layers 5 6 7 8 9 \
        --sets top=17,18,19,20,21 ratio=9,10,12,14,15 spread=9,12,15,18,21 --unions top+spread

--unions also fits one map per union of sets (`a+b`: the features of both sets side by side, twice the source
layers): whether the window is better predicted from more of the source's depth at once than from any one
channel list (a probe only: a MoT channel maps one source layer to each window layer).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


from mot_viz.engine.channels import Channels
from mot_viz.engine.models import load_model
from mot_viz.engine.mot import (MoT, ReplayConfig, native_cache, prepare_source, target_context_ids,
                                translator_inputs, translator_targets)
from mot_viz.train.window_fidelity import vector_fidelity
from mot_viz.train.mean_vector import heldout_texts
from mot_viz.train.bank import CORPORA, BankConfig, context_ids
from mot_viz.train.ridge import fit_ridge_many


def parse_set(text: str) -> tuple[str, tuple[int, ...]]:
    name, layers = text.split("=")
    return name, tuple(int(x) for x in layers.split(","))


@torch.no_grad()
def blocks(mots: dict[str, MoT], source, target, ids) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], tuple]:
    """One context's translator inputs for every candidate set ({name: (K, V) [N_t, W, H_S]}) and the native window
    (K, V) [N_t, W, H_T], in the translator's pre-RoPE key space; one source prefill and one native pass serve all."""
    first = next(iter(mots.values()))
    src = prepare_source(first, source, target, ids, with_attention=False)
    inputs = {name: tuple(t[0] for t in translator_inputs(mot, src, source)) for name, mot in mots.items()}
    native = translator_targets(first, target, native_cache(target, ids), len(target.prefix_ids))
    return inputs, tuple(t[0] for t in native)


def features(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return torch.cat([keys.flatten(1), values.flatten(1)], dim=1)


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
    parser.add_argument("--unions", nargs="*", default=[], help="a+b[+c…]: sets whose features are fitted together")
    args = parser.parse_args(argv)
    window = tuple(args.target_layers)
    for name, layers in args.sets:
        Channels(layers, window)  # same length, strictly increasing: a valid channel list
    source, target = load_model(args.source), load_model(args.target)
    for name, layers in args.sets:
        if max(layers) >= source.spec.num_layers:
            parser.error(f"set {name}: the source has {source.spec.num_layers} layers")
    mots = {name: MoT.build(source.spec, target.spec, Channels(layers, window), ReplayConfig(topk_sparse_attn=None),
                            key_space="pre_rope") for name, layers in args.sets}

    t0 = time.perf_counter()
    contexts = context_ids(target, BankConfig(corpus=args.corpus, num_tokens=args.tokens, seed=0))
    n_val = max(1, len(contexts) // 10)
    per_context = [blocks(mots, source, target, target.ids_tensor(ids)) for ids in contexts]
    heldout = {c: [blocks(mots, source, target, target_context_ids(target, t)) for t in heldout_texts(target, c, args.n)]
               for c in args.heldout}

    names = {name for name, _ in args.sets}
    for union in args.unions:
        if not set(union.split("+")) <= names or "+" not in union:
            parser.error(f"union {union}: join two or more of the sets {sorted(names)} with '+'")

    def set_features(inputs, name: str) -> torch.Tensor:
        """One context's features [N_t, F] of set `name` (or of a union a+b: each set's side by side)."""
        return torch.cat([features(*inputs[part]) for part in name.split("+")], dim=1)

    def stacked(items, name: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Features [T, F] of set `name` and the native K/V targets [T, W·H_T] over the given contexts."""
        x = torch.cat([set_features(inputs, name) for inputs, _ in items])
        return x, {kv: torch.cat([native[i].flatten(1) for _, native in items]) for i, kv in enumerate("kv")}

    print(f"probe bank: {sum(map(len, contexts))} tokens of {args.corpus} ({len(contexts) - n_val} contexts to fit, "
          f"{n_val} to choose λ); {args.n} held-out contexts per corpus; {time.perf_counter() - t0:.0f} s", flush=True)

    print("\n| set | source layers | held-out | raw K | centered K | raw V | centered V | centered K per layer |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    layers_of = dict(args.sets)
    candidates = list(args.sets) + [(u, tuple(sorted({l for p in u.split("+") for l in layers_of[p]})))
                                    for u in args.unions]
    for name, layers in candidates:
        fits = fit_ridge_many(*stacked(per_context[:-n_val], name), *stacked(per_context[-n_val:], name))
        for corpus, items in heldout.items():
            scores: dict[tuple[str, str, int], list[float]] = {}
            for inputs, (nk, nv) in items:
                x = set_features(inputs, name)
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
