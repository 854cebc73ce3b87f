"""Several readers, one hub: documents split at paragraphs (shard_document), the shards' translations composed at their
offsets (translate_shards: with an identity translator each shard's part of the window is the target's own cache of
that shard prefilled at its offset; each shard's queries see only their own shard and the BOS prefix), the errors,
and the evaluation's rows, resume and checks on the tiny pair."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from mot_viz.data.long_context import SEPARATOR, distractor_stacks, document_shards, shard_document
from mot_viz.engine import hf
from mot_viz.engine.alignment import encode
from mot_viz.engine.channels import Channels
from mot_viz.engine.layout import window_blocks
from mot_viz.engine.mot import MoT, translate
from mot_viz.engine.shards import compose_indices, translate_shards
from mot_viz.engine.testing import CORPUS, load_test_model, tiny_model, tiny_tokenizer
from mot_viz.errors import ConfigError, ContextError
from mot_viz.eval import shard_caches
from mot_viz.eval import shards as shard_eval
from mot_viz.eval.shards import ShardSettings
from tolerance import assert_close, close
from run_settings import settings_of

SHARDS = [CORPUS[0] + SEPARATOR, CORPUS[1] + SEPARATOR, CORPUS[2] + SEPARATOR, CORPUS[4]]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(400, bos=True)


# ----- splitting a document ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 3])
def test_shards_cover_the_document_at_paragraph_starts_with_the_evidence_marked(tok, k):
    for doc in distractor_stacks(tok, 1500, 3, seed=0):
        text = doc.example.context
        shards = shard_document(tok, doc, k)
        assert len(shards) == k and "".join(s.text for s in shards) == text  # every character in exactly one shard
        assert [s.span[0] for s in shards] == [0] + [s.span[1] for s in shards[:-1]] and shards[-1].span[1] == len(text)
        assert all(s.text == text[s.span[0]:s.span[1]] for s in shards)
        assert all(s.text.endswith(SEPARATOR) for s in shards[:-1])  # cut between paragraphs
        holders = [s for s in shards if s.holds_evidence]
        assert len(holders) == 1 and text[slice(*doc.evidence)] in holders[0].text


def test_the_cuts_balance_target_tokens(tok):
    paragraphs = [CORPUS[i % 4] for i in range(8)]  # eight paragraphs of similar length
    text = SEPARATOR.join(paragraphs)
    doc = replace(distractor_stacks(tok, 900, 1)[0], evidence=(0, 5))
    doc = replace(doc, example=replace(doc.example, context=text))
    tokens = [len(encode(tok, s.text)) for s in shard_document(tok, doc, 2)]
    best = min(abs(sum(len(encode(tok, p + SEPARATOR)) for p in paragraphs[:j]) * 2 - sum(tokens))
               for j in range(1, 8))
    assert abs(tokens[0] - tokens[1]) <= best + 2  # the most even cut there is (joined text ±1 token per cut)


def test_a_split_that_cannot_be_made_or_does_not_cover_the_text_is_refused(tok):
    doc = distractor_stacks(tok, 900, 1)[0]
    n = len(doc.example.context)
    with pytest.raises(ContextError, match="paragraphs, fewer than the 9 shards"):
        shard_document(tok, doc, 9)
    for spans in ([(0, 10), (12, n)], [(0, 10), (10, n - 1)], [(0, 0), (0, n)], []):
        with pytest.raises(ContextError, match="do not cover"):
            document_shards(doc, spans)
    assert [s.text for s in document_shards(doc, [(0, 10), (10, n)])] == [doc.example.context[:10],
                                                                         doc.example.context[10:]]


# ----- composing the translated shards -----------------------------------------------------------------------------


def identity_mot(lm, layers: tuple[int, ...]) -> MoT:
    """A linear map from a model to itself that writes its input: K to K, V to V."""
    mot = MoT.build(lm.spec, lm.spec, Channels(layers, layers), variant="linear")
    linear = mot.translator.linear
    out, features = linear.key_proj.weight.shape
    eye, zeros = torch.eye(out), torch.zeros(out, features - out)
    with torch.no_grad():
        linear.key_proj.weight.copy_(torch.cat([eye, zeros], 1))
        linear.value_proj.weight.copy_(torch.cat([zeros, eye], 1))
    return mot


def cache_at_offset(lm, text: str, offset: int) -> list[hf.KV]:
    """The model's own cache of BOS + text alone, every position shifted by `offset` (the shard read at its place)."""
    ids = lm.ids_tensor(lm.prefix_ids + encode(lm.tokenizer, text))
    cache = hf.new_cache()
    with torch.no_grad():
        lm.model(input_ids=ids, position_ids=torch.arange(offset, offset + ids.shape[1]).view(1, -1), cache=cache,
                 use_cache=True)
    return hf.kv_from_cache(cache)


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])  # tiny Llama (no BOS), tiny Gemma 3 (BOS, sliding)
@pytest.mark.parametrize("k", [2, 3])
def test_each_translated_shard_is_the_targets_cache_of_that_shard_at_its_offset(name, k):
    lm = load_test_model(name)
    layers = (1, 2)
    mot = identity_mot(lm, layers)
    texts = SHARDS[:k - 1] + [SHARDS[-1]]
    out = translate_shards(mot, lm, lm, texts)
    lengths = [len(encode(lm.tokenizer, t)) for t in texts]
    assert out.lengths == tuple(lengths) and out.offsets == tuple(sum(lengths[:i]) for i in range(k))
    assert out.target_ids[0].tolist() == sum((encode(lm.tokenizer, t) for t in texts), [])
    p = len(lm.prefix_ids)
    for text, offset, n in zip(texts, out.offsets, lengths):
        keys, values = window_blocks(cache_at_offset(lm, text, offset), layers, p)
        assert_close(out.window_keys[:, offset:offset + n], keys)
        assert_close(out.window_values[:, offset:offset + n], values)
    # the shards read where they are are not the document read at once: the later shards' keys differ
    whole = window_blocks(cache_at_offset(lm, "".join(texts), 0), layers, p)[0]
    assert not close(out.window_keys[:, lengths[0]:], whole[:, lengths[0]:], rtol=1e-3)
    assert out.hub_bytes == 2 * lm.spec.kv_hidden * 2 * sum(min(p + sum(lengths), lm.spec.sliding_window)
                                                            if i in lm.spec.sliding_layers else p + sum(lengths)
                                                            for i in range(lm.spec.num_layers))
    assert len(out.source_bytes) == k and set(out.timings) >= {"source_prefill", "source_prefill_max", "translator",
                                                                "replay"}


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_each_shards_queries_see_only_their_own_shard_and_the_prefix(name):
    lm = load_test_model(name)
    mot = identity_mot(lm, (1, 2))
    out = translate_shards(mot, lm, lm, SHARDS[:3])
    p, total = out.prefix_len, sum(out.lengths)
    assert out.sparse_indices and set(out.sparse_indices) == set(mot.sparse_layers())
    for layer, idx in out.sparse_indices.items():
        assert idx.shape[:3] == (1, 1, p + total)
        for offset, n, src in zip(out.offsets, out.lengths, out.sources):
            for q in range(p + offset, p + offset + n):
                row = idx[0, 0, q]
                seen = row[row <= q]  # larger indices (the future, the sentinel) are masked
                assert ((seen < p) | ((seen >= p + offset) & (seen < p + offset + n))).all()
            # the shard's own indices, moved by its offset (its sentinel to the document's)
            own = next(i for l, i in translate_shards(mot, lm, lm, [SHARDS[out.offsets.index(offset)]])
                       .sparse_indices.items() if l == layer)
            moved = torch.where(own >= p + n, p + total, torch.where(own >= p, own + offset, own))
            assert torch.equal(idx[0, 0, p + offset:p + offset + n, :own.shape[-1]], moved[0, 0, p:])
        assert (idx[0, 0, :p, p:] == p + total).all() and (idx[0, 0, :p, :p] == torch.arange(p)).all()


