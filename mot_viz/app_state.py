"""The app's shared state: the sidebar, the cached loaders and the one cached translation per input.

The only non-page module that imports Streamlit. Every page reads the *applied* selection (what the
last "Translate" — or the first visit — chose) through :func:`current_run`; the translation of one
(source, target, checkpoint, context) is computed once and shared by every page and every browser tab.
Cached objects are never mutated. The applied selection and every page option (``pg.*`` widget key) live in the
URL's query parameters (mot_viz.permalink), so a reload or a copied link opens the same view.

Test mode: with ``MOT_VIZ_TEST_MODELS=1`` the bundled model names load tiny random stand-ins
(mot_viz.testing), and ``MOT_VIZ_PRETRAINED`` may point the checkpoint list at another folder.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from .answers import CONDITION_LABELS, Answer, answer_from_cache, condition_caches
from .checkpoint import load_checkpoint, read_config
from .data import BUILTIN_DATASETS, PLAIN, ChatFrame, QAExample, build_prompt, choice_label_texts, question_suffix
from .errors import CheckpointError, ModelLoadError, MotVizError
from .fidelity import MeanVectors, reference_means, translation_fidelity
from .figures import token_labels
from .models import BUNDLED_MODELS, DEFAULT_SOURCE, DEFAULT_TARGET, LoadedModel, load_model
from .mot import MoT, Translation, check_pair, translate
from .permalink import (MAX_TEXT_IN_LINK, PAGE_PREFIX, SidebarLink, check_value, page_params, parse_link,
                        python_snippet, query_string, sidebar_params, text_digest)
from .quickfit import QuickFitConfig, fit_pair, fits_dir
from .runs import read_log

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CHECKPOINT = "smollm2-to-gemma3"
MEAN_VECTOR_PASSAGES = 16  # LAMBADA passages behind the pages' mean-vector baseline (fewer than the CLIs' 40: start-up)
MAX_CONTEXT_TOKENS = 1024  # the app's cap on target tokens: CPU time grows with the context
EXAMPLES_PER_DATASET = 50  # examples offered per dataset (load_dataset(name, n=50, seed=0))
DEFAULT_MAX_NEW_TOKENS = 24  # the evaluator's generation length, so the app's answers match its numbers
DATASET_LABELS = {"squad": "SQuAD", "boolq": "BoolQ", "arc-easy": "ARC-Easy", "arc-challenge": "ARC-Challenge",
                  "openbookqa": "OpenBookQA", "mmlu": "MMLU"}
OTHER = "other (type below)"
DATASET_MODE, FREE_TEXT_MODE = "Dataset example", "Free text"
DEFAULT_FREE_TEXT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after "
    "the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.\n"
)

# Widget keys that outlive the page that shows them (see keep_widget_state); buttons are never listed.
_DEFAULTS: dict[str, object] = {
    "sb.source": DEFAULT_SOURCE, "sb.source_other": "", "sb.target": DEFAULT_TARGET, "sb.target_other": "",
    "sb.checkpoint_other": "", "sb.mode": DATASET_MODE, "sb.dataset": "squad", "sb.example": 0,
    "sb.text": DEFAULT_FREE_TEXT, "sb.question": "Who designed the tower?", "sb.gold": "Gustave Eiffel",
}
PAGE_KEY_PREFIX = PAGE_PREFIX  # pages give their widgets keys starting with "pg.", so they persist (and are linked)


def test_mode() -> bool:
    """Whether the loaders serve tiny test models (``MOT_VIZ_TEST_MODELS=1``)."""
    return os.environ.get("MOT_VIZ_TEST_MODELS") == "1"


def pretrained_dir() -> Path:
    """Where the shipped checkpoints live (``$MOT_VIZ_PRETRAINED``, default ``<repo>/pretrained``)."""
    return Path(os.environ.get("MOT_VIZ_PRETRAINED", REPO_ROOT / "pretrained"))


# ----- what the user chose -------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """The inputs of one translation; hashable, so it keys every cache."""

    source: str  # model name as typed or chosen
    target: str
    checkpoint: str  # checkpoint folder path ("" when none was found)
    text: str  # the context that is translated
    example: QAExample | None  # the question and gold answers; None for free text without a question
    suffix: str | None  # the target's native suffix after the context (the question part of the prompt)
    label: str  # where the context came from, for captions


FIT_PREFIX = "fit: "  # checkpoints fitted in the app (mot_viz.quickfit), listed after the shipped ones


def available_checkpoints() -> dict[str, str]:
    """Checkpoint folders in pretrained/, then the linear maps fitted here (<cache>/fits): name -> path."""
    found = {}
    try:
        fits = fits_dir()
    except MotVizError:  # an unusable cache folder: its own message comes with the first model load
        fits = None
    for root, prefix in ((pretrained_dir(), ""), (fits, FIT_PREFIX)):
        if root is not None and root.is_dir():
            found.update({prefix + p.name: str(p) for p in sorted(root.iterdir()) if (p / "config.json").is_file()})
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
    """pretrained/smollm2-to-gemma3 for the default pair if present, else the first made for the chosen names."""
    if source == DEFAULT_SOURCE and target == DEFAULT_TARGET and DEFAULT_CHECKPOINT in checkpoints:
        return DEFAULT_CHECKPOINT
    made_for = checkpoints_for_pair(source, target, checkpoints)
    if made_for:
        return made_for[0]
    return DEFAULT_CHECKPOINT if DEFAULT_CHECKPOINT in checkpoints else next(iter(checkpoints), None)


@st.cache_data(show_spinner=False)
def dataset_examples(name: str) -> list[QAExample]:
    """The examples offered for a built-in dataset (the same ones every session)."""
    from .data import load_dataset

    return load_dataset(name, n=EXAMPLES_PER_DATASET, seed=0)


def free_text_selection(text: str, question: str, gold: str,
                        chat: ChatFrame | None = None) -> tuple[str, QAExample | None, str | None]:
    """The translated context, example and suffix of a typed text: the question is asked after it, '|' separates
    gold answers. A chat-tuned target (`chat`) gets its chat header before the text and its turn markup around
    the answer, as in the dataset prompts (mot_viz.data.build_prompt)."""
    context = (chat or PLAIN).head + text
    if not question.strip():
        return context, None, None
    answers = tuple(a.strip() for a in gold.split("|") if a.strip())
    example = QAExample("free-text", "free text", text, question.strip(), answers)
    # the question starts on its own line, as in the dataset prompts
    suffix = ("" if text.endswith("\n") else "\n") + question_suffix(question.strip(), chat)
    return context, example, suffix


# ----- cached loaders (hashable keys only) ---------------------------------------------------------


def _model_loader() -> Callable[[str], LoadedModel]:
    if test_mode():
        from .testing import load_test_model

        return load_test_model
    return load_model


@st.cache_resource(show_spinner=False, max_entries=4)
def _cached_model(name: str, test: bool) -> LoadedModel:
    return _model_loader()(name)


def get_model(name: str) -> LoadedModel:
    """The loaded model of a name (cached per process); ModelLoadError when it cannot be loaded."""
    if not name.strip():
        raise ModelLoadError("No model name is given. Choose a bundled model, or type a Hub id, a local folder "
                             "or a local .gguf file.")
    try:
        return _cached_model(name, test_mode())
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


# (source, target, checkpoint path, checkpoint stamp, context text, test mode): what one translation depends on
TranslationKey = tuple[str, str, str, int, str, bool]


def translation_key(sel: Selection, checkpoint: str | None = None) -> TranslationKey:
    """The cache key of the selection's translation (optionally with another checkpoint)."""
    path = sel.checkpoint if checkpoint is None else checkpoint
    return sel.source, sel.target, path, checkpoint_stamp(path), sel.text, test_mode()


