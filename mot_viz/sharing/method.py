"""What every way of sharing a context is (`Method`): what it needs, what it builds ahead of the question and once the
question arrives, what it hands the target, what the target computes over the context, and the seconds of each step.

A method's seconds, as every evaluation records them (the source's reading of the context excluded from the target's
side: in the use case the source holds its cache already):

* ``Built.seconds``: the whole build from the text; ``Built.ahead``: its part that can be done before the question
  arrives (the source's prefill; relay's writing, whose message needs no question);
* ``Method.target_side``: the seconds before the target reads the question, the work done ahead excluded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..engine import hf
from ..errors import ConfigError
from ..engine.models import LoadedModel, ModelSpec
from ..engine.mot import MoT, Translation
from ..engine.prompts import QAExample
from ..train.mean_vector import MeanVectors

FP16_BYTES = 2  # bytes per value of a cache handed over (fp16 / bf16), as kv_cache_bytes counts
# the stages of a translation the target runs once the question arrives (the source's prefill is done ahead)
TARGET_STAGES = ("alignment", "translator", "replay", "assemble")
# a translation's timing keys -> the names of its stages that every method's stages share (Method.stages)
STAGE_NAMES = {"source_prefill": "source prefill", "alignment": "alignment", "translator": "translation",
               "replay": "replay", "assemble": "cache assembly"}


def layers_bytes(tokens, layers: int, kv_hidden: int):
    """Bytes of K and V at `layers` layers over `tokens` positions (a number or an array), fp16: a translated window,
    a full-depth map's cache, the layers kvcomm shares."""
    return tokens * layers * 2 * kv_hidden * FP16_BYTES


def translated_seconds(translation: Translation) -> float:
    """Seconds to build a translated cache: every stage of the translation except the target's native prefill."""
    return sum(v for stage, v in translation.timings.items() if stage != "native_prefill")


def target_stages_seconds(timings: dict[str, float]) -> float:
    """The target's side of a translation: alignment + translator + replay (or, without replay, assembling)."""
    return sum(timings.get(stage, 0.0) for stage in TARGET_STAGES)


def translation_stages(timings: dict[str, float]) -> list[tuple[str, float]]:
    """A translation's stages (its target's native prefill apart) under the names every method shares (STAGE_NAMES)."""
    return [(name, timings[key]) for key, name in STAGE_NAMES.items() if key in timings]


@dataclass(frozen=True)
class Needs:
    """What a method needs beside the MoT's translation of the context (each loaded once per run)."""

    example: bool = False  # the example itself (its passage and question), not only the translated context
    means: bool = False  # the mean native window of the target and window layers (train.mean_vector.reference_means)
    direct: bool = False  # a full-depth map without replay (--direct)
    kvcomm: bool = False  # a layer choice calibrated on the run's first example (--kvcomm_fraction)
    linear: bool = False  # the pair's closed-form map of the same window (--linear)


# what a build is given for each of Needs' fields, and how its caller passes it
NEED_HINTS = {"example": "the example (the source writes about its passage): pass example",
              "means": "the mean native window: pass means=mean_vectors(...)",
              "direct": "a full-depth map without replay: pass direct=load_checkpoint(...)",
              "kvcomm": "its layer choice: pass kvcomm=kvcomm_selection(...)",
              "linear": "the pair's closed-form map: pass linear=load_checkpoint(...)"}


@dataclass(frozen=True)
class Inputs:
    """What a method's build may read: the models, the context's translation, the example, and what it needs."""

    mot: MoT
    source: LoadedModel
    target: LoadedModel
    translation: Translation  # the MoT's translation of the example's context (its native cache included)
    example: QAExample | None = None
    seed: int = 0  # the random control's draw
    means: MeanVectors | None = None
    relay_tokens: int | None = None  # the longest relay message, in source tokens (None: the relay's default)
    kvcomm: object | None = None  # kvcomm.KVCommSelection
    direct: MoT | None = None
    linear: MoT | None = None


@dataclass(frozen=True)
class Built:
    """One method's cache (or message) of one context."""

    kv: list[hf.KV] | None  # the target's cache of the context (None: no context); a relay's: of its message
    seconds: float  # the whole build from the text
    ahead: float = 0.0  # the part of `seconds` that can be done before the question arrives
    plan: hf.AttentionPlan | None = None  # the plan the cache is read under (kvcomm's hidden positions)
    relay: object | None = None  # relay.Relay: the message and its costs (the relays only)
    translation: Translation | None = None  # its own translation, when not the MoT's (direct)
    timings: dict[str, float] | None = None  # its own stages under a translation's keys (the linear map's)


@dataclass(frozen=True)
class Request:
    """A run's settings that the methods check before any model loads (each evaluation fills it from its own)."""

    conditions: tuple[str, ...]
    config: dict  # --checkpoint's config.json
    checkpoint: str
    context_tokens: int  # the longest context of the run, in target tokens
    relay_tokens: int  # --relay_tokens
    kvcomm_fraction: float  # --kvcomm_fraction
    direct: str | None = None  # --direct
    linear: str | None = None  # --linear


