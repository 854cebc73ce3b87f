"""Each requested method's cache of one context (condition_caches), for the evaluations and the app alike, and the
models a run's methods need beside the MoT (load_sharing)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engine import hf
from ..engine.checkpoint import load_checkpoint
from ..engine.models import LoadedModel
from ..engine.mot import MoT, Translation, translate
from ..engine.prompts import Prompt, QAExample, build_prompt
from ..train.mean_vector import MeanVectors, reference_means
from .kvcomm import KVCommSelection, kvcomm_selection
from .method import Built, Inputs
from .registry import DEFAULTS, method, methods
from .relay import RELAY_TOKENS, Relay


@dataclass(frozen=True)
class ConditionCaches:
    """Each requested condition's cache of one context, and the seconds it took to build from the text.

    The one owner of these times, for the evaluator and the app alike: each method's build (Method.build) says its
    seconds and the part of them done ``ahead`` of the question, once the source has read the context (the source's
    prefill; relay's writing, whose message needs no question).
    """

    translation: Translation
    kv: dict[str, list[hf.KV] | None]
    seconds: dict[str, float]
    relays: dict[str, Relay] = field(default_factory=dict)  # the methods that hand over a message
    plans: dict[str, hf.AttentionPlan] = field(default_factory=dict)  # kvcomm: answer its cache under this plan
    direct: Translation | None = None  # the "direct" condition's own translation (its stages in .timings)
    prompt: Prompt | None = None  # the example's prompt, built once: its context was translated, its suffix is asked
    ahead: dict[str, float] = field(default_factory=dict)  # condition -> seconds of its build done before the question
    own: dict[str, Translation] = field(default_factory=dict)  # condition -> its own translation, when not the MoT's
    built: dict[str, Built] = field(default_factory=dict)  # condition -> its build, as Method.build returned it

    def after_question(self, condition: str) -> float:
        """The seconds of a condition's build left once the question arrives (seconds less ahead)."""
        return self.seconds[condition] - self.ahead.get(condition, 0.0)

    def timings(self, condition: str) -> dict[str, float]:
        """The stages of the translation a condition's cache came from (its own, else the MoT's)."""
        return (self.own.get(condition) or self.translation).timings

    def stages(self, condition: str) -> list[tuple[str, float]]:
        """Method.stages of a condition of these caches: its build's stages and their seconds."""
        return method(condition).stages(self.built[condition], self.timings(condition))

    def target_side(self, condition: str) -> float:
        """Method.target_side of a condition of these caches."""
        return method(condition).target_side(self.timings(condition), self.relays.get(condition))


@dataclass(frozen=True)
class SharingModels:
    """What a run's methods need beside the MoT, loaded once: the direct map, the kvcomm layer choice, the mean native
    window, the pair's closed-form map."""

    direct: MoT | None = None
    kvcomm: KVCommSelection | None = None
    means: MeanVectors | None = None
    linear: MoT | None = None


def condition_caches(mot: MoT, source: LoadedModel, target: LoadedModel, example: QAExample | None,
                     translation: Translation | None = None, seed: int = 0,
                     conditions: tuple[str, ...] = DEFAULTS["evaluate"], means: MeanVectors | None = None,
                     relay_tokens: int = RELAY_TOKENS, kvcomm: KVCommSelection | None = None,
                     direct: MoT | None = None, linear: MoT | None = None) -> ConditionCaches:
    """The translation of the example's context (or the one given) and the cache of each requested condition, in the
    registry's order.

    What a method needs (Method.needs) is checked before anything is built: "mean" needs `means` (the mean native
    window of this target and window layers); the relays the example (its passage and question), their messages at
    most `relay_tokens` source tokens; "kvcomm" its layer choice `kvcomm` (kvcomm.kvcomm_selection), its cache
    answered under ``plans["kvcomm"]`` (answers_from_caches(plans=...)); "direct" a full-depth map without replay;
    "linear" the pair's closed-form map.
    """
    asked = methods(conditions)
    given = {"example": example, "means": means, "direct": direct, "kvcomm": kvcomm, "linear": linear}
    for m in asked:
        m.ready(given)
    prompt = None if example is None else build_prompt(example, target.chat_frame)
    if translation is None:
        translation = translate(mot, source, target, prompt.context_text)
    inputs = Inputs(mot, source, target, translation, example, seed, means, relay_tokens, kvcomm, direct, linear)
    kv, seconds, relays, plans, ahead, own, builds = {}, {}, {}, {}, {}, {}, {}
    for m in asked:
        built = builds[m.name] = m.build(inputs)
        kv[m.name], seconds[m.name], ahead[m.name] = built.kv, built.seconds, built.ahead
        if built.relay is not None:
            relays[m.name] = built.relay
        if built.plan is not None:
            plans[m.name] = built.plan
        if built.translation is not None:
            own[m.name] = built.translation
    return ConditionCaches(translation, kv, seconds, relays, plans, own.get("direct"), prompt, ahead, own, builds)


def load_sharing(conditions: tuple[str, ...], direct: str | None, kvcomm_fraction: float, source: LoadedModel,
                 target: LoadedModel, calibration: list[QAExample], mot: MoT | None = None,
                 linear: str | None = None) -> SharingModels:
    """What the asked methods need (Method.needs), loaded once per run: the direct map, the kvcomm layer choice
    calibrated on `calibration` (when there is one), the mean native window of `mot`'s window layers, the closed-form
    map `linear`."""
    need = lambda field: any(getattr(m.needs, field) for m in methods(conditions))  # noqa: E731
    return SharingModels(
        load_checkpoint(direct, source, target)[0] if need("direct") else None,
        kvcomm_selection(source, target, calibration, kvcomm_fraction) if need("kvcomm") and calibration else None,
        reference_means(target, mot.channels.target_layers) if need("means") and mot is not None else None,
        load_checkpoint(linear, source, target)[0] if need("linear") and linear else None)