# a translation of a 1,024-token context on the default pair holds ~200 MB of caches: keep a few
@st.cache_resource(show_spinner=False, max_entries=6)
def _cached_translation(key: TranslationKey) -> Translation:
    source, target, path, _, text, _ = key
    src, tgt = get_model(source), get_model(target)
    mot, _ = get_checkpoint(path, src, tgt)
    return translate(mot, src, tgt, text, max_tokens=min(MAX_CONTEXT_TOKENS, tgt.spec.max_positions))


def get_translation(sel: Selection, checkpoint: str | None = None) -> Translation:
    """The translation of the selection's context (optionally with another checkpoint); computed once per input."""
    return _cached_translation(translation_key(sel, checkpoint))


@st.cache_resource(show_spinner=False, max_entries=4)
def _cached_condition_caches(key: TranslationKey) -> tuple[dict, float]:
    """Every answer condition's cache, and the seconds of the one new piece of work (the random-window replay)."""
    source, target, path, _, _, _ = key
    src, tgt = get_model(source), get_model(target)
    mot, _ = get_checkpoint(path, src, tgt)
    start = time.perf_counter()
    # condition_caches reads the example only to translate it; the translation is given here
    _, caches = condition_caches(mot, src, tgt, None, _cached_translation(key))
    return caches, time.perf_counter() - start