def test_compose_indices_pads_a_short_shard_with_the_sentinel():
    a = torch.tensor([[0, 2, 2], [0, 1, 2]]).view(1, 1, 2, 3)  # P = 1, one context token, k = 2; sentinel 2
    b = torch.tensor([[0, 3, 3, 3, 3], [0, 1, 3, 3, 3], [0, 2, 1, 3, 3]]).view(1, 1, 3, 5)  # two tokens, k = 4
    out = compose_indices([a, b], (0, 1), (1, 2), prefix_len=1)  # the document's sentinel: 1 + 3
    assert out.tolist() == [[[[0, 4, 4, 4, 4], [0, 1, 4, 4, 4], [0, 2, 4, 4, 4], [0, 3, 2, 4, 4]]]]


def test_one_shard_is_the_ordinary_translation(checkpoints):
    from mot_viz.engine.checkpoint import load_checkpoint

    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot = load_checkpoint(checkpoints["smollm2-to-gemma3"], source, target)[0]
    text = "".join(SHARDS)
    one, alone = translate_shards(mot, source, target, [text]), translate(mot, source, target, text, with_native=False)
    for (k, v), (k0, v0) in zip(one.mixed_kv, alone.mixed_kv):
        assert torch.equal(k, k0) and torch.equal(v, v0)
    several = translate_shards(mot, source, target, SHARDS)  # a real pair: the composed cache has the document's size
    assert several.mixed_kv[0][0].shape[2] == len(target.prefix_ids) + several.target_ids.shape[1]
    assert abs(several.target_ids.shape[1] - one.target_ids.shape[1]) <= len(SHARDS)  # encoded apart at the cuts
    assert several.source_bytes[0] < one.source_bytes[0]  # an agent holds its shard only


