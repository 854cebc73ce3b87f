"""The cached loaders (st.cache_resource / st.cache_data, on hashable keys only): the checkpoints on offer, the
datasets' examples, the models, a checkpoint, the one translation per input, every answer condition's cache and
answer, the mean vectors and the window fidelity, and the pages' own analyses of a translation (first-token KL,
expert what-if, the shift analysis of the checkpoint's window and a live start sweep).

The translation of one (source, target, checkpoint, context) is computed once and shared by every page and every
browser tab. Cached objects are never mutated.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import streamlit as st
import torch

from ..analysis import shift
from ..analysis.logit_lens import Lens, LensTrace, attention_shares, logit_lens, translation_lens_trace
from ..analysis.shift.metrics import kl_divergence
from ..analysis.whatif import WhatIf, what_if
from ..data.eval_data import load_dataset
from ..engine.checkpoint import load_checkpoint, read_config
from ..engine.models import DEFAULT_SOURCE, DEFAULT_TARGET, LoadedModel, load_model
from ..engine.mot import MoT, Translation, check_pair, translate, translate_window
from ..engine.prompts import QAExample
from ..engine.testing import load_test_model
from ..engine.translator import GateOverride
from ..errors import CheckpointError, ModelLoadError, MotVizError
from ..eval.answers import (CONDITION_LABELS, CONDITIONS, Answer, PromptedCache, answers_from_caches,
                            first_answer_logprobs)
from ..sharing import registry
from ..sharing.caches import ConditionCaches, condition_caches
from ..sharing.mean import MEAN
from ..sharing.linear import find_linear
from ..sharing.method import Offering, translated_seconds
from ..sharing.random_window import RANDOM
from ..sharing.registry import REFERENCE, TRANSLATED
from ..train.mean_vector import MeanVectors, reference_means
from ..train.quickfit import fits_dir
from ..train.rival_checkpoint import is_trained_folder
from ..train.window_fidelity import translation_fidelity
from .settings import (DEFAULT_CHECKPOINT, EXAMPLES_PER_DATASET, MAX_CONTEXT_TOKENS, MEAN_VECTOR_PASSAGES,
                       REPO_ROOT, pretrained_dir, test_mode)
from .state import Run, Selection

FIT_PREFIX = "fit: "  # checkpoints fitted in the app (mot_viz.train.quickfit), listed after the shipped ones
CONTROL_SEED = 0  # the Answers page's random control; the Shift page reuses its cache at this seed
# the methods whose caches the Answers page builds on request, apart from CONDITIONS: those reading the mean native
# window (a window with no context in it, method.md §13), computed once per target and window layers
WITH_MEANS = (MEAN.name,)


def available_checkpoints() -> dict[str, str]:
    """Checkpoint folders in pretrained/, then the linear maps fitted here (<cache>/fits): name -> path (the networks
    of other ways of sharing shipped beside them are not MoT checkpoints: the Methods page finds those)."""
    found = {}
    try:
        fits = fits_dir()
    except MotVizError:  # an unusable cache folder: its own message comes with the first model load
        fits = None
    for root, prefix in ((pretrained_dir(), ""), (fits, FIT_PREFIX)):
        if root is not None and root.is_dir():
            found.update({prefix + p.name: str(p) for p in sorted(root.iterdir())
                          if (p / "config.json").is_file() and not is_trained_folder(p)})
    return found


def checkpoints_for_pair(source: str, target: str, checkpoints: dict[str, str]) -> list[str]:
    """Names of the checkpoints whose config says they were made for these model names."""
    names = []
    for name, path in checkpoints.items():
        try:
            cfg = read_config(path)
        except MotVizError:
            continue
        if cfg["source"].get("name") == source and cfg["target"].get("name") == target:
            names.append(name)
    return names


def default_checkpoint(source: str, target: str, checkpoints: dict[str, str]) -> str | None:
    """pretrained/smollm2-to-gemma3-mid (DEFAULT_CHECKPOINT) for the default pair if present, else the first made for
    the chosen names."""
    if source == DEFAULT_SOURCE and target == DEFAULT_TARGET and DEFAULT_CHECKPOINT in checkpoints:
        return DEFAULT_CHECKPOINT
    made_for = checkpoints_for_pair(source, target, checkpoints)
    if made_for:
        return made_for[0]
    return DEFAULT_CHECKPOINT if DEFAULT_CHECKPOINT in checkpoints else next(iter(checkpoints), None)


@st.cache_data(show_spinner=False)
def dataset_examples(name: str) -> list[QAExample]:
    """The examples offered for a built-in dataset (the same ones every session)."""
    return load_dataset(name, n=EXAMPLES_PER_DATASET, seed=0)


# ----- cached loaders (hashable keys only) ---------------------------------------------------------


def _model_loader() -> Callable[[str], LoadedModel]:
    if test_mode():
        return load_test_model
    return load_model


@st.cache_resource(show_spinner=False, max_entries=4)
def _cached_model(name: str, test: bool, _progress: Callable[[str], None] | None = None) -> LoadedModel:
    loader = _model_loader()
    return loader(name) if test else loader(name, progress=_progress)


def get_model(name: str, progress: Callable[[str], None] | None = None) -> LoadedModel:
    """The loaded model of a name (cached per process); ModelLoadError when it cannot be loaded.

    progress receives the one-time steps of a first load (hashing and converting a .gguf file into the user cache).
    """
    if not name.strip():
        raise ModelLoadError("No model name is given. Choose a bundled model, or type a Hub id, a local folder "
                             "or a local .gguf file.")
    try:
        return _cached_model(name, test_mode(), _progress=progress)
    except MotVizError:
        raise
    except Exception as exc:  # a typed Hub id or folder can fail in many ways inside transformers
        raise ModelLoadError(f"Cannot load model '{name}': {type(exc).__name__}: {exc}. "
                             "Check the name or path, or choose a bundled model.") from exc


def checkpoint_stamp(path: str) -> int:
    """Modification time of the checkpoint's weights, so a re-exported checkpoint is not served stale."""
    weights = Path(path) / "translator.safetensors"
    return weights.stat().st_mtime_ns if weights.is_file() else 0