@st.cache_resource(show_spinner=False, max_entries=64)
def _cached_answer(key: TranslationKey, condition: str, example: QAExample, suffix: str | None,
                   max_new_tokens: int) -> Answer:
    if condition == "mot":  # the replayed cache alone: a second checkpoint needs no random-window replay
        kv = _cached_translation(key).mixed_kv
    else:
        kv = _cached_condition_caches(key)[0][condition]
    return answer_from_cache(get_model(key[1]), kv, example, condition, max_new_tokens, suffix)


@st.cache_resource(show_spinner=False, max_entries=4)
def _cached_mean_vectors(target: str, layers: tuple[int, ...], test: bool) -> MeanVectors:
    return reference_means(get_model(target), layers, MEAN_VECTOR_PASSAGES)


def linear_baseline_for(sel: Selection, mot: MoT) -> str | None:
    """A shipped 'linear' checkpoint for the same pair and window as `mot` (other than the selected one), if any."""
    for path in available_checkpoints().values():
        if path == sel.checkpoint:
            continue
        try:
            cfg = read_config(path)
        except MotVizError:
            continue
        if (cfg["translator"].get("variant") == "linear" and cfg["source"].get("fingerprint") == mot.source.fingerprint
                and cfg["target"].get("fingerprint") == mot.target.fingerprint
                and cfg["channels"] == mot.channels.to_json()):
            return path
    return None


def window_fidelity(run: "Run") -> pd.DataFrame:
    """Window fidelity of the run's translation on its own context, with the mean-vector and linear baselines."""
    return _cached_window_fidelity(translation_key(run.selection), run.selection)


@st.cache_data(show_spinner="Scoring the window against its baselines …", max_entries=8)
def _cached_window_fidelity(key: TranslationKey, _sel: Selection) -> pd.DataFrame:
    source, target, path, _, _, _ = key
    src, tgt = get_model(source), get_model(target)
    mot, _ = get_checkpoint(path, src, tgt)
    means = _cached_mean_vectors(target, tuple(mot.channels.target_layers), test_mode())
    own = "linear" if mot.translator.config.variant == "linear" else "translator"
    rows = translation_fidelity(_cached_translation(key), tgt, mot.channels, means, candidate=own)
    linear = linear_baseline_for(_sel, mot) if own != "linear" else None
    if linear is not None:
        rows += translation_fidelity(get_translation(_sel, linear), tgt, mot.channels, candidate="linear")
    return pd.DataFrame(rows)


def answer_row(sel: Selection, condition: str, max_new_tokens: int, checkpoint: str | None = None) -> dict:
    """One row of the answers table: the condition's answer, its score vs the gold answers, and its times.

    With `checkpoint`, the condition's cache comes from that (second) checkpoint's translation.
    """
    key = translation_key(sel, checkpoint)
    answer = _cached_answer(key, condition, sel.example, sel.suffix, max_new_tokens)
    t = _cached_translation(key).timings
    cache_seconds = {
        "native": t.get("native_prefill", 0.0),
        "no_context": 0.0,
        "mot": sum(v for stage, v in t.items() if stage != "native_prefill"),  # every stage of the translation
        "random": _cached_condition_caches(key)[1] if condition == "random" else 0.0,
    }
    label = CONDITION_LABELS[condition]
    if checkpoint and checkpoint != sel.checkpoint:
        label = f"MoT-translated cache, second checkpoint ({Path(checkpoint).name})"
    return {
        "key": f"{condition} (2nd)" if checkpoint and checkpoint != sel.checkpoint else condition,
        "condition": label,
        "answer": answer.text,
        "score": answer.score,  # None without a gold answer (closed-set examples always have one)
        "exact_match": answer.exact_match,
        "seconds_cache": cache_seconds[condition],
        "seconds_answer": answer.seconds,
        "choice_logprobs": None if answer.choice_logprobs is None else
        ", ".join(f"{x:.3f}" for x in answer.choice_logprobs),
    }


# ----- the run every page reads -------------------------------------------------------------------


@dataclass
class Run:
    """Everything a page shows for the applied selection (all cached; never mutate)."""

    selection: Selection
    source: LoadedModel
    target: LoadedModel
    mot: MoT
    config: dict
    translation: Translation
    target_tokens: list[str]  # each target token decoded on its own, whitespace visible
    source_tokens: list[str]


