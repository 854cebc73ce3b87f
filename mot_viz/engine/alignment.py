"""Cross-tokenizer alignment by character-span overlap (method.md §2).

Both tokenizations are placed on one reference text; each target token is then a mixture of the
source tokens that share characters with it. The translator therefore always works on the target
token grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ..errors import ContextError


@dataclass
class TokenAlignment:
    """Alignment of one text's source tokens to its target tokens (batch of 1 or more, same lengths)."""

    weights: torch.Tensor  # [B, N_t, N_s], rows sum to 1
    target_to_source: torch.Tensor  # [B, N_t] long
    source_to_target: torch.Tensor  # [B, N_s] long
    target_spans: list[tuple[int, int]]  # character spans of the target tokens over the reference text
    source_spans: list[tuple[int, int]]
    overlap: torch.Tensor  # [N_t, N_s] shared characters (after the empty-row fix)

    @cached_property  # the weights are never changed after alignment
    def identity(self) -> bool:
        n_t, n_s = self.weights.shape[-2:]
        return n_t == n_s and bool(torch.equal(self.weights[0], torch.eye(n_t, dtype=self.weights.dtype)))

    @cached_property
    def nonzero(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per batch row, the (target index, source index, weight) of every nonzero weight: a few per target token."""
        return [(*w.nonzero(as_tuple=True), w[w != 0]) for w in self.weights]


def decode(tokenizer, ids: list[int]) -> str:
    """The reference decoding: special tokens kept, tokenization spaces not cleaned up."""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def check_text(text: str) -> None:
    """Raise ContextError if `text` is not valid Unicode (a lone surrogate, e.g. from a JSON "\\ud800" escape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a tokenizer would fail with a bare TypeError
        raise ContextError(
            f"The text holds a lone surrogate character (U+{ord(text[exc.start]):04X} at character {exc.start:,}), "
            "which is not valid Unicode, so no tokenizer can read it. Remove that character, or re-save the text "
            "as UTF-8."
        ) from None


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of `text` without special tokens (no BOS anywhere, method.md §2); every text the library
    tokenizes (contexts, questions, training passages) comes through here, so here it is checked (check_text)."""
    check_text(text)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def char_spans(tokenizer, ids: list[int], text: str) -> list[tuple[int, int]]:
    """Character span of each token of `ids` over `text` (fast path: offsets; fallback: decode prefixes)."""
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) == list(ids) and len(enc["offset_mapping"]) == len(ids):
            return [(int(b), int(e)) for b, e in enc["offset_mapping"]]
    except (NotImplementedError, TypeError, ValueError):
        pass  # slow tokenizers have no offsets
    spans, prev = [], 0
    for k in range(1, len(ids) + 1):
        c = _common_prefix_len(text, decode(tokenizer, ids[:k]))
        end = min(max(c, prev), len(text))
        spans.append((prev, end))
        prev = end
    if spans and spans[-1][1] < len(text):
        spans[-1] = (spans[-1][0], len(text))
    return spans


def overlap_matrix(target_spans: list[tuple[int, int]], source_spans: list[tuple[int, int]]) -> torch.Tensor:
    """O[t, s] = shared characters; an all-zero row gets a 1 at the source span with the nearest centre."""
    t = torch.tensor(target_spans, dtype=torch.float64).view(-1, 2)
    s = torch.tensor(source_spans, dtype=torch.float64).view(-1, 2)
    o = (torch.minimum(t[:, None, 1], s[None, :, 1]) - torch.maximum(t[:, None, 0], s[None, :, 0])).clamp(min=0)
    empty = o.sum(1) == 0
    if empty.any():
        centre_dist = ((t[:, None, 0] + t[:, None, 1]) / 2 - (s[None, :, 0] + s[None, :, 1]) / 2).abs()
        nearest = centre_dist.argmin(1)  # argmin returns the first (lowest) index on ties
        o[empty, nearest[empty]] = 1.0
    return o


def align_ids(source_tokenizer, source_ids: list[int], target_tokenizer, target_ids: list[int],
              text: str | None = None) -> TokenAlignment:
    """Align one row. `text` is the reference text; by default the decoded target ids."""
    text = decode(target_tokenizer, target_ids) if text is None else text
    t_spans = char_spans(target_tokenizer, target_ids, text)
    s_spans = char_spans(source_tokenizer, source_ids, text)
    o = overlap_matrix(t_spans, s_spans)
    weights = o / o.sum(1, keepdim=True).clamp(min=1)
    t2s = o.argmax(1)
    s2t = o.argmax(0)
    no_target = o.sum(0) == 0
    if no_target.any():
        t = torch.tensor(t_spans, dtype=torch.float64)
        s = torch.tensor(s_spans, dtype=torch.float64)
        dist = ((s[:, None, 0] + s[:, None, 1]) / 2 - (t[None, :, 0] + t[None, :, 1]) / 2).abs()
        s2t[no_target] = dist.argmin(1)[no_target]
    return TokenAlignment(
        weights=weights.float()[None], target_to_source=t2s[None], source_to_target=s2t[None],
        target_spans=t_spans, source_spans=s_spans, overlap=o.float(),
    )


def identity_alignment(n: int) -> TokenAlignment:
    """The alignment used when source and target share the tokenizer and the ids (method.md §2)."""
    ar = torch.arange(n)
    spans = [(i, i + 1) for i in range(n)]
    return TokenAlignment(torch.eye(n)[None], ar[None], ar[None], spans, spans, torch.eye(n))


def apply_alignment(block: torch.Tensor, alignment: TokenAlignment) -> torch.Tensor:
    """Source block [B, N_s, W, H] -> target grid [B, N_t, W, H] by the alignment weights.

    A target token overlaps a few source tokens, so only the nonzero weights are applied (linear in the
    length; the dense product is quadratic).
    """
    n_t = alignment.weights.shape[1]
    rows = []
    for row, (t, s, w) in zip(block, alignment.nonzero):
        weighted = row[s] * w.to(block)[:, None, None]
        rows.append(block.new_zeros(n_t, *block.shape[2:]).index_add(0, t.to(block.device), weighted))
    return torch.stack(rows)


def remap_sparse_indices(indices: torch.Tensor, alignment: TokenAlignment) -> torch.Tensor:
    """Source top-k key indices [B, 1, N_s, k] -> target [B, 1, N_t, k]; duplicates become the sentinel N_t."""
    n_s = indices.shape[2]
    n_t = alignment.target_to_source.shape[1]
    target_to_source = alignment.target_to_source.to(indices.device)
    rows = indices[:, 0].gather(1, target_to_source[..., None].expand(-1, -1, indices.shape[-1]))
    mapped = alignment.source_to_target.to(indices.device).gather(1, rows.clamp(0, n_s - 1).flatten(1)).view_as(rows)
    # entry j repeats an entry i < j of its row: sorted by (index, rank), such an entry follows an equal index
    k = mapped.shape[-1]
    order = (mapped * k + torch.arange(k, device=mapped.device)).argsort(dim=-1)  # distinct keys: a stable order
    ranked = mapped.gather(-1, order)
    repeat = torch.zeros_like(ranked, dtype=torch.bool)
    repeat[..., 1:] = ranked[..., 1:] == ranked[..., :-1]
    duplicate = torch.zeros_like(repeat).scatter_(-1, order, repeat)
    return mapped.masked_fill(duplicate, n_t)[:, None]