@dataclass(frozen=True)
class Method:
    """One way of sharing a context with the target. Subclasses implement build and the costs; the flags tell the
    evaluations and pages what they may ask of it without naming it."""

    name: str
    label: str  # as the pages and reports name it
    needs: Needs = field(default_factory=Needs)
    tie: str | None = None  # a control holding no context-specific content: as a sentence names it (else None)
    # its cache is the target's own kind of cache of the context, comparable with the native one
    # position by position (kv_cosine); False: no context, a message, the source's K/V
    comparable: bool = True
    message: bool = False  # it hands over a message the target reads, not a cache
    # a way of sharing whose cache a layer-patching scan patches into native's, layer by layer (python -m
    # mot_viz.eval.patching --methods, the Layer patching page): a cache of the context at native's positions
    patchable: bool = False
    for_question: bool = False  # its build reads the question (a conversation, asking one per turn, cannot keep it)
    reads_source: bool = True  # the source model reads the context (a run keeps it loaded beside the target)
    bound: bool = False  # a bound of the ratios (native the ceiling, no context the floor): no retention of its own
    one_reader: bool = False  # no count of source agents changes it (the shards evaluation reads it once)
    # a control of the MoT: the same replay over a window that is not the MoT's translation (the pair's closed-form
    # map of it; a window with no context in it), so that MoT − control is what the MoT's translation adds
    control: bool = False
    evaluations: tuple[str, ...] = ("evaluate", "long_context", "conversation", "shards")  # where it runs
    short: str = ""  # as the Methods page names it, which shows it beside the others when set

    def check(self, request: Request) -> None:
        """Raise ConfigError/CheckpointError for settings this method cannot use, before any model loads (called for
        every registered method; `self.name in request.conditions` says whether it is asked for)."""

    def ready(self, given: dict) -> None:
        """Raise ConfigError unless `given` (Needs' field -> what the caller has, None when it has not) holds all this
        method needs: checked before anything is built."""
        for need, hint in NEED_HINTS.items():
            if getattr(self.needs, need) and given.get(need) is None:
                raise ConfigError(f"the '{self.name}' condition needs {hint}")

    def has(self, given: dict) -> bool:
        """Whether `given` (as for ready) holds all this method needs."""
        return all(given.get(need) is not None for need in NEED_HINTS if getattr(self.needs, need))

    def build(self, inputs: Inputs) -> Built:
        """The cache (or message) of the context of `inputs`."""
        raise NotImplementedError

    def stages(self, built: Built, timings: dict[str, float]) -> list[tuple[str, float]]:
        """Its build's stages up to the target's reading of the question, with their seconds, under the names every
        method shares (STAGE_NAMES; "target prefill", "message writing", ...): by default those of the translation
        its cache came from (`timings`: its own, else the MoT's), or its own (Built.timings)."""
        return translation_stages(built.timings if built.timings is not None else timings)

    def handed_what(self, target: ModelSpec, window_layers: int, relay=None, kvcomm=None) -> str:
        """What it hands the target, in words (handed_bytes counts it): by default the translated window."""
        return f"the translated window's K/V ({window_layers} layers)"

    def carries(self, mot: MoT, given: dict) -> tuple[int, ...] | None:
        """The target layers whose K/V hold what the source sent (`given` as for ready: the maps it was built with);
        None where its cache holds no context to compare with native's (native itself, no context, a message)."""
        return mot.channels.target_layers

    def by_agents(self, agents, k: int | None):
        """Its setting of a document read by several source agents (python -m mot_viz.eval.shards; `agents`: that
        evaluation's Agents, which reads the document once, cuts it into shards and composes what the agents hand
        over): one reader (k None) or k agents, one shard each."""
        raise ConfigError(f"the shards evaluation does not offer '{self.name}'")

    def handed_bytes(self, tokens: int, target: ModelSpec, window_layers: int, relay=None, kvcomm=None,
                     source: ModelSpec | None = None) -> float:
        """Bytes handed to the target for a context of `tokens` target tokens: by default the translated window (its
        target layers' K and V at every context position, fp16)."""
        return float(layers_bytes(tokens, window_layers, target.kv_hidden))

    def target_work(self, tokens: int, relay=None, prefix: int = 0) -> tuple[str, int]:
        """What the target computes over the context and over how many positions: ("replay", N), ("prefill", M) or
        ("none", 0); by default a replay over the context."""
        return "replay", tokens

    def target_side(self, timings: dict[str, float], relay=None, writing: float | None = None) -> float:
        """Seconds before the target reads the question, the work done ahead excluded, from the stages of the
        translation the cache came from (`timings`) or its relay; NaN where it is not measured (by default)."""
        return np.nan