def test_shards_cannot_be_moved_in_a_target_without_rotary_embeddings():
    lm = tiny_model("gpt2")
    mot = identity_mot(lm, (1, 2))
    with pytest.raises(ConfigError, match="no rotary position embedding"):
        translate_shards(mot, lm, lm, SHARDS[:2])
    assert translate_shards(mot, lm, lm, SHARDS[:1]).mixed_kv  # one shard stays where it is


def test_empty_or_too_long_shards_are_refused():
    lm = load_test_model("smollm2-135m")
    mot = identity_mot(lm, (1, 2))
    with pytest.raises(ContextError, match="empty"):
        translate_shards(mot, lm, lm, [SHARDS[0], "  "])
    with pytest.raises(ContextError, match="no shards"):
        translate_shards(mot, lm, lm, [])
    long = "word " * 500  # about 2,500 tiny-tokenizer tokens: each fits, the two together do not
    with pytest.raises(ContextError, match="hold .* target tokens together"):
        translate_shards(mot, lm, lm, [long, long])


# ----- the evaluation ----------------------------------------------------------------------------------------------


def settings_for(checkpoints, **kw) -> ShardSettings:
    base = dict(checkpoint=str(checkpoints["smollm2-to-gemma3"]), budget=1500, shards=(2, 3), n=1, seed=0,
                max_new_tokens=4, bootstrap=50)
    return settings_of(ShardSettings, **{**base, **kw})


@pytest.mark.parametrize("change, message", [
    (dict(budget=5000), "does not fit the source model"),
    (dict(shards=(1, 2)), "at least 2"),
    (dict(shards=(2, 2)), "distinct"),
    (dict(n=0), "at least 1"),
])
def test_bad_settings_fail_before_a_model_loads(checkpoints, monkeypatch, change, message):
    monkeypatch.setattr(shard_eval, "load_model", lambda name: pytest.fail("a model was loaded"))
    with pytest.raises(ConfigError, match=message):
        shard_eval.run(settings_for(checkpoints, **change), Path("/nonexistent/out"))


def test_a_target_without_rotary_embeddings_fails_before_a_model_loads(checkpoints, monkeypatch, tmp_path):
    monkeypatch.setattr(shard_eval, "load_model", lambda name: pytest.fail("a model was loaded"))
    folder = tmp_path / "gpt2-target"
    folder.mkdir()
    config = json.loads((checkpoints["smollm2-to-gemma3"] / "config.json").read_text())
    config["target"]["model_type"] = "gpt2"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="no rotary position embedding"):
        shard_eval.check_settings(settings_for(checkpoints, checkpoint=str(folder)))


