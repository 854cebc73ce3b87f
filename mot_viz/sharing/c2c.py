"""C2C (method.md §15) in its two forms, their networks trained by python -m mot_viz.train.rival (mot_viz.train.c2c):

* ``c2c-pr``, a single projection path (the MoT authors' projection baseline): the target's top N = min(L_S, L_T)
  layers' cache projected from the source's top N, last aligned to last, in place of the target's own; below them the
  target's own prefill. For SmolLM2 → Gemma 3 (N = L_T) it replaces the target's every layer, so the target runs no
  prefill and no replay. It answers MoT's question: can the target skip reading the context?
* ``c2c``, C2C's own fuser: the target prefills the context itself, then each of its top N layers' K/V is enriched
  with a gated residual computed from its own and the aligned source layer's. It answers another question: does the
  source's cache add to a target that has read the context? Native is not its ceiling.
"""

from __future__ import annotations

import time

import torch

from ..engine.mot import native_cache
from ..train.c2c import FUSER, NAME, fused_cache, projected_cache
from .method import Built, Inputs
from .trained import Handed, TrainedWay, trained_option


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
        held = Handed(len(net.source_layers), int(src.source_ids.shape[1]), positions)
        return self.built(inputs, kv, start, held, prefill)


C2C_PR_OPTION = trained_option(NAME, "c2c_pr", "the projection path the 'c2c-pr' way of sharing answers from (python "
                               "-m mot_viz.train.rival --method c2c-pr; default: pretrained/<pair>-c2c-pr beside "
                               "--checkpoint)")

C2C_PR = ProjectionWay(NAME, "C2C projection path (one MLP maps the source's top layers' K/V onto the target's, in "
                       "place of its own; no replay; with every target layer projected, as for SmolLM2 → Gemma 3, the "
                       "target never reads the context)", (C2C_PR_OPTION,),
                       "its trained projection path: pass --c2c_pr CHECKPOINT", patchable=True, one_reader=True,
                       short="C2C projection path (top layers, no replay)", side="alignment + projection")


class FuserWay(TrainedWay):
    def build(self, inputs: Inputs) -> Built:
        """The target's own prefill (the MoT's translation's native cache, timed there), then the fusion."""
        start = time.perf_counter()
        t = inputs.translation
        with torch.no_grad():
            kv = fused_cache(inputs.artifact.net, t.source, inputs.source, inputs.target, t.native_kv)
        net = inputs.artifact.net
        held = Handed(len(net.source_layers), int(t.source.source_ids.shape[1]), int(t.target_ids.shape[1]))
        return self.built(inputs, kv, start - t.timings.get("native_prefill", 0.0), held,
                          t.timings.get("native_prefill", 0.0))


C2C_OPTION = trained_option(FUSER, "c2c", "the fuser the 'c2c' way of sharing answers from (python -m "
                            "mot_viz.train.rival --method c2c; default: pretrained/<pair>-c2c beside --checkpoint)")

C2C = FuserWay(FUSER, "C2C fuser (the target reads the context itself; each layer's K/V gains a gated residual from "
               "its own and the source's: native enriched, not replaced)", (C2C_OPTION,),
               "its trained fuser: pass --c2c CHECKPOINT", patchable=True, one_reader=True,
               short="C2C fuser (target prefill + fusion)", side="target prefill + fusion")
