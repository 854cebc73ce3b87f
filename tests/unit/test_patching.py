"""Layer patching (mot_viz.engine.patching): the identities that pin a scan down, on tiny models of every family."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import FAMILIES, tiny_model
from mot_viz.engine import hf, patching
from mot_viz.engine.alignment import encode
from mot_viz.engine.mot import native_cache, target_context_ids
from mot_viz.engine.patching import (ANSWER_SENTENCE, REST, answer_sentence_buckets, layer_groups, patch,
                                     patching_scan)
from mot_viz.errors import ConfigError
from tolerance import assert_close

CONTEXT = "The Eiffel Tower is in Paris. It is named after the engineer Gustave Eiffel. The tower is tall."
QUESTION = " Question: Who is it named after? Answer:"
ANSWER = " Gustave Eiffel"


def _setup(family: str):
    model = tiny_model(family, layers=4, bos=family == "gemma3_text")
    with torch.no_grad():  # a random tiny model is near-uniform: a sharper readout makes cache errors cost nats
        model.model.get_output_embeddings().weight.mul_(30)
    native = native_cache(model, target_context_ids(model, CONTEXT))
    question = model.ids_tensor(encode(model.tokenizer, QUESTION))
    return model, native, question, encode(model.tokenizer, ANSWER)


def _noisy(cache, layers, scale=1.0, seed=0):
    """`cache` with norm-scaled noise added to K and V at `layers` (a translated cache that errs there)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for l, (k, v) in enumerate(cache):
        if l in layers:
            k = k + scale * k.std() * torch.randn(k.shape, generator=g)
            v = v + scale * v.std() * torch.randn(v.shape, generator=g)
        out.append((k, v))
    return out


def _reading(scan, direction, target, bucket="all"):
    return next(r for r in scan.readings if (r.direction, r.target, r.bucket) == (direction, target, bucket))


@pytest.mark.parametrize("family", FAMILIES)
def test_restoring_every_layer_reads_native_and_breaking_every_layer_reads_translated(family):
    model, native, question, answer = _setup(family)
    translated = _noisy(native, range(4), scale=100.0)
    scan = patching_scan(model.model, native, translated, question, answer, groups={"every": range(4)})
    assert abs(scan.gap) > 0.05  # the noise costs the answer something, or the identities below say nothing
    assert_close(scan.native, hf.continuation_logprob(model.model, native, question, answer), what="native end")
    assert_close(_reading(scan, "restore", "every").logprob, scan.native, what="restore every layer")
    assert_close(_reading(scan, "break", "every").logprob, scan.translated, what="break every layer")
    assert_close([_reading(scan, "restore", "every").share, _reading(scan, "break", "every").share], [1.0, 1.0])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_cache_that_differs_at_one_layer_is_found_there_alone(family):
    model, native, question, answer = _setup(family)
    translated = _noisy(native, {2}, scale=100.0)
    scan = patching_scan(model.model, native, translated, question, answer)
    assert abs(scan.gap) > 0.05
    frame = scan.frame()
    layer_rows = frame[frame.target.str.startswith("layer ")]
    moved = layer_rows[layer_rows.share.abs() > 1e-3]
    assert sorted(moved.target.unique()) == ["layer 2"]
    assert_close(layer_rows.set_index(["direction", "target"]).share.loc[[("restore", "layer 2"), ("break", "layer 2")]]
                 .to_numpy(), [1.0, 1.0])


def test_patching_nothing_changes_nothing_and_positions_are_patched_only_where_asked():
    model, native, *_ = _setup("gemma3_text")
    translated = _noisy(native, range(4))
    same = patch(translated, native, [])
    assert all(k is tk and v is tv for (k, v), (tk, tv) in zip(same, translated))
    positions = [1, 4, 5]
    patched = patch(translated, native, [1, 3], positions)
    other = [p for p in range(native[0][0].shape[2]) if p not in positions]
    for l, ((k, v), (tk, tv), (nk, nv)) in enumerate(zip(patched, translated, native)):
        if l in (1, 3):
            assert torch.equal(k[:, :, positions], nk[:, :, positions]) and torch.equal(v[:, :, positions],
                                                                                       nv[:, :, positions])
            assert torch.equal(k[:, :, other], tk[:, :, other]) and torch.equal(v[:, :, other], tv[:, :, other])
        else:
            assert k is tk and v is tv
    assert torch.equal(translated[1][0], _noisy(native, range(4))[1][0])  # the patched cache itself is unchanged


