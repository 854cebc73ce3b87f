"""Cross-tokenizer alignment (method.md §2), on the two real bundled tokenizers, the tiny test tokenizers and by
hand; the sparse, linear-time alignment equals the dense definition (a reference implementation kept here)."""

from __future__ import annotations

import functools
import random

import pytest
import torch
from transformers import AutoTokenizer

from mot_viz.engine.alignment import (align_ids, align_spans, apply_alignment, char_spans, decode, encode,
                                      identity_alignment, remap_sparse_indices)
from mot_viz.engine.model_files import bundled_model_dir
from mot_viz.engine.testing import TEST_MODELS, tiny_tokenizer

TEXTS = {
    "plain": "The quick brown fox jumps over the lazy dog.",
    "spaces": "   leading and trailing spaces   ",
    "newlines": "line one\nline two\n\n  indented line three\n",
    "digits": "In 1969, 3 astronauts flew 384,400 km; pi is 3.14159.",
    "accents": "Café, naïve façade, Zürich, São Paulo, résumé.",
    "emoji": "I love it 😀🎉 — really! 👍🏽",
}
AWKWARD = {  # characters a tokenizer splits into bytes (byte-level BPE, or SentencePiece's byte fallback)
    "whitespace runs": "a  b   c\t\t d \n\n\n   e\r\n f      \t",
    "zwj emoji": "family 👨‍👩‍👧‍👦, flags 🇫🇷🇯🇵, skin 👋🏿👋🏻, keycap 1️⃣",
    "scripts": "日本語のテキスト、中文文本、한국어 텍스트, Ελληνικά, русский, עברית, العربية",
    "combining": "e\u0301 a\u0308 n\u0303 — Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
    "rare symbols": "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 ∮ E⋅da = Q, ᚠᛇᚻ᛫ᛒᛦᚦ, \x00\x7f\u200b\ufeff\U0010fffd",
}
ALL_TEXTS = {**TEXTS, **AWKWARD}
LONG = " ".join(ALL_TEXTS.values()) * 3  # about 600 to 2,000 tokens of every kind above


# ----- the dense definition of method.md §2, as the alignment computed it before it was made sparse ---------------


def reference_alignment(target_spans, source_spans):
    """(weights [1, N_t, N_s], overlap [N_t, N_s], target_to_source [1, N_t], source_to_target [1, N_s])."""
    t = torch.tensor(target_spans, dtype=torch.float64).view(-1, 2)
    s = torch.tensor(source_spans, dtype=torch.float64).view(-1, 2)
    o = (torch.minimum(t[:, None, 1], s[None, :, 1]) - torch.maximum(t[:, None, 0], s[None, :, 0])).clamp(min=0)
    empty = o.sum(1) == 0
    if empty.any():
        centre_dist = ((t[:, None, 0] + t[:, None, 1]) / 2 - (s[None, :, 0] + s[None, :, 1]) / 2).abs()
        nearest = centre_dist.argmin(1)
        o[empty, nearest[empty]] = 1.0
    weights = o / o.sum(1, keepdim=True).clamp(min=1)
    t2s, s2t = o.argmax(1), o.argmax(0)
    no_target = o.sum(0) == 0
    if no_target.any():
        dist = ((s[:, None, 0] + s[:, None, 1]) / 2 - (t[None, :, 0] + t[None, :, 1]) / 2).abs()
        s2t[no_target] = dist.argmin(1)[no_target]
    return weights.float()[None], o.float(), t2s[None], s2t[None]


def reference_decode_prefix_spans(tokenizer, ids, text):
    spans, prev = [], 0
    for k in range(1, len(ids) + 1):
        d, c = decode(tokenizer, ids[:k]), 0
        while c < min(len(text), len(d)) and text[c] == d[c]:
            c += 1
        end = min(max(c, prev), len(text))
        spans.append((prev, end))
        prev = end
    if spans and spans[-1][1] < len(text):
        spans[-1] = (spans[-1][0], len(text))
    return spans


def assert_matches_reference(a, target_spans, source_spans):
    weights, overlap, t2s, s2t = reference_alignment(target_spans, source_spans)
    assert torch.equal(a.weights, weights) and torch.equal(a.overlap, overlap)
    assert torch.equal(a.target_to_source, t2s) and torch.equal(a.source_to_target, s2t)
    (t, s, w), = a.nonzero  # the pairs apply_alignment sums, in the dense matrix's row-major order
    assert torch.equal(torch.stack([t, s]), weights[0].nonzero().T) and torch.equal(w, weights[0][weights[0] != 0])


class NoOffsets:  # a tokenizer without offset mappings: forces the decode-prefix path
    def __init__(self, tok):
        self.tok = tok

    def __call__(self, *args, return_offsets_mapping=False, **kwargs):
        if return_offsets_mapping:
            raise NotImplementedError
        return self.tok(*args, **kwargs)

    def decode(self, *args, **kwargs):
        return self.tok.decode(*args, **kwargs)


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
    assert char_spans(NoOffsets(tok), ids, text) == char_spans(tok, ids, text)


