"""What does a smaller linear map cost? Reduced-rank ridge fits of a checkpoint's map, scored on held-out bank contexts.

A linear checkpoint's map (mot_viz.engine.translator.LinearKVMap: the inputs it reads, its principal axes) is fitted again
on its bank (mot_viz.train.bank.checkpoint_bank) from the training contexts alone: λ chosen per K and V on the last tenth
of them, then, for every rank asked, its K and V outputs confined to that many principal directions of its own
fitted values (mot_viz.train.ridge, `linear_rank`). Each fit is scored per window layer on the bank's held-out contexts
(raw and centered cosine of K and V, mot_viz.train.window_fidelity.window_cosines), beside the fp16 size of the map it makes:

    OMP_NUM_THREADS=2 python research/probes/rank_probe.py --checkpoint pretrained/smollm2-to-gemma3-mid-linear \
        --ranks 128 256 384 512 768 0 --out research/results/fidelity/rank_probe-mid.md

Rank 0 is the full map. With --fractions each rank is fitted on a share of the training contexts as well (the first
ones of the shuffled bank, λ chosen again): the map's learning curve, whether more bank text would help:

    OMP_NUM_THREADS=1 python research/probes/rank_probe.py --checkpoint pretrained/smollm2-to-gemma3-linear --ranks 0 \
        --fractions 0.25 0.5 1 --out research/results/fidelity/learning_curve-terminal.md

With --balanced each rank is also fitted with every window layer's outputs weighed
equally (each layer's target scaled to unit mean square before the principal directions are chosen: the cosines
are per layer, the plain criterion favours the layers of largest variance). (The shipped map is refitted on every bank context, held-out ones included, so its own
weights cannot be scored on them: this probe fits its own.) Memory: the map's input rows of the whole bank (~2 GB
for the mid map's 5,632 features) and its normal equations in float64.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch


from probe_common import held_out_items, probe_split, window_cosine_cells, window_cosine_header, window_cosines
from probe_common import write_lines
from probe_common import checkpoint_bank
from mot_viz.train.fit import layer_balance_weights, map_inputs
from mot_viz.train.ridge import LAMBDAS, NormalEquations, predict


def map_megabytes(features: int, outputs: int, rank: int, buffers: int) -> float:
    """fp16 size of a map's K and V paths (two factors at a rank, one matrix at rank 0) and its projection buffers."""
    per_path = (features + outputs) * rank + outputs if rank else (features + 1) * outputs
    return 2 * (2 * per_path + buffers) / 1e6


@torch.no_grad()
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a linear checkpoint trained from a bank")
    parser.add_argument("--ranks", nargs="+", type=int, required=True, help="ranks to score (0: the full map)")
    parser.add_argument("--balanced", action="store_true", help="also fit each rank with the window layers weighed equally")
    parser.add_argument("--fractions", nargs="+", type=float, default=[1.0],
                        help="shares of the training contexts to fit on (a learning curve: does more bank text help?)")
    parser.add_argument("--out", type=Path, help="markdown table to write (also printed)")
    args = parser.parse_args(argv)
    mot, _, _, bank = checkpoint_bank(args.checkpoint)
    linear = mot.translator.linear
    if linear is None:
        parser.error(f"{args.checkpoint} has no linear map")
    fit_part, lam_part, val = probe_split(bank)
    n_lam = len(lam_part)
    t0 = time.perf_counter()
    x_all = map_inputs(mot, bank, fit_part)
    x_lam, x_val = (map_inputs(mot, bank, part).double() for part in (lam_part, val))
    targets = {"k": bank.target_keys.flatten(1), "v": bank.target_values.flatten(1)}
    buffers = sum(b.numel() for b in linear.buffers())
    outputs = targets["k"].shape[1]
    lines = [f"Map of `{args.checkpoint}` ({x_all.shape[1]} features -> {outputs} per K and V) refitted on bank "
             f"`{bank.folder.name}`: up to {len(fit_part)} training contexts ({len(x_all)} tokens), λ per K and V "
             f"chosen on the next {n_lam}, scored on {len(val)} held-out contexts ({len(x_val)} tokens).", "",
             f"| rank | training contexts (tokens) | λ K / V | map size (fp16) | "
             f"{window_cosine_header(list(mot.channels.target_layers))} |",
             "|---|---:|---:|---:|" + "---:|" * (2 * len(mot.channels.target_layers) + 4)]
    print("\n".join(lines), flush=True)
    for fraction in args.fractions:  # a prefix of the (shuffled) training contexts: the map's learning curve
        part = fit_part[:max(1, round(len(fit_part) * fraction))]
        x = x_all[:len(bank.rows(part))]  # map_inputs keeps the contexts' order
        normal = NormalEquations(x)
        projected, lam = {}, {}
        for kv, y in targets.items():  # λ of the full map on the λ contexts, as fit_linear chooses it
            projected[kv] = normal.project(y[bank.rows(part)])
            lam[kv], _ = normal.choose_lambda(*projected[kv], x_lam, y[bank.rows(lam_part)], LAMBDAS)
        layer_weight = {kv: layer_balance_weights(y[bank.rows(part)].view(len(x), linear.window, -1))
                        for kv, y in targets.items()}
        runs = [(rank, False) for rank in args.ranks] + [(rank, True) for rank in args.ranks if rank and args.balanced]
        for rank, balanced in runs:
            pred = {}
            for kv in targets:
                pred[kv] = predict(x_val, *normal.solve(*projected[kv], lam[kv], rank,
                                                        layer_weight[kv] if balanced else None))
            items = held_out_items(bank, val, pred["k"], pred["v"])
            kept = rank if 0 < rank < outputs else 0
            size = map_megabytes(x.shape[1], outputs, kept, buffers)
            line = (f"| {kept or 'full'}{', layers balanced' * balanced} | {len(part)} ({len(x)}) | "
                    f"{lam['k']:g} / {lam['v']:g} | {size:.1f} MB | {window_cosine_cells(window_cosines(items))} |")
            lines.append(line)
            print(line, f"({time.perf_counter() - t0:.0f} s)", flush=True)
        del normal
    write_lines(args.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
