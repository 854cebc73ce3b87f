"""``native``: the target prefills the context itself (method.md §8), the reference every other way is measured by."""

from __future__ import annotations

import numpy as np

from ..engine.models import ModelSpec, kv_cache_bytes
from ..engine.mot import MoT
from .method import Built, Inputs, Method
from .names import REFERENCE


class Native(Method):
    def build(self, inputs: Inputs) -> Built:
        """The translation's own native cache (translate prefills the target on the context)."""
        return Built(inputs.translation.native_kv, inputs.translation.timings.get("native_prefill", 0.0))

    def handed_bytes(self, built: Built | None, tokens: int, target: ModelSpec, window_layers: int,
                     source: ModelSpec | None = None) -> float:
        """A full target cache of the context: what handing over a cache instead of the text would move."""
        return float(kv_cache_bytes(target, tokens))

    def handed_what(self, built: Built | None, target: ModelSpec, window_layers: int) -> str:
        return "a full target cache of the context, were it handed over"  # it hands over nothing: the text is read

    def stages(self, built: Built, timings: dict[str, float]) -> list[tuple[str, float]]:
        return [("target prefill", built.seconds)]

    def carries(self, mot: MoT, artifact=None) -> tuple[int, ...] | None:
        return None  # the reference itself

    def target_work(self, built: Built | None, tokens: int, prefix: int = 0) -> tuple[str, int]:
        return "prefill", tokens

    def target_side(self, built: Built | None, timings) -> float:
        return timings.get("native_prefill", np.nan)


NATIVE = Native(REFERENCE, "Native context (target prefilled the text itself)", reads_source=False,
                bound=True, short="native (the target reads the context)")
