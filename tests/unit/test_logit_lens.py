"""Logit lens and attention on the context (mot_viz.analysis.logit_lens) on tiny random models of every family."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Gemma3ForCausalLM, OPTConfig, OPTForCausalLM

from conftest import CORPUS, FAMILIES, tiny_config, tiny_model, tiny_tokenizer
from mot_viz.analysis import logit_lens as lens_module
from mot_viz.analysis.logit_lens import (attention_shares, lens_trace, logit_lens, native_answer_ids,
                                         translation_lens_trace)
from mot_viz.analysis.shift.metrics import kl_divergence
from mot_viz.engine import hf
from mot_viz.engine.alignment import encode
from mot_viz.engine.channels import Channels
from mot_viz.engine.models import prepare_model
from mot_viz.engine.mot import MoT, ReplayConfig, translate
from mot_viz.errors import ContextError
from mot_viz.eval.answers import first_answer_logprobs
from tolerance import close


def _opt(**kw):
    torch.manual_seed(0)
    tok = tiny_tokenizer(300)
    cfg = OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=256,
                    pad_token_id=1, vocab_size=len(tok), **kw)
    return prepare_model(OPTForCausalLM(cfg), tok, "tiny-opt-variant")


def _gemma_softcap():
    torch.manual_seed(0)
    tok = tiny_tokenizer(300)
    cfg = tiny_config("gemma3_text", len(tok), 3)
    cfg.final_logit_softcapping = 2.0  # small enough that leaving it out would show
    return prepare_model(Gemma3ForCausalLM(cfg), tok, "tiny-gemma-softcap")


MODELS = {**{f: (lambda f=f: tiny_model(f, layers=3)) for f in FAMILIES},
          "opt-post-ln": lambda: _opt(word_embed_proj_dim=32, do_layer_norm_before=False),
          "opt-project-out": lambda: _opt(word_embed_proj_dim=16),
          "gemma-softcap": _gemma_softcap}


@pytest.mark.parametrize("name", list(MODELS))
def test_readout_of_the_last_layer_is_the_model_output(name):
    """The lens at the last layer reads exactly the model's own output distribution; earlier layers read others."""
    lm = MODELS[name]()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    prefix = hf.run(lm.model, ids[:, :3]).kv
    trace = hf.residual_trace(lm.model, ids[:, 3:], prefix)
    readout = hf.final_readout(lm.model)
    with torch.no_grad():
        last = readout(trace.residual[-1])
        first = readout(trace.residual[1])
    assert close(last, trace.result.logits)
    assert not close(first, trace.result.logits, rtol=1e-3)
    if name == "gemma-softcap":
        assert last.abs().max() <= 2.0


def _pair(target_family="gemma3_text"):
    source = tiny_model("llama", vocab_size=280, layers=4, seed=1)
    target = tiny_model(target_family, layers=4, bos=target_family == "gemma3_text")
    mot = MoT.build(source.spec, target.spec, Channels((1, 2), (1, 2)), ReplayConfig(topk_sparse_attn=4), dim=16,
                    heads=2)
    return source, target, mot


@pytest.mark.parametrize("family", ["gemma3_text", "qwen2", "gpt2"])
def test_lens_agrees_with_the_answers_and_the_verdicts_first_token_kl(family):
    source, target, mot = _pair(family)
    translation = translate(mot, source, target, CORPUS[0] + " " + CORPUS[1])
    suffix_text = "\nQuestion: Where is the tower?\nAnswer:"
    trace = translation_lens_trace(mot, source, target, translation, suffix_text, linear=mot)
    assert trace.conditions == ("native", "mot", "linear", "no_context")
    lens = logit_lens(target, trace, 0)
    table = lens.layers.set_index(["condition", "layer"])
    last = target.spec.num_layers - 1
    # native read at its own last layer is native's final distribution, and its greedy token is top-1 there
    assert table.loc[("native", last), "kl_to_native_final"] == pytest.approx(0, abs=1e-6)
    assert table.loc[("native", last), "token_rank"] == 1
    assert (table.xs("native", level="condition").kl_to_native_layer.abs() < 1e-6).all()
    # the translated cache's last layer is the first answer token's KL the reuse verdict reads
    native_lp, mot_lp = first_answer_logprobs(target, [translation.native_kv, translation.mixed_kv], suffix_text)
    assert table.loc[("mot", last), "kl_to_native_final"] == pytest.approx(kl_divergence(native_lp, mot_lp),
                                                                              rel=1e-4, abs=1e-6)
    # "linear" was given the MoT itself: the same cache, the same lens
    assert table.loc[("linear", last), "kl_to_native_final"] == pytest.approx(
        table.loc[("mot", last), "kl_to_native_final"], rel=1e-5, abs=1e-7)
    assert lens.top.groupby(["condition", "layer"]).prob.apply(lambda p: (p.diff().dropna() <= 1e-9).all()).all()
    first = lens.first_top1.set_index("condition").first_top1_layer
    assert first["native"] is not None and first["native"] <= last
    # every later position predicts the next native answer token
    for position in range(trace.positions):
        later = logit_lens(target, trace, position).layers.set_index(["condition", "layer"])
        assert later.loc[("native", last), "token_rank"] == 1
    with pytest.raises(ValueError, match="outside"):
        logit_lens(target, trace, trace.positions)


