"""``linear``: the pair's closed-form map of the same window (train.ridge), on the MoT's own source context and
replayed as the MoT's was: what the experts and the router add over one linear map."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..engine import hf
from ..engine.checkpoint import read_config
from ..engine.models import LoadedModel
from ..engine.mot import MoT, Translation, replay_window, translate_window
from ..errors import ConfigError
from .checkpoints import same_pair
from .method import Built, Inputs, Method, Needs, Request


def linear_cache(mot: MoT, linear: MoT, source: LoadedModel, target: LoadedModel, translation: Translation) -> list[hf.KV]:
    """The closed-form map's window on the translation's own source context, replayed as the MoT's was."""
    with torch.no_grad():
        out = translate_window(linear, translation.source, source, target)
        return replay_window(mot, target, translation, out.keys, out.values)


def default_linear(checkpoint: str) -> str | None:
    """The `-linear` checkpoint beside a MoT (pretrained/x-mid → pretrained/x-mid-linear), when there is one."""
    path = Path(str(checkpoint).rstrip("/").removesuffix("-single") + "-linear")
    return str(path) if path != Path(checkpoint) and (path / "config.json").is_file() else None


def check_linear(conditions: tuple[str, ...], linear: str | None, checkpoint: str, config: dict) -> None:
    """Raise ConfigError for a linear condition without the pair's closed-form map, or a --linear checkpoint made for
    another model pair than `checkpoint` (whose config is `config`)."""
    if "linear" in conditions and not linear:
        raise ConfigError(f"the linear condition needs the pair's closed-form map: pass --linear <checkpoint>, or "
                          f"--conditions without linear (no '-linear' checkpoint beside {checkpoint}).")
    if linear:
        if not same_pair(config, read_config(linear)):
            raise ConfigError(f"--linear {linear} was made for another model pair than {checkpoint}.")


class LinearMap(Method):
    def check(self, request: Request) -> None:
        check_linear(request.conditions, request.linear, request.checkpoint, request.config)

    def build(self, inputs: Inputs) -> Built:
        """The source's prefill and the alignment are the MoT's (the map reads the same source context), then its own
        window and replay."""
        timings = inputs.translation.timings
        start = time.perf_counter()
        kv = linear_cache(inputs.mot, inputs.linear, inputs.source, inputs.target, inputs.translation)
        return Built(kv, timings["source_prefill"] + timings["alignment"] + time.perf_counter() - start)

    def by_agents(self, agents, k: int | None):
        """One reader: the map's window on the MoT's own source context, replayed; k agents: their windows composed
        as the MoT's are."""
        if k is None:
            return agents.replayed(linear_cache(agents.mot, agents.linear, agents.source, agents.target, agents.one),
                                   self.reads_source)
        return agents.composed(agents.texts(k), agents.linear)


LINEAR = LinearMap("linear", "Linear map (the pair's closed-form map of the same window, replayed as the MoT's)",
                   Needs(linear=True), evaluations=("long_context", "conversation", "shards"))