@st.cache_resource(show_spinner=False, max_entries=8)
def _cached_checkpoint(path: str, stamp: int) -> tuple[MoT, dict]:
    return load_checkpoint(path)


def get_checkpoint(path: str, source: LoadedModel, target: LoadedModel) -> tuple[MoT, dict]:
    """The checkpoint's MoT and config, checked against the loaded pair (CheckpointError if it does not fit)."""
    if not path:
        found = ", ".join(available_checkpoints()) or "none"
        raise CheckpointError(f"No MoT checkpoint is chosen (found in {pretrained_dir()}: {found}). Pick one, or "
                              "type the path of a checkpoint folder; `bash scripts/train_pretrained.sh` trains them.")
    mot, config = _cached_checkpoint(path, checkpoint_stamp(path))
    check_pair(mot, source, target)
    return mot, config


class TranslationKey(NamedTuple):
    """What one translation depends on: the key of every cached result of the app."""

    source: str
    target: str
    checkpoint: str  # folder path
    stamp: int  # checkpoint_stamp: a rewritten checkpoint is a new key
    text: str  # the context that is translated
    test: bool  # the tiny test models stand in for the bundled ones


def translation_key(sel: Selection, checkpoint: str | None = None) -> TranslationKey:
    """The cache key of the selection's translation (optionally with another checkpoint)."""
    path = sel.checkpoint if checkpoint is None else checkpoint
    return TranslationKey(sel.source, sel.target, path, checkpoint_stamp(path), sel.text, test_mode())


def _loaded(key: TranslationKey) -> tuple[LoadedModel, LoadedModel, MoT]:
    """The key's source and target models and its checkpoint's MoT."""
    src, tgt = get_model(key.source), get_model(key.target)
    return src, tgt, get_checkpoint(key.checkpoint, src, tgt)[0]


# a translation of a 1,024-token context on the default pair holds ~200 MB of caches: keep a few
@st.cache_resource(show_spinner=False, max_entries=6)
def _cached_translation(key: TranslationKey) -> Translation:
    src, tgt, mot = _loaded(key)
    return translate(mot, src, tgt, key.text, max_tokens=min(MAX_CONTEXT_TOKENS, tgt.spec.max_positions))


def get_translation(sel: Selection, checkpoint: str | None = None) -> Translation:
    """The translation of the selection's context (optionally with another checkpoint); computed once per input."""
    return _cached_translation(translation_key(sel, checkpoint))


@st.cache_resource(show_spinner=False, max_entries=4)
def _cached_condition_caches(key: TranslationKey) -> ConditionCaches:
    """Every answer condition's cache of the key's translation, with its build time (mot_viz.eval.answers)."""
    src, tgt, mot = _loaded(key)
    return condition_caches(mot, src, tgt, None, _cached_translation(key), seed=CONTROL_SEED, conditions=CONDITIONS)


