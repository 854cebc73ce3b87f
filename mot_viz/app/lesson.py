"""The Lesson page's steps: the method in eight steps on the applied translation, each drawn by the functions its
own page draws with (mot_viz.analysis.*, the app's cached loaders), with two or three sentences and one thing to try.

A step's text is cheap (:attr:`Step.text`); its figures may take seconds on a first visit (:attr:`Step.build`, whose
loaders are cached per context, so a second visit and the other pages reuse them). The same steps fill the page and
the lesson file (mot_viz.analysis.lesson_file).
"""

from __future__ import annotations

import html
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from ..analysis.cache_metrics import cache_error_table, cache_space_table, cost_table, gate_table, window_vectors
from ..analysis.figures import (alignment_heatmap, alignment_table, answers_figure, cache_space_figure,
                               layer_error_figure)
from ..analysis.lesson_file import LessonPage, LessonStep, lesson_html
from ..analysis.method_diagram import diagram_of, global_layers
from ..analysis.method_figures import stages_figure
from ..analysis.methods import method_labels, summary_table
from ..analysis.patching import scan_figure
from ..analysis.routing_figures import gates_heatmap
from ..engine.patching import layer_groups
from ..errors import MotVizError
from ..sharing.registry import TRANSLATED
from .loaders import answer_rows
from .methods import cached_methods, methods_offer
from .openings import WHY_OPENS_ON_DIRECT, opens_on
from .patching import offered_methods, scan
from .settings import DEFAULT_MAX_NEW_TOKENS
from .state import Run


class Step(NamedTuple):
    """One step of the lesson."""

    title: str
    page: str  # the page file (views/) whose figure the step shows
    text: Callable[[Run], str]  # two or three sentences, with this run's numbers
    try_this: str
    build: Callable[[Run], LessonStep]  # the figures (and their data), tables and a note on this run
    wait: str | None = None  # the progress line while a first visit computes (a step that takes seconds)
    tries: dict | None = None  # the page options (pg.* keys) "try this" sets before it opens the page


def _spec_text(run: Run) -> str:
    s, t = run.source.spec, run.target.spec
    return (f"The source ({s.name}, {s.num_layers} layers) and the target ({t.name}, {t.num_layers} layers) each "
            "read the same context and keep a key (K) and a value (V) vector per token in every layer: "
            f"{s.kv_hidden} numbers per token and layer in the source, {t.kv_hidden} in the target. "
            + _difference(s, t))


def _difference(s, t) -> str:
    if s.fingerprint == t.fingerprint:
        return "Here both are the same model, so the translator has the identity to learn."
    differ = [what for what, d in (("depth", s.num_layers != t.num_layers), ("width", s.kv_hidden != t.kv_hidden)) if d]
    return (f"Their caches differ in {' and '.join(differ)}, and " if differ else "Their caches have one shape, but ") + (
        "each model's K/V live in a space of its own, so the target cannot read the source's cache as it is.")


def _two_caches(run: Run) -> LessonStep:
    position = run.mot.channels.window - 1
    s_layer, t_layer = run.mot.channels.pairs()[position]
    vectors = window_vectors(run.translation, run.mot.channels, position, "K")
    shown = {k: v for k, v in vectors.items() if k in ("native target", "source (aligned)")}
    points = cache_space_table(shown, run.target_tokens, "pca")
    return LessonStep(figures=[(cache_space_figure(points), points, "lesson_caches")],
                      note=f"Keys of target layer {t_layer} (left) and source layer {s_layer} (right), one dot per "
                           "token, each space projected on its own.")


def _alignment(run: Run) -> LessonStep:
    alignment = run.translation.source.alignment
    table = alignment_table(alignment.overlap, run.target_tokens, run.source_tokens)
    return LessonStep(figures=[(alignment_heatmap(alignment.overlap, run.target_tokens, run.source_tokens,
                                                  "shared characters"), table, "lesson_alignment")])


def _translator_text(run: Run) -> str:
    ch, cfg = run.mot.channels, run.mot.translator.config
    head = (f"The source's K/V at {ch.window} layers (source {ch.source_layers[0]}–{ch.source_layers[-1]}) feed "
            f"target layers {ch.target_layers[0]}–{ch.target_layers[-1]}, through one translator for K and one for "
            "V. ")
    if cfg.variant != "mot":
        return head + f"This checkpoint's translator is a {cfg.variant} one, with no router."
    return head + (f"Each has {cfg.num_experts} experts, each translating the whole window while attending across "
                   f"all the context's tokens; a router keeps the top {cfg.top_k} per token and weighs them with "
                   "gates that sum to 1 (the heat map: one column per token)."
                   + (" Every token also gets a linear map of the window, the experts' output added to it."
                      if cfg.linear_residual else ""))


