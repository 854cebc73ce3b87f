"""What the ways of sharing trained here by python -m mot_viz.train.rival have in common (method.md §15): a
`TrainedWay` is a Method that loads its network once per run (mot_viz.train.rival_checkpoint) from the checkpoint its
option names, by default the one shipped for the pair beside --checkpoint; what its build read and made the target
compute (`Handed`) gives its costs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..engine import hf
from ..engine.models import ModelSpec
from ..engine.mot import MoT
from ..errors import CheckpointError, ConfigError
from ..train.rival_checkpoint import TrainedCheckpoint, load_trained, read_trained_config
from .checkpoints import first_offered, same_pair
from .method import (FP16_BYTES, Built, Inputs, Loading, Method, Offering, Option, Request, layers_bytes,
                     translation_stages)


def trained_in(folder: Path, method: str, pair: dict) -> Path | None:
    """The first folder in `folder` that holds `method`'s network for the pair of `pair` (a checkpoint's config.json:
    its source's and target's fingerprints), if any."""
    return first_offered(sorted(folder.iterdir()) if folder.is_dir() else (),
                         lambda config: config["method"] == method and same_pair(pair, config),
                         read=read_trained_config)


def shipped_beside(method: str) -> Callable[[str], str | None]:
    """An Option.beside: the folder beside --checkpoint that holds this way's network for the same pair (the shipped
    pretrained/<pair>-<method>), when there is one."""

    def find(checkpoint: str) -> str | None:
        try:
            pair = json.loads((Path(checkpoint) / "config.json").read_text())
        except (OSError, json.JSONDecodeError):
            return None
        found = trained_in(Path(checkpoint).resolve().parent, method, pair)
        return None if found is None else str(Path(checkpoint).parent / found.name)

    return find


def trained_option(method: str, name: str, help: str) -> Option:
    """The option naming a trained way's network: by default the one shipped for the pair beside --checkpoint
    (Option.beside); in the app the one in pretrained/ for the pair (Option.find)."""

    def find(offering: Offering) -> str | None:
        found = trained_in(offering.pretrained, method, offering.pair())
        return None if found is None else str(found)

    return Option(name, str, None, help, beside=shipped_beside(method), find=find, what=f"{method} network",
                  missing=f"no {method} network for this pair in pretrained/ (python -m mot_viz.train.rival --method "
                          f"{method} trains one).")


@dataclass(frozen=True)
class Handed:
    """What a trained way's build read of the source and made the target compute (Built.held): its costs read it."""

    source_layers: int  # source layers whose K/V the network reads (0: it reads their hidden states instead)
    positions: int  # source positions it reads: the context's source tokens
    prefill: int = 0  # positions the target runs a forward over (0: none)


def handed(built: Built | None) -> Handed | None:
    """What a trained way's build read and made the target compute (its Built.held), when built."""
    return built.held if built is not None and isinstance(built.held, Handed) else None


class TrainedWay(Method):
    """A way of sharing with a network trained here: its option names the checkpoint (by default the one shipped for
    the pair beside --checkpoint), loaded once per run; subclasses build the cache from it."""

    @property
    def option(self) -> Option:
        return self.options[0]

    def check(self, request: Request) -> None:
        path = self.option.of(request.options)
        if self.name not in request.conditions:
            return
        if not path:
            raise ConfigError(f"the '{self.name}' way of sharing needs its trained network: pass {self.option.flag} "
                              f"CHECKPOINT (python -m mot_viz.train.rival --method {self.name}), or --conditions "
                              f"without {self.name}.")
        config = read_trained_config(path, self.option.flag)
        if config["method"] != self.name:
            raise CheckpointError(f"{self.option.flag} {path} holds a {config['method']} network, not {self.name}.")
        if not same_pair(request.config, config):
            raise CheckpointError(f"{self.option.flag} {path} was trained for another model pair than --checkpoint "
                                  f"{request.checkpoint}. Pass one of the same pair.")

    def load(self, loading: Loading) -> TrainedCheckpoint | None:
        path = self.option.of(loading.options)
        return load_trained(path, loading.source.spec, loading.target.spec, self.name) if path else None

    def built(self, inputs: Inputs, kv: list[hf.KV], start: float, held: Handed, prefill: float = 0.0) -> Built:
        """A Built of a cache made from the MoT's source context (its prefill, done ahead of the question, and its
        alignment): the seconds since `start` plus those; `prefill`: the target's own prefill's seconds among them."""
        t = inputs.translation.timings
        ahead = t.get("source_prefill", 0.0)
        own = time.perf_counter() - start
        stages = {"source_prefill": ahead, "alignment": t.get("alignment", 0.0), "translator": own - prefill}
        if held.prefill:
            stages["native_prefill"] = prefill
        return Built(kv, sum(stages.values()), ahead, timings=stages, held=held)

    def stages(self, built: Built, timings: dict[str, float]) -> list[tuple[str, float]]:
        """Its own stages (Built.timings), the target's prefill where it runs one."""
        own = built.timings or {}
        extra = [("target prefill", own["native_prefill"])] if "native_prefill" in own else []
        return translation_stages(own) + extra

    def by_agents(self, agents, k: int | None):
        """One reader: the network's cache of the one reader's whole document (no shard count changes it)."""
        one = agents.one
        built = self.build(Inputs(agents.mot, agents.source, agents.target, one, agents.example,
                                  options=agents.options, artifact=agents.artifact(self)))
        read = agents.read(built.kv, (one.source.source_prefix_len + int(one.source.source_ids.shape[1]),),
                           built.held)
        return replace(read, timings=dict(built.timings or {}))

    def carries(self, mot: MoT, artifact=None) -> tuple[int, ...] | None:
        """The target layers its network writes (every layer before the network is loaded)."""
        return tuple(range(mot.target.num_layers)) if artifact is None else tuple(artifact.net.target_layers)

    def handed_bytes(self, built: Built | None, tokens: int, target: ModelSpec, window_layers: int,
                     source: ModelSpec | None = None) -> float:
        """What the network reads of the source, fp16 (it runs on the target's side): the K and V of the layers it
        reads at the source's every context position, or their last-layer hidden states (Built.held: a Handed; not
        built: every source layer's K and V over `tokens` positions)."""
        spec = source or target
        read = handed(built) or Handed(spec.num_layers, tokens)
        if not read.source_layers:
            return float(read.positions * spec.hidden_size * FP16_BYTES)
        return float(layers_bytes(read.positions, read.source_layers, spec.kv_hidden))

    def handed_what(self, built: Built | None, target: ModelSpec, window_layers: int) -> str:
        read = handed(built)
        if read is not None and not read.source_layers:
            return "the source's last-layer hidden states, one per source token"
        layers = f"{read.source_layers} layers" if read is not None else "the layers it reads"
        return f"the source's own K/V at {layers} (the network runs on the target's side)"

    def target_work(self, built: Built | None, tokens: int, prefix: int = 0) -> tuple[str, int]:
        """A prefill where the network's cache needs one (Handed.prefill), else nothing over the context."""
        prefill = (handed(built) or Handed(0, 0)).prefill
        return ("prefill", prefill) if prefill else ("none", 0)

    def target_side(self, built: Built | None, timings) -> float:
        """Alignment + the network (+ the target's prefill where it runs one), as measured; the source's prefill is
        done ahead."""
        own = built.timings if built is not None and built.timings else timings
        return float(own.get("alignment", 0.0) + own.get("translator", 0.0) + own.get("native_prefill", 0.0))