def show_error(exc: BaseException) -> None:
    """An error as a message, never a traceback: a user-caused one with its fix, anything else with a details expander."""
    if isinstance(exc, MotVizError):
        st.error(f"**{exc.title}.** {exc}", icon="⚠️")
        return
    st.error(f"**Unexpected error.** {type(exc).__name__}: {exc}\n\nThe page could not be drawn. Other pages and "
             "another context or checkpoint may still work; if this persists, please report it with the details.",
             icon="🛑")
    with st.expander("Details"):
        st.code("".join(traceback.format_exception(exc)), language=None)


def current_run() -> Run:
    """The applied selection's models, checkpoint and translation; on a user error, shows it and stops the page."""
    sel = applied_selection()
    try:
        with st.spinner(f"Loading {sel.source} and {sel.target} …"):
            source, target = get_model(sel.source), get_model(sel.target)
        with st.spinner("Loading the checkpoint …"):
            mot, config = get_checkpoint(sel.checkpoint, source, target)
        with st.spinner("Translating the context (source prefill, alignment, translator, replay) …"):
            translation = get_translation(sel)
    except MotVizError as exc:
        show_error(exc)
        st.stop()
    return Run(sel, source, target, mot, config, translation,
               token_labels(target.tokenizer, translation.target_ids[0].tolist()),
               token_labels(source.tokenizer, translation.source.source_ids[0].tolist()))


# ----- widgets and the sidebar ---------------------------------------------------------------------


def keep_widget_state() -> None:
    """Keep every keyed widget's value when its page or mode is not shown (Streamlit drops unrendered widgets)."""
    for key, value in _DEFAULTS.items():
        st.session_state.setdefault(key, value)
    for key in list(st.session_state.keys()):
        if isinstance(key, str) and (key.startswith("sb.") or key.startswith(PAGE_KEY_PREFIX)):
            st.session_state[key] = st.session_state[key]


def widget_default(key: str, default: object, options: list | None = None) -> None:
    """Give a keyed widget its first value (widgets then take no value= argument, so none is overridden).

    A value no longer offered among `options` (e.g. a removed checkpoint) falls back to the default, and so does
    a value an opened link set that does not fit the default's type or the options (the page's warning names it).
    """
    if key in st.session_state.get(_LINK_UNCHECKED, ()):  # a value an opened link set: it must fit this widget
        _check_linked_value(key, default, options)
    if key not in st.session_state or (options is not None and st.session_state[key] not in options):
        st.session_state[key] = default


def _model_picker(role: str) -> str:
    key = f"sb.{role}"
    options = [*BUNDLED_MODELS, OTHER]
    widget_default(key, options[0], options)
    choice = st.selectbox(f"{role.capitalize()} model", options, key=key,
                          format_func=lambda n: n if n == OTHER else f"{n} (bundled)")
    typed = st.text_input(f"{role.capitalize()}: Hub id, local folder or .gguf file", key=f"{key}_other",
                          disabled=choice != OTHER, placeholder="e.g. gpt2 or /models/my-model.gguf")
    return typed.strip() if choice == OTHER else choice


def _checkpoint_picker(source: str, target: str) -> str:
    fitted = _fit_control(source, target, available_checkpoints())
    checkpoints = available_checkpoints()
    options = [*checkpoints, OTHER]
    default = default_checkpoint(source, target, checkpoints) or OTHER
    if st.session_state.get("sb.pair") != (source, target):  # a new pair: offer the checkpoint made for it
        st.session_state["sb.pair"] = (source, target)
        st.session_state["sb.checkpoint"] = default
    if fitted is not None:  # just fitted: choose it (the selectbox is drawn below, so its state may still change)
        st.session_state["sb.checkpoint"] = next(n for n, p in checkpoints.items() if p == fitted)
    widget_default("sb.checkpoint", default, options)
    choice = st.selectbox("MoT checkpoint", options, key="sb.checkpoint",
                          help=f"Folders in {pretrained_dir()} holding config.json + translator.safetensors.")
    typed = st.text_input("Checkpoint folder path", key="sb.checkpoint_other", disabled=choice != OTHER,
                          placeholder="e.g. runs/my-run/checkpoint")
    return typed.strip() if choice == OTHER else checkpoints[choice]


def quickfit_config() -> QuickFitConfig:
    """The app's quick fit: 4k bank tokens (a smaller bank with the tiny test models)."""
    return QuickFitConfig(tokens=512, max_context_tokens=64) if test_mode() else QuickFitConfig()


