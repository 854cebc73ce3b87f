"""Cross-tokenizer alignment by character-span overlap (method.md §2).

Both tokenizations are placed on one reference text; each target token is then a mixture of the
source tokens that share characters with it. The translator therefore always works on the target
token grid.

A target token shares characters with a few source tokens only, so the overlap is kept as its nonzero
(target, source, shared characters) triples, found span by span: linear in the text's length. The dense
[N_t, N_s] matrices of method.md §2 are built on demand, for views that show them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ..errors import ContextError

DENSE_CHUNK = 1024  # rows per dense block where spans are out of order (bounded memory)


@dataclass
class TokenAlignment:
    """Alignment of one text's source tokens to its target tokens (a batch of 1), stored sparse."""

    target_index: torch.Tensor  # [K] long: the target token of each nonzero overlap, in row-major order
    source_index: torch.Tensor  # [K] long: its source token
    shared: torch.Tensor  # [K] float64: characters they share (after the empty-row fix), all > 0
    target_to_source: torch.Tensor  # [1, N_t] long
    source_to_target: torch.Tensor  # [1, N_s] long
    target_spans: list[tuple[int, int]]  # character spans of the target tokens over the reference text
    source_spans: list[tuple[int, int]]

    @cached_property  # the alignment is never changed after it is made
    def pair_weights(self) -> torch.Tensor:
        """[K] float32: A[t, s] = O[t, s] / max(Σ_s O[t, s], 1) at each nonzero overlap (rows sum to 1)."""
        n_t = self.target_to_source.shape[1]
        row_sum = torch.zeros(n_t, dtype=torch.float64).index_add_(0, self.target_index, self.shared)
        return (self.shared / row_sum.clamp(min=1)[self.target_index]).float()

    @cached_property
    def overlap(self) -> torch.Tensor:
        """[N_t, N_s] shared characters, dense (quadratic in the length: for views of short texts)."""
        return self._dense(self.shared.float())

    @cached_property
    def weights(self) -> torch.Tensor:
        """[1, N_t, N_s] alignment weights, dense (quadratic in the length: for views of short texts)."""
        return self._dense(self.pair_weights)[None]

    def _dense(self, values: torch.Tensor) -> torch.Tensor:
        shape = (self.target_to_source.shape[1], self.source_to_target.shape[1])
        return torch.zeros(shape, dtype=values.dtype).index_put_((self.target_index, self.source_index), values)

    @cached_property
    def identity(self) -> bool:
        n_t, n_s = self.target_to_source.shape[1], self.source_to_target.shape[1]
        ar = torch.arange(n_t)
        return (n_t == n_s and self.target_index.shape[0] == n_t and torch.equal(self.target_index, ar)
                and torch.equal(self.source_index, ar) and bool((self.pair_weights == 1).all()))

    @cached_property
    def nonzero(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per batch row, the (target index, source index, weight) of every nonzero weight: a few per target token."""
        return [(self.target_index, self.source_index, self.pair_weights)]


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
    """Length of the common prefix of a and b, by bisection over slice comparisons (each one runs in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid)
    return lo


def char_spans(tokenizer, ids: list[int], text: str) -> list[tuple[int, int]]:
    """Character span of each token of `ids` over `text` (fast path: offsets; fallback: decode prefixes).

    The fallback, for tokenizers without offsets or whose re-encoding of `text` differs from `ids`, decodes every
    prefix of `ids`: quadratic in the length, where the fast path is linear.
    """
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


def _ordered(x: torch.Tensor) -> bool:
    return bool((x[1:] >= x[:-1]).all())


def _overlap_pairs(t: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target spans t [N_t, 2] and source spans s [N_s, 2] -> (t index, s index, shared characters) of every pair
    sharing characters, in row-major order."""
    (tb, te), (sb, se) = t.T.contiguous(), s.T.contiguous()
    if _ordered(sb) and _ordered(se):
        # the sources a target span can share characters with are one run: from the first ending after its start
        # to the last starting before its end
        lo = torch.searchsorted(se, tb, right=True)
        counts = (torch.searchsorted(sb, te) - lo).clamp(min=0)
        ti = torch.repeat_interleave(torch.arange(len(t)), counts)
        si = lo[ti] + torch.arange(len(ti)) - (counts.cumsum(0) - counts)[ti]
    else:  # spans out of order (no tokenizer seen so far): every pair, a block of target rows at a time
        pairs = []
        for i in range(0, len(t), DENSE_CHUNK):
            o = torch.minimum(te[i:i + DENSE_CHUNK, None], se) - torch.maximum(tb[i:i + DENSE_CHUNK, None], sb)
            rows, cols = (o > 0).nonzero(as_tuple=True)
            pairs.append((rows + i, cols))
        ti, si = (torch.cat(p) for p in zip(*pairs)) if pairs else (torch.zeros(0, dtype=torch.long),) * 2
    shared = torch.minimum(te[ti], se[si]) - torch.maximum(tb[ti], sb[si])
    keep = shared > 0
    return ti[keep], si[keep], shared[keep]


def _nearest(points: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """For each point, the index of the centre closest to it; ties go to the lowest index (as argmin's)."""
    n = len(centres)
    if _ordered(centres):
        i = torch.searchsorted(centres, points)  # the first centre >= the point
        left, right = (i - 1).clamp(min=0), i.clamp(max=n - 1)
        take_left = (i > 0) & ((i == n) | (points - centres[left] <= centres[right] - points))
        # equal centres: the first of the left one's value (the right one is already the first of its value)
        return torch.where(take_left, torch.searchsorted(centres, centres[left]), right)
    return torch.cat([(points[i:i + DENSE_CHUNK, None] - centres).abs().argmin(1)
                      for i in range(0, len(points), DENSE_CHUNK)] or [torch.zeros(0, dtype=torch.long)])


def _first_argmax(group: torch.Tensor, index: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    """Per group 0..n-1, the lowest index among its entries of largest value (argmax's tie rule); -1 where none."""
    best = torch.zeros(n, dtype=values.dtype).scatter_reduce(0, group, values, "amax")  # values are > 0
    top = values == best[group]
    first = torch.full((n,), torch.iinfo(torch.long).max).scatter_reduce(0, group[top], index[top], "amin")
    return first.masked_fill(best == 0, -1)


def align_spans(target_spans: list[tuple[int, int]], source_spans: list[tuple[int, int]]) -> TokenAlignment:
    """The alignment of two span lists over one text (method.md §2), in time linear in their lengths.

    O[t, s] = shared characters; an all-zero row gets a 1 at the source span with the nearest centre (lowest
    index on ties). Weights A = O / max(row sum, 1); target_to_source = argmax over each row of O;
    source_to_target = argmax over each column, or where a column is all zero the target span with the
    nearest centre. Argmax ties go to the lowest index.
    """
    t = torch.tensor(target_spans, dtype=torch.long).view(-1, 2)
    s = torch.tensor(source_spans, dtype=torch.long).view(-1, 2)
    n_t, n_s = len(t), len(s)
    t_centre, s_centre = t.double().sum(1) / 2, s.double().sum(1) / 2
    ti, si, shared = _overlap_pairs(t, s)
    empty = torch.ones(n_t, dtype=torch.bool).index_fill_(0, ti, False).nonzero().squeeze(1)
    if len(empty):
        ti, si = torch.cat([ti, empty]), torch.cat([si, _nearest(t_centre[empty], s_centre)])
        shared = torch.cat([shared, torch.ones_like(empty)])
        order = (ti * n_s + si).argsort()  # back to row-major order (the added pairs are new cells)
        ti, si, shared = ti[order], si[order], shared[order]
    shared = shared.double()
    t2s = _first_argmax(ti, si, shared, n_t)
    s2t = _first_argmax(si, ti, shared, n_s)
    no_target = (s2t < 0).nonzero().squeeze(1)
    s2t[no_target] = _nearest(s_centre[no_target], t_centre)
    return TokenAlignment(target_index=ti, source_index=si, shared=shared, target_to_source=t2s[None],
                          source_to_target=s2t[None], target_spans=target_spans, source_spans=source_spans)


def align_ids(source_tokenizer, source_ids: list[int], target_tokenizer, target_ids: list[int],
              text: str | None = None) -> TokenAlignment:
    """Align one row. `text` is the reference text; by default the decoded target ids."""
    text = decode(target_tokenizer, target_ids) if text is None else text
    return align_spans(char_spans(target_tokenizer, target_ids, text), char_spans(source_tokenizer, source_ids, text))


def identity_alignment(n: int) -> TokenAlignment:
    """The alignment used when source and target share the tokenizer and the ids (method.md §2)."""
    ar = torch.arange(n)
    spans = [(i, i + 1) for i in range(n)]
    return TokenAlignment(ar, ar, torch.ones(n, dtype=torch.float64), ar[None], ar[None], spans, spans)


def apply_alignment(block: torch.Tensor, alignment: TokenAlignment) -> torch.Tensor:
    """Source block [B, N_s, W, H] -> target grid [B, N_t, W, H] by the alignment weights.

    A target token overlaps a few source tokens, so only the nonzero weights are applied (linear in the
    length; the dense product is quadratic).
    """
    n_t = alignment.target_to_source.shape[1]
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
