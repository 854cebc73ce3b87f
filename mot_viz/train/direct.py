"""The full-depth direct map at its paper's recipe (closed-form, arXiv 2608.03893; method.md §15).

Per target layer, the k source layers whose single-layer ridge map predicts it best on held-out tokens (R²), their
aligned K concatenated for its K and their V for its V, one ridge map each with a fixed penalty. Everything is
computed from moments of the bank summed shard by shard in float64 (mot_viz.train.bank.bank_shards), so a bank of
every source layer over ~100k tokens is never held in memory: the rows of train contexts give the fits, those of
held-out contexts score them (R² from the same sums). The paper's λ = 0.01 reads two ways, both offered: absolute,
λ·I added to the selected features' centred Gram summed over the calibration tokens (at ~90k tokens close to ordinary
least squares), or relative, λ times that Gram's mean diagonal (mot_viz.train.ridge's convention; what λ means on
standardised features); each fit also scores the same layers under the other reading (`other_r2`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from .bank import bank_shards

DIRECT_K = 8  # source layers per target layer (method.md §15)
DIRECT_LAMBDA = 0.01  # ridge penalty (method.md §15), absolute or relative: see the module's docstring


@dataclass
class Moments:
    """Float64 sums over rows of features x [n, F] and targets y [n, O], each row first less fixed shifts (reference
    means, which keep the sums' cancellation small): n, Σx, Σxxᵀ, Σy, Σxyᵀ and Σy² per output column. Every mean and
    fit computed from them is in the shifted frame (affine adds the shifts back)."""

    n: int
    sx: torch.Tensor  # (F,)
    sxx: torch.Tensor  # (F, F)
    sy: torch.Tensor  # (O,)
    sxy: torch.Tensor  # (F, O)
    syy: torch.Tensor  # (O,)
    x_shift: torch.Tensor  # (F,) float32
    y_shift: torch.Tensor  # (O,) float32

    @classmethod
    def zeros(cls, x_shift: torch.Tensor, y_shift: torch.Tensor) -> "Moments":
        f, o = len(x_shift), len(y_shift)
        z = lambda *shape: torch.zeros(*shape, dtype=torch.float64)
        return cls(0, z(f), z(f, f), z(o), z(f, o), z(o), x_shift.float(), y_shift.float())

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Add rows x [n, F], y [n, O]; float32 products per chunk of rows, summed in float64."""
        for i in range(0, len(x), 2048):
            xc, yc = x[i:i + 2048].float() - self.x_shift, y[i:i + 2048].float() - self.y_shift
            self.n += len(xc)
            self.sx += xc.double().sum(0)
            self.sy += yc.double().sum(0)
            self.sxx += (xc.T @ xc).double()
            self.sxy += (xc.T @ yc).double()
            self.syy += yc.double().pow(2).sum(0)

    def centred(self, rows: torch.Tensor, cols: torch.Tensor, x_mean: torch.Tensor, y_mean: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(Σ(x−x̄)(x−x̄)ᵀ over feature indices `rows`, Σ(x−x̄)(y−ȳ)ᵀ over those and output indices `cols`), centred
        on the given means (another set's, to score a fit on these rows)."""
        sx, sy = self.sx[rows], self.sy[cols]
        xx = (self.sxx[rows][:, rows] - torch.outer(sx, x_mean) - torch.outer(x_mean, sx)
              + self.n * torch.outer(x_mean, x_mean))
        xy = (self.sxy[rows][:, cols] - torch.outer(sx, y_mean) - torch.outer(x_mean, sy)
              + self.n * torch.outer(x_mean, y_mean))
        return xx, xy

    def sse(self, rows: torch.Tensor, cols: torch.Tensor, weight: torch.Tensor, x_mean: torch.Tensor,
            y_mean: torch.Tensor) -> float:
        """Σ‖y − ȳ' − (x − x̄')·weight‖² over these rows: the squared error of a fit with means (x̄', ȳ')."""
        xx, xy = self.centred(rows, cols, x_mean, y_mean)
        yy = self.syy[cols] - 2 * y_mean * self.sy[cols] + self.n * y_mean ** 2
        return float(yy.sum() - 2 * (weight * xy).sum() + (weight * (xx @ weight)).sum())

    def sst(self, cols: torch.Tensor) -> float:
        """Σ‖y − mean of these rows‖²: the total the R² divides by."""
        return float((self.syy[cols] - self.sy[cols] ** 2 / self.n).sum())


@dataclass
class LayerFit:
    """One target layer's K (or V) map: y ≈ (x[sources] − x_mean)·weight + y_mean, in the moments' shifted frame."""

    sources: tuple[int, ...]  # input positions (source layers' places in the bank), best single-layer R² first
    weight: torch.Tensor  # (k·H_S, H_T)
    x_mean: torch.Tensor  # (k·H_S,)
    y_mean: torch.Tensor  # (H_T,)
    r2: float  # held-out R² of this map
    single_r2: list[float]  # held-out R² of each input layer's own map, by input position
    other_r2: float  # held-out R² of the same layers' map with the penalty read the other way (relative/absolute)


def layer_block(layers: Iterable[int], width: int) -> torch.Tensor:
    """The feature indices of these layers (each `width` wide, layer-major) in a flattened [.., L·width] row."""
    return torch.cat([torch.arange(l * width, (l + 1) * width) for l in layers])


def ridge_fit(train: Moments, rows: torch.Tensor, cols: torch.Tensor, lam: float, relative: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight, x_mean, y_mean) of the ridge map from features `rows` to outputs `cols` on the train moments: the
    penalty λ·I added to the centred Gram summed over the rows (absolute), or with `relative` λ times its mean
    diagonal (mot_viz.train.ridge's convention)."""
    x_mean, y_mean = train.sx[rows] / train.n, train.sy[cols] / train.n
    xx, xy = train.centred(rows, cols, x_mean, y_mean)
    scale = float(xx.diagonal().mean().clamp(min=1e-12)) if relative else 1.0
    eye = torch.eye(len(rows), dtype=xx.dtype)
    return torch.linalg.solve(xx + lam * scale * eye, xy), x_mean, y_mean


def affine(train: Moments, rows: torch.Tensor, cols: torch.Tensor, weight: torch.Tensor, x_mean: torch.Tensor,
           y_mean: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A fit in the moments' shifted frame as (weight [F, O], bias [O]) of y ≈ x·weight + bias on unshifted rows."""
    x0, y0 = x_mean + train.x_shift[rows].double(), y_mean + train.y_shift[cols].double()
    return weight.float(), (y0 - x0 @ weight).float()


def held_out_r2(train: Moments, val: Moments, rows: torch.Tensor, cols: torch.Tensor, lam: float,
                relative: bool = False) -> float:
    """R² on the held-out moments of the ridge map fitted on the train moments."""
    weight, x_mean, y_mean = ridge_fit(train, rows, cols, lam, relative)
    return 1 - val.sse(rows, cols, weight, x_mean, y_mean) / val.sst(cols)


def top_k_fit(train: Moments, val: Moments, num_inputs: int, in_width: int, out_layer: int, out_width: int,
              k: int, lam: float, relative: bool = False) -> LayerFit:
    """Output layer `out_layer`'s map from the k input layers of highest single-layer held-out R² (ties: the earlier
    layer), their features concatenated in that order; penalty λ, `relative` or absolute (ridge_fit)."""
    cols = layer_block([out_layer], out_width)
    single = [held_out_r2(train, val, layer_block([l], in_width), cols, lam, relative) for l in range(num_inputs)]
    sources = tuple(sorted(range(num_inputs), key=lambda l: (-single[l], l))[:k])
    rows = layer_block(sources, in_width)
    weight, x_mean, y_mean = ridge_fit(train, rows, cols, lam, relative)
    r2 = 1 - val.sse(rows, cols, weight, x_mean, y_mean) / val.sst(cols)
    return LayerFit(sources, weight, x_mean, y_mean, r2, single,
                    held_out_r2(train, val, rows, cols, lam, not relative))


def bank_moments(shards: Iterable[dict[str, torch.Tensor]], num_contexts: int, val_fraction: float = 0.1,
                 progress: bool = False) -> dict[str, tuple[Moments, Moments]]:
    """{"k": (train, held-out), "v": (…)}: moments of every bank input layer's aligned source K (V) against every
    target layer's K (V), summed shard by shard; the last share of contexts is held out (Bank.split's rule)."""
    n_val = max(1, round(num_contexts * val_fraction)) if num_contexts > 1 else 0
    first_val, moments, seen = num_contexts - n_val, {}, 0
    bar = tqdm(total=num_contexts, desc="moments", unit="context", disable=not progress, dynamic_ncols=True)
    for shard in shards:
        context = torch.repeat_interleave(torch.arange(seen, seen + len(shard["lengths"])), shard["lengths"])
        seen += len(shard["lengths"])
        held_out = context >= first_val
        for name, src, tgt in (("k", "source_keys", "target_keys"), ("v", "source_values", "target_values")):
            x, y = shard[src].flatten(1), shard[tgt].flatten(1)  # (T, L_in·H_S), (T, L_T·H_T)
            if name not in moments:  # the first rows' means: the shift of every row
                shift = (x[:1024].double().mean(0), y[:1024].double().mean(0))
                moments[name] = (Moments.zeros(*shift), Moments.zeros(*shift))
            moments[name][0].add(x[~held_out], y[~held_out])
            moments[name][1].add(x[held_out], y[held_out])
        bar.update(len(shard["lengths"]))
    bar.close()
    if seen != num_contexts or not moments:
        raise ValueError(f"the bank's shards hold {seen} contexts, its manifest {num_contexts}")
    return moments


def fit_every_layer(moments: dict[str, tuple[Moments, Moments]], in_width: int, out_width: int, k: int, lam: float,
                    relative: bool = False) -> dict[str, list[LayerFit]]:
    """{"k": [LayerFit per output layer], "v": [...]}: top_k_fit of every output layer of the moments, K and V apart."""
    fits = {}
    for name, (train, val) in moments.items():
        num_inputs, num_outputs = len(train.sx) // in_width, len(train.sy) // out_width
        fits[name] = [top_k_fit(train, val, num_inputs, in_width, t, out_width, k, lam, relative)
                      for t in range(num_outputs)]
    return fits


def cached_moments(folder: Path, manifest: dict, val_fraction: float, progress: bool = False
                   ) -> dict[str, tuple[Moments, Moments]]:
    """bank_moments of a complete bank, saved beside its shards once summed (a second fit of the bank, with another k
    or λ, reads them in seconds instead of summing the bank again)."""
    path = folder / f"moments-val{val_fraction:g}.safetensors"
    parts = [(name, split) for name in ("k", "v") for split in ("train", "val")]
    if path.is_file():
        saved = load_file(str(path))
        loaded = {p: Moments(**{f.name: saved[f"{p[0]}.{p[1]}.{f.name}"] for f in fields(Moments)}) for p in parts}
        for moments in loaded.values():
            moments.n = int(moments.n)
        return {name: (loaded[name, "train"], loaded[name, "val"]) for name in ("k", "v")}
    moments = bank_moments(bank_shards(folder, manifest), manifest["num_contexts"], val_fraction, progress)
    tensors = {}
    for name, split in parts:
        m = moments[name][split == "val"]
        tensors |= {f"{name}.{split}.{f.name}": torch.tensor(m.n) if f.name == "n" else getattr(m, f.name)
                    for f in fields(Moments)}
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")  # whole or absent: a killed save is never read
    save_file(tensors, str(tmp))
    os.replace(tmp, path)
    return moments
