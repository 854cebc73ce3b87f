"""The mean-vector baseline (method.md §13): every token's window K/V replaced by one mean native vector per layer.

A window with no context in it: the floor a translation must beat, scored by the fidelity CLI, the evaluator's
"mean" condition and the app's pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.alignment import decode, encode
from ..engine.layout import window_blocks
from ..engine.models import LoadedModel
from ..engine.mot import native_cache, target_context_ids
from .bank import corpus_passages

REFERENCE_PASSAGES = 40  # LAMBADA training passages behind the mean-vector baseline (fidelity CLI, evaluator)


@dataclass
class MeanVectors:
    """The mean native K and V of each window layer over reference prose, [W, H_T] each (cache space)."""

    keys: torch.Tensor
    values: torch.Tensor
    corpus: str
    tokens: int

    def blocks(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean-vector window for n tokens: K and V blocks [1, n, W, H_T], every token the same."""
        return (self.keys.expand(1, n, -1, -1).contiguous(), self.values.expand(1, n, -1, -1).contiguous())


@torch.no_grad()
def mean_vectors(target: LoadedModel, layers, texts: list[str], corpus: str) -> MeanVectors:
    """Token-weighted mean native window K/V of the target over `texts`."""
    sums_k = sums_v = None
    tokens = 0
    p = len(target.prefix_ids)
    for text in texts:
        ids = target_context_ids(target, text)
        kv = native_cache(target, ids)
        k, v = window_blocks(kv, layers, p)  # (1, N, W, H)
        sums_k = k[0].sum(0) if sums_k is None else sums_k + k[0].sum(0)
        sums_v = v[0].sum(0) if sums_v is None else sums_v + v[0].sum(0)
        tokens += k.shape[1]
    return MeanVectors(sums_k / tokens, sums_v / tokens, corpus, tokens)


def reference_means(target: LoadedModel, layers, passages: int = REFERENCE_PASSAGES) -> MeanVectors:
    """The mean-vector baseline's reference: the mean native window over the first `passages` LAMBADA passages."""
    return mean_vectors(target, layers, heldout_texts(target, "lambada", passages), "lambada")


def heldout_texts(target: LoadedModel, corpus: str, n: int, max_tokens: int = 448) -> list[str]:
    """`n` held-out passages of `corpus` (mot_viz.train.bank.CORPORA), each cut to at most `max_tokens` target tokens."""
    texts = []
    for passage in corpus_passages(corpus):
        ids = encode(target.tokenizer, passage.strip())
        if len(ids) >= 32:
            texts.append(decode(target.tokenizer, ids[:max_tokens]))
        if len(texts) == n:
            break
    return texts
