"""``native``: the target prefills the context itself (method.md §8), the reference every other way is measured by."""

from __future__ import annotations

import numpy as np

from ..engine.models import ModelSpec, kv_cache_bytes
from .method import Built, Inputs, Method


class Native(Method):
    def build(self, inputs: Inputs) -> Built:
        """The translation's own native cache (translate prefills the target on the context)."""
        return Built(inputs.translation.native_kv, inputs.translation.timings.get("native_prefill", 0.0))

    def handed_bytes(self, tokens: int, target: ModelSpec, window_layers: int, relay=None, kvcomm=None,
                     source: ModelSpec | None = None) -> float:
        """A full target cache of the context: what handing over a cache instead of the text would move."""
        return float(kv_cache_bytes(target, tokens))

    def target_work(self, tokens: int, relay=None, prefix: int = 0) -> tuple[str, int]:
        return "prefill", tokens

    def target_side(self, timings: dict[str, float], relay=None, writing: float | None = None) -> float:
        return timings.get("native_prefill", np.nan)


NATIVE = Native("native", "Native context (target prefilled the text itself)", reads_source=False,
                bound=True)