def _fit_control(source: str, target: str, checkpoints: dict[str, str]) -> str | None:
    """"Fit a linear translator for this pair" (mot_viz.quickfit); returns the checkpoint path it just fitted."""
    made_for = checkpoints_for_pair(source, target, checkpoints)
    title = "Fit a linear translator for this pair" if made_for else "No checkpoint for this pair? Fit one"
    with st.expander(title, expanded=not made_for and bool(source.strip() and target.strip())):
        cfg = quickfit_config()
        st.caption(f"The closed-form ridge map of a window (method.md §13, the baseline every translator must beat), "
                   f"fitted on {cfg.tokens:,} tokens of LAMBADA prose: about a minute on two CPU cores, then saved "
                   f"in {fits_dir()} and listed as `{FIT_PREFIX}…` for every page.")
        widget_default("sb.fit.window", "terminal")
        where = st.radio("Window", ["terminal", "from a target layer"], key="sb.fit.window", horizontal=True)
        start = None
        if where != "terminal":
            widget_default("sb.fit.start", 0)
            start = int(st.number_input("First target layer (5 layers)", min_value=0, step=1, key="sb.fit.start"))
        if not st.button("Fit a linear translator", key="fit.go", width="stretch"):
            return None
        bar = st.progress(0.0, text="Loading the models …")
        try:
            src, tgt = get_model(source), get_model(target)
            cfg = QuickFitConfig(**{**cfg.__dict__, "window_start": start})
            path = fit_pair(src, tgt, cfg, on_progress=lambda message, done: bar.progress(done, text=message))
        except MotVizError as exc:
            bar.empty()
            show_error(exc)
            return None
        bar.empty()
        st.success(f"Fitted: `{FIT_PREFIX}{path.name}` is now the checkpoint. Press **Translate** to apply it.")
        st.download_button("Download it (zip)", checkpoint_zip(path), file_name=f"{path.name}.zip",
                           mime="application/zip", key="fit.download", on_click="ignore")
        return str(path)