@st.cache_resource(show_spinner=False, max_entries=8)
def _cached_mean_caches(key: TranslationKey) -> ConditionCaches:
    """The caches of WITH_MEANS on the key's translation, with the seconds each build took (the mean vectors
    themselves are computed once per target and window)."""
    src, tgt, mot = _loaded(key)
    means = cached_mean_vectors(key.target, tuple(mot.channels.target_layers), test_mode())
    return condition_caches(mot, src, tgt, None, _cached_translation(key), conditions=WITH_MEANS,
                            artifacts={MEAN.name: means})


def _caches_of(key: TranslationKey, condition: str) -> ConditionCaches:
    """The cached caches that hold `condition`'s (those built on request apart, else every answer condition's)."""
    return _cached_mean_caches(key) if condition in WITH_MEANS else _cached_condition_caches(key)


@st.cache_resource(show_spinner=False, max_entries=8)  # ~4 MB each on the default pair (3 log-prob rows)
def _prompted(key: TranslationKey, suffix: str) -> dict[str, PromptedCache]:
    """The question `suffix` appended to the key's native, MoT and random-control caches, with the first answer
    token's log-probs there: filled by the Answers page's batch (its prompt step), read by the Per-layer page's
    first-token KL and the Shift page's trace, which would otherwise run the question over the same caches again.
    Empty until the Answers page has answered this question."""
    return {}


@st.cache_resource(show_spinner=False, max_entries=32)
def _cached_answers(key: TranslationKey, conditions: tuple[str, ...], example: QAExample, suffix: str | None,
                    max_new_tokens: int) -> dict[str, Answer]:
    """The answers under `conditions`, decoded as one batch (mot_viz.eval.answers: the no-context cache left-padded)."""
    if conditions == (TRANSLATED,):  # the replayed cache alone: a second checkpoint needs no control caches
        caches = {TRANSLATED: _cached_translation(key).mixed_kv}
    else:
        caches = {c: _caches_of(key, c).kv[c] for c in conditions}
    # the Answers page's batch of every answer condition: kept for the pages that run the question over them again
    prompted = {} if suffix is not None and set(CONDITIONS) <= set(caches) else None
    answers = answers_from_caches(get_model(key.target), caches, example, max_new_tokens, suffix, prompted=prompted)
    if prompted:
        _prompted(key, suffix).update(prompted)
    return answers


@st.cache_resource(show_spinner=False, max_entries=4)
def cached_mean_vectors(target: str, layers: tuple[int, ...], test: bool) -> MeanVectors:
    return reference_means(get_model(target), layers, MEAN_VECTOR_PASSAGES)


def app_offering(checkpoint: str, mot: MoT) -> Offering:
    """What the ways of sharing are offered with beside `checkpoint` (its MoT) in the app: the MoT checkpoints on offer
    (shipped and fitted) and the shipped networks' folder."""
    return Offering(checkpoint, mot, tuple(available_checkpoints().values()), pretrained_dir())


def linear_baseline_for(checkpoint: str, mot: MoT) -> str | None:
    """A shipped or fitted 'linear' checkpoint for the same pair and window as `mot` (the checkpoint at `checkpoint`),
    other than that checkpoint itself, if any (the linear way's own finder)."""
    return find_linear(app_offering(checkpoint, mot))


def window_fidelity(run: Run, second: str | None = None) -> pd.DataFrame:
    """Window fidelity of the run's translation on its own context, with the mean-vector and linear baselines,
    and (candidate "second") that of a second checkpoint on the same context."""
    return _cached_window_fidelity(translation_key(run.selection),
                                   None if second is None else translation_key(run.selection, second))


@st.cache_data(show_spinner="Scoring the window against its baselines …", max_entries=8)
def _cached_window_fidelity(key: TranslationKey, second: TranslationKey | None) -> pd.DataFrame:
    src, tgt, mot = _loaded(key)
    means = cached_mean_vectors(key.target, tuple(mot.channels.target_layers), test_mode())
    own = "linear" if mot.translator.config.variant == "linear" else "translator"
    translation = _cached_translation(key)
    others = {}
    linear = linear_baseline_for(key.checkpoint, mot) if own != "linear" else None
    if linear is not None and (second is None or second.checkpoint != linear):
        # the same window of the same pair: the map reads this translation's source context (no second prefill)
        with torch.no_grad():
            out = translate_window(get_checkpoint(linear, src, tgt)[0], translation.source, src, tgt)
        others["linear"] = (out.keys, out.values)
    rows = translation_fidelity(translation, tgt, mot.channels, means, candidate=own, others=others)
    if second is not None:
        rows += translation_fidelity(_cached_translation(second), tgt, _loaded(second)[2].channels, candidate="second")
    return pd.DataFrame(rows)


