"""The Streamlit app's shared parts: the sidebar, the cached loaders and the one cached translation per input.

The only part of mot_viz that imports Streamlit. Every page reads the *applied* selection (what the
last "Translate" — or the first visit — chose) through :func:`current_run`; the translation of one
(source, target, checkpoint, context) is computed once and shared by every page and every browser tab.
Cached objects are never mutated. The applied selection and every page option (``pg.*`` widget key) not at its
default live in the URL's query parameters (mot_viz.app.permalink), so a reload or a copied link opens the same view.

Pages read ``from mot_viz import app`` and call ``app.run_page(main)``, ``app.current_run()``, … The modules,
each importing only those above it:

* ``permalink`` — the pure part of links: a view as query parameters and back, checked value by value;
* ``settings`` — where the checkpoints live, test mode (``MOT_VIZ_TEST_MODELS=1``), limits and defaults;
* ``state`` — ``Selection`` (the inputs of one translation) and ``Run`` (what a page shows for it);
* ``openings`` — what the app and each page open on, and why (the shipped results that chose it);
* ``loaders`` — the cached loaders: checkpoints on offer, models, checkpoints, translations, answers, fidelity;
* ``long_context`` — the Long context page's loaders: one long document evaluated, the shipped results;
* ``multi_agent`` — the Multi-agent page's loaders: one CoQA conversation answered turn by turn, the shipped results,
  one document read in shards by several source agents;
* ``methods`` — the Methods page's loaders: which ways of sharing the pair offers (each finds and loads its own
  artifact), each one's cache and answer;
* ``patching`` — the Layer patching page's loaders: one method's patching scan of the applied context;
* ``lesson`` — the Lesson page's steps, each drawn by its page's own functions (the heavy ones in a background
  thread), and the lesson file of a run;
* ``presenter`` — presenter mode: no sidebar or explanation boxes, larger text and figures, the arrow keys;
* ``links`` — the applied view in ``st.query_params`` and back (the pure part is mot_viz.app.permalink);
* ``page`` — what a page draws with (``explain``, ``method_picture``, ``run_caption``, ``show_figure``,
  ``show_error``) and keyed widgets' first values (``widget_default``);
* ``sidebar`` — the model, checkpoint and context pickers, the quick-fit control;
* ``frame`` — every page run's frame: ``run_page``, ``navigation_frame``, ``current_run`` → ``Run``;
* ``results_folders`` — the Evaluations page's results folders: the shipped ones or one typed, each read once while
  its files are unchanged, and the picker that chooses one;
* ``run_layers`` — the Evaluations page's per-layer sections of a folder (layer_error.csv, patching.csv);
* ``live_run`` and ``live_panel`` — an evaluation run from the app as a process of its own (no Streamlit), and the
  Evaluations page's panel that starts, follows, stops and resumes it;
* ``server`` — starts the app in a subprocess (benchmarks and the browser test).
"""

from .frame import applied_selection, current_run, fragment, navigation_frame, page_setup, run_page
from .links import eval_run_views, link_params, python_code
from .long_context import LongView, long_document, shipped_long_results
from .multi_agent import ConversationView, ShardView, conversation_view, shard_view, shipped_conversation_results
from .loaders import (CONTROL_SEED, FIT_PREFIX, answer_rows, available_checkpoints, checkpoint_stamp,
                      checkpoints_for_pair, dataset_examples, default_checkpoint, first_token_kl, get_checkpoint,
                      get_model, get_translation, lens_at, lens_trace, linear_baseline_for, live_sweep, second_translation, translation_key,
                      verdict_validation, what_if_pair, window_analysis, window_fidelity)
from .page import (NO_SECOND, SecondRun, choices_text, escape_markdown, explain, keep_widget_state, method_picture,
                   question_header, run_caption, second_checkpoint, second_run, show_error, show_figure, show_text, widget_default)
from .settings import (DEFAULT_CHECKPOINT, DEFAULT_MAX_NEW_TOKENS, EXAMPLES_PER_DATASET, MAX_CONTEXT_TOKENS, REPO_ROOT,
                       pretrained_dir, test_mode)
from .sidebar import quickfit_config, sidebar
from .state import Run, Selection

__all__ = [
    "CONTROL_SEED", "ConversationView", "conversation_view", "shipped_conversation_results", "ShardView", "shard_view",
    "DEFAULT_CHECKPOINT", "DEFAULT_MAX_NEW_TOKENS", "EXAMPLES_PER_DATASET", "FIT_PREFIX", "LongView",
    "MAX_CONTEXT_TOKENS", "NO_SECOND", "REPO_ROOT", "Run", "SecondRun", "Selection", "answer_rows",
    "applied_selection", "available_checkpoints", "checkpoint_stamp", "checkpoints_for_pair", "choices_text",
    "question_header",
    "current_run", "dataset_examples", "default_checkpoint", "escape_markdown", "eval_run_views", "explain",
    "first_token_kl",
    "fragment", "get_checkpoint", "get_model", "get_translation", "keep_widget_state", "lens_at", "lens_trace",
    "linear_baseline_for",
    "link_params", "live_sweep", "long_document", "method_picture", "navigation_frame", "page_setup", "pretrained_dir",
    "python_code",
    "quickfit_config", "run_caption", "run_page", "second_checkpoint", "second_run", "second_translation",
    "shipped_long_results", "show_error", "show_figure", "show_text", "sidebar", "test_mode", "translation_key",
    "verdict_validation", "what_if_pair", "widget_default", "window_analysis", "window_fidelity",
]
