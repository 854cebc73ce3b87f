"""Is there more to translate than a linear map finds? A per-token MLP fitted to a map's residual, on held-out bank contexts.

A linear checkpoint's map (mot_viz.translator.LinearKVMap: the inputs it reads) is fitted again on its bank
(mot_viz.bank.checkpoint_bank) from the training contexts alone, at full rank (λ per K and V chosen on the last tenth
of them, as scripts/rank_probe.py does). Then, for each hidden width asked, a two-layer MLP (standardised map inputs
-> width -> GELU -> K and V outputs, its last layer zero so it starts as the map) is trained with AdamW on the map's
residual over the same training contexts (K and V residuals each scaled to unit mean square), the epoch of lowest MSE
on the λ contexts kept. The map and map + MLP are scored per window layer on the bank's held-out contexts (raw and
centered cosine of K and V, mot_viz.fidelity.window_cosines):

    OMP_NUM_THREADS=1 python scripts/nonlinear_probe.py --checkpoint pretrained/smollm2-to-gemma3-mid-linear \
        --hidden 1024 4096 --epochs 8 --out results/fidelity/nonlinear_probe-mid.md

A probe of what per-token nonlinear functions of the map's own inputs could add (the experts of a mixture read the
window's layers alone and attend over tokens), not a checkpoint. Memory: the map's input rows of the whole bank
(~2 GB for the mid map's 5,632 features) and its normal equations in float64.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mot_viz.bank import checkpoint_bank  # noqa: E402
from mot_viz.fidelity import held_out_items, window_cosine_cells, window_cosine_header, window_cosines  # noqa: E402
from mot_viz.fit import cosine_lr, map_inputs  # noqa: E402
from mot_viz.fsutil import write_lines  # noqa: E402
from mot_viz.ridge import LAMBDAS, NormalEquations, predict  # noqa: E402


def train_mlp(x: torch.Tensor, r: torch.Tensor, x_lam: torch.Tensor, r_lam: torch.Tensor, hidden: int, epochs: int,
              lr: float, batch: int, seed: int) -> tuple[torch.nn.Module, list[float]]:
    """An MLP x -> r (both already standardised) by AdamW with a cosine schedule; returns the epoch of lowest MSE on
    (x_lam, r_lam) and every epoch's MSE there (epoch 0: the zero MLP, i.e. the map alone)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    mlp = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.GELU(), torch.nn.Linear(hidden, r.shape[1]))
    torch.nn.init.zeros_(mlp[2].weight)
    torch.nn.init.zeros_(mlp[2].bias)
    opt = torch.optim.AdamW(mlp.parameters(), lr=lr, weight_decay=0.01)

    def lam_mse() -> float:
        with torch.no_grad():
            return float(sum(((mlp(x_lam[i:i + 4096]) - r_lam[i:i + 4096]) ** 2).sum()
                             for i in range(0, len(x_lam), 4096)) / r_lam.numel())

    steps_per_epoch = math.ceil(len(x) / batch)
    total = epochs * steps_per_epoch
    history, best, best_state, step = [lam_mse()], float("inf"), None, 0
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), batch):
            step += 1
            for group in opt.param_groups:
                group["lr"] = cosine_lr(lr, step, steps_per_epoch // 4, total)
            rows = order[i:i + batch]
            loss = ((mlp(x[rows]) - r[rows]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        history.append(lam_mse())
        print(f"  width {hidden} epoch {epoch + 1}/{epochs}: λ-context MSE {history[-1]:.4f} (map alone {history[0]:.4f})",
              flush=True)
        if history[-1] < best:
            best, best_state = history[-1], {k: v.clone() for k, v in mlp.state_dict().items()}
    mlp.load_state_dict(best_state)
    return mlp, history


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="a linear checkpoint trained from a bank")
    parser.add_argument("--hidden", nargs="+", type=int, default=[1024], help="MLP hidden widths to try")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="markdown table to write (also printed)")
    args = parser.parse_args(argv)
    mot, _, _, bank = checkpoint_bank(args.checkpoint)
    if mot.translator.linear is None:
        parser.error(f"{args.checkpoint} has no linear map")
    train, val = bank.split()
    n_lam = max(1, round(len(train) * 0.1))
    fit_part, lam_part = train[:-n_lam], train[-n_lam:]
    t0 = time.perf_counter()
    with torch.no_grad():
        x = map_inputs(mot, bank, fit_part)
        x_lam, x_val = map_inputs(mot, bank, lam_part), map_inputs(mot, bank, val)
        normal = NormalEquations(x)
        targets = {"k": bank.target_keys.flatten(1), "v": bank.target_values.flatten(1)}
        fitted = {}  # per K/V: the map's predictions on the training, λ and held-out rows
        for kv, y in targets.items():
            projected = normal.project(y[bank.rows(fit_part)])
            lam, _ = normal.choose_lambda(*projected, x_lam.double(), y[bank.rows(lam_part)], LAMBDAS)
            weight, bias = normal.solve(*projected, lam)[:2]
            fitted[kv] = [predict(part.double(), weight, bias).float() for part in (x, x_lam, x_val)]
        del normal
        residual = {kv: [y[bank.rows(part)] - pred for part, pred in zip((fit_part, lam_part), fitted[kv][:2])]
                    for kv, y in targets.items()}
        scale = {kv: float(r[0].pow(2).mean().sqrt()) for kv, r in residual.items()}
        r_fit, r_lam = (torch.cat([residual[kv][j] / scale[kv] for kv in "kv"], 1) for j in (0, 1))
        mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
        x, x_lam, x_val = ((part - mean) / std for part in (x, x_lam, x_val))
    outputs = targets["k"].shape[1]
    lines = [f"Map of `{args.checkpoint}` ({x.shape[1]} features -> {outputs} per K and V) refitted at full rank on "
             f"bank `{bank.folder.name}`: {len(fit_part)} training contexts ({len(x)} tokens), λ chosen on the next "
             f"{n_lam} ({len(x_lam)} tokens), scored on {len(val)} held-out contexts ({len(x_val)} tokens); each MLP "
             f"trained on the map's residual over the training contexts ({args.epochs} epochs, batch {args.batch}, "
             f"AdamW lr {args.lr:g}, seed {args.seed}), the epoch of lowest λ-context MSE kept. Map fit: "
             f"{time.perf_counter() - t0:.0f} s.", "",
             f"| translator | λ-context residual MSE (map: 1) | {window_cosine_header(list(mot.channels.target_layers))} |",
             "|---|---:|" + "---:|" * (2 * len(mot.channels.target_layers) + 4)]
    map_items = held_out_items(bank, val, fitted["k"][2], fitted["v"][2])
    lines.append(f"| full-rank map | 1 | {window_cosine_cells(window_cosines(map_items))} |")
    print("\n".join(lines), flush=True)
    for hidden in args.hidden:
        t1 = time.perf_counter()
        mlp, history = train_mlp(x, r_fit, x_lam, r_lam, hidden, args.epochs, args.lr, args.batch, args.seed)
        with torch.no_grad():
            out = torch.cat([mlp(x_val[i:i + 4096]) for i in range(0, len(x_val), 4096)])
        pred = {kv: fitted[kv][2] + out[:, j * outputs:(j + 1) * outputs] * scale[kv] for j, kv in enumerate("kv")}
        items = held_out_items(bank, val, pred["k"], pred["v"])
        line = (f"| map + MLP width {hidden} (best epoch {history.index(min(history))}; "
                f"{time.perf_counter() - t1:.0f} s) | {min(history) / history[0]:.3f} | "
                f"{window_cosine_cells(window_cosines(items))} |")
        lines.append(line)
        print(line, flush=True)
    write_lines(args.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