def _translator(run: Run) -> LessonStep:
    figures = [(diagram_of(run.mot, "experts"), pd.DataFrame(run.mot.channels.pairs(), columns=["source layer",
                                                                                               "target layer"]),
                "lesson_translator")]
    routing = run.translation.translated.key_routing
    if routing is not None:
        gates = gate_table(routing.gates, run.target_tokens)
        figures.append((gates_heatmap(gates, "K router gates per token"), gates, "lesson_gates"))
    return LessonStep(figures=figures)


def _replay_text(run: Run) -> str:
    if run.mot.replay.direct:
        return ("This checkpoint is a full-depth map without replay: the translated K/V of every layer are the "
                "target's cache as they are, and the target never runs over the context.")
    costs = cost_table(run.translation.timings).set_index("stage")["seconds"]
    spent = costs.get("translator + replay")
    native = run.translation.timings.get("native_prefill")
    times = (f" Here the translator and the replay took {spent:.2f} s, the target's own prefill {native:.2f} s."
             if spent is not None and native else "")
    return ("The target does not skip its prefill: it runs one forward pass of its own over the context tokens (the "
            "**replay**), and inside the window its attention reads the translated K/V instead of its own. Every "
            "layer caches the K/V it computes from its own hidden states, so the translation reaches the cache "
            "only through them: the layers above the window (green) inherit the shift." + times)


def _replay(run: Run) -> LessonStep:
    costs = cost_table(run.translation.timings).round({"seconds": 3, "× native prefill": 2})
    return LessonStep(figures=[(diagram_of(run.mot, "above"), costs, "lesson_replay")],
                      tables=[("What it cost on this context", costs)])


def _answers(run: Run) -> LessonStep:
    example = run.selection.example
    if example is None:
        return LessonStep(note="This free-text context has no question: type one in the sidebar to see answers.")
    table = pd.DataFrame(answer_rows(run.selection, DEFAULT_MAX_NEW_TOKENS))
    scores = dict(zip(table["key"], table["score"]))
    note = "Answers: " + "; ".join(f"{row.condition}: “{row.answer}”" for row in table.itertuples())
    if scores.get("native") is not None and scores.get("mot") is not None:
        note += f". Score: MoT {scores['mot']:.2f}, native {scores['native']:.2f}."
    return LessonStep(figures=[(answers_figure(table.assign(answer=table["answer"].map(html.escape))), table,
                                "lesson_answers")], note=note)


def _errors(run: Run) -> LessonStep:
    table = cache_error_table(run.translation, run.mot.channels)
    return LessonStep(figures=[(layer_error_figure(table, run.mot.channels.target_layers,
                                                   direct=run.mot.replay.direct), table, "lesson_layer_error")])


def _patching(run: Run) -> LessonStep:
    window = tuple(run.mot.channels.target_layers)
    offer = methods_offer(run)
    method = opens_on(offered_methods(offer))
    frame = scan(run, offer, method, layer_groups(run.target.spec, window), False)
    gap = frame["native"].iloc[0] - frame["translated"].iloc[0]
    shown = method_labels()[method]
    note = (f"{shown}: the gap between native and its cache on this gold answer is {gap:.3f} nats per token"
            + (" (under 0.05: shares of so small a gap are mostly noise)." if abs(gap) < 0.05 else "."))
    if method != TRANSLATED:
        note += " " + WHY_OPENS_ON_DIRECT.replace("choose it above", "see it on the page")
    return LessonStep(figures=[(scan_figure(frame, window, global_layers(run.target.spec), "share"), frame,
                                f"lesson_patching_{method}")], note=note)


def _methods(run: Run) -> LessonStep:
    result = cached_methods(run, methods_offer(run), DEFAULT_MAX_NEW_TOKENS)
    example = run.selection.example
    metric = None if example is None else "correct" if example.kind == "closed" else "F1" if example.answers else None
    table = summary_table(result, metric).drop(columns=["method"])
    return LessonStep(figures=[(stages_figure(result.stages), result.stages, "lesson_methods")],
                      tables=[("Each method's answer", table)])


