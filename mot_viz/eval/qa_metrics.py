"""QA metrics as pure functions: SQuAD token F1 and exact match, answer post-processing,
bootstrap confidence intervals, retained quality and the gap closed over no context (method.md §8, §12)."""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..sharing.names import FLOOR, REFERENCE

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# Generation runs past the answer into a new line or a new template field; cut it there (method.md §8).
_STOP_MARKERS = ("\n", "\r", "Question:", "Context:", "Answer:")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _as_golds(golds: str | Sequence[str]) -> list[str]:
    gold_list = [golds] if isinstance(golds, str) else list(golds)
    if not gold_list:
        raise ValueError("at least one gold answer is needed")
    return gold_list


def _token_f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        # both empty is a perfect match (e.g. an all-article answer); one empty shares nothing
        return float(pred_tokens == gold_tokens)
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_f1(prediction: str, golds: str | Sequence[str]) -> float:
    """SQuAD token F1 of ``prediction``, the maximum over the gold answers."""
    return max(_token_f1(prediction, gold) for gold in _as_golds(golds))


def exact_match(prediction: str, golds: str | Sequence[str]) -> float:
    """1.0 if ``prediction`` equals any gold answer after SQuAD normalisation, else 0.0."""
    normalized = normalize_answer(prediction)
    return float(any(normalized == normalize_answer(gold) for gold in _as_golds(golds)))


def postprocess_generation(text: str) -> str:
    """Strip a generated answer and cut it at the first newline, ``Question:``, ``Context:`` or ``Answer:``."""
    text = text.strip()
    cut = min((i for i in (text.find(m) for m in _STOP_MARKERS) if i >= 0), default=len(text))
    return text[:cut].strip()


class ConfidenceInterval(NamedTuple):
    """A mean with its bootstrap interval; unpacks as ``(mean, lo, hi)``."""

    mean: float
    lo: float
    hi: float


def bootstrap_ci(
    values: Sequence[float] | np.ndarray, n_boot: int = 1000, seed: int = 0, alpha: float = 0.05
) -> ConfidenceInterval:
    """Mean of ``values`` and its percentile-bootstrap ``1 - alpha`` interval.

    Deterministic for a given ``seed``. Empty input gives NaNs; a single value gives a zero-width interval.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be positive, got {n_boot}")
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        return ConfidenceInterval(math.nan, math.nan, math.nan)
    mean = float(x.mean())
    rng = np.random.default_rng(seed)
    resampled = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)  # (n_boot,)
    lo, hi = np.quantile(resampled, [alpha / 2, 1 - alpha / 2])
    return ConfidenceInterval(mean, float(lo), float(hi))


def retained(translated: float, native: float) -> float:
    """Retained quality: translated metric ÷ native-context metric (method.md §12); NaN when native is 0 or NaN."""
    if native == 0 or math.isnan(native) or math.isnan(translated):
        return math.nan
    return translated / native


def paired_ratios(native: np.ndarray, none: np.ndarray, value: np.ndarray, n_boot: int = 1000,
                  seed: int = 0) -> dict[str, float]:
    """Retention (value ÷ native) and gap closed, the share of the context's gain captured ((value − none) ÷
    (native − none): 0 = no better than no context, 1 = native), of one condition's scores on the same examples
    (arrays of one length; `none` all NaN when no context was not run), each with a paired percentile-bootstrap 95%
    interval over the same resamples. Retention reads 21% for a condition no better than no context where no context
    itself keeps 21%; gap closed reads 0 there."""
    native, none, value = (np.asarray(a, dtype=np.float64) for a in (native, none, value))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(value), size=(n_boot, len(value)))  # (n_boot, n): the same resamples for every ratio
    m_native, m_none, m_value = native[idx].mean(1), none[idx].mean(1), value[idx].mean(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        retention = m_value / m_native
        gap = (m_value - m_none) / (m_native - m_none)
        point_r = value.mean() / native.mean() if native.mean() else np.nan
        point_g = (value.mean() - none.mean()) / (native.mean() - none.mean()) if native.mean() != none.mean() \
            else np.nan
    out = {"retention": float(point_r), "gap_closed": float(point_g)}
    for name, boots in (("retention", retention), ("gap_closed", gap)):
        finite = boots[np.isfinite(boots)]
        lo, hi = np.quantile(finite, [0.025, 0.975]) if finite.size else (np.nan, np.nan)
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = float(lo), float(hi)
    return out


def condition_ratios(wide: pd.DataFrame, condition: str, n_boot: int, seed: int) -> dict:
    """Retention and gap closed of one condition, with paired bootstrap intervals over the same documents (wide: a
    row per document, a column per condition; "native" needed, "no_context" for the gap): paired_ratios."""
    none = wide[FLOOR].to_numpy() if FLOOR in wide else np.full(len(wide), np.nan)
    return paired_ratios(wide[REFERENCE].to_numpy(), none, wide[condition].to_numpy(), n_boot, seed)
