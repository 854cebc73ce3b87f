"""Contexts as the target reads them in the shift analysis, and the caches replayed with an injected window.

A ContextCase is one context, its suffix and the teacher-forced answer tokens; ``window_caches``
replays the injected window and its controls (dir_only, mag_only, random) into whole caches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ...engine import hf
from ...engine.alignment import encode
from ...engine.controls import dir_only, mag_only, random_control_window
from ...engine.models import LoadedModel
from ...engine.mot import native_cache, target_context_ids
from ...engine.patching import answer_token_ids
from ...engine.prompts import QAExample, build_prompt
from ...errors import ConfigError

KV = hf.KV
WINDOW_CONDITIONS = ("full_mix", "dir_only", "mag_only", "random")


# ----- contexts -------------------------------------------------------------------------------------------


@dataclass
class ContextCase:
    """One context as the target reads it in the analysis."""

    target_ids: torch.Tensor  # [1, N_t] context tokens (cached; translated or perturbed)
    suffix_ids: torch.Tensor  # [1, S] appended natively; its last token is the seed
    answer_ids: list[int]  # teacher-forced answer tokens (≤ 4)
    context_text: str
    example: QAExample | None = None  # for the task metric; None for free text


def case_from_example(target: LoadedModel, example: QAExample, max_answer_tokens: int = 4) -> ContextCase:
    """The context, suffix and teacher-forced answer tokens of a QA example (prompts as in method.md §8)."""
    prompt = build_prompt(example, target.chat_frame)
    ids = target_context_ids(target, prompt.context_text)
    suffix = target.ids_tensor(encode(target.tokenizer, prompt.suffix_text))
    return ContextCase(ids, suffix, answer_token_ids(target.tokenizer, example, max_answer_tokens),
                       prompt.context_text, example)


@torch.no_grad()
def case_from_text(target: LoadedModel, context_text: str, suffix_text: str, example: QAExample | None = None,
                   max_answer_tokens: int = 4) -> ContextCase:
    """A context with its own suffix (e.g. typed in the app).

    The teacher-forced answer is the example's gold answer (or gold label) when it has one, else the
    native cache's own greedy answer tokens.
    """
    ids = target_context_ids(target, context_text)
    suffix = target.ids_tensor(encode(target.tokenizer, suffix_text or ""))
    if suffix.shape[1] == 0:
        raise ConfigError("the suffix is empty; the analysis needs at least the seed token (ask a question)")
    has_gold = example is not None and (example.kind == "closed" or any(a.strip() for a in example.answers))
    if has_gold:
        answer = answer_token_ids(target.tokenizer, example, max_answer_tokens)
    else:
        native = native_cache(target, ids)
        answer = hf.greedy_generate(target.model, native, suffix, max_answer_tokens,
                                    hf.eos_ids(target.model, target.tokenizer))
    if not answer:
        raise ConfigError("no answer tokens to teacher-force (the target stops at once): give a gold answer")
    return ContextCase(ids, suffix, answer, context_text, example if has_gold else None)


# ----- caches ---------------------------------------------------------------------------------------------


ReplayFn = Callable[[torch.Tensor, torch.Tensor], list[KV]]  # (K block, V block) [1, N, W, H] -> cache


@torch.no_grad()
def window_caches(replay_fn: ReplayFn, native_k: torch.Tensor, native_v: torch.Tensor, window_k: torch.Tensor,
                  window_v: torch.Tensor, conditions: Sequence[str] = WINDOW_CONDITIONS, seed: int = 0,
                  ready: dict[str, list[KV]] | None = None) -> dict[str, list[KV]]:
    """The caches replayed with the injected window and its controls (method.md §9.1, §9.2).

    native_*, window_*: blocks [1, N, W, H]. The random window is drawn K first, then V, from one
    generator seeded with `seed` (controls.random_control_window, as ``answers.random_control_cache`` draws it).
    Caches already replayed for some conditions (a Translation's mixed cache as "full_mix", the answers' random control of the same seed as
    "random") can be passed in `ready` to save their replays.
    """
    out: dict[str, list[KV]] = {}
    for cond in conditions:
        if cond in (ready or {}):
            out[cond] = ready[cond]
        elif cond == "full_mix":
            out[cond] = replay_fn(window_k, window_v)
        elif cond == "dir_only":
            out[cond] = replay_fn(dir_only(native_k, window_k), dir_only(native_v, window_v))
        elif cond == "mag_only":
            out[cond] = replay_fn(mag_only(native_k, window_k), mag_only(native_v, window_v))
        elif cond == "random":
            out[cond] = replay_fn(*random_control_window(native_k, native_v, window_k, window_v, seed))
        else:
            raise ConfigError(f"unknown window condition {cond!r}; choose from {WINDOW_CONDITIONS}")
    return out