STEPS = (
    Step("Two models read one text", "5_cache_space.py", _spec_text,
         "On Cache space, the translated vectors join the target's own: see where they land.", _two_caches),
    Step("Their tokens do not line up", "4_alignment.py",
         lambda run: (f"The source cut the text into {len(run.source_tokens)} tokens, the target into "
                      f"{len(run.target_tokens)}. The translator works on the target's tokens: each target token's "
                      "source K/V is the average of the source tokens it shares characters with, weighted by those "
                      "characters."),
         "Switch the view to the weights: each target token's row shares 1 among the source tokens it overlaps.",
         _alignment, tries={"pg.align.view": "weights"}),
    Step("The translator and its router", "3_routing.py", _translator_text,
         "On Expert routing, drop one expert under “What if”: see how far the replayed cache and the answer move.",
         _translator, tries={"pg.routing.whatif": "drop one expert"}),
    Step("What the target computes: the replay", "2_cache_error.py", _replay_text,
         "Pick the -direct checkpoint in the sidebar: no replay, the translated K/V are the cache.", _replay),
    Step("Does it answer?", "1_answers.py",
         lambda run: ("The target answers the question from caches of the same context: its own (native), none, "
                      "the MoT's, and a random window of the same error. Close to native alone is not proof: the "
                      "replay runs the target's own layers over the context, so the MoT must beat the controls."),
         "Also answer from the mean-vector window, a window with no context in it: does the MoT beat it?",
         _answers, wait="The target answers from each cache (a first visit: seconds) …",
         tries={"pg.answers.mean": True}),
    Step("Where the error sits", "2_cache_error.py",
         lambda run: ("Translated: what the translator wrote in the window (shaded). Replayed: the cache the target "
                      "keeps. Below the window only the replay's sparse attention (if any) moves it; the layers "
                      "above inherit the shift through the hidden states, and an early window leaves more layers to "
                      "correct or amplify it."),
         "Compare the mid-depth and the top-window checkpoints in the sidebar; Shift analysis says whether the "
         "layers above correct the shift.", _errors),
    Step("What each layer's error costs", "13_layer_patching.py",
         lambda run: ("Restoring one layer's native K/V inside the translated cache shows what that layer's error "
                      "costs the gold answer's log-probability, as a share of the gap between native and "
                      "translated (1 = the whole gap)."),
         "On Layer patching, switch the method to the MoT: on the bundled pair its gap averages 0.063 nats over 100 SQuAD "
         "examples (the direct map's 2.15), so there is little left to place.",
         _patching, wait="Patching every layer both ways (a first visit: tens of seconds) …",
         tries={"pg.patch.method": TRANSLATED}),
    Step("The other ways of sharing", "12_methods.py",
         lambda run: ("The same context handed over in the field's other ways: the target's own reading, no "
                      "context, and those this pair offers (a linear or full-depth map, KVComm, the C2C, LSC and "
                      "Interlat networks trained here). The bars split each method's time to the first answer token "
                      "into its stages."),
         "On Methods, tick “Include the text relay”: the source writes a message instead of handing over a cache.",
         _methods, wait="Building every method's cache and answering from it (a first visit: tens of seconds) …",
         tries={"pg.methods.relay": True}),
)


BACKGROUND_NICENESS = 10  # added to the lesson's background thread's niceness (Unix: 19 is the lowest priority)


class LessonWork:
    """The heavy steps (those with a :attr:`Step.wait` line) of one selection, built one at a time in a background
    thread once the lesson opens, so that a class does not wait for them: the step a reader is on goes first, and a
    page that asks for a step still in the queue gets None at once (it shows a progress line and asks again)."""

    def __init__(self, run: Run):
        self._run = run
        self._changed = threading.Condition()
        self._queue = [i for i, step in enumerate(STEPS) if step.wait is not None]
        self._done: dict[int, tuple[LessonStep | None, BaseException | None]] = {}
        self._current: tuple[int, float] | None = None  # the step being built, since (time.monotonic())
        self.heavy = len(self._queue)
        threading.Thread(target=self._work, daemon=True, name="lesson-steps").start()

    def _work(self) -> None:
        _yield_the_cores()
        while True:
            with self._changed:
                if not self._queue:
                    return
                index = self._queue.pop(0)
                self._current = (index, time.monotonic())
            try:
                done = (STEPS[index].build(self._run), None)
            except BaseException as exc:  # noqa: BLE001 — shown by the page that asks for the step
                done = (None, exc)
            with self._changed:
                self._done[index], self._current = done, None
                self._changed.notify_all()

    def ask(self, index: int) -> tuple[LessonStep | None, BaseException | None] | None:
        """The step's (figures, None) or (None, the error its build raised) when built; else None, with the step moved
        to the front of the queue."""
        with self._changed:
            if index not in self._done and index in self._queue:
                self._queue.remove(index)
                self._queue.insert(0, index)
            return self._done.get(index)

    def wait(self, index: int) -> tuple[LessonStep | None, BaseException | None]:
        """The step's result, waiting for it (first in the queue) as long as it takes."""
        self.ask(index)
        with self._changed:
            self._changed.wait_for(lambda: index in self._done)
            return self._done[index]

    def progress(self, index: int) -> tuple[float, str]:
        """The share of the heavy steps built, and a line on what is being built now."""
        with self._changed:
            share = len(self._done) / self.heavy
            if self._current is None:
                return share, "starting …"
            building, since = self._current
            seconds = f"{time.monotonic() - since:.0f} s so far"
            if building == index:
                return share, f"computing this step: {seconds}"
            return share, f"step {building + 1} is computing ({seconds}); this step is next"


