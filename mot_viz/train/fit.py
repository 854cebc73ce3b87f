"""Fitting a translator on a training bank: the closed-form linear map and the fast bank stage.

Neither needs the models: the bank (mot_viz.train.bank) holds the translator's inputs and what it should
write. ``fit_linear`` solves the ridge map of the window (method.md §13, "Linear"); ``bank_stage``
trains the experts against the native window directly (the translation term), thousands of steps in
minutes, before the Context Correction Loss of method.md §7 sees the replay.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from ..engine.mot import MoT
from ..engine.translator import Routing, features
from ..errors import ConfigError
from .bank import Bank
from .config import LAYER_WEIGHTINGS
from .ridge import LAMBDAS, cross_fitted, fit_ridge_many


def cosine_lr(base: float, step: int, warmup: int, total: int) -> float:
    """Learning rate at 1-based `step`: linear warm-up, then cosine to 0 (method.md §7, §12)."""
    warmup = max(1, warmup)
    total = max(total, warmup + 1)
    if step <= warmup:
        return base * step / warmup
    return base * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def map_inputs(mot: MoT, bank: Bank, contexts: list[int]) -> torch.Tensor:
    """The linear map's input rows [n, F'] of whole bank contexts (earlier tokens read within each context)."""
    linear = mot.translator.linear
    return torch.cat([linear.inputs(*bank.context(i)[:2])[0] for i in contexts])


def principal_axes(x_rows, dims: int) -> torch.Tensor:
    """The top `dims` principal axes [F, dims] of feature rows (an iterable of [n_i, F] chunks), in float32."""
    gram, total, count = None, None, 0
    for x in x_rows:
        x = x.double()
        gram = x.T @ x if gram is None else gram + x.T @ x
        total = x.sum(0) if total is None else total + x.sum(0)
        count += len(x)
    mean = total / count
    eigvals, eigvecs = torch.linalg.eigh(gram / count - torch.outer(mean, mean))
    return eigvecs[:, eigvals.argsort(descending=True)[:dims]].float()


def layer_balance_weights(target: torch.Tensor) -> torch.Tensor:
    """Target rows [n, W, H] -> output weights [W·H]: 1 / RMS of each window layer's centred target, so a reduced-rank
    fit weighed by them treats every window layer alike (the cosines are per layer)."""
    rms = (target - target.mean(0)).double().pow(2).mean(dim=(0, 2)).sqrt()
    return (1 / rms)[:, None].expand(-1, target.shape[2]).flatten()


@torch.no_grad()
def fit_linear(mot: MoT, bank: Bank, lambdas=LAMBDAS, val_fraction: float = 0.1, balanced: bool = False) -> dict:
    """Fit the translator's linear path on the bank in closed form; λ per K/V chosen on held-out contexts.

    Projections are fitted first, on the training contexts: the extra layers' principal axes (linear_extra_dims),
    then those of the token features for the earlier tokens (linear_previous_dims). With linear_rank the fit is
    reduced-rank ridge (mot_viz.train.ridge), every window layer weighed alike if `balanced` (layer_balance_weights).
    Returns a report: chosen λ, held-out MSE per λ, tokens used and seconds.
    """
    linear = mot.translator.linear
    if linear is None:
        raise ConfigError("this translator has no linear path: use variant 'linear' or linear_residual=True")
    t0 = time.perf_counter()
    train, val = bank.split(val_fraction)
    w = linear.window
    if linear.extra_basis is not None:
        linear.extra_basis.copy_(principal_axes(
            (features(sk[:, :, w:], sv[:, :, w:])[0] for sk, sv, _, _ in map(bank.context, train)),
            linear.extra_basis.shape[1]))
    if linear.previous_basis is not None:
        linear.previous_basis.copy_(principal_axes(
            (linear.token_features(*bank.context(i)[:2])[0] for i in train), linear.previous_basis.shape[1]))
    tr, va = bank.rows(train), bank.rows(val)
    x, x_val = map_inputs(mot, bank, train), map_inputs(mot, bank, val)
    if linear.per_layer:
        return _fit_per_layer(linear, x, x_val, bank, tr, va, lambdas, t0)
    report = {"train_tokens": len(tr), "val_tokens": len(va), "val_contexts": len(val), "features": x.shape[1]}
    targets = {"k": bank.target_keys, "v": bank.target_values}
    rank = mot.translator.config.factored_rank
    weights = {n: layer_balance_weights(t[tr]) for n, t in targets.items()} if rank and balanced else None
    fits = fit_ridge_many(x, {n: t[tr].flatten(1) for n, t in targets.items()}, x_val,
                          {n: t[va].flatten(1) for n, t in targets.items()}, lambdas, rank=rank, out_weights=weights)
    if rank:
        report["rank"] = rank
        report["rank_balanced"] = bool(weights)
    for name, down, proj in (("k", linear.key_down, linear.key_proj), ("v", linear.value_down, linear.value_proj)):
        fit = fits[name]
        if down is None:
            proj.weight.copy_(fit.weight.T)
        else:
            down.weight.copy_(fit.weight.T)
            proj.weight.copy_(fit.up.T)
        proj.bias.copy_(fit.bias)
        report[f"lambda_{name}"] = fit.lam
        report[f"val_mse_{name}"] = {str(k): v for k, v in fit.val_mse.items()}
    report["seconds"] = round(time.perf_counter() - t0, 2)
    return report


def _fit_per_layer(linear, x, x_val, bank: Bank, tr, va, lambdas, t0: float) -> dict:
    """fit_linear of a per-layer map (linear_per_layer): window layer w's K and V from its own rows x[:, w], one ridge
    fit per layer (memory of one layer's features at a time), λ per layer and K/V; the report lists them by layer."""
    report = {"train_tokens": len(tr), "val_tokens": len(va), "features": x.shape[-1], "per_layer": True}
    for w in range(linear.window):
        fits = fit_ridge_many(x[:, w], {"k": bank.target_keys[tr, w], "v": bank.target_values[tr, w]}, x_val[:, w],
                              {"k": bank.target_keys[va, w], "v": bank.target_values[va, w]}, lambdas)
        for name, proj in (("k", linear.key_proj), ("v", linear.value_proj)):
            proj.weight[w].copy_(fits[name].weight)
            proj.bias[w].copy_(fits[name].bias)
            report.setdefault(f"lambda_{name}", []).append(fits[name].lam)
            report.setdefault(f"val_mse_{name}", []).append(fits[name].val_mse[fits[name].lam])
    report["seconds"] = round(time.perf_counter() - t0, 2)
    return report


def trainable_parameters(mot: MoT, train_linear_path: bool = False) -> list[torch.nn.Parameter]:
    """The parameters a training stage updates: all of them, or all but a mixture's fitted linear path.

    The closed-form map is already the least-squares optimum of the translation term; Adam steps sized for
    the experts would only add noise to it, so by default a linear-initialised mixture keeps it fixed
    (``requires_grad`` off) and its experts learn the residual. A pure linear variant trains its map.
    """
    translator = mot.translator
    keep_fixed = translator.linear is not None and translator.config.variant != "linear" and not train_linear_path
    if keep_fixed:
        for param in translator.linear.parameters():
            param.requires_grad_(False)
    return [p for p in translator.parameters() if p.requires_grad]


def balance_loss(routing: Routing | None) -> torch.Tensor:
    """Switch-style load balancing: E · Σ_e (share of kept slots going to e) · (mean router probability of e).

    1 when routing is uniform, up to E when every token goes to one expert; 0 for a single translator.
    """
    if routing is None:
        return torch.zeros(())
    probs = routing.logits.softmax(-1).flatten(0, 1)  # (tokens, E)
    kept = (routing.gates > 0).float().flatten(0, 1)
    load = kept.sum(0) / kept.sum().clamp(min=1)
    return probs.shape[-1] * (load * probs.mean(0)).sum()


def _crops(bank: Bank, contexts: list[int], crop: int, gen: torch.Generator,
           linear_rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    """A batch of equal-length random crops [B, L, W, H] from the given contexts (L = min(crop, shortest)): source K,
    source V, target K, target V, then the same rows of `linear_rows` (the fixed map's K and V output) if given."""
    offsets = bank.offsets
    length = min(crop, min(offsets[i + 1] - offsets[i] for i in contexts))
    rows = []
    for i in contexts:
        start = offsets[i] + int(torch.randint(0, offsets[i + 1] - offsets[i] - length + 1, (1,), generator=gen))
        rows.append(torch.arange(start, start + length, device=bank.source_keys.device))
    rows = torch.stack(rows)  # (B, L)
    blocks = (bank.source_keys, bank.source_values, bank.target_keys, bank.target_values) + tuple(linear_rows or ())
    return tuple(t[rows] for t in blocks)


@torch.no_grad()
def linear_path_rows(mot: MoT, bank: Bank) -> tuple[torch.Tensor, torch.Tensor]:
    """The translator's linear path over every bank context, whole (each token's earlier tokens are its context's),
    as rows [T, W, H_T] of K and of V: what a stage that keeps the fitted map fixed adds to the experts' output."""
    parts = [mot.translator.linear(*bank.context(i)[:2]) for i in range(bank.num_contexts)]
    return torch.cat([k[0] for k, _ in parts]), torch.cat([v[0] for _, v in parts])


@torch.no_grad()
def cross_fitted_rows(mot: MoT, bank: Bank, folds: int, lambdas: dict[str, float]
                      ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The fixed map's output over every bank context as `linear_path_rows` gives it, except that each context's rows
    come from the same map (its inputs, λ per K/V, rank) refitted without that context's fold (contexts i with
    i % folds == f): out-of-sample rows, so the experts learn the residual the map leaves on new text (its in-sample
    residual is smaller). Returns (K rows, V rows, report: folds, seconds, the in-sample and out-of-fold MSE)."""
    t0 = time.perf_counter()
    x = map_inputs(mot, bank, list(range(bank.num_contexts)))
    groups = [torch.cat([bank.rows([i]) for i in range(f, bank.num_contexts, folds)]) for f in range(folds)]
    targets = {"k": bank.target_keys.flatten(1), "v": bank.target_values.flatten(1)}
    out = cross_fitted(x, targets, groups, lambdas, mot.translator.config.linear_rank)
    inside = linear_path_rows(mot, bank)
    shape = (len(x), mot.translator.linear.window, -1)
    report = {"folds": folds, "seconds": round(time.perf_counter() - t0, 1)}
    for (name, t), own in zip(targets.items(), inside):
        report[f"in_sample_mse_{name}"] = float(((own.flatten(1) - t) ** 2).mean())
        report[f"out_of_fold_mse_{name}"] = float(((out[name] - t) ** 2).mean())
    return out["k"].view(shape), out["v"].view(shape), report


def bank_loss(mot: MoT, sk, sv, tk, tv, lin_k=None, lin_v=None, balance_weight: float = 0.0,
              layer_weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Translation term on bank blocks: MSE(translated K, native K) + MSE(V) (+ balance), and its parts.

    lin_k, lin_v: the fixed linear path's output for these tokens (linear_path_rows), or None to run it.
    layer_weights: (K, V) weights [W] of each window layer's mean squared error (None: every layer weighs 1, the
    plain MSE); the logged parts are the plain MSEs either way.
    """
    out = mot.translator(sk, sv, linear_out=None if lin_k is None else (lin_k, lin_v))
    per_k, per_v = layer_mse(out.keys, out.values, tk, tv)
    wk, wv = layer_weights if layer_weights is not None else (1.0, 1.0)
    balance = balance_loss(out.key_routing) + balance_loss(out.value_routing)
    total = (wk * per_k).mean() + (wv * per_v).mean() + balance_weight * balance
    return total, {"tr_mse_k": per_k.mean().item(), "tr_mse_v": per_v.mean().item(), "balance": float(balance.detach())}


def layer_mse(keys, values, tk, tv) -> tuple[torch.Tensor, torch.Tensor]:
    """Each window layer's mean squared error [W] of translated K and V blocks [B, N, W, H] against the native ones
    (every layer has as many elements, so their mean is the window's MSE)."""
    return ((keys - tk) ** 2).mean(dim=(0, 1, 3)), ((values - tv) ** 2).mean(dim=(0, 1, 3))


@torch.no_grad()
def _context_layer_mse(mot: MoT, bank: Bank, contexts: list[int]):
    """(tokens, per-layer K MSE [W], per-layer V MSE [W]) of the translator on each whole bank context."""
    for i in contexts:
        sk, sv, tk, tv = bank.context(i)
        out = mot.translator(sk, sv)
        yield (sk.shape[1], *layer_mse(out.keys, out.values, tk, tv))


def map_residual_weights(mot: MoT, bank: Bank, contexts: list[int],
                         linear_rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, V) weights [W]: mean over layers of the translator's per-layer mean squared error on `contexts`, divided
    by each layer's own (bank_layer_weighting "map_residual": taken before the bank stage, when a linear-initialised
    translator is exactly its map, so every layer weighs by its error relative to the map's on it). With the fixed
    map's rows (linear_path_rows or cross_fitted_rows) the error is theirs."""
    def rows_mse(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = bank.rows([i])
        lin_k, lin_v = (r[rows][None] for r in linear_rows)
        return layer_mse(lin_k, lin_v, bank.target_keys[rows][None], bank.target_values[rows][None])

    sums = [0.0, 0.0]
    parts = (((k, v) for _, k, v in _context_layer_mse(mot, bank, contexts)) if linear_rows is None
             else map(rows_mse, contexts))
    for per_k, per_v in parts:
        sums = [sums[0] + per_k, sums[1] + per_v]
    return tuple(s.mean() / s for s in sums)


@torch.no_grad()
def bank_validation(mot: MoT, bank: Bank, contexts: list[int]) -> dict[str, float]:
    """Mean translation MSE of K and V over whole held-out contexts (token-weighted)."""
    sums, tokens = {"val_mse_k": 0.0, "val_mse_v": 0.0}, 0
    for n, per_k, per_v in _context_layer_mse(mot, bank, contexts):
        sums["val_mse_k"] += float(per_k.mean()) * n
        sums["val_mse_v"] += float(per_v.mean()) * n
        tokens += n
    return {k: v / max(tokens, 1) for k, v in sums.items()}


class BankLoss(torch.nn.Module):
    """The translation term on bank blocks as a module (what DistributedDataParallel wraps under torchrun)."""

    def __init__(self, mot: MoT, balance_weight: float = 0.0,
                 layer_weights: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        self.mot = mot
        self.balance_weight = balance_weight
        self.layer_weights = layer_weights

    def forward(self, sk, sv, tk, tv, lin_k=None, lin_v=None) -> tuple[torch.Tensor, dict[str, float]]:
        return bank_loss(self.mot, sk, sv, tk, tv, lin_k, lin_v, self.balance_weight, self.layer_weights)


def bank_stage(mot: MoT, bank: Bank, steps: int, lr: float, batch: int = 8, crop: int = 128,
               weight_decay: float = 0.01, warmup: int = 50, grad_clip: float = 1.0, balance_weight: float = 0.0,
               seed: int = 0, log_every: int = 100, rank: int = 0, world: int = 1,
               parallel: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
               log: Callable[[dict], None] | None = None, progress: bool = True,
               params: list[torch.nn.Parameter] | None = None, layer_weighting: str = "none",
               linear_rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[dict]:
    """Train every translator parameter on the bank's translation term for `steps` AdamW steps.

    Each step takes `batch` random training contexts (a rank takes its own share under torchrun) and a
    random crop of each; the held-out contexts are scored every `log_every` steps. Returns the log rows.
    `params` (default: every translator parameter) are the ones updated; `parallel` wraps the loss module
    (DistributedDataParallel across the ranks of a torchrun). layer_weighting "map_residual" weighs each window
    layer's error by :func:`map_residual_weights` of up to 40 training contexts (every log row records them).
    linear_rows: a fixed map's output rows to train on (cross_fitted_rows; default: linear_path_rows).
    """
    from tqdm import tqdm

    train, val = bank.split()
    params = list(mot.translator.parameters()) if params is None else params
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    rows, window, t0 = [], [], time.perf_counter()
    if layer_weighting not in LAYER_WEIGHTINGS:
        raise ValueError(f"layer_weighting must be one of {LAYER_WEIGHTINGS}, not {layer_weighting!r}")
    linear = mot.translator.linear
    fixed = linear is not None and mot.translator.config.variant != "linear" and not any(
        p.requires_grad and any(p is q for q in params) for p in linear.parameters())
    if linear_rows is not None and not fixed:
        raise ValueError("linear_rows are a fixed map's output: this stage trains the map (or has none)")
    # a fixed map's output does not change between steps: computed once over whole contexts, each crop takes its rows
    if fixed and linear_rows is None:
        linear_rows = linear_path_rows(mot, bank)
    weights = map_residual_weights(mot, bank, train[:40], linear_rows) if layer_weighting == "map_residual" else None
    loss_fn = BankLoss(mot, balance_weight, weights)
    loss_fn = parallel(loss_fn) if parallel is not None else loss_fn
    mot.train()
    bar = tqdm(total=steps, disable=not progress or rank != 0, desc="bank stage", dynamic_ncols=True)
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(lr, step, warmup, steps)
        picks = torch.randint(0, len(train), (batch * world,), generator=torch.Generator().manual_seed(seed + step))
        mine = [train[int(i)] for i in picks[rank::world]]
        total, parts = loss_fn(*_crops(bank, mine, crop, gen, linear_rows))
        optimizer.zero_grad(set_to_none=True)
        total.backward()  # under DistributedDataParallel: the gradients arrive averaged over the ranks
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
        optimizer.step()
        window.append(parts)
        bar.update(1)
        bar.set_postfix(mse_k=f"{parts['tr_mse_k']:.4f}", mse_v=f"{parts['tr_mse_v']:.4f}")
        if step % log_every == 0 or step == steps:
            mot.eval()
            row = {"bank_step": step, "lr": cosine_lr(lr, step, warmup, steps),
                   "elapsed_s": round(time.perf_counter() - t0, 1),
                   **{k: sum(w[k] for w in window) / len(window) for k in window[0]},
                   **bank_validation(mot, bank, val),
                   **({} if weights is None else {"layer_weights_k": [round(float(w), 4) for w in weights[0]],
                                                  "layer_weights_v": [round(float(w), 4) for w in weights[1]]})}
            mot.train()
            rows.append(row)
            window = []
            if log is not None:
                log(row)
    bar.close()
    mot.eval()
    return rows
