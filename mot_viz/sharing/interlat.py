"""``interlat``: a latent hand-off (Interlat as the MoT authors compare with it, method.md §15), its processor
trained by python -m mot_viz.train.rival (mot_viz.train.interlat): the source's last-layer hidden states over the
context, processed, are the target's input embeddings; the target runs a forward over them in the text's place,
behind its own BOS, and answers from that cache. Its positions are the source's tokens, not the target's, so no
layer of its cache compares with native's position by position.
"""

from __future__ import annotations

import time

import torch

from ..engine.mot import MoT
from ..train.interlat import NAME, latent_forward, source_hidden
from .method import Built, Inputs
from .trained import Handed, TrainedWay, trained_option


class LatentHandOff(TrainedWay):
    def build(self, inputs: Inputs) -> Built:
        """The source's forward over the context (done ahead of the question), the processor, then the target's
        forward over the latents (its prefill), each timed."""
        times = [time.perf_counter()]
        with torch.no_grad():
            hidden = source_hidden(inputs.source, inputs.translation.text)
            times.append(time.perf_counter())
            latents = inputs.artifact.net(hidden)
            times.append(time.perf_counter())
            kv = latent_forward(inputs.target, latents)
            times.append(time.perf_counter())
        steps = (b - a for a, b in zip(times, times[1:]))
        stages = dict(zip(("source_prefill", "translator", "native_prefill"), steps))
        positions = int(hidden.shape[1])  # the target's forward runs over one latent per source token
        return Built(kv, sum(stages.values()), stages["source_prefill"], timings=stages,
                     held=Handed(0, positions, prefill=positions))

    def carries(self, mot: MoT, artifact=None) -> tuple[int, ...] | None:
        return None


INTERLAT_OPTION = trained_option(NAME, "interlat", "the hidden-state processor the 'interlat' way of sharing "
                                 "answers from (python -m mot_viz.train.rival --method interlat; default: "
                                 "pretrained/<pair>-interlat beside --checkpoint)")

INTERLAT = LatentHandOff(NAME, "Interlat latent hand-off (the source's last hidden states, processed, are the target's "
                         "input embeddings: the target runs over them in the text's place)", (INTERLAT_OPTION,),
                         "its trained processor: pass --interlat CHECKPOINT", comparable=False, one_reader=True,
                         short="Interlat latent hand-off (target runs over latents)",
                         side="processor + target forward over the latents")
