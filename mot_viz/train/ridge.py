"""Closed-form ridge regression: the linear translator and the start of every trained one (method.md §13).

Pure tensor functions, in float64 on the features' device (the targets join them there). Features and targets are
centred, so the intercept is not penalised; the penalty is relative (λ · mean eigenvalue of the feature covariance),
so one grid fits every pair's scale.
One eigendecomposition serves every λ of the grid; λ is chosen on held-out rows. With a rank, the fit is reduced-rank
ridge: the ridge weights projected on the top principal directions of their own fitted values, stored as two factors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

LAMBDAS = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # relative penalties tried by default


@dataclass
class RidgeFit:
    """y ≈ x @ weight + bias, with the penalty that did best on the held-out rows."""

    weight: torch.Tensor  # [F, O], or [F, rank] with `up`
    bias: torch.Tensor  # [O]
    lam: float  # chosen relative penalty
    val_mse: dict[float, float]  # held-out MSE per relative penalty tried
    up: torch.Tensor | None = None  # [rank, O] for a reduced-rank fit: y ≈ x @ weight @ up + bias

    @property
    def full_weight(self) -> torch.Tensor:
        """The [F, O] weight (the product of the factors for a reduced-rank fit)."""
        return self.weight if self.up is None else self.weight @ self.up


class NormalEquations:
    """The centred normal equations of features x in float64, diagonalised once for any target and λ.

    Sums run over row chunks in float64, so memory is the features themselves (as given) plus one chunk: a bank of
    ~100k tokens by several thousand features fits in a few GB.
    """

    CHUNK = 8192  # rows per float64 chunk

    def __init__(self, x: torch.Tensor):
        self.x = x
        self.x_mean = sum(c.double().sum(0) for c in self._chunks(x)) / len(x)
        gram = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64, device=x.device)
        for c in self._chunks(x):
            c = c.double() - self.x_mean
            gram.addmm_(c.T, c)
        self.scale = float(gram.diagonal().mean().clamp(min=1e-12))
        self.eigvals, self.eigvecs = torch.linalg.eigh(gram)

    def _chunks(self, t: torch.Tensor):
        return (t[i:i + self.CHUNK] for i in range(0, len(t), self.CHUNK))

    def project(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y_mean = y.to(self.x.device, torch.float64).mean(0)
        xty = torch.zeros(self.x.shape[1], y.shape[1], dtype=torch.float64, device=self.x.device)
        for c, t in zip(self._chunks(self.x), self._chunks(y)):
            xty.addmm_((c.double() - self.x_mean).T, t.to(c.device, torch.float64) - y_mean)
        return self.eigvecs.T @ xty, y_mean  # (F, O), (O,)

    def solve(self, projected: torch.Tensor, y_mean: torch.Tensor, lam: float, rank: int = 0,
              out_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(weight, bias, up): the ridge solution for λ; with 0 < rank < O, weight [F, rank] and up [rank, O] are its
        projection on the `rank` principal directions of its fitted values on these rows (up None otherwise), each
        output column scaled by out_weight [O] first if given (the directions that matter once outputs are weighed)."""
        weight = self.eigvecs @ (projected / (self.eigvals.clamp(min=0) + lam * self.scale)[:, None])

        def fitted_cov(w: torch.Tensor) -> torch.Tensor:  # wᵀ·gram·w through the eigendecomposition
            rotated = self.eigvecs.T @ w
            return rotated.T @ (self.eigvals.clamp(min=0)[:, None] * rotated)

        weight, up = reduce_rank(weight, fitted_cov, rank, out_weight)
        return weight, y_mean - self.x_mean @ (weight if up is None else weight @ up), up

    def choose_lambda(self, projected: torch.Tensor, y_mean: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor,
                      lambdas: Sequence[float], rank: int = 0, out_weight: torch.Tensor | None = None
                      ) -> tuple[float, dict[float, float]]:
        """(the λ with the lowest MSE on (x_val, y_val), that MSE per λ) of the fits solve gives."""
        xv, yv = x_val.double(), y_val.to(x_val.device, torch.float64)
        val_mse = {lam: float(((predict(xv, *self.solve(projected, y_mean, lam, rank, out_weight)) - yv) ** 2).mean())
                   for lam in lambdas}
        return min(val_mse, key=val_mse.get), val_mse


