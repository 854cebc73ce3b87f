"""``random``: the norm-matched random window (method.md §9.2), replayed as the MoT's was: what the MoT's error alone,
with no context in it, would answer."""

from __future__ import annotations

import time

import torch

from ..engine import hf
from ..engine.controls import random_control_window
from ..engine.models import LoadedModel
from ..engine.mot import MoT, Translation, replay_window
from .method import Built, Inputs, Method, translated_seconds


def random_control_cache(mot: MoT, target: LoadedModel, translation: Translation, seed: int = 0) -> list[hf.KV]:
    """Replay with the norm-matched random window (method.md §9.2), drawn independently for K and V."""
    out = translation.translated
    k, v = random_control_window(*translation.native_window_blocks(mot.channels), out.keys, out.values, seed)
    with torch.no_grad():
        return replay_window(mot, target, translation, k, v)


class RandomWindow(Method):
    def build(self, inputs: Inputs) -> Built:
        """Its noise is norm-matched to the translation's error, so it costs the translation and its own replay."""
        t = inputs.translation
        start = time.perf_counter()
        kv = random_control_cache(inputs.mot, inputs.target, t, inputs.seed)
        return Built(kv, translated_seconds(t) + time.perf_counter() - start, t.timings.get("source_prefill", 0.0))


RANDOM = RandomWindow("random", "Random-window control (norm-matched noise)", tie="random-window control",
                      control=True, evaluations=("evaluate",))
