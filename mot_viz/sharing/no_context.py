"""``no_context``: the target answers the question alone, the floor every way of sharing must rise above."""

from __future__ import annotations

import time

from ..engine.models import ModelSpec
from ..engine.mot import MoT, empty_context_cache
from .method import Built, Inputs, Method
from .names import FLOOR


class NoContext(Method):
    def build(self, inputs: Inputs) -> Built:
        """The empty cache (the target's BOS prefix, or None)."""
        start = time.perf_counter()
        kv = empty_context_cache(inputs.target)
        return Built(kv, time.perf_counter() - start)

    def handed_bytes(self, built: Built | None, tokens: int, target: ModelSpec, window_layers: int,
                     source: ModelSpec | None = None) -> float:
        return 0.0

    def handed_what(self, built: Built | None, target: ModelSpec, window_layers: int) -> str:
        return "nothing"

    def stages(self, built: Built, timings: dict[str, float]) -> list[tuple[str, float]]:
        return [("target prefill", built.seconds)]  # of its BOS prefix

    def carries(self, mot: MoT, artifact=None) -> tuple[int, ...] | None:
        return None  # no context positions

    def target_work(self, built: Built | None, tokens: int, prefix: int = 0) -> tuple[str, int]:
        return "none", 0

    def target_side(self, built: Built | None, timings) -> float:
        return 0.0


NO_CONTEXT = NoContext(FLOOR, "No context (question only)", tie="question alone (no context)",
                       comparable=False, reads_source=False,
                       bound=True, short="no context (question only)")
