"""Does a token's neighbourhood in the source cache predict the target window better? A ridge probe on the bank.

The closed-form map (mot_viz.train.ridge, `variant: linear`) reads one token's aligned source K and V. This probe fits
the same ridge map on the same training bank (the shipped checkpoints' three-genre bank, read from the user
cache; built first if missing) with each token's features widened by its context, λ chosen on the bank's
held-out tenth as fit_linear chooses it, and scores every variant on the bank's held-out contexts per window
layer: raw and centered cosine of K and V (mot_viz.train.window_fidelity.vector_fidelity per context, then the mean over
contexts; keys in the translator's pre-RoPE space). A probe of the input, not a training run:

    OMP_NUM_THREADS=1 python research/probes/context_ridge_probe.py --checkpoint pretrained/smollm2-to-gemma3-mid-linear \
        --variants token prev prev_next running_mean --out research/results/fidelity/context_ridge_probe-mid.md

Variants (per context; positions outside it are zeros): token = x_t; prev = [x_t, x_{t-1}];
prev_next = [x_t, x_{t-1}, x_{t+1}]; prev2 = [x_t, x_{t-1}, x_{t-2}]; running_mean = [x_t, mean(x_0..x_t)];
prev_pca, prev_next_pca = prev, prev_next with the neighbours projected on the top PCA_DIMS principal axes of
the training tokens' features (a cheaper map: the neighbours add PCA_DIMS features each, not F).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch


from mot_viz.engine.translator import features
from probe_common import window_cosine_cells, window_cosine_header, window_cosines
from probe_common import write_lines
from probe_common import checkpoint_bank
from mot_viz.train.ridge import fit_ridge_many

VARIANTS = ("token", "prev", "prev_next", "prev2", "running_mean", "prev_pca", "prev_next_pca")
PCA_DIMS = 256  # the *_pca variants: neighbours' features projected on the training features' top principal axes


def shifted(x: torch.Tensor, by: int) -> torch.Tensor:
    """x [N, F] moved `by` positions later in the context (by > 0: row t holds x_{t-by}); zeros where none."""
    out = torch.zeros_like(x)
    if by > 0:
        out[by:] = x[:-by]
    else:
        out[:by] = x[-by:]
    return out


def widen(x: torch.Tensor, variant: str, basis: torch.Tensor | None = None) -> torch.Tensor:
    """One context's token features [N, F] -> the variant's features [N, F·k] (the *_pca ones: F + r·k)."""
    if variant == "prev_pca":
        return torch.cat([x, shifted(x, 1) @ basis], 1)
    if variant == "prev_next_pca":
        return torch.cat([x, shifted(x, 1) @ basis, shifted(x, -1) @ basis], 1)
    if variant == "token":
        return x
    if variant == "prev":
        return torch.cat([x, shifted(x, 1)], 1)
    if variant == "prev_next":
        return torch.cat([x, shifted(x, 1), shifted(x, -1)], 1)
    if variant == "prev2":
        return torch.cat([x, shifted(x, 1), shifted(x, 2)], 1)
    if variant == "running_mean":
        return torch.cat([x, x.cumsum(0) / torch.arange(1, len(x) + 1, dtype=x.dtype)[:, None]], 1)
    raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint whose config names the bank")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", type=Path, help="markdown table to write (also printed)")
    args = parser.parse_args(argv)
    mot, source, target, bank = checkpoint_bank(args.checkpoint)  # as training built it
    train, val = bank.split()
    # the ridge map's own λ choice: its held-out tenth of the training contexts
    n_fit_val = max(1, round(len(train) * 0.1))
    fit_train, fit_val = train[:-n_fit_val], train[-n_fit_val:]
    offsets, window = bank.offsets, mot.channels.window

    def token_features(i: int) -> torch.Tensor:
        a, b = offsets[i], offsets[i + 1]
        return features(bank.source_keys[a:b][None], bank.source_values[a:b][None])[0]

    basis = None
    if any(v.endswith("_pca") for v in args.variants):  # principal axes of the training tokens' features
        x = torch.cat([token_features(i) for i in fit_train[::4]]).double()
        basis = torch.linalg.svd(x - x.mean(0), full_matrices=False).Vh[:PCA_DIMS].T.float()  # (F, r)

    def stacked(contexts: list[int], variant: str) -> torch.Tensor:
        return torch.cat([widen(token_features(i), variant, basis) for i in contexts])

    def targets(contexts: list[int]) -> dict[str, torch.Tensor]:
        rows = bank.rows(contexts)
        return {"k": bank.target_keys[rows].flatten(1), "v": bank.target_values[rows].flatten(1)}

    lines = [f"Bank `{bank.folder.name}`: {len(train)} training contexts ({len(bank.rows(train))} tokens), "
             f"{len(val)} held-out ({len(bank.rows(val))} tokens); window target layers "
             f"{list(mot.channels.target_layers)}, source layers {list(mot.channels.source_layers)}.", "",
             f"| features | dims | λ K / V | fit s | {window_cosine_header(mot.channels.target_layers)} |",
             "|---|---:|---|---:|" + "---:|" * (2 * window + 4)]
    print(lines[0], flush=True)
    for variant in args.variants:
        t0 = time.perf_counter()
        fits = fit_ridge_many(stacked(fit_train, variant), targets(fit_train), stacked(fit_val, variant),
                              targets(fit_val))
        seconds = time.perf_counter() - t0
        def held_out(i: int) -> tuple[torch.Tensor, ...]:
            """Context i's predicted and native K and V blocks [N, W, H]."""
            x, t = stacked([i], variant).double(), targets([i])
            pred = {kv: (x @ fits[kv].weight.double() + fits[kv].bias.double()).float().view(len(x), window, -1)
                    for kv in "kv"}
            return pred["k"], pred["v"], t["k"].view(len(x), window, -1), t["v"].view(len(x), window, -1)

        scores = window_cosines(held_out(i) for i in val)
        dims = stacked([val[0]], variant).shape[1]
        row = (f"| {variant} | {dims} | {fits['k'].lam:g} / {fits['v'].lam:g} | {seconds:.0f} | "
               f"{window_cosine_cells(scores)} |")
        lines.append(row)
        print(row, flush=True)
    write_lines(args.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