def verdict_validation(checkpoint: str) -> dict | None:
    """How well the reuse verdict's default thresholds agreed with QA for this checkpoint (by its folder name), if
    scripts/verdict_validation.py measured it: <results>/<name>/validation.json under results/verdict
    ($MOT_VIZ_VERDICT_RESULTS points elsewhere: tests)."""
    root = Path(os.environ.get("MOT_VIZ_VERDICT_RESULTS", REPO_ROOT / "results" / "verdict"))
    path = root / Path(checkpoint).name / "validation.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def answer_rows(sel: Selection, max_new_tokens: int, checkpoint: str | None = None,
                with_mean: bool = False) -> list[dict]:
    """Rows of the answers table: each condition's answer, its score vs the gold answers, and its times.

    Every condition of mot_viz.eval.answers.CONDITIONS for the selected checkpoint (with_mean: and the mean-vector
    window's, WITH_MEANS, decoded in the same batch); with another `checkpoint`, the one row of that (second) checkpoint's
    MoT-translated cache.
    """
    second = checkpoint is not None and checkpoint != sel.checkpoint
    key = translation_key(sel, checkpoint)
    conditions = (TRANSLATED,) if second else CONDITIONS + (WITH_MEANS if with_mean else ())
    answers = _cached_answers(key, conditions, sel.example, sel.suffix, max_new_tokens)
    seconds = ({TRANSLATED: translated_seconds(_cached_translation(key))} if second  # no control caches were built
               else {c: _caches_of(key, c).seconds[c] for c in conditions})
    return [{
        "key": f"{condition} (2nd)" if second else condition,
        "condition": f"MoT-translated cache, second checkpoint ({Path(checkpoint).name})" if second
        else CONDITION_LABELS[condition],
        "answer": answer.text,
        "score": answer.score,  # None without a gold answer (closed-set examples always have one)
        "exact_match": answer.exact_match,
        "seconds_cache": seconds[condition],
        "seconds_answer": answer.seconds,  # a batch's decoding time is shared evenly among its rows
        "choice_logprobs": None if answer.choice_logprobs is None else
        ", ".join(f"{x:.3f}" for x in answer.choice_logprobs),
    } for condition, answer in answers.items()]


# ----- the pages' analyses of a translation ---------------------------------------------------------


@st.cache_resource(show_spinner=False, max_entries=16)
def _cached_first_token_kl(key: TranslationKey, suffix: str) -> float:
    prompted = _prompted(key, suffix)
    if REFERENCE in prompted and TRANSLATED in prompted:  # the Answers page ran this question over both caches
        return kl_divergence(prompted[REFERENCE].first_logprobs, prompted[TRANSLATED].first_logprobs)
    target, translation = get_model(key.target), _cached_translation(key)
    return kl_divergence(*first_answer_logprobs(target, [translation.native_kv, translation.mixed_kv], suffix))


def first_token_kl(sel: Selection, checkpoint: str | None = None) -> float | None:
    """KL(native ‖ translated) of the first answer token on this context and question (None without a question);
    optionally with another checkpoint's translation."""
    return None if sel.suffix is None else _cached_first_token_kl(translation_key(sel, checkpoint), sel.suffix)


@st.cache_resource(show_spinner="Translating again with the overridden gates …", max_entries=8)
def _cached_what_if(key: TranslationKey, example: QAExample | None, suffix: str | None, mode: str,
                    expert: int | None, max_new_tokens: int) -> list[WhatIf]:
    src, tgt, mot = _loaded(key)
    base = _cached_translation(key)
    return [what_if(mot, src, tgt, base, override, example, suffix, max_new_tokens)
            for override in (GateOverride(), GateOverride(mode, expert))]


def what_if_pair(sel: Selection, mode: str, expert: int | None, max_new_tokens: int) -> list[WhatIf]:
    """The router's own choice and the overridden gates (mot_viz.analysis.whatif), in that order."""
    return _cached_what_if(translation_key(sel), sel.example, sel.suffix, mode, expert, max_new_tokens)


