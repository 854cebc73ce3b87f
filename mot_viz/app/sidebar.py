"""The shared sidebar: the model, checkpoint and context pickers, the quick-fit control, and the Selection that a
Translate press (or the first visit) applies."""

from __future__ import annotations


import streamlit as st

from ..data.eval_data import BUILTIN_DATASETS
from ..engine.checkpoint import checkpoint_zip
from ..engine.model_files import BUNDLED_MODELS
from ..engine.synthetic import NO_QUALITY, SYNTHETIC_ALIGNMENT, is_synthetic, synthetic_names
from ..engine.prompts import ChatFrame, QAExample, build_prompt, free_text_selection
from ..errors import MotVizError
from ..train.quickfit import QuickFitConfig, fit_pair, fits_dir
from .links import LINK, link_of_widgets, share
from .loaders import (FIT_PREFIX, available_checkpoints, checkpoints_for_pair, dataset_examples, default_checkpoint,
                      get_model)
from .openings import DEFAULT_DATASET
from .page import choices_text, escape_markdown, show_error, show_text, widget_default
from .settings import DATASET_LABELS, DATASET_MODE, FREE_TEXT_MODE, OTHER, pretrained_dir, test_mode
from .state import Selection


def _model_picker(role: str) -> str:
    key = f"sb.{role}"
    options = [*BUNDLED_MODELS, *synthetic_names(), OTHER]
    widget_default(key, options[0], options)
    choice = st.selectbox(f"{role.capitalize()} model", options, key=key,
                          format_func=lambda n: n if n == OTHER else f"{n} (random weights: cost, no quality)"
                          if is_synthetic(n) else f"{n} (bundled)")
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
    """"Fit a linear translator for this pair" (mot_viz.train.quickfit); returns the checkpoint path it just fitted."""
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


def _target_chat_frame(target: str) -> ChatFrame | None:
    """The chat turns of a chat-tuned target (None for a base model, or one that cannot be loaded: its page says why)."""
    try:
        with st.spinner(f"Loading {escape_markdown(target)}…"):
            note = st.empty()  # a first load's one-time steps (a .gguf file is converted once, with its progress)
            frame = get_model(target, progress=lambda m: note.info(escape_markdown(m), icon="⏳")).chat_frame
            note.empty()
            return frame
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
    widget_default("sb.dataset", DEFAULT_DATASET, list(BUILTIN_DATASETS))
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
        show_text("Question", example.question)
        if example.choices:
            show_text("Choices", choices_text(example))
        show_text("Gold", " | ".join(example.answers))
    prompt = build_prompt(example, chat)
    if chat is not None:
        st.caption("The target is chat-tuned: the prompt is wrapped in its chat template.")
    return prompt.context_text, example, prompt.suffix_text, f"{DATASET_LABELS.get(name, name)} #{int(index)}"


def sidebar() -> Selection:
    """Draw the shared sidebar; a Translate press (or the first visit) makes its values the applied selection."""
    with st.sidebar:
        st.subheader("Models and checkpoint")
        source, target = _model_picker("source"), _model_picker("target")
        if is_synthetic(source) or is_synthetic(target):
            st.warning(f"{NO_QUALITY.capitalize()}. {SYNTHETIC_ALIGNMENT.capitalize()}: a context is token ids written "
                       "as numbers ('17 4021 883'), any other word reads as <unk>. A synthetic pair's translator is a "
                       "recipe's shape with seeded random weights, written by "
                       "`python -m mot_viz.train.synthetic_checkpoint --source … --target … --out …` (never a checkpoint "
                       "of real models).", icon="⚠️")
        checkpoint = _checkpoint_picker(source, target)
        st.subheader("Context")
        text, example, suffix, label = _context_picker(target)
        chosen = Selection(source, target, checkpoint, text, example, suffix, label)
        pressed = st.button("Translate", type="primary", width="stretch")
        applied_now = pressed or "applied" not in st.session_state
        if applied_now:
            st.session_state["applied"] = chosen  # the first visit runs on the defaults without a click
            st.session_state[LINK] = link_of_widgets(source, target)
        elif st.session_state["applied"] != chosen:
            st.info("The inputs changed. Press **Translate** to apply them.", icon="ℹ️")
        share(st.session_state["applied"], applied_now)
    return st.session_state["applied"]