def test_attention_shares_add_up_and_read_the_error():
    source, target, mot = _pair("gemma3_text")
    translation = translate(mot, source, target, " ".join(CORPUS[:3]))
    suffix = encode(target.tokenizer, "\nQuestion: Who designed it?\nAnswer:")
    answer = native_answer_ids(target, translation.native_kv, suffix)
    native = translation.native_kv
    noisy = [(k, v + torch.randn_like(v)) for k, v in native]
    caches = {"native": native, "copy": [(k.clone(), v.clone()) for k, v in native], "noisy": noisy,
              "no_context": hf.run(target.model, target.ids_tensor(target.prefix_ids)).kv}
    trace = lens_trace(target, caches, suffix, answer, translation.prefix_len)
    shares = attention_shares(trace, 0)
    total = shares[["bos", "context", "question"]].sum(axis=1)
    assert ((total - 1).abs() < 1e-5).all()
    by = shares.groupby("condition")
    assert by.get_group("no_context").context.abs().max() < 1e-9
    assert by.get_group("copy").read_error_v.abs().max() < 1e-6  # identical K/V read: no error
    assert by.get_group("noisy").read_error_v.min() > 0.1
    assert "read_error_v" not in by.get_group("native").dropna(axis=1, how="all")
    # the tiny Gemma's sliding layers (window 8) see at most 8 positions, its global layers the whole context
    context_len = translation.native_kv[0][0].shape[2] - translation.prefix_len
    native_rows = by.get_group("native")
    assert (native_rows[native_rows.sliding_window.notna()].visible_context <= 8).all()
    assert (native_rows[native_rows.sliding_window.isna()].visible_context == context_len).all()
    with pytest.raises(ValueError, match="native"):
        lens_trace(target, {"copy": native}, suffix, answer, translation.prefix_len)
    with pytest.raises(ValueError, match="answer token"):
        lens_trace(target, caches, suffix, [], translation.prefix_len)
    assert not math.isnan(shares.context.sum())


def test_the_question_alone_reads_what_following_the_answer_reads_at_its_first_position():
    source, target, mot = _pair("gemma3_text")
    translation = translate(mot, source, target, CORPUS[0] + " " + CORPUS[1])
    suffix_text = "\nQuestion: Where is the tower?\nAnswer:"
    alone = translation_lens_trace(mot, source, target, translation, suffix_text, answer_tokens=0)
    followed = translation_lens_trace(mot, source, target, translation, suffix_text, answer_tokens=4)
    assert alone.positions == 1 and alone.answer_ids[0] == followed.answer_ids[0]  # no decoding: native's top token
    a, f = logit_lens(target, alone, 0).layers, logit_lens(target, followed, 0).layers
    assert (a.top1 == f.top1).all() and (a.token_rank == f.token_rank).all()
    assert a.kl_to_native_final.to_numpy() == pytest.approx(f.kl_to_native_final.to_numpy(), rel=1e-4, abs=1e-6)


def test_the_trace_keeps_only_the_positions_the_lens_reads():
    """What a trace holds grows with the question's length, not its square: the states and attention rows of the
    positions read, equal to those rows of the whole computation."""
    source, target, mot = _pair("gemma3_text")
    translation = translate(mot, source, target, CORPUS[0])
    for words in (1, 20):
        suffix = encode(target.tokenizer, "\nQuestion: " + "Where " * words + "is it?\nAnswer:")
        answer = native_answer_ids(target, translation.native_kv, suffix, 3)
        trace = lens_trace(target, {"native": translation.native_kv}, suffix, answer, translation.prefix_len)
        keys = translation.native_kv[0][0].shape[2] + len(suffix) + len(answer) - 1
        assert trace.residual["native"].shape == (target.spec.num_layers + 1, len(answer), target.spec.hidden_size)
        assert all(a.shape == (target.spec.num_heads, len(answer), keys) for a in trace.attention["native"])
    plan = hf.AttentionPlan(record_queries=set(range(target.spec.num_layers)))
    ids = target.ids_tensor(suffix + answer[:-1])
    full = hf.residual_trace(target.model, ids, translation.native_kv, plan)
    for layer, (k, _) in enumerate(full.result.kv):
        query, scaling, window = full.result.queries[layer]
        whole = hf.causal_probs(query, k, scaling, window)[0]  # (H, S + A - 1, keys): every row
        assert close(trace.attention["native"][layer], whole[:, -len(answer):])
    assert close(trace.residual["native"], full.residual[:, 0, -len(answer):].float())


def test_a_question_the_lens_cannot_read_is_refused_before_any_work(monkeypatch):
    source, target, mot = _pair("gemma3_text")  # the tiny target allows 256 positions
    translation = translate(mot, source, target, CORPUS[0])
    for name in ("linear_cache", "native_answer_ids", "lens_trace"):
        monkeypatch.setattr(lens_module, name, lambda *a, **k: pytest.fail("the lens started its work"))
    with pytest.raises(ContextError, match=r"allows at most 256 tokens\. Shorten the context or the question"):
        translation_lens_trace(mot, source, target, translation, "\nQuestion: " + "Where " * 60 + "?\nAnswer:",
                               linear=mot, answer_tokens=4)
    monkeypatch.setattr(lens_module, "LENS_QUESTION_TOKENS", 20)
    with pytest.raises(ContextError, match=r"The question is \d+ target tokens long; the logit lens reads a question "
                                           r"of at most 20 .* Shorten the question\."):
        translation_lens_trace(mot, source, target, translation, "\nQuestion: " + "Where " * 10 + "?\nAnswer:",
                               linear=mot)