def reduce_rank(weight: torch.Tensor, fitted_cov, rank: int, out_weight: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reduced-rank ridge: weight [F, O] -> (weight [F, rank], up [rank, O]) spanning the `rank` principal directions
    of the fitted values (fitted_cov(w) = wᵀ·gram·w), outputs scaled by out_weight [O] first if given; (weight, None)
    unchanged unless 0 < rank < O."""
    if not 0 < rank < weight.shape[1]:
        return weight, None
    w = (torch.ones(weight.shape[1], dtype=weight.dtype, device=weight.device) if out_weight is None
         else out_weight.to(weight.device, weight.dtype))
    values, vectors = torch.linalg.eigh(fitted_cov(weight * w))
    top = vectors[:, values.argsort(descending=True)[:rank]]  # [O, rank], orthonormal columns
    return (weight * w) @ top, top.T / w


def predict(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight (@ up for a reduced-rank fit) + bias."""
    out = x @ weight
    return (out if up is None else out @ up) + bias


def fit_ridge(x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor,
              lambdas: Sequence[float] = LAMBDAS, refit_all: bool = True, rank: int = 0) -> RidgeFit:
    """Fit y [n, O] from x [n, F] for every λ, keep the one with the lowest MSE on (x_val, y_val)."""
    return fit_ridge_many(x, {"y": y}, x_val, {"y": y_val}, lambdas, refit_all, rank)["y"]


def fit_ridge_many(x: torch.Tensor, ys: dict[str, torch.Tensor], x_val: torch.Tensor, ys_val: dict[str, torch.Tensor],
                   lambdas: Sequence[float] = LAMBDAS, refit_all: bool = True, rank: int = 0,
                   out_weights: dict[str, torch.Tensor] | None = None) -> dict[str, RidgeFit]:
    """`fit_ridge` for several targets of the same features (one decomposition), λ chosen per target.

    With refit_all the chosen λ is refitted on train and held-out rows together (the returned weights);
    val_mse always reports the train-only fits, so the choice stays honest. rank > 0: reduced-rank fits (the
    held-out MSE that chooses λ is the reduced fit's); out_weights: per target, the output weights of its reduced fit
    (NormalEquations.solve's out_weight).
    """
    if any(y.shape[0] != x.shape[0] for y in ys.values()) or any(y.shape[0] != x_val.shape[0] for y in ys_val.values()):
        raise ValueError("features and targets need the same number of rows")
    normal, xv, best, val_mse = NormalEquations(x), x_val.double(), {}, {}
    for name, y in ys.items():
        best[name], val_mse[name] = normal.choose_lambda(*normal.project(y), xv, ys_val[name], lambdas, rank,
                                                         (out_weights or {}).get(name))
    if refit_all:
        normal = NormalEquations(torch.cat([x, x_val]))
    fits = {}
    for name, y in ys.items():
        y_all = torch.cat([y, ys_val[name]]) if refit_all else y
        weight, bias, up = normal.solve(*normal.project(y_all), best[name], rank, (out_weights or {}).get(name))
        fits[name] = RidgeFit(weight.float(), bias.float(), best[name], val_mse[name],
                              None if up is None else up.float())
    return fits


def cross_fitted(x: torch.Tensor, ys: dict[str, torch.Tensor], folds: Sequence[torch.Tensor],
                 lams: dict[str, float], rank: int = 0) -> dict[str, torch.Tensor]:
    """Out-of-fold predictions: the rows of each fold (row indices) predicted by the ridge fit of every other fold's
    rows, with relative penalty lams[name] (and `rank`, as NormalEquations.solve). Returns {name: [n, O]} in x's row
    order, float32.

    What a model stacked on the fit sees on new text: its residuals out of sample, not the smaller in-sample ones.
    One pass sums each fold's statistics in float64; each fold's fit subtracts its own from the totals and solves by
    Cholesky (same solution as fit_ridge's eigendecomposition).
    """
    stats = [_fold_sums(x, ys, rows) for rows in folds]
    total = _FoldSums(sum(f.n for f in stats), sum(f.sx for f in stats), sum(f.gram for f in stats),
                      {k: sum(f.sy[k] for f in stats) for k in ys}, {k: sum(f.xty[k] for f in stats) for k in ys})
    out = {k: torch.zeros(x.shape[0], y.shape[1], device=x.device) for k, y in ys.items()}
    for rows, fold in zip(folds, stats):
        m = total.n - fold.n
        x_mean = (total.sx - fold.sx) / m
        g = (total.gram - fold.gram) - m * torch.outer(x_mean, x_mean)  # the other folds' centred gram
        scale = float(g.diagonal().mean().clamp(min=1e-12))
        for k in ys:
            y_mean = (total.sy[k] - fold.sy[k]) / m
            rhs = (total.xty[k] - fold.xty[k]) - m * torch.outer(x_mean, y_mean)
            chol = torch.linalg.cholesky(g + lams[k] * scale * torch.eye(len(g), dtype=g.dtype, device=g.device))
            weight, up = reduce_rank(torch.cholesky_solve(rhs, chol), lambda w: w.T @ g @ w, rank)
            bias = y_mean - x_mean @ (weight if up is None else weight @ up)
            for i in range(0, len(rows), NormalEquations.CHUNK):
                idx = rows[i:i + NormalEquations.CHUNK]
                out[k][idx] = predict(x[idx].double(), weight, bias, up).float()
    return out


@dataclass
class _FoldSums:
    """Uncentred float64 sums of one fold's rows: count, Σx, Σxxᵀ, and per target Σy, Σxyᵀ."""

    n: int
    sx: torch.Tensor
    gram: torch.Tensor
    sy: dict[str, torch.Tensor]
    xty: dict[str, torch.Tensor]


def _fold_sums(x: torch.Tensor, ys: dict[str, torch.Tensor], rows: torch.Tensor) -> _FoldSums:
    f, like = x.shape[1], {"dtype": torch.float64, "device": x.device}
    sums = _FoldSums(len(rows), torch.zeros(f, **like), torch.zeros(f, f, **like),
                     {k: torch.zeros(y.shape[1], **like) for k, y in ys.items()},
                     {k: torch.zeros(f, y.shape[1], **like) for k, y in ys.items()})
    for i in range(0, len(rows), NormalEquations.CHUNK):
        idx = rows[i:i + NormalEquations.CHUNK]
        c = x[idx].double()
        sums.sx += c.sum(0)
        sums.gram.addmm_(c.T, c)
        for k, y in ys.items():
            t = y[idx].to(x.device, torch.float64)
            sums.sy[k] += t.sum(0)
            sums.xty[k].addmm_(c.T, t)
    return sums