def tokenizer_pairs():
    """(source, target) tokenizer pairs: the tiny test models' (every family's tiny model uses one of these
    byte-level BPEs) both ways, and the two real bundled ones both ways."""
    tiny = {name: tiny_tokenizer(vocab, bos) for name, (_, vocab, _, _, bos) in TEST_MODELS.items()}
    real = {name: real_tokenizer(name) for name in TEST_MODELS}
    return [(f"tiny {s}→{t}", tiny[s], tiny[t]) for s, t in (("smollm2-135m", "gemma3-270m"),
                                                            ("gemma3-270m", "smollm2-135m"))] + \
           [(f"real {s}→{t}", real[s], real[t]) for s, t in (("smollm2-135m", "gemma3-270m"),
                                                            ("gemma3-270m", "smollm2-135m"))]


@pytest.mark.parametrize("kind", [*ALL_TEXTS, "long"])
def test_alignment_equals_the_dense_definition_on_every_tokenizer(kind):
    text0 = LONG if kind == "long" else ALL_TEXTS[kind]
    for name, source, target in tokenizer_pairs():
        t_ids = encode(target, text0)
        text = decode(target, t_ids)
        s_ids = encode(source, text)
        a = align_ids(source, s_ids, target, t_ids, text)
        assert a.target_spans == char_spans(target, t_ids, text), name
        assert_matches_reference(a, a.target_spans, a.source_spans)
        if kind == "long":
            assert len(t_ids) > 500, name
        else:  # the decode-prefix spans too, which often leave empty spans (a byte of a character) and empty rows
            spans = char_spans(NoOffsets(source), s_ids, text)
            assert spans == reference_decode_prefix_spans(source, s_ids, text), name
            assert_matches_reference(align_spans(a.target_spans, spans), a.target_spans, spans)


def random_spans(rng: random.Random, n: int, length: int, ordered: bool) -> list[tuple[int, int]]:
    """Tilings with empty spans and repeated spans (a character's bytes), or spans anywhere, overlapping."""
    if not ordered:
        return [tuple(sorted((rng.randint(0, length), rng.randint(0, length)))) for _ in range(n)]
    cuts = sorted(rng.randint(0, length) for _ in range(n - 1))
    spans = list(zip([0, *cuts], [*cuts, length]))
    return [spans[i // 2] if rng.random() < 0.2 else spans[i] for i in range(n)]  # some repeated a little later


@pytest.mark.parametrize("seed", range(40))
def test_alignment_equals_the_dense_definition_on_random_spans(seed):
    rng = random.Random(seed)
    length = rng.choice([1, 5, 40, 300])
    t_ordered, s_ordered = seed % 4 != 1, seed % 4 != 2  # out-of-order spans take the blockwise path
    t_spans = random_spans(rng, rng.randint(1, 60), length, t_ordered)
    s_spans = random_spans(rng, rng.randint(1, 60), length, s_ordered)
    assert_matches_reference(align_spans(t_spans, s_spans), t_spans, s_spans)


def test_empty_row_goes_to_nearest_centre_lowest_index_on_ties():
    a = align_spans([(0, 4), (4, 4), (4, 8)], [(0, 2), (2, 6), (6, 8)])
    assert a.overlap[1].tolist() == [0.0, 1.0, 0.0]  # empty span at 4: nearest source centre is (2,6)'s 4
    a = align_spans([(5, 5)], [(0, 4), (6, 10)])  # centres 2 and 8 are both 3 away: lowest index
    assert a.overlap[0].tolist() == [1.0, 0.0]
    a = align_spans([(5, 5)], [(0, 4), (0, 4), (6, 10), (6, 10)])  # repeated spans: still the lowest index
    assert a.overlap[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    a = align_spans([(0, 3), (3, 6)], [(0, 3), (3, 3), (3, 3), (3, 6)])  # sources with no target: nearest centre
    assert a.source_to_target[0].tolist() == [0, 0, 0, 1]  # (3, 3) is 1.5 from both centres: the lower target


def test_long_text_aligns_in_linear_size_without_a_dense_matrix():
    tok_t, tok_s = tiny_tokenizer(400, True), tiny_tokenizer(300)
    text = decode(tok_t, encode(tok_t, LONG * 16))
    t_ids, s_ids = encode(tok_t, text), encode(tok_s, text)
    a = align_ids(tok_s, s_ids, tok_t, t_ids, text)
    assert len(t_ids) > 20_000
    # spans tiling one text meet a few others each (a character's byte tokens share its span): linear in N
    assert len(a.target_index) < 2 * (len(t_ids) + len(s_ids))
    block = torch.randn(1, len(s_ids), 1, 2)
    apply_alignment(block, a)
    assert not a.identity
    assert "weights" not in a.__dict__ and "overlap" not in a.__dict__  # the engine's path never made them dense


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