@st.cache_resource(show_spinner=False, max_entries=8)
def _cached_window_analysis(key: TranslationKey, suffix: str, example: QAExample | None,
                            seed: int) -> tuple[shift.WindowAnalysis, shift.ContextCase]:
    src, tgt, mot = _loaded(key)
    case = shift.case_from_text(tgt, key.text, suffix, example)
    # at the Answers page's seed the random control is the same cache: built once for both pages
    random_kv = _cached_condition_caches(key).kv[RANDOM.name] if seed == CONTROL_SEED else None
    # and if the Answers page has run this question over those caches, only the answer tokens run here
    prompted = _prompted(key, suffix) if seed == CONTROL_SEED else None
    return shift.analyse_translation(mot, src, tgt, case, _cached_translation(key), seed=seed,
                                     random_kv=random_kv, answer_likelihood=False,  # the page does not show it
                                     prompted=prompted), case


def window_analysis(sel: Selection, seed: int) -> tuple[shift.WindowAnalysis, shift.ContextCase]:
    """§9.2 for the checkpoint's own window on the selection's context, and the context case it traced."""
    return _cached_window_analysis(translation_key(sel), sel.suffix, sel.example, seed)


@st.cache_resource(show_spinner=False, max_entries=8)
def _cached_live_sweep(key: TranslationKey, suffix: str, example: QAExample | None, mode: str, window: int,
                       size: float, controls: bool, seed: int,
                       _progress: shift.ProgressFn | None = None) -> shift.SweepResult:
    src, tgt = get_model(key.source), get_model(key.target)
    profile_mot = get_checkpoint(key.checkpoint, src, tgt)[0] if mode != "perturbation" else None
    cfg = shift.SweepConfig(mode=mode, window=window, perturbation_size=size, seed=seed, controls=controls,
                            task_metric=False)
    case = shift.case_from_text(tgt, key.text, suffix, example)
    return shift.sweep(tgt, [case], cfg, source=src, profile_mot=profile_mot, progress=_progress)


def live_sweep(sel: Selection, mode: str, window: int, size: float, controls: bool, seed: int,
               progress: shift.ProgressFn | None = None) -> shift.SweepResult:
    """§9.1 start sweep on the selection's context alone (mot_viz.analysis.shift.sweep, no task metric)."""
    return _cached_live_sweep(translation_key(sel), sel.suffix, sel.example, mode, window, size, controls, seed,
                              _progress=progress)


@st.cache_resource(show_spinner="Reading the target's residual stream under each cache …", max_entries=8)
def _cached_lens_trace(key: TranslationKey, suffix: str, second: TranslationKey | None,
                       answer_tokens: int) -> LensTrace:
    src, tgt, mot = _loaded(key)
    linear = linear_baseline_for(key.checkpoint, mot) if mot.translator.config.variant != "linear" else None
    others = {} if second is None else {"second": _cached_translation(second).mixed_kv}
    return translation_lens_trace(mot, src, tgt, _cached_translation(key), suffix,
                                  None if linear is None else get_checkpoint(linear, src, tgt)[0], others,
                                  answer_tokens)


@st.cache_resource(show_spinner=False, max_entries=32)
def _cached_lens(key: TranslationKey, suffix: str, second: TranslationKey | None, answer_tokens: int, position: int,
                 gold_token: int | None) -> tuple[Lens, pd.DataFrame]:
    trace = _cached_lens_trace(key, suffix, second, answer_tokens)
    return logit_lens(get_model(key.target), trace, position, gold_token), attention_shares(trace, position)


def lens_trace(sel: Selection, second: str | None = None, answer_tokens: int = 0) -> LensTrace:
    """The lens trace of the selection's context and question (mot_viz.analysis.logit_lens): native, MoT, the
    installed linear map of the same window, a `second` checkpoint's replayed cache if given, no context; over the
    question alone (answer_tokens 0) or also the native cache's first `answer_tokens` answer tokens."""
    return _cached_lens_trace(translation_key(sel), sel.suffix, None if second is None else translation_key(sel, second),
                              answer_tokens)


def lens_at(sel: Selection, position: int, second: str | None = None, gold_token: int | None = None,
            answer_tokens: int = 0) -> tuple[Lens, pd.DataFrame]:
    """The logit lens and the attention shares of the lens trace (as lens_trace) at one position."""
    return _cached_lens(translation_key(sel), sel.suffix, None if second is None else translation_key(sel, second),
                        answer_tokens, position, gold_token)


def second_translation(sel: Selection, checkpoint: str) -> tuple[MoT, Translation]:
    """A second checkpoint's MoT and its translation of the selection's context (CheckpointError if it does not fit
    the pair)."""
    key = translation_key(sel, checkpoint)
    return _loaded(key)[2], _cached_translation(key)
