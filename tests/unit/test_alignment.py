"""Cross-tokenizer alignment (method.md §2), on the two real bundled tokenizers and by hand."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import AutoTokenizer

from mot_viz.engine.alignment import (align_ids, apply_alignment, char_spans, decode, encode, identity_alignment,
                                      overlap_matrix, remap_sparse_indices)
from mot_viz.engine.models import bundled_model_dir

TEXTS = {
    "plain": "The quick brown fox jumps over the lazy dog.",
    "spaces": "   leading and trailing spaces   ",
    "newlines": "line one\nline two\n\n  indented line three\n",
    "digits": "In 1969, 3 astronauts flew 384,400 km; pi is 3.14159.",
    "accents": "Café, naïve façade, Zürich, São Paulo, résumé.",
    "emoji": "I love it 😀🎉 — really! 👍🏽",
}


@functools.lru_cache(maxsize=None)
def real_tokenizer(name: str):
    return AutoTokenizer.from_pretrained(str(bundled_model_dir(name)))


@pytest.mark.parametrize("kind", sorted(TEXTS))
def test_real_tokenizers_align_with_rows_summing_to_one(kind):
    source, target = real_tokenizer("smollm2-135m"), real_tokenizer("gemma3-270m")
    t_ids = encode(target, TEXTS[kind])
    text = decode(target, t_ids)
    s_ids = encode(source, text)
    a = align_ids(source, s_ids, target, t_ids, text)
    n_t, n_s = len(t_ids), len(s_ids)
    assert a.weights.shape == (1, n_t, n_s)
    assert torch.allclose(a.weights.sum(-1), torch.ones(1, n_t), atol=1e-6)
    assert a.target_to_source.shape == (1, n_t) and a.source_to_target.shape == (1, n_s)
    assert int(a.target_to_source.max()) < n_s and int(a.source_to_target.max()) < n_t
    # spans tile the reference text in order, and each target token's text is what its span covers
    for spans in (a.target_spans, a.source_spans):
        assert spans[0][0] == 0 and spans[-1][1] == len(text)
        assert all(b1 <= b2 for (b1, _), (b2, _) in zip(spans, spans[1:]))
    # target→source points at an overlapping source token wherever the target token has characters
    for t, (b, e) in enumerate(a.target_spans):
        if e > b:
            s = int(a.target_to_source[0, t])
            sb, se = a.source_spans[s]
            assert min(e, se) > max(b, sb)


def test_decode_prefix_fallback_matches_offsets_on_plain_text():
    tok = real_tokenizer("smollm2-135m")
    text = TEXTS["plain"]
    ids = encode(tok, text)

    class NoOffsets:  # the same tokenizer without offset mappings: forces the decode-prefix path
        def __call__(self, *args, return_offsets_mapping=False, **kwargs):
            if return_offsets_mapping:
                raise NotImplementedError
            return tok(*args, **kwargs)

        def decode(self, *args, **kwargs):
            return tok.decode(*args, **kwargs)

    assert char_spans(NoOffsets(), ids, text) == char_spans(tok, ids, text)


def test_overlap_empty_row_goes_to_nearest_centre_lowest_index_on_ties():
    o = overlap_matrix([(0, 4), (4, 4), (4, 8)], [(0, 2), (2, 6), (6, 8)])
    assert o[1].tolist() == [0.0, 1.0, 0.0]  # empty span at 4: nearest source centre is (2,6)'s 4
    o = overlap_matrix([(5, 5)], [(0, 4), (6, 10)])  # centres 2 and 8 are both 3 away: lowest index
    assert o[0].tolist() == [1.0, 0.0]


def test_weights_by_hand():
    class CharTok:  # one token per character, or per pair of characters
        def __init__(self, width):
            self.width = width

        def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
            spans = [(i, min(i + self.width, len(text))) for i in range(0, len(text), self.width)]
            out = {"input_ids": list(range(len(spans)))}
            if return_offsets_mapping:
                out["offset_mapping"] = spans
            return out

    a = align_ids(CharTok(2), [0, 1, 2], CharTok(3), [0, 1], text="abcdef")
    # target "abc" shares 2 chars with "ab", 1 with "cd"; target "def" shares 1 with "cd", 2 with "ef"
    assert torch.allclose(a.weights[0], torch.tensor([[2 / 3, 1 / 3, 0], [0, 1 / 3, 2 / 3]]))
    assert a.target_to_source[0].tolist() == [0, 2]
    assert a.source_to_target[0].tolist() == [0, 0, 1]  # ties in column 1 go to the first target


def test_apply_alignment_and_index_remap():
    a = identity_alignment(4)
    block = torch.randn(1, 4, 2, 6)
    assert torch.equal(apply_alignment(block, a), block)
    idx = torch.tensor([[[[0, 0], [1, 0], [2, 1], [3, 3]]]])  # duplicates within a row
    out = remap_sparse_indices(idx, a)
    assert out.tolist() == [[[[0, 4], [1, 0], [2, 1], [3, 4]]]]  # repeated index -> sentinel N_t = 4
    # every later repeat of an entry becomes the sentinel, wherever it sits in the row (k = 32, many repeats)
    idx = torch.randint(0, 6, (1, 1, 4, 32), generator=torch.Generator().manual_seed(0)).clamp(max=3)
    out = remap_sparse_indices(idx, a)[0, 0].tolist()
    for row, got in zip(idx[0, 0].tolist(), out):
        assert got == [4 if v in row[:j] else v for j, v in enumerate(row)]
