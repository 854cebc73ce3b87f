"""What every way of sharing a context is (`Method`): what it needs, what it builds ahead of the question and once the
question arrives, what it hands the target, what the target computes over the context, and the seconds of each step.

A method's seconds, as every evaluation records them (the source's reading of the context excluded from the target's
side: in the use case the source holds its cache already):

* ``Built.seconds``: the whole build from the text; ``Built.ahead``: its part that can be done before the question
  arrives (the source's prefill; relay's writing, whose message needs no question);
* ``Method.target_side``: the seconds before the target reads the question, the work done ahead excluded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..engine import hf
from ..errors import ConfigError
from ..engine.models import LoadedModel, ModelSpec
from ..engine.mot import MoT, Translation
from ..engine.prompts import QAExample

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
class Option:
    """A run setting that belongs to a way of sharing: every evaluation's parser declares it (registry.add_options),
    the run's settings store it under its name, and the method reads it from the run's options (Option.of)."""

    name: str  # the flag without its dashes (--relay_tokens) and the key a run's settings store it under
    type: Callable = str
    default: object = None
    help: str = ""
    # a default found beside the run's --checkpoint when the flag is not given (linear: "<checkpoint>-linear")
    beside: Callable[[str], object] | None = None
    # the value an app offers it with, found among the checkpoints on offer for the pair (Offering); None: none found
    find: Callable[["Offering"], str | None] | None = None
    what: str = ""  # what `find` finds, as a message names it ("linear map")
    missing: str = ""  # one line saying that none was found and how to make one

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    def of(self, options: Mapping) -> object:
        """Its value in a run's options (its default where they do not hold it)."""
        value = options.get(self.name)
        return self.default if value is None else value


@dataclass(frozen=True)
class Offering:
    """What a way of sharing is offered with beside a MoT checkpoint in the app: the checkpoint, its MoT, and the
    checkpoint folders on offer, where each method finds its own artifact (Option.find, Method.not_offered)."""

    checkpoint: str  # the MoT checkpoint's folder
    mot: MoT
    folders: tuple[str, ...]  # the MoT checkpoint folders on offer (shipped, fitted here)
    pretrained: Path  # where trained networks of the other ways ship

    def pair(self) -> dict:
        """The MoT's pair as a checkpoint's config holds it (source and target specs)."""
        return {"source": self.mot.source.to_json(), "target": self.mot.target.to_json()}


@dataclass(frozen=True)
class Loading:
    """What a method may read when it loads its artifact, once per run (Method.load)."""

    source: LoadedModel
    target: LoadedModel
    mot: MoT | None  # the run's MoT (its window layers), when the run has one
    options: Mapping  # the run's options, by Option.name
    # the run's first example(s), for a method calibrated on them: made on first use (a run whose methods calibrate
    # nothing never prepares them)
    examples: Callable[[], tuple[QAExample, ...]] = tuple

    @property
    def calibration(self) -> tuple[QAExample, ...]:
        return tuple(self.examples())


@dataclass(frozen=True)
class Inputs:
    """What a method's build may read: the models, the context's translation, the example, the run's options and
    the method's own artifact (Method.load)."""

    mot: MoT
    source: LoadedModel
    target: LoadedModel
    translation: Translation  # the MoT's translation of the example's context (its native cache included)
    example: QAExample | None = None
    seed: int = 0  # the random control's draw
    options: Mapping = field(default_factory=dict)  # the run's options, by Option.name
    artifact: object | None = None  # what this method loaded once for the run (Method.load), None when nothing


@dataclass(frozen=True)
class Built:
    """One method's cache (or message) of one context."""

    kv: list[hf.KV] | None  # the target's cache of the context (None: no context); a relay's: of its message
    seconds: float  # the whole build from the text
    ahead: float = 0.0  # the part of `seconds` that can be done before the question arrives
    plan: hf.AttentionPlan | None = None  # the plan the cache is read under (kvcomm's hidden positions)
    translation: Translation | None = None  # its own translation, when not the MoT's (direct)
    timings: dict[str, float] | None = None  # its own stages under a translation's keys (the linear map's)
    # what the method's costs and rows read beside the cache: a relay's message (relay.Relay), kvcomm's layer choice
    held: object | None = None


@dataclass(frozen=True)
class Request:
    """A run's settings that the methods check before any model loads (each evaluation fills it from its own)."""

    conditions: tuple[str, ...]
    config: dict  # --checkpoint's config.json
    checkpoint: str
    context_tokens: int  # the longest context of the run, in target tokens
    options: Mapping = field(default_factory=dict)  # the run's options, by Option.name