def test_bucket_readings_patch_their_positions_and_together_make_the_whole():
    model, native, question, answer = _setup("llama")
    translated = _noisy(native, range(4), scale=100.0)
    buckets = answer_sentence_buckets(model.tokenizer, CONTEXT, "Gustave Eiffel", prefix_len=0)
    assert set(buckets[ANSWER_SENTENCE]) | set(buckets[REST]) == set(range(native[0][0].shape[2]))
    assert not set(buckets[ANSWER_SENTENCE]) & set(buckets[REST])
    text = model.tokenizer.decode(encode(model.tokenizer, CONTEXT)[min(buckets[ANSWER_SENTENCE]):
                                                                   max(buckets[ANSWER_SENTENCE]) + 1])
    assert "Gustave Eiffel" in text and "Paris" not in text and "tall" not in text
    scan = patching_scan(model.model, native, translated, question, answer, groups={"every": range(4)},
                         buckets=buckets)
    expected = hf.continuation_logprob(model.model, patch(translated, native, range(4), buckets[ANSWER_SENTENCE]),
                                       question, answer)
    assert_close(_reading(scan, "restore", "every", ANSWER_SENTENCE).logprob, expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_readings_started_above_the_lowest_patched_layer_equal_readings_of_every_layer(family, monkeypatch):
    model, native, question, answer = _setup(family)
    translated = _noisy(native, range(4), scale=100.0)
    buckets = answer_sentence_buckets(model.tokenizer, CONTEXT, "Gustave Eiffel", prefix_len=0)
    groups = {"upper": (2, 3), "ends": (0, 3), "none": ()}
    scans = {}
    for fast in (False, True):  # batch 3: batches mix starts, the lowest start reads a batch
        monkeypatch.setattr(patching, "REUSE_LOWER_LAYERS", fast)
        scans[fast] = patching_scan(model.model, native, translated, question, answer, groups, buckets, batch=3)
    plain, fast = scans[False].frame(), scans[True].frame()
    assert abs(scans[False].gap) > 0.05 and len(fast) == 2 * 3 * (4 + len(groups))
    assert fast[["direction", "target", "bucket"]].equals(plain[["direction", "target", "bucket"]])
    assert_close(fast[["logprob", "native", "translated"]].to_numpy(), plain[["logprob", "native", "translated"]]
                 .to_numpy(), what="readings")
    assert_close(fast.share.to_numpy(), plain.share.to_numpy(), rtol=1e-3, what="shares")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_one_output_layer_pass_over_many_readings_equals_the_models_own_log_softmax(family, monkeypatch):
    # the scan reads its readings' last states without the output layer and scores them in one pass, a few
    # vocabulary rows at a time; this must be the model's own logits' log-softmax (and Gemma's soft-cap where set)
    model, native, question, answer = _setup(family)
    if family == "gemma3_text":
        model.model.config.final_logit_softcapping = 5.0  # a cap that bites on the sharpened readout
    caches = [native, _noisy(native, [1], seed=1), _noisy(native, [2, 3], seed=2)]
    states = hf.continuation_states(model.model, caches, question, answer)
    assert states.shape[:2] == (3, len(answer)) and 3 * len(answer) > hf.FEW_ROWS  # the chunked path, not the few rows'
    monkeypatch.setattr(hf.forward, "VOCAB_CHUNK", 7)  # many chunks, the last one short
    scores = hf.continuation_scores(model.model, states, answer)
    ids = torch.cat([question, torch.tensor([answer])], dim=1)
    keep = torch.arange(question.shape[1] - 1, ids.shape[1] - 1)
    for cache, score in zip(caches, scores):
        logits = model.model(input_ids=ids, cache=hf.cache_from_kv(cache), use_cache=True).logits[0, keep]
        expected = logits.float().log_softmax(-1)[torch.arange(len(answer)), answer].mean().item()
        assert_close(score, expected, what=f"{family}: chunked output layer")
    assert len(set(round(s, 4) for s in scores)) == 3  # the caches differ, so do their readings


def test_hidden_positions_follow_the_translated_k_v():
    # a KVComm-like cache: the native K/V, hidden past token 0 at layer 1 (its unshared layer)
    model, native, question, answer = _setup("gemma3_text")
    length = native[0][0].shape[2]
    hidden = {1: (1, length)}
    scan = patching_scan(model.model, native, native, question, answer, hidden=hidden)
    hidden_lp = hf.continuation_logprob(model.model, native, question, answer, hf.AttentionPlan(hide=hidden))
    assert_close(scan.translated, hidden_lp)
    assert_close(_reading(scan, "restore", "layer 1").logprob, scan.native)  # restored: nothing hidden
    assert_close(_reading(scan, "break", "layer 1").logprob, scan.translated)
    assert_close(_reading(scan, "break", "layer 2").logprob, scan.native)
    with pytest.raises(ConfigError, match="cannot be patched one bucket at a time"):
        patching_scan(model.model, native, native, question, answer, buckets={"b": [1]}, hidden=hidden)


def test_groups_of_a_target_with_global_and_sliding_layers():
    model = tiny_model("gemma3_text", layers=6, bos=True)
    groups = layer_groups(model.spec, (1, 2, 3))
    assert groups == {"window": (1, 2, 3), "global": (2, 5), "sliding": (0, 1, 3, 4)}
    assert set(layer_groups(tiny_model("llama", layers=4).spec, (1,))) == {"window"}


def test_bad_input_is_one_line_with_the_fix():
    model, native, question, answer = _setup("qwen2")
    length = native[0][0].shape[2]
    with pytest.raises(ConfigError, match=r"layer 4 outside the target's 4 layers: choose among 0 … 3"):
        patch(native, native, [4])
    with pytest.raises(ConfigError, match=r"layers 7, 9 outside"):
        patching_scan(model.model, native, native, question, answer, groups={"mine": [1, 7, 9]})
    with pytest.raises(ConfigError, match=rf"bucket 'far': positions {length} outside the context's cache"):
        patching_scan(model.model, native, native, question, answer, buckets={"far": [0, length]})
    with pytest.raises(ConfigError, match="is not in the context"):
        answer_sentence_buckets(model.tokenizer, CONTEXT, "London", prefix_len=0)
    for error in (ConfigError("x"),):
        assert "\n" not in str(error)
    scan = patching_scan(model.model, native, native, question, answer, layers=[0])
    assert scan.gap == 0 and all(math.isnan(r.share) for r in scan.readings)  # no gap, no share
