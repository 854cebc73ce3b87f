"""``c2c-pr``: a single projection path (the MoT authors' projection baseline of C2C, method.md §15), its network
trained by python -m mot_viz.train.rival (mot_viz.train.c2c): the target's top N = min(L_S, L_T) layers' cache
projected from the source's top N, last aligned to last; below them the target's own prefill. For SmolLM2 → Gemma 3
(N = L_T) it replaces the target's every layer, so the target runs no prefill and no replay.
"""

from __future__ import annotations

import time

import torch

from ..engine.mot import native_cache
from ..train.c2c import NAME, projected_cache
from .method import Built, Inputs, Option
from .trained import Handed, TrainedWay, shipped_beside


class ProjectionWay(TrainedWay):
    def build(self, inputs: Inputs) -> Built:
        """The projection of the MoT's source context; below it (N < L_T), the target's own prefill, timed."""
        start = time.perf_counter()
        net, src = inputs.artifact.net, inputs.translation.source
        prefill = 0.0
        with torch.no_grad():
            native = None
            if net.target_layers[0]:
                before = time.perf_counter()
                native = native_cache(inputs.target, src.target_ids)
                prefill = time.perf_counter() - before
            kv = projected_cache(net, src, inputs.source, inputs.target, native)
        positions = int(src.target_ids.shape[1]) if net.target_layers[0] else 0
        return self.built(inputs, kv, start, Handed(len(net.source_layers), prefill=positions), prefill)


C2C_PR_OPTION = Option("c2c_pr", str, None, "the projection path the 'c2c-pr' way of sharing answers from (python -m "
                       "mot_viz.train.rival --method c2c-pr; default: pretrained/<pair>-c2c-pr beside --checkpoint)",
                       beside=shipped_beside(NAME))

C2C_PR = ProjectionWay(NAME, "C2C projection path (one MLP maps each aligned source layer's K/V to the target's every "
                       "layer; no replay: the target never reads the context)", (C2C_PR_OPTION,),
                       "its trained projection path: pass --c2c_pr CHECKPOINT", patchable=True, one_reader=True,
                       short="C2C projection path (every layer, no replay)", side="alignment + projection")