@dataclass(frozen=True)
class Method:
    """One way of sharing a context with the target. Subclasses implement build and the costs; the flags tell the
    evaluations and pages what they may ask of it without naming it. What is its own it declares: its options (the
    flags every evaluation's parser takes from the registry), the artifact it loads once per run (load) and what a
    run's settings record of it (record)."""

    name: str
    label: str  # as the pages and reports name it
    options: tuple[Option, ...] = ()  # the run settings it reads (Option; two methods may share one)
    loads: str = ""  # what load() brings, as an error names it ("" when it loads nothing)
    reads_example: bool = False  # its build reads the example itself (its passage and question), not only the cache
    records: tuple[str, ...] = ()  # the keys record() writes into a run's settings
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
    # its target side in words, where it is its own translation's (a long-context run's stages list it apart)
    side: str = ""

    def check(self, request: Request) -> None:
        """Raise ConfigError/CheckpointError for settings this method cannot use, before any model loads (called for
        every registered method; `self.name in request.conditions` says whether it is asked for)."""

    def load(self, loading: Loading) -> object | None:
        """What it needs beside the MoT's translation, loaded once per run (a checkpoint, a calibration, the mean
        native window); None by default (nothing)."""
        return None

    def not_offered(self, offering: Offering) -> str | None:
        """Why this method cannot be offered beside the checkpoint at all (a pair it does not fit; the checkpoint is
        itself the artifact), in one line; None where it can (its options' `find` then look for what it reads)."""
        return None

    def record(self, artifact) -> dict:
        """What a run's settings record of its artifact (its keys: `records`); nothing by default."""
        return {}

    def ready(self, artifact, example=None) -> None:
        """Raise ConfigError unless its artifact (load) and, when it reads it, the example are given: checked before
        anything is built."""
        if self.loads and artifact is None:
            raise ConfigError(f"the '{self.name}' way of sharing needs {self.loads}")
        if self.reads_example and example is None:
            raise ConfigError(f"the '{self.name}' way of sharing reads the example (its passage and question): pass "
                              "the example")

    def has(self, artifact) -> bool:
        """Whether it can be built with this artifact (it loads nothing, or it was loaded)."""
        return not self.loads or artifact is not None

    def build(self, inputs: Inputs) -> Built:
        """The cache (or message) of the context of `inputs`."""
        raise NotImplementedError

    def stages(self, built: Built, timings: dict[str, float]) -> list[tuple[str, float]]:
        """Its build's stages up to the target's reading of the question, with their seconds, under the names every
        method shares (STAGE_NAMES; "target prefill", "message writing", ...): by default those of the translation
        its cache came from (`timings`: its own, else the MoT's), or its own (Built.timings)."""
        return translation_stages(built.timings if built.timings is not None else timings)

    def carries(self, mot: MoT, artifact=None) -> tuple[int, ...] | None:
        """The target layers whose K/V hold what the source sent (`artifact`: what it loaded, e.g. the map it was
        built with); None where its cache holds no context to compare with native's (native, no context, a
        message)."""
        return mot.channels.target_layers

    def by_agents(self, agents, k: int | None):
        """Its setting of a document read by several source agents (python -m mot_viz.eval.shards; `agents`: that
        evaluation's Agents, which reads the document once, cuts it into shards and composes what the agents hand
        over, and holds this run's options and artifacts): one reader (k None) or k agents, one shard each."""
        raise ConfigError(f"the shards evaluation does not offer '{self.name}'")

    # its costs, read from what it built (Built: its cache, and what it holds beside it)

    def handed_what(self, built: Built | None, target: ModelSpec, window_layers: int) -> str:
        """What it hands the target, in words (handed_bytes counts it): by default the translated window."""
        return f"the translated window's K/V ({window_layers} layers)"

    def handed_bytes(self, built: Built | None, tokens: int, target: ModelSpec, window_layers: int,
                     source: ModelSpec | None = None) -> float:
        """Bytes handed to the target for a context of `tokens` target tokens: by default the translated window (its
        target layers' K and V at every context position, fp16)."""
        return float(layers_bytes(tokens, window_layers, target.kv_hidden))

    def target_work(self, built: Built | None, tokens: int, prefix: int = 0) -> tuple[str, int]:
        """What the target computes over the context and over how many positions: ("replay", N), ("prefill", M) or
        ("none", 0); by default a replay over the context."""
        return "replay", tokens

    def target_side(self, built: Built | None, timings) -> float:
        """Seconds before the target reads the question, the work done ahead excluded, from the stages of the
        translation the cache came from (`timings`: a mapping, or a table's stage columns) or what it built; NaN
        where it is not measured (by default)."""
        return np.nan

    def row_fields(self, built: Built) -> dict:
        """Columns of its own in an evaluation's rows (a relay's message); none by default."""
        return {}
