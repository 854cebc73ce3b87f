"""How much does a closed-form map gain from reading more of the source's depth? Ridge maps on a checkpoint's bank.

For a checkpoint trained from a bank (its window, key space and bank, mot_viz.train.bank.checkpoint_bank), every source
layer's aligned K and V is computed once per bank context (one source prefill each), and one ridge map
(mot_viz.train.ridge, λ chosen on the last tenth of the training contexts, then refitted on all of them) is fitted per
candidate input: the window's own source layers plus extra source layers, optionally projected on principal axes of
the bank (`name=layers[:dims]`, layers `all` for every source layer outside the window), each with the previous
token's features on 256 principal axes as the shipped maps read them. Scored per window layer on the bank's
held-out contexts (raw and centered cosine of K and V, mot_viz.train.window_fidelity.window_cosines):

    OMP_NUM_THREADS=2 python research/probes/deep_map_probe.py --checkpoint pretrained/smollm2-to-gemma3-mid \
        --sets window= u14=3,5,7,9,11,12,13,15,27 u14-512=3,5,7,9,11,12,13,15,27:512 all=all

A probe of the inputs (what more source layers could give a map), not a checkpoint: the shipped maps are fitted by
mot_viz.train.train with linear_extra_layers (and linear_extra_dims) from the same bank settings. Memory: the features of
every source layer of a ~100k-token bank (~4.5 GB for SmolLM2-135M) plus one candidate's design matrix.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch


from mot_viz.engine.alignment import apply_alignment
from mot_viz.engine.layout import window_blocks
from mot_viz.engine.mot import prepare_source, rotate_block
from mot_viz.engine.translator import previous_features
from probe_common import held_out_items, probe_split, window_cosine_cells, window_cosine_header, window_cosines
from probe_common import write_lines
from probe_common import checkpoint_bank
from mot_viz.train.fit import principal_axes
from mot_viz.train.ridge import fit_ridge_many

PREVIOUS_DIMS = 256  # the previous token's features, on as many principal axes as the shipped maps use


def parse_set(text: str) -> tuple[str, str, int]:
    name, _, spec = text.partition("=")
    layers, _, dims = spec.partition(":")
    return name, layers, int(dims or 0)


@torch.no_grad()
def every_layer(mot, source, target, bank) -> torch.Tensor:
    """Each bank token's aligned source K and V at every source layer [T, 2, L, H_S], keys in the map's key space."""
    layers = tuple(range(source.spec.num_layers))
    rows = []
    for i in range(bank.num_contexts):
        a, b = bank.offsets[i], bank.offsets[i + 1]
        src = prepare_source(mot, source, target, target.ids_tensor(bank.target_ids[a:b].tolist()), with_attention=False)
        keys, values = window_blocks(src.source_kv, layers)
        if mot.translator.config.key_space == "pre_rope":
            keys = rotate_block(source, layers, keys, src.source_prefix_len, inverse=True)
        rows.append(torch.stack([apply_alignment(keys, src.alignment)[0], apply_alignment(values, src.alignment)[0]], 1))
    return torch.cat(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint trained from a bank")
    parser.add_argument("--sets", nargs="+", required=True, type=parse_set,
                        help="name=extra layers (comma-separated, empty: the window alone, all: every other layer)"
                             "[:principal axes of the extra layers]")
    parser.add_argument("--out", type=Path, help="markdown table to write (also printed)")
    args = parser.parse_args(argv)
    mot, source, target, bank = checkpoint_bank(args.checkpoint)
    fit_part, lam_part, val = probe_split(bank)
    train, n_lam = fit_part + lam_part, len(lam_part)
    window = list(mot.channels.source_layers)
    t0 = time.perf_counter()
    every = every_layer(mot, source, target, bank)
    lines = [f"Bank `{bank.folder.name}`: {len(train)} training contexts ({len(bank.rows(train))} tokens; λ chosen on the "
             f"last {n_lam}), {len(val)} held-out ({len(bank.rows(val))} tokens); window source layers {window}, "
             f"target layers {list(mot.channels.target_layers)}; every map also reads the previous token on "
             f"{PREVIOUS_DIMS} principal axes. Features of every source layer: {time.perf_counter() - t0:.0f} s.", "",
             f"| map | features | {window_cosine_header(list(mot.channels.target_layers))} |",
             "|---|---:|" + "---:|" * (2 * len(window) + 4)]
    print("\n".join(lines), flush=True)
    targets = {"k": bank.target_keys.flatten(1), "v": bank.target_values.flatten(1)}

    for name, spec, dims in args.sets:
        extra = ([l for l in range(source.spec.num_layers) if l not in window] if spec == "all"
                 else [int(x) for x in spec.split(",") if x])
        if set(extra) & set(window):
            parser.error(f"set {name}: layers {sorted(set(extra) & set(window))} are the window's own")
        t1 = time.perf_counter()
        basis = (principal_axes((every[bank.rows([i])][:, :, extra].flatten(1) for i in train), dims)
                 if extra and dims else None)

        def token_features(contexts: list[int]) -> list[torch.Tensor]:
            out = []
            for i in contexts:
                rows = every[bank.rows([i])]
                x = rows[:, :, window].flatten(1)
                if extra:
                    e = rows[:, :, extra].flatten(1)
                    x = torch.cat([x, e if basis is None else e @ basis], 1)
                out.append(x)
            return out

        prev_basis = principal_axes(token_features(train), PREVIOUS_DIMS)

        def design(contexts: list[int]) -> torch.Tensor:
            return torch.cat([previous_features(x[None], 1, prev_basis)[0] for x in token_features(contexts)])

        fits = fit_ridge_many(design(fit_part), {kv: t[bank.rows(fit_part)] for kv, t in targets.items()},
                              design(lam_part), {kv: t[bank.rows(lam_part)] for kv, t in targets.items()})
        x_val = design(val)
        pred = {kv: (x_val @ fit.weight + fit.bias) for kv, fit in fits.items()}
        items = held_out_items(bank, val, pred["k"], pred["v"])
        what = f"{len(extra)} extra layers" + (f" on {dims} axes" if basis is not None else "") if extra else "window"
        line = (f"| {name} ({what}; λ K {fits['k'].lam:g}, V {fits['v'].lam:g}; {time.perf_counter() - t1:.0f} s) | "
                f"{x_val.shape[1]} | {window_cosine_cells(window_cosines(items))} |")
        lines.append(line)
        print(line, flush=True)
    write_lines(args.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