def checkpoint_zip(path: Path) -> bytes:
    """A checkpoint folder's config.json and weights as a zip, for download."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in ("config.json", "translator.safetensors"):
            archive.write(path / name, f"{path.name}/{name}")
    return buffer.getvalue()


def _target_chat_frame(target: str) -> ChatFrame | None:
    """The chat turns of a chat-tuned target (None for a base model, or one that cannot be loaded: its page says why)."""
    try:
        with st.spinner(f"Loading {target}…"):
            return get_model(target).chat_frame
    except MotVizError:
        return None


def _context_picker(target: str) -> tuple[str, QAExample | None, str | None, str]:
    mode = st.radio("Context", [DATASET_MODE, FREE_TEXT_MODE], key="sb.mode", horizontal=True)
    chat = _target_chat_frame(target)
    if mode == FREE_TEXT_MODE:
        where = " after the target's chat header" if chat is not None else ""
        text = st.text_area(f"Context text (translated as typed{where})", key="sb.text", height=160)
        question = st.text_input("Question (optional, for the Answers page)", key="sb.question")
        gold = st.text_input("Gold answer(s), separated by |", key="sb.gold")
        context, example, suffix = free_text_selection(text, question, gold, chat)
        return context, example, suffix, "free text"
    widget_default("sb.dataset", "squad", list(BUILTIN_DATASETS))
    name = st.selectbox("Dataset", list(BUILTIN_DATASETS), key="sb.dataset", format_func=DATASET_LABELS.get)
    try:
        examples = dataset_examples(name)
    except MotVizError as exc:
        show_error(exc)
        return "", None, None, DATASET_LABELS.get(name, name)
    if not 0 <= st.session_state["sb.example"] < len(examples):
        st.session_state["sb.example"] = 0
    index = st.number_input(f"Example (0–{len(examples) - 1})", min_value=0, max_value=len(examples) - 1,
                            step=1, key="sb.example")
    example = examples[int(index)]
    with st.expander("Question and gold answer", expanded=True):
        st.markdown(f"**Question:** {example.question}")
        if example.choices:
            labels = choice_label_texts(example)
            st.markdown("\n".join(f"- **{lab}**: {text}" for lab, text in zip(labels, example.choices)))
        st.markdown(f"**Gold:** {' | '.join(example.answers)}")
    prompt = build_prompt(example, chat)
    if chat is not None:
        st.caption("The target is chat-tuned: the prompt is wrapped in its chat template.")
    return prompt.context_text, example, prompt.suffix_text, f"{DATASET_LABELS.get(name, name)} #{int(index)}"


def sidebar() -> Selection:
    """Draw the shared sidebar; a Translate press (or the first visit) makes its values the applied selection."""
    with st.sidebar:
        st.subheader("Models and checkpoint")
        source, target = _model_picker("source"), _model_picker("target")
        checkpoint = _checkpoint_picker(source, target)
        st.subheader("Context")
        text, example, suffix, label = _context_picker(target)
        chosen = Selection(source, target, checkpoint, text, example, suffix, label)
        pressed = st.button("Translate", type="primary", width="stretch")
        if pressed or "applied" not in st.session_state:
            st.session_state["applied"] = chosen  # the first visit runs on the defaults without a click
            st.session_state[_LINK] = _link_of_widgets(source, target)
        elif st.session_state["applied"] != chosen:
            st.info("The inputs changed. Press **Translate** to apply them.", icon="ℹ️")
        _share()
    return st.session_state["applied"]


# ----- permalinks: the applied view in the URL (mot_viz.permalink) ---------------------------------

_LINK = "link.applied"  # the applied selection as a permalink.SidebarLink
_LINK_NOTES = "link.ignored"  # what an opened link held that was ignored: one warning, until a page run completes
_LINK_UNCHECKED = "link.unchecked"  # page options an opened link set that no widget_default has checked yet
_LINK_DRAWN = "link.drawn"  # linked page options that fit their widget's type this run: key -> value (checked at the end)
_LINK_DROP = "link.drop"  # linked page options to forget at the start of the next run (a widget holds them now)
_LINK_RERUN = "link.rerun"  # a linked page option was dropped during the run: rerun to show the one warning
MAX_REMEMBERED_TEXTS = 256  # long free texts this process can restore by digest
_LONG_TEXTS: OrderedDict[str, str] = OrderedDict()  # digest -> text; a link holds only the digest of these
_LONG_TEXTS_LOCK = threading.Lock()


def _remember_text(text: str) -> None:
    digest = text_digest(text)
    with _LONG_TEXTS_LOCK:
        _LONG_TEXTS[digest] = text
        _LONG_TEXTS.move_to_end(digest)
        while len(_LONG_TEXTS) > MAX_REMEMBERED_TEXTS:
            _LONG_TEXTS.popitem(last=False)


def _recall_text(digest: str) -> str | None:
    with _LONG_TEXTS_LOCK:
        return _LONG_TEXTS.get(digest)


def _restore_link() -> None:
    """A fresh session: seed the sidebar and page widgets from the URL's link before any widget is drawn."""
    state = st.session_state
    if "applied" in state or "link.restored" in state:
        return
    state["link.restored"] = True
    params = st.query_params.to_dict()
    if not params:
        return
    parsed = parse_link(params, models=list(BUNDLED_MODELS), checkpoints=list(available_checkpoints()),
                        datasets=list(BUILTIN_DATASETS), examples=EXAMPLES_PER_DATASET, recall_text=_recall_text)
    link = parsed.sidebar
    for role, key in (("source", "sb.source"), ("target", "sb.target")):
        if getattr(link, role):
            state[key] = getattr(link, role)
    for role, value in parsed.typed.items():  # not loaded from a link; offered under "other"
        state[f"sb.{role}_other"] = value
    if link.checkpoint:
        state["sb.pair"] = (link.source or DEFAULT_SOURCE, link.target or DEFAULT_TARGET)  # keeps it (_checkpoint_picker)
        state["sb.checkpoint"] = link.checkpoint
    if link.text is not None:
        state.update({"sb.mode": FREE_TEXT_MODE, "sb.text": link.text, "sb.question": link.question or "",
                      "sb.gold": link.gold or ""})
    elif link.dataset is not None or link.example is not None:
        state["sb.mode"] = DATASET_MODE
        if link.dataset is not None:
            state["sb.dataset"] = link.dataset
        if link.example is not None:
            state["sb.example"] = link.example
    state.update(parsed.page)
    state[_LINK_UNCHECKED] = set(parsed.page)
    if parsed.ignored:
        state[_LINK_NOTES] = parsed.ignored


def _check_linked_value(key: str, default: object, options: list | None) -> None:
    """Keep a page option an opened link set if it fits the widget's type and options; else drop it (and say so)."""
    state = st.session_state
    state[_LINK_UNCHECKED].discard(key)
    fits, value = check_value(state[key], default, options)
    if fits:
        state[key] = value
        state.setdefault(_LINK_DRAWN, {})[key] = value
        return
    state.setdefault(_LINK_NOTES, []).append(f"the page option {key[len(PAGE_PREFIX):]}={state[key]!r} "
                                             f"(the option takes values like {default!r})")
    state[_LINK_RERUN] = True  # the warning is drawn above the page: show it in a fresh run
    del state[key]


