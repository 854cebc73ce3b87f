"""Each requested way of sharing's cache of one context (condition_caches), for the evaluations and the app alike,
and what a run's methods load once beside the MoT (load_artifacts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..engine import hf
from ..engine.models import LoadedModel
from ..engine.mot import MoT, Translation, translate
from ..engine.prompts import Prompt, QAExample, build_prompt
from .method import Built, Inputs, Loading
from .registry import load_artifacts, method, methods


@dataclass(frozen=True)
class ConditionCaches:
    """Each requested way of sharing's cache of one context, and the seconds it took to build from the text.

    The one owner of these times, for the evaluator and the app alike: each method's build (Method.build) says its
    seconds and the part of them done ``ahead`` of the question, once the source has read the context (the source's
    prefill; relay's writing, whose message needs no question).
    """

    translation: Translation
    kv: dict[str, list[hf.KV] | None]
    built: dict[str, Built]  # condition -> its build, as Method.build returned it
    prompt: Prompt | None = None  # the example's prompt, built once: its context was translated, its suffix is asked

    @property
    def seconds(self) -> dict[str, float]:
        return {c: b.seconds for c, b in self.built.items()}

    @property
    def ahead(self) -> dict[str, float]:
        """Condition -> seconds of its build done before the question."""
        return {c: b.ahead for c, b in self.built.items()}

    @property
    def plans(self) -> dict[str, hf.AttentionPlan]:
        """The conditions whose cache is read under a plan of its own (kvcomm: its hidden positions)."""
        return {c: b.plan for c, b in self.built.items() if b.plan is not None}

    def after_question(self, condition: str) -> float:
        """The seconds of a condition's build left once the question arrives (seconds less ahead)."""
        return self.built[condition].seconds - self.built[condition].ahead

    def timings(self, condition: str) -> dict[str, float]:
        """The stages of the translation a condition's cache came from (its own, else the MoT's)."""
        return (self.built[condition].translation or self.translation).timings

    def stages(self, condition: str) -> list[tuple[str, float]]:
        """Method.stages of a condition of these caches: its build's stages and their seconds."""
        return method(condition).stages(self.built[condition], self.timings(condition))

    def target_side(self, condition: str) -> float:
        """Method.target_side of a condition of these caches."""
        return method(condition).target_side(self.built[condition], self.timings(condition))


def condition_caches(mot: MoT, source: LoadedModel, target: LoadedModel, example: QAExample | None,
                     translation: Translation | None = None, seed: int = 0,
                     conditions: tuple[str, ...] = (), options: Mapping | None = None,
                     artifacts: Mapping | None = None) -> ConditionCaches:
    """The translation of the example's context (or the one given) and the cache of each requested condition, in the
    registry's order.

    What a method needs is checked before anything is built (Method.ready): its artifact, loaded once per run
    (`artifacts`, by method name: load_artifacts), and the example where its build reads it (the relays). `options`:
    the run's options, by Option.name (registry.run_options; a method reads its own, its default where missing).
    """
    asked, artifacts, options = methods(conditions), artifacts or {}, options or {}
    for m in asked:
        m.ready(artifacts.get(m.name), example)
    prompt = None if example is None else build_prompt(example, target.chat_frame)
    if translation is None:
        translation = translate(mot, source, target, prompt.context_text)
    builds = {m.name: m.build(Inputs(mot, source, target, translation, example, seed, options, artifacts.get(m.name)))
              for m in asked}
    return ConditionCaches(translation, {c: b.kv for c, b in builds.items()}, builds, prompt)


def run_artifacts(conditions, options: Mapping, source: LoadedModel, target: LoadedModel, mot: MoT | None = None,
                  calibration=()) -> dict[str, object]:
    """What the asked methods load once per run (registry.load_artifacts): calibration, the run's first example(s)
    for a method calibrated on them, or a function that makes them (called only by a method that calibrates)."""
    examples = calibration if callable(calibration) else lambda: tuple(calibration)
    return load_artifacts(conditions, Loading(source, target, mot, options, examples))
