"""``linear``: the pair's closed-form map of the same window (train.ridge), on the MoT's own source context and
replayed as the MoT's was: what the experts and the router add over one linear map."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..engine import hf
from ..engine.checkpoint import load_checkpoint, read_config
from ..engine.models import LoadedModel, ModelSpec
from ..engine.mot import MoT, Translation, replay_window, translate_window
from ..errors import ConfigError
from .checkpoints import first_offered, same_pair
from .method import Built, Inputs, Loading, Method, Offering, Option, Request


def timed_linear_cache(mot: MoT, linear: MoT, source: LoadedModel, target: LoadedModel,
                       translation: Translation) -> tuple[list[hf.KV], dict[str, float]]:
    """The closed-form map's window on the translation's own source context, replayed as the MoT's was, and the
    seconds of its two steps under a translation's keys ("translator": the map, "replay")."""
    with torch.no_grad():
        start = time.perf_counter()
        out = translate_window(linear, translation.source, source, target)
        mapped = time.perf_counter()
        kv = replay_window(mot, target, translation, out.keys, out.values)
    return kv, {"translator": mapped - start, "replay": time.perf_counter() - mapped}


def linear_cache(mot: MoT, linear: MoT, source: LoadedModel, target: LoadedModel, translation: Translation) -> list[hf.KV]:
    """The closed-form map's window on the translation's own source context, replayed as the MoT's was."""
    return timed_linear_cache(mot, linear, source, target, translation)[0]


def default_linear(checkpoint: str) -> str | None:
    """The `-linear` checkpoint beside a MoT (pretrained/x-mid → pretrained/x-mid-linear), when there is one."""
    path = Path(str(checkpoint).rstrip("/").removesuffix("-single") + "-linear")
    return str(path) if path != Path(checkpoint) and (path / "config.json").is_file() else None


def find_linear(offering: Offering) -> str | None:
    """A linear checkpoint on offer for the MoT's pair and window, other than the MoT's own checkpoint."""
    pair, window = offering.pair(), offering.mot.channels.to_json()
    return first_offered(offering.folders, lambda c: c["translator"].get("variant") == "linear"
                         and same_pair(pair, c) and c["channels"] == window, skip=offering.checkpoint)


LINEAR_OPTION = Option("linear", str, None, "the pair's closed-form map of the same window the 'linear' control "
                       "replays (default: <checkpoint>-linear, when there is one)", beside=default_linear,
                       find=find_linear, what="linear map",
                       missing="no linear checkpoint (a `-linear` folder) for this pair and window: the app's “Fit a "
                               "linear translator” (or python -m mot_viz.train.quickfit) makes one.")


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
    def not_offered(self, offering: Offering) -> str | None:
        if offering.mot.translator.config.variant == "linear":
            return "the checkpoint itself is a linear map: its row is MoT's."
        return None

    def check(self, request: Request) -> None:
        check_linear(request.conditions, LINEAR_OPTION.of(request.options), request.checkpoint, request.config)

    def load(self, loading: Loading) -> MoT | None:
        path = LINEAR_OPTION.of(loading.options)
        return load_checkpoint(path, loading.source, loading.target)[0] if path else None

    def build(self, inputs: Inputs) -> Built:
        """The source's prefill and the alignment are the MoT's (the map reads the same source context), then its own
        window and replay, each step timed (timed_linear_cache)."""
        t = inputs.translation
        kv, own = timed_linear_cache(inputs.mot, inputs.artifact, inputs.source, inputs.target, t)
        stages = {"source_prefill": t.timings["source_prefill"], "alignment": t.timings["alignment"], **own}
        return Built(kv, sum(stages.values()), timings=stages)

    def handed_what(self, built: Built | None, target: ModelSpec, window_layers: int) -> str:
        return f"the mapped window's K/V ({window_layers} layers)"

    def carries(self, mot: MoT, artifact=None) -> tuple[int, ...] | None:
        return artifact.channels.target_layers

    def by_agents(self, agents, k: int | None):
        """One reader: the map's window on the MoT's own source context, replayed; k agents: their windows composed
        as the MoT's are."""
        linear = agents.artifact(self)
        if k is None:
            return agents.replayed(linear_cache(agents.mot, linear, agents.source, agents.target, agents.one),
                                   self.reads_source)
        return agents.composed(agents.texts(k), linear)


LINEAR = LinearMap("linear", "Linear map (the pair's closed-form map of the same window, replayed as the MoT's)",
                   (LINEAR_OPTION,), "the pair's closed-form map: pass --linear CHECKPOINT", control=True,
                   patchable=True,
                   evaluations=("long_context", "conversation", "shards"), short="linear map (same window, replayed)")