def _drop_linked_page_options(failed: bool) -> bool:
    """After a page run: forget linked page options the page could not use, and say which (True: rerun now).

    `failed`: the page raised, so every linked option not yet confirmed is suspect; otherwise those a widget
    replaced (a radio or select box shows its first choice for a value it does not offer).
    """
    state = st.session_state
    drawn = state.pop(_LINK_DRAWN, {})
    if failed:
        dropped = set(drawn) | state.get(_LINK_UNCHECKED, set())
        state[_LINK_UNCHECKED] = set()
    else:
        dropped = {key for key, value in drawn.items() if key in state and state[key] != value}
    if dropped:
        state[_LINK_DROP] = dropped
        many = len(dropped) > 1
        why = f"the page failed with {'them' if many else 'it'}" if failed else "not among the choices"
        names = ", ".join(f"{k[len(PAGE_PREFIX):]}={drawn[k]!r}" if k in drawn else k[len(PAGE_PREFIX):]
                          for k in sorted(dropped))
        state.setdefault(_LINK_NOTES, []).append(f"the page option{'s' if many else ''} {names} ({why})")
    return state.pop(_LINK_RERUN, False) or bool(dropped)


def _link_of_widgets(source: str, target: str) -> SidebarLink:
    """The sidebar's current choice as a link (what a Translate press applies)."""
    state = st.session_state
    checkpoint = state["sb.checkpoint_other"].strip() if state["sb.checkpoint"] == OTHER else state["sb.checkpoint"]
    if state["sb.mode"] == FREE_TEXT_MODE:
        if len(state["sb.text"]) > MAX_TEXT_IN_LINK:
            _remember_text(state["sb.text"])
        return SidebarLink(source, target, checkpoint, text=state["sb.text"], question=state["sb.question"],
                           gold=state["sb.gold"])
    return SidebarLink(source, target, checkpoint, dataset=state["sb.dataset"], example=int(state["sb.example"]))


def link_params() -> dict[str, str]:
    """The query parameters of this session's view: the applied selection and every page option."""
    state = st.session_state
    link = state.get(_LINK)
    pages = {k: state[k] for k in state.keys() if isinstance(k, str) and k.startswith(PAGE_PREFIX)}
    return {**(sidebar_params(link) if link is not None else {}), **page_params(pages)}


def _sync_link() -> dict[str, str]:
    """Write the view to the URL when it differs (setting query parameters does not rerun the script)."""
    params = link_params()
    if st.query_params.to_dict() != params:
        st.query_params.from_dict(params)
    return params


def python_code() -> str:
    """The "Copy as Python" snippet: library code that translates the applied context and prints per-layer numbers."""
    sel, link = applied_selection(), st.session_state.get(_LINK) or SidebarLink()
    path = Path(sel.checkpoint)
    shown = str(path.relative_to(REPO_ROOT)) if path.is_absolute() and path.is_relative_to(REPO_ROOT) else sel.checkpoint
    return python_snippet(sel.source, sel.target, shown, dataset=link.dataset, example=link.example,
                          text=link.text if link.dataset is None else None, examples_per_dataset=EXAMPLES_PER_DATASET,
                          max_context_tokens=MAX_CONTEXT_TOKENS)


def _share() -> None:
    """The sidebar's "Copy link" and "Copy as Python" for the applied selection."""
    params = _sync_link()
    with st.expander("Copy link"):
        st.caption("The address bar holds this view's link. Or append this to the app's address and page "
                   "(e.g. `…:8501/cache_error`):")
        st.code(query_string(params) or "(the defaults: no parameters)", language=None, wrap_lines=True)
    with st.expander("Copy as Python"):
        st.caption("The same translation with the library, printing the Per-layer cache error page's numbers "
                   "(run it from the repository root).")
        st.code(python_code(), language="python")


def applied_selection() -> Selection:
    """The selection the pages show (set by the sidebar that page_setup draws)."""
    if "applied" not in st.session_state:  # a page run on its own that skipped page_setup: draw the sidebar now
        return _setup()
    return st.session_state["applied"]


# True while app.py's navigation frame runs a page: the frame has drawn the sidebar for this run already
_FRAME_DREW_SIDEBAR: contextvars.ContextVar[bool] = contextvars.ContextVar("mot_viz_frame_sidebar", default=False)


def _setup() -> Selection:
    st.set_page_config(page_title="MoT Viz", page_icon="🔀", layout="wide")
    _restore_link()
    for key in st.session_state.pop(_LINK_DROP, ()):  # linked page options that failed: their defaults apply
        st.session_state.pop(key, None)
    keep_widget_state()
    if st.session_state.get(_LINK_NOTES):  # until a page run completes (a rerun may come first)
        st.warning("This link holds values the app cannot restore, so it shows the defaults instead of: "
                   + "; ".join(st.session_state[_LINK_NOTES]) + ".", icon="⚠️")
    return sidebar()


