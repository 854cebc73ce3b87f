"""``lsc``: a global shared latent space (LSC as the MoT authors compare with it, method.md §15), its translators
trained by python -m mot_viz.train.rival (mot_viz.train.lsc): the source's every layer's K/V of each token into a
latent of fixed slots by the source's translator, out of it to the target's every layer by the target's; the target
answers from that cache with no prefill and no replay.
"""

from __future__ import annotations

import time

import torch

from ..train.lsc import NAME, latent_cache
from .method import Built, Inputs
from .trained import Handed, TrainedWay, trained_option


class LatentWay(TrainedWay):
    def build(self, inputs: Inputs) -> Built:
        start = time.perf_counter()
        net = inputs.artifact.net
        with torch.no_grad():
            kv = latent_cache(net, inputs.translation.source, inputs.source, inputs.target)
        held = Handed(len(net.source_layers), int(inputs.translation.source.source_ids.shape[1]))
        return self.built(inputs, kv, start, held)


LSC_OPTION = trained_option(NAME, "lsc", "the shared-latent translators the 'lsc' way of sharing answers from "
                            "(python -m mot_viz.train.rival --method lsc; default: pretrained/<pair>-lsc beside "
                            "--checkpoint)")

LSC = LatentWay(NAME, "LSC shared latent space (the source's every layer into a latent, out to the target's every "
                "layer; no replay: the target never reads the context)", (LSC_OPTION,),
                "its trained translators: pass --lsc CHECKPOINT", patchable=True, one_reader=True,
                short="LSC shared latent (every layer, no replay)", side="alignment + latent translators")
