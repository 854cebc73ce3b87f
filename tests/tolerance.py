"""Float comparisons that hold on any CPU and any thread count.

Two computations of the same float32 quantity (a sparse and a dense path, 1 thread and 2) differ by rounding that
scales with the magnitude of what is summed, not with each element's own size: an element near zero can carry the
rounding of its larger neighbours. So the tolerance here is relative to the reference's scale (its largest
magnitude), never a bare absolute number; a real bug moves values by a large share of that scale.
"""

from __future__ import annotations

import numpy as np
import torch


def _array(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def scale_error(actual, expected, equal_nan: bool = False) -> float:
    """max |actual − expected| ÷ max |expected| (0 when both are all zero; inf when the shapes differ)."""
    a, b = _array(actual), _array(expected)
    if a.shape != b.shape:
        return float("inf")
    if equal_nan:
        both = np.isnan(a) & np.isnan(b)
        if (np.isnan(a) != np.isnan(b)).any():
            return float("inf")
        a, b = np.where(both, 0.0, a), np.where(both, 0.0, b)
    scale = np.abs(b).max(initial=0.0)
    diff = np.abs(a - b).max(initial=0.0)
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return float(diff / scale)


def close(actual, expected, rtol: float = 1e-4, equal_nan: bool = False) -> bool:
    """Equal up to rtol of the reference's scale (see the module's docstring)."""
    return scale_error(actual, expected, equal_nan) <= rtol


def assert_close(actual, expected, rtol: float = 1e-4, equal_nan: bool = False, what: str = "") -> None:
    """close(), with the relative error in the message when it fails."""
    error = scale_error(actual, expected, equal_nan)
    assert error <= rtol, f"{what + ': ' if what else ''}relative error {error:.3g} > {rtol:g}"