def _yield_the_cores() -> None:
    """Lower this thread's priority (and that of the torch threads it starts, which inherit it), so that a page the
    reader opens meanwhile runs first on a machine with few cores (Linux: a thread's niceness is its own)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICENESS)
    except (AttributeError, OSError):  # no per-thread priority on this system: the work runs at the page's
        pass


_WORK_LOCK = threading.Lock()
_WORK: dict = {}  # Selection -> LessonWork, the newest last
_KEEP = 4  # selections whose built steps are kept (the cached loaders keep theirs too)


def lesson_work(run: Run) -> LessonWork:
    """The heavy steps of the run's selection, started in the background on the first call (once per selection)."""
    with _WORK_LOCK:
        work = _WORK.pop(run.selection, None) or LessonWork(run)
        _WORK[run.selection] = work
        while len(_WORK) > _KEEP:
            del _WORK[next(iter(_WORK))]
        return work


def running(selection) -> LessonWork | None:
    """The heavy steps being built (or built) for a selection, if the lesson was opened on it."""
    with _WORK_LOCK:
        return _WORK.get(selection)


def built_step(run: Run, index: int) -> LessonStep:
    """Step `index` for the run, waiting for it: a light step is built here, a heavy one by its LessonWork (first in
    its queue); raises what the build raised."""
    if STEPS[index].wait is None:
        return STEPS[index].build(run)
    shown, error = lesson_work(run).wait(index)
    if error is not None:
        raise error
    return shown


# ----- the lesson file -------------------------------------------------------------------------------


def lesson_pages(run: Run, progress: Callable[[int, str], None] = lambda i, title: None) -> list[LessonPage]:
    """Every step drawn for the run, as the lesson file writes them (`progress` is told each step before it is
    computed); a step that cannot be drawn for this run (e.g. patching without a gold answer) says why."""
    pages = []
    for i, step in enumerate(STEPS):
        progress(i, step.title)
        try:
            shown, error = built_step(run, i), ""
        except MotVizError as exc:
            shown, error = None, str(exc)
        pages.append(LessonPage(step.title, step.text(run), step.try_this, shown, error))
    return pages


def lesson_facts(run: Run) -> dict[str, str]:
    """The run's pair, checkpoint, context and sizes, for the file's first table."""
    sel, ch = run.selection, run.mot.channels
    return {"source → target": f"{run.source.spec.name} ({run.source.spec.num_layers} layers) → "
                               f"{run.target.spec.name} ({run.target.spec.num_layers} layers)",
            "checkpoint": Path(sel.checkpoint).name, "context": sel.label,
            "tokens": f"{len(run.target_tokens)} target, {len(run.source_tokens)} source",
            "injection window (source → target layer)": ", ".join(f"{s}→{t}" for s, t in ch.pairs()),
            "question": "" if sel.example is None else sel.example.question,
            "gold answer": "" if sel.example is None else " | ".join(sel.example.answers)}


def lesson_document(run: Run, link: str, reproduce: str, progress=lambda i, title: None) -> str:
    """The lesson file of the run: every step, the run's facts and context, `link` and `reproduce` (the Python that
    translates the same context)."""
    return lesson_html("MoT lesson: " + f"{run.source.spec.name} → {run.target.spec.name}",
                       lesson_pages(run, progress), lesson_facts(run), run.selection.text, reproduce, link)
