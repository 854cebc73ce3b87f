"""``mean``: every window token's K/V replaced by the layer's mean native K/V (method.md §13, "Mean vector"): a window
with no context-specific content, replayed as the MoT's was."""

from __future__ import annotations

import time

import torch

from ..engine import hf
from ..engine.models import LoadedModel
from ..engine.mot import MoT, Translation, replay_window
from ..train.mean_vector import MeanVectors, reference_means
from .method import Built, Inputs, Loading, Method


def mean_vector_cache(mot: MoT, target: LoadedModel, translation: Translation, means: MeanVectors) -> list[hf.KV]:
    """Replay with every window token's K/V replaced by the layer's mean native K/V (method.md §13, "Mean vector").

    `means`: the mean native window of this target and window layers; the sparse indices are the translation's.
    """
    k, v = means.blocks(translation.target_ids.shape[1])
    with torch.no_grad():
        return replay_window(mot, target, translation, k, v)


class MeanWindow(Method):
    def load(self, loading: Loading) -> MeanVectors | None:
        """The mean native window of the run's target and window layers."""
        return None if loading.mot is None else reference_means(loading.target, loading.mot.channels.target_layers)

    def build(self, inputs: Inputs) -> Built:
        """Its own replay (the mean native window is computed once per target and window, not per context)."""
        start = time.perf_counter()
        kv = mean_vector_cache(inputs.mot, inputs.target, inputs.translation, inputs.artifact)
        return Built(kv, time.perf_counter() - start)

    def by_agents(self, agents, k: int | None):
        """The one reader's translation with the mean window replayed (no count of agents changes it)."""
        kv = mean_vector_cache(agents.mot, agents.target, agents.one, agents.artifact(self))
        return agents.replayed(kv, self.reads_source)


MEAN = MeanWindow("mean", "Mean-vector control (window = mean native K/V, no context-specific content)",
                  loads="the mean native window of the target's window layers (train.mean_vector.reference_means)",
                  tie="mean-vector control", reads_source=False, one_reader=True, control=True)