def test_the_evaluation_writes_every_setting_and_resumes_only_the_missing_documents(checkpoints, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setattr(shard_eval, "load_model", load_test_model)
    out = tmp_path / "shards"
    shard_eval.run(settings_for(checkpoints), out, progress=False)
    first = pd.read_csv(out / "examples.csv")
    assert first["condition"].tolist() == list(shard_eval.conditions((2, 3))) and first["id"].nunique() == 1
    rows = first.set_index("condition")
    assert rows.loc["native", "hub_tokens"] > 1400 and rows.loc["native", "source_mb"] == 0
    assert rows.loc["shards_3", "shards"] == 3 and rows.loc["whole", "shards"] == 1
    # the agents together hold about the one reader's cache; each holds a part; the hub holds the whole document
    assert rows.loc["shards_3", "source_max_mb"] < rows.loc["shards_2", "source_max_mb"] < rows.loc["whole",
                                                                                                    "source_mb"]
    assert abs(rows.loc["shards_2", "hub_tokens"] - rows.loc["native", "hub_tokens"]) <= 3
    assert rows.loc["evidence_2", "hub_tokens"] < rows.loc["shards_2", "hub_tokens"]
    assert rows.loc["shards_2", "source_prefill_max"] <= rows.loc["shards_2", "source_prefill"]
    assert pd.isna(rows.loc["shards_2", "native_prefill"]) and rows.loc["native", "native_prefill"] > 0
    with pytest.raises(ConfigError, match="--resume"):
        shard_eval.run(settings_for(checkpoints, n=2), out, progress=False)
    computed = []
    real = shard_eval.document_rows
    monkeypatch.setattr(shard_eval, "document_rows", lambda *a, **k: computed.append(a[3].example.id) or real(*a, **k))
    summary = shard_eval.run(settings_for(checkpoints, n=2), out, resume=True, progress=False)
    both = pd.read_csv(out / "examples.csv")
    assert len(computed) == 1 and computed[0] not in set(first["id"]) and both["id"].nunique() == 2
    pd.testing.assert_frame_equal(both[both["id"].isin(first["id"])].reset_index(drop=True), first)
    assert summary["condition"].tolist() == list(shard_eval.conditions((2, 3))) and (summary["n"] == 2).all()
    paired = pd.read_csv(out / "paired.csv").set_index(["a", "b"])
    wide = both.pivot_table(index="id", columns="condition", values="score")
    assert paired.loc[("shards_2", "whole"), "diff"] == pytest.approx((wide["shards_2"] - wide["whole"]).mean())
    md = (out / "summary.md").read_text()
    assert "shards_3" in md and "retention" in md and "--shards 2 3" in md
    with pytest.raises(ConfigError, match="other settings"):
        shard_eval.run(settings_for(checkpoints, shards=(2,)), out, resume=True, progress=False)


def test_the_linear_map_composes_like_the_mot_and_the_mean_window_is_every_evaluations(checkpoints, tmp_path,
                                                                                     monkeypatch):
    """The controls through the hub: "linear" is the closed-form map replayed on the one reader's translation,
    "linear_k" the map's translations of k shards composed as the MoT's are, "mean" the mean-vector window replayed
    over the document as every evaluation does (no shard count changes it); each is paired with its MoT setting."""
    from mot_viz.engine.checkpoint import load_checkpoint
    from mot_viz.sharing.linear import linear_cache
    from mot_viz.sharing.mean import mean_vector_cache
    from mot_viz.train.mean_vector import reference_means

    with pytest.raises(ConfigError, match="--linear"):  # before a model loads
        shard_eval.check_settings(settings_for(checkpoints, sharing=("linear",)))
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot = load_checkpoint(str(checkpoints["smollm2-to-gemma3"]), source, target)[0]
    linear = load_checkpoint(str(checkpoints["smollm2-to-gemma3-linear"]), source, target)[0]
    means = reference_means(target, mot.channels.target_layers, passages=4)
    doc = distractor_stacks(target.tokenizer, 1500, 1, seed=0)[0]
    caches = shard_caches.setting_caches(mot, source, target, doc, (2,), ("linear", "mean"),
                                         artifacts={"linear": linear, "mean": means})
    assert list(caches) == list(shard_eval.conditions((2,), ("linear", "mean")))
    assert "mean_2" not in caches and {"linear", "linear_2", "mean"} <= set(caches)
    context_text = shard_caches.build_prompt(doc.example, target.chat_frame).context_text
    whole = translate(mot, source, target, context_text)
    for got, want in zip(caches["linear"].kv, linear_cache(mot, linear, source, target, whole), strict=True):
        assert_close(got[0], want[0])
        assert_close(got[1], want[1])
    texts = shard_caches.shard_prompts(context_text, doc.example.context,
                                     [s.text for s in shard_document(target.tokenizer, doc, 2)])
    composed = translate_shards(linear, source, target, texts)
    for got, want in zip(caches["linear_2"].kv, composed.mixed_kv, strict=True):
        assert_close(got[0], want[0])
        assert_close(got[1], want[1])
    assert not close(caches["linear_2"].kv[-1][0], caches["shards_2"].kv[-1][0])  # another map than the MoT's
    for got, want in zip(caches["mean"].kv, mean_vector_cache(mot, target, whole, means), strict=True):
        assert_close(got[0], want[0])  # the evaluator's own mean-vector window
        assert_close(got[1], want[1])
    assert caches["mean"].source_mb == 0 and caches["linear_2"].shards == 2

    monkeypatch.setattr(shard_eval, "load_model", load_test_model)
    out = tmp_path / "controls"
    shard_eval.run(settings_for(checkpoints, shards=(2,), sharing=("linear", "mean"),
                                linear=str(checkpoints["smollm2-to-gemma3-linear"])), out, progress=False)
    paired = pd.read_csv(out / "paired.csv").set_index(["a", "b"])
    assert {("whole", "linear"), ("shards_2", "linear_2"), ("whole", "mean")} <= set(paired.index)
    assert "--conditions linear mean --linear" in (out / "summary.md").read_text()
