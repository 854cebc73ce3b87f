"""Is the in-domain V ceiling in the inputs or in the translator's capacity? A per-token MLP probe on the bank.

The shipped translators reach raw V cosine ≈ 0.80–0.81 on the bank's held-out contexts, their own linear path
≈ 0.80 (docs/results.md); issue #10 asks for 0.85. This probe keeps the checkpoint's inputs (each token's aligned
source K and V and, where the checkpoint's linear path reads it, the previous token's projection) and its linear
path, and trains a wide per-token residual MLP on top of it (LayerNorm → Linear(F, hidden) → GELU →
Linear(hidden, K and V of the window)) with Adam on the bank's training contexts, the loss the MSE of each
output dimension divided by its training variance. It scores, per window layer, raw and centered cosine of K and
V on the bank's held-out contexts (mot_viz.train.window_fidelity.vector_fidelity per context, mean over contexts), for the
checkpoint's linear path, the checkpoint itself (experts included), and the MLP after every --eval_every epochs:

    OMP_NUM_THREADS=1 python research/probes/capacity_probe.py --checkpoint pretrained/smollm2-to-gemma3-mid \
        --hidden 1024 --epochs 12 --out research/results/fidelity/capacity_probe-mid.md

The shipped maps are refitted on every bank context, held-out ones included (docs/decisions.md), so on
those contexts the checkpoint's own linear path is scored in sample. With --refit the probe fits its own map instead,
at full rank on the training contexts alone (mot_viz.train.ridge.fit_ridge_many, λ per K and V chosen on the last tenth of
them, not refitted on all), and the MLP refines that map:

    OMP_NUM_THREADS=1 python research/probes/capacity_probe.py --checkpoint pretrained/smollm2-to-gemma3-mid-linear --refit \
        --standardize --hidden 1024 --epochs 12 --out research/results/fidelity/capacity_probe-mid-refit-std.md

(--standardize: the inputs scaled per feature instead of the MLP's LayerNorm; without it, on these 5,632 features
of very different scales, the MLP barely trained: results/fidelity/capacity_probe-mid-refit.md.)

A probe of the translator's capacity, not a translator: the MLP reads one token (and its predecessor) at a time,
so if it cannot pass the linear path by much, a wider per-token map is not where the missing V cosine is.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn


from probe_common import probe_split, window_cosine_cells, window_cosine_header, window_cosines
from probe_common import write_lines
from probe_common import checkpoint_bank
from mot_viz.train.ridge import LAMBDAS, fit_ridge_many, predict

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a MoT checkpoint with a linear path")
    parser.add_argument("--hidden", type=int, default=1024, help="the MLP's hidden width")
    parser.add_argument("--epochs", type=int, default=12, help="0: score the linear path and the checkpoint only")
    parser.add_argument("--eval_every", type=int, default=3, help="score the held-out contexts every this many epochs")
    parser.add_argument("--batch", type=int, default=512, help="tokens per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--refit", action="store_true",
                        help="fit the map on the training contexts alone (full rank) instead of the checkpoint's own")
    parser.add_argument("--standardize", action="store_true",
                        help="scale each input feature to zero mean and unit variance on the training tokens instead "
                             "of the MLP's LayerNorm (which a few large features dominate when a map reads many layers)")
    parser.add_argument("--out", type=Path, help="markdown table to write (also printed)")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    mot, source, target, bank = checkpoint_bank(args.checkpoint)  # as training built it
    linear = mot.translator.linear
    if linear is None:
        raise SystemExit(f"{args.checkpoint} has no linear path; give a linear checkpoint or a MoT with one")
    fit_part, lam_part, val = probe_split(bank)
    train = fit_part + lam_part
    window = mot.channels.window

    @torch.no_grad()
    def context_arrays(i: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Context i's map inputs [N, F], the checkpoint's linear-path prediction [N, 2·W·H_T] (None with --refit) and
        native target [N, 2·W·H_T]."""
        sk, sv, tk, tv = bank.context(i)
        lin = None if args.refit else torch.cat([t[0].flatten(1) for t in linear(sk, sv)], 1)
        return linear.inputs(sk, sv)[0], lin, torch.cat([tk[0].flatten(1), tv[0].flatten(1)], 1)

    t0 = time.perf_counter()
    parts = [context_arrays(i) for i in train]
    x_train, y_train = (torch.cat([p[j] for p in parts]) for j in (0, 2))
    lin_train = None if args.refit else torch.cat([p[1] for p in parts])
    del parts
    held_out = [context_arrays(i) for i in val]
    half = y_train.shape[1] // 2
    print(f"bank {bank.folder.name}: {len(train)} training contexts ({len(x_train)} tokens), {len(val)} held-out "
          f"({sum(len(h[0]) for h in held_out)} tokens); {x_train.shape[1]} input features; "
          f"{time.perf_counter() - t0:.0f} s to read", flush=True)
    map_name = "linear path of the checkpoint"
    if args.refit:  # the map on the training rows read above: the fit contexts' rows, then the λ contexts'
        t0 = time.perf_counter()
        n_fit = len(bank.rows(fit_part))
        ys = {"k": y_train[:, :half], "v": y_train[:, half:]}
        with torch.no_grad():
            fits = fit_ridge_many(x_train[:n_fit], {kv: y[:n_fit] for kv, y in ys.items()}, x_train[n_fit:],
                                  {kv: y[n_fit:] for kv, y in ys.items()}, LAMBDAS, refit_all=False)

            def mapped(x: torch.Tensor) -> torch.Tensor:
                return torch.cat([predict(x, f.weight, f.bias, f.up) for f in fits.values()], 1)

            lin_train = mapped(x_train)
            held_out = [(x, mapped(x), y) for x, _, y in held_out]
        map_name = (f"full-rank map fitted on {len(fit_part)} training contexts (λ K {fits['k'].lam:g} / V "
                    f"{fits['v'].lam:g}; {time.perf_counter() - t0:.0f} s)")
        print(map_name, flush=True)
    if args.standardize:
        mean, std = x_train.mean(0), x_train.std(0).clamp(min=1e-6)
        x_train = (x_train - mean) / std
        held_out = [((x - mean) / std, lin, y) for x, lin, y in held_out]
    scale = y_train.std(0).clamp(min=1e-6)  # each output dimension's training spread

    def score(predict) -> dict[str, torch.Tensor]:
        def blocks(i: int, x, lin, y) -> tuple[torch.Tensor, ...]:
            """Context i's predicted and native K and V blocks [N, W, H]."""
            pred = predict(i, x, lin)
            return tuple(t[:, sl].view(len(x), window, -1) for t in (pred, y)
                         for sl in (slice(0, half), slice(half, None)))

        with torch.no_grad():
            return window_cosines(blocks(i, *h) for i, h in zip(val, held_out))

    def mot_prediction(i: int, x, lin) -> torch.Tensor:
        sk, sv, _, _ = bank.context(i)
        out = mot.translator(sk, sv)
        return torch.cat([out.keys[0].flatten(1), out.values[0].flatten(1)], 1)

    norm = [] if args.standardize else [nn.LayerNorm(x_train.shape[1])]
    mlp = nn.Sequential(*norm, nn.Linear(x_train.shape[1], args.hidden), nn.GELU(), nn.Linear(args.hidden, y_train.shape[1]))
    nn.init.zeros_(mlp[-1].weight)  # starts as the linear path
    nn.init.zeros_(mlp[-1].bias)

    def mlp_prediction(i: int, x, lin) -> torch.Tensor:
        return lin + mlp(x) * scale

    layers = list(mot.channels.target_layers)
    lines = [f"Bank `{bank.folder.name}`: {len(train)} training contexts ({len(x_train)} tokens), {len(val)} "
             f"held-out ({sum(len(h[0]) for h in held_out)} tokens); window target layers {layers}; inputs: "
             f"{x_train.shape[1]} features (the checkpoint's linear-path inputs"
             f"{', standardised' if args.standardize else ''}); the map: {map_name}. MLP hidden {args.hidden}, Adam lr "
             f"{args.lr}, batch {args.batch} tokens, cosine schedule over {args.epochs} epochs, seed {args.seed}.", "",
             f"| translator | {window_cosine_header(layers)} |", "|---|" + "---:|" * (2 * window + 4)]

    def row(name: str, scores: dict[str, torch.Tensor]) -> None:
        line = f"| {name} | {window_cosine_cells(scores)} |"
        lines.append(line)
        print(line, flush=True)

    print("\n".join(lines), flush=True)
    row(map_name, score(lambda i, x, lin: lin))
    if mot.translator.config.variant != "linear":
        row("the checkpoint (linear path + experts)" + (", in sample" if args.refit else ""),
            score(mot_prediction))
    opt = torch.optim.Adam(mlp.parameters(), lr=args.lr)
    steps_per_epoch = math.ceil(len(x_train) / args.batch)
    total = max(1, steps_per_epoch * args.epochs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    residual = (y_train - lin_train) / scale
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(x_train))
        running = 0.0
        for s in range(steps_per_epoch):
            idx = order[s * args.batch:(s + 1) * args.batch]
            loss = nn.functional.mse_loss(mlp(x_train[idx]), residual[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            running += loss.item() / steps_per_epoch
        print(f"epoch {epoch}: training loss {running:.4f} (per-dimension MSE / variance), "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        if epoch % args.eval_every == 0 or epoch == args.epochs:
            mlp.eval()
            row(f"linear path + MLP {args.hidden}, epoch {epoch}", score(mlp_prediction))
            mlp.train()
    write_lines(args.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