@contextlib.contextmanager
def navigation_frame():
    """The entry script's frame around ``st.navigation(...).run()``: draws the sidebar once for every page."""
    _setup()
    token = _FRAME_DREW_SIDEBAR.set(True)
    try:
        yield
    finally:  # also on st.stop / rerun, so a reused script thread starts clean
        _FRAME_DREW_SIDEBAR.reset(token)


def run_page(body: Callable[[], None]) -> None:
    """Every page's entry: the shared sidebar, then the page body; the one place an error becomes a message.

    A library error shows its fix; anything else a short message with a "Details" expander, never a bare
    traceback. st.stop and reruns are BaseExceptions and pass through. A completed run writes the view to the URL.
    """
    page_setup()
    try:
        body()
    except Exception as exc:
        if _drop_linked_page_options(failed=True):  # the page failed on options an opened link set: use defaults
            st.rerun()
        show_error(exc)
    if _drop_linked_page_options(failed=False):  # a widget replaced a linked value it does not offer
        st.rerun()
    _sync_link()  # with the page options this run gave their first values
    st.session_state.pop(_LINK_NOTES, None)  # shown in this completed run


def page_setup() -> Selection:
    """The first call of every page: the shared sidebar, and the applied selection.

    Inside app.py's navigation frame the sidebar is already drawn and this only returns the selection. Streamlit
    also runs a file in pages/ on its own (a session that opens a page's URL before any session has run the entry
    script, or AppTest.switch_page); then this draws the sidebar itself.
    """
    return applied_selection() if _FRAME_DREW_SIDEBAR.get() else _setup()


# ----- page helpers --------------------------------------------------------------------------------


def explain(markdown: str) -> None:
    """The page's short teaching note."""
    with st.expander("What am I looking at?"):
        st.markdown(markdown)


def run_caption(run: Run) -> None:
    """One line naming the pair, checkpoint and context the page shows."""
    sel = run.selection
    st.caption(f"{sel.source} → {sel.target} · checkpoint `{Path(sel.checkpoint).name}` · context: {sel.label} "
               f"({len(run.target_tokens)} target / {len(run.source_tokens)} source tokens)")


def show_figure(fig: go.Figure, data: pd.DataFrame, name: str) -> None:
    """A plotly chart (PNG from its modebar camera) with a CSV download of the data behind it."""
    st.plotly_chart(fig, width="stretch", key=f"fig.{name}",
                    config={"toImageButtonOptions": {"format": "png", "filename": name, "scale": 2},
                            "displaylogo": False})
    st.download_button(f"Download the data (CSV): {name}.csv", data.to_csv(index=False).encode("utf-8"),
                       file_name=f"{name}.csv", mime="text/csv", key=f"dl.{name}", on_click="ignore")


def evaluation_table(config: dict) -> pd.DataFrame | None:
    """The QA results recorded in a checkpoint's config.json (metrics.evaluation; scripts/results_md.py --record):
    one row per dataset and condition with n, the metric, its 95% interval and the share of native kept."""
    evaluation = (config.get("metrics") or {}).get("evaluation")
    if not evaluation:
        return None
    rows = []
    try:
        for dataset, record in evaluation.items():
            for condition, values in record["conditions"].items():
                metric = next(k for k in values if k not in ("n", "ci95", "retained"))
                low, high = values["ci95"]
                rows.append({"dataset": dataset, "condition": CONDITION_LABELS.get(condition, condition),
                             "n": values["n"], "metric": metric, "mean": round(values[metric], 3),
                             "95% CI": f"[{low:.3f}, {high:.3f}]", "retained": f"{values['retained']:.1%}",
                             "prompts": record.get("prompts", "plain"), "results": record["results"]})
    except (AttributeError, KeyError, TypeError, ValueError, StopIteration) as exc:
        raise CheckpointError(f"metrics.evaluation in the checkpoint's config.json is malformed ({type(exc).__name__}: "
                              f"{exc}). Record it again with scripts/results_md.py --record.") from exc
    return pd.DataFrame(rows)


def read_training_log(checkpoint: str, name: str = "log.jsonl") -> pd.DataFrame | None:
    """The checkpoint's log.jsonl (or bank_log.jsonl) as a DataFrame (one row per logged step), or None without one."""
    path = Path(checkpoint) / name
    if not path.is_file():
        return None
    rows = read_log(path)  # a torn last line (an interrupted append) is skipped
    return pd.DataFrame(rows) if rows else None
