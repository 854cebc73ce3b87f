"""``direct``: a full-depth map without replay (method.md §15, the closed-form direct map): every target layer's K/V
translated from the source's, assembled into the whole cache; the target never reads the context."""

from __future__ import annotations

from ..engine.checkpoint import load_checkpoint
from ..engine.models import ModelSpec
from ..engine.mot import MoT, translate
from ..errors import CheckpointError, ConfigError
from .checkpoints import checked_config, first_offered, full_depth, same_pair
from .method import (Built, Inputs, Loading, Method, Offering, Option, Request, layers_bytes,
                     target_stages_seconds, translated_seconds)


def find_direct(offering: Offering) -> str | None:
    """A full-depth map without replay on offer for the MoT's pair."""
    pair = offering.pair()
    return first_offered(offering.folders, lambda c: bool((c.get("replay") or {}).get("direct")) and same_pair(pair, c))


DIRECT_OPTION = Option("direct", str, None, "the full-depth map without replay the 'direct' way of sharing answers "
                       "from (a checkpoint of python -m mot_viz.train.quickfit --direct, e.g. "
                       "pretrained/smollm2-to-gemma3-direct)", find=find_direct, what="full-depth map",
                       missing="no full-depth map without replay for this pair (e.g. pretrained/smollm2-to-gemma3-"
                               "direct; python -m mot_viz.train.quickfit --direct fits one).")


def check_direct_map(direct: MoT | None) -> None:
    """Raise ConfigError unless `direct` is a full-depth map without replay (the "direct" condition's cache)."""
    if direct is None or not direct.replay.direct:
        raise ConfigError("the 'direct' condition needs a full-depth map without replay: pass --direct "
                          "pretrained/smollm2-to-gemma3-direct (or a fit of python -m mot_viz.train.quickfit --direct)")


def check_direct_flag(conditions: tuple[str, ...], direct_path: str | None, checkpoint: str, config: dict) -> None:
    """Raise ConfigError/CheckpointError unless the "direct" condition and --direct come together, with a full-depth
    map without replay of the pair of --checkpoint (whose config.json is `config`)."""
    wanted = "direct" in conditions
    if wanted != bool(direct_path):
        raise ConfigError("the 'direct' condition needs --direct CHECKPOINT (a full-depth map without replay, e.g. "
                          "pretrained/smollm2-to-gemma3-direct)" if wanted else
                          f"--direct {direct_path} is read by the 'direct' condition: add direct to --conditions")
    if not wanted:
        return
    direct = checked_config("--direct", direct_path)
    if not same_pair(config, direct):
        raise CheckpointError(f"--direct {direct_path} was made for another model pair than --checkpoint "
                              f"{checkpoint}. Pass a direct map of the same pair.")
    if not (direct.get("replay") or {}).get("direct") or not full_depth(direct):
        raise CheckpointError(f"--direct {direct_path} replays its window; the 'direct' condition needs a full-depth "
                              "map without replay: fit one with python -m mot_viz.train.quickfit --direct.")


class DirectMap(Method):
    def check(self, request: Request) -> None:
        check_direct_flag(request.conditions, DIRECT_OPTION.of(request.options), request.checkpoint, request.config)

    def load(self, loading: Loading) -> MoT:
        return load_checkpoint(DIRECT_OPTION.of(loading.options), loading.source, loading.target)[0]

    def ready(self, artifact, example=None) -> None:
        check_direct_map(artifact)

    def build(self, inputs: Inputs) -> Built:
        """Its own translation of the text by the full-depth map: no replay; its source prefill is done ahead."""
        directed = translate(inputs.artifact, inputs.source, inputs.target, inputs.translation.text, with_native=False)
        return Built(directed.mixed_kv, translated_seconds(directed), directed.timings.get("source_prefill", 0.0),
                     translation=directed)

    def by_agents(self, agents, k: int | None):
        """Each agent's shard in the prompt's frame translated by the direct map, the caches joined at their offsets."""
        return agents.joined([agents.context_text] if k is None else agents.texts(k), agents.artifact(self))

    def handed_bytes(self, built: Built | None, tokens: int, target: ModelSpec, window_layers: int,
                     source: ModelSpec | None = None) -> float:
        """Every layer's translated K and V."""
        return float(layers_bytes(tokens, target.num_layers, target.kv_hidden))

    def handed_what(self, built: Built | None, target: ModelSpec, window_layers: int) -> str:
        return f"every layer's translated K/V ({target.num_layers} layers)"

    def carries(self, mot: MoT, artifact=None) -> tuple[int, ...] | None:
        return artifact.channels.target_layers

    def target_work(self, built: Built | None, tokens: int, prefix: int = 0) -> tuple[str, int]:
        return "none", 0

    def target_side(self, built: Built | None, timings) -> float:
        return target_stages_seconds(timings)


DIRECT = DirectMap("direct", "Full-depth direct map (every layer's K/V translated, no replay: the target never reads "
                   "the context)", (DIRECT_OPTION,), "a full-depth map without replay: pass --direct "
                   "pretrained/smollm2-to-gemma3-direct", patchable=True,
                   short="direct map (every layer, no replay)", side="alignment + translator + assemble")
