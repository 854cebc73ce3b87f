"""Propagated-shift analysis (method.md §9.1, §9.2) on tiny random models of every supported family."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import OPTConfig, OPTForCausalLM

from conftest import CORPUS, FAMILIES, tiny_model, tiny_tokenizer
from mot_viz.analysis import shift
from mot_viz.engine import hf
from mot_viz.engine.channels import Channels, injection_channels
from mot_viz.engine.models import prepare_model
from mot_viz.engine.mot import MoT, ReplayConfig, replay, translate
from mot_viz.engine.prompts import QAExample
from mot_viz.errors import ConfigError
from mot_viz.sharing.random_window import random_control_cache
from tolerance import close
from mot_viz.eval.answers import CONDITIONS

EXAMPLE = QAExample(id="t", dataset="tiny/test", context=CORPUS[0] + " " + CORPUS[1], question="Where is the tower?",
                    answers=("in Paris, France",))


def _opt_post_ln():
    torch.manual_seed(0)
    tok = tiny_tokenizer(300)
    cfg = OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=256,
                    word_embed_proj_dim=32, pad_token_id=1, vocab_size=len(tok), do_layer_norm_before=False)
    return prepare_model(OPTForCausalLM(cfg), tok, "tiny-opt-post-ln")


@pytest.mark.parametrize("family", [*FAMILIES, "opt-post-ln"])
def test_residual_identity_holds_for_every_family(family):
    model = _opt_post_ln() if family == "opt-post-ln" else tiny_model(family, layers=3)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    prefix = hf.run(model.model, ids[:, :4]).kv
    tr = hf.residual_trace(model.model, ids[:, 4:], prefix)  # on top of a cache, like the analysis
    n_layers = len(hf.decoder_layers(model.model))
    assert tr.residual.shape == (n_layers + 1, 1, 2, 32) and tr.attn.shape == tr.mlp.shape == (n_layers, 1, 2, 32)
    step = tr.residual[1:] - tr.residual[:-1]  # (L, B, N, D)
    scale = tr.residual.abs().max()
    assert (step - tr.attn - tr.mlp).abs().max() <= 1e-5 * scale
    # both additions are real: leaving either out breaks the identity
    assert (step - tr.attn).abs().max() > 1e-3 * scale and (step - tr.mlp).abs().max() > 1e-3 * scale
    # recording does not change what the model computes
    assert torch.equal(tr.result.logits, hf.run(model.model, ids[:, 4:], prefix).logits)


def test_trace_hooks_are_removed():
    model = tiny_model("llama", layers=2)
    before = [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.model.modules()]
    hf.residual_trace(model.model, torch.tensor([[5, 6]]))
    after = [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.model.modules()]
    assert before == after


@pytest.mark.parametrize("family", FAMILIES)
def test_one_forward_trace_equals_stepwise_teacher_forcing(family):
    target = tiny_model(family, layers=3)
    case = shift.case_from_example(target, EXAMPLE)
    kv = hf.run(target.model, case.target_ids).kv
    fast = shift.trace_cache(target, kv, case.suffix_ids, case.answer_ids)
    slow = shift.trace_cache(target, kv, case.suffix_ids, case.answer_ids, stepwise=True)
    assert fast.residual.shape == (len(case.answer_ids), 4, 32)
    scale = slow.residual.abs().max()
    for a, b in ((fast.residual, slow.residual), (fast.attn, slow.attn), (fast.mlp, slow.mlp)):
        assert (a - b).abs().max() <= 1e-4 * scale
    assert (fast.seed_logprobs - slow.seed_logprobs).abs().max() <= 1e-4
    assert fast.answer_logprob == pytest.approx(slow.answer_logprob, abs=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_native_window_gives_zero_shift_and_zero_kl(family):
    target = tiny_model(family, layers=4)
    case = shift.case_from_example(target, EXAMPLE)
    # size 0: the injected window *is* the native window, and so is the norm-matched random control
    res = shift.sweep(target, [case], shift.SweepConfig(window=2, perturbation_size=0.0, task_metric=False))
    assert (res.summary["full_mix_n_tokens"] == 0).all() and (res.summary["random_n_tokens"] == 0).all()
    assert (res.summary["full_mix_n_skipped"] == len(case.answer_ids)).all()
    kl_cols = [c for c in res.summary if c.startswith("kl_")]
    assert len(kl_cols) == 5 and (res.summary[kl_cols].abs() <= 1e-6).all().all()
    assert (res.summary["delta_answer_logprob_full_mix"].abs() <= 1e-5).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_perturbed_window_shift_metrics(family):
    target = tiny_model(family, layers=6)
    target.model.double()  # float64, so the exact identities below are not blurred by float32 rounding
    case = shift.case_from_example(target, EXAMPLE)
    channels = injection_channels(6, 6, start=1, window=2)  # k0 = 3 (includes a full-attention Gemma layer)
    native = hf.run(target.model, case.target_ids).kv
    nk, nv = shift.window_blocks(native, channels.target_layers)
    wk, wv = shift.perturbed_window(nk, nv, 0.5, 0.5, seed=1)
    mixed = replay(target, case.target_ids, channels.target_layers, wk, wv, sparse=None)
    nat = shift.trace_cache(target, native, case.suffix_ids, case.answer_ids)
    mix = shift.trace_cache(target, mixed, case.suffix_ids, case.answer_ids)
    shifts, skipped = shift.token_shifts(nat, mix, channels.start, channels.end + 1)
    assert skipped == 0 and len(shifts) == len(case.answer_ids)
    for t in shifts:
        assert t.initial_shift > 1e-6
        assert t.pre_window_shift == 0  # dense replay: nothing below the window moves
        assert len(t.rho) == 6 - 3 + 1  # k = k0..L
        assert t.rho[0] == pytest.approx(1.0, abs=1e-12) and t.alpha_rel_k[0] == pytest.approx(0.0, abs=1e-12)
        assert t.final_shrink == pytest.approx(t.final_shift / t.initial_shift, rel=1e-9)
        # the attention and MLP shares decompose the along-shift correction exactly
        assert t.attn_share + t.mlp_share == pytest.approx(t.alpha_rel, rel=1e-8, abs=1e-10)
        assert -1 - 1e-9 <= t.cos <= 1 + 1e-9 and t.beta >= 0
        # α and β are the along- and across-shift parts of c_L, so cos = α/‖c_L‖ = α/hypot(α, β)
        assert t.cos == pytest.approx(t.alpha / math.hypot(t.alpha, t.beta), rel=1e-6)


def _synthetic(residual_rows):
    res = torch.tensor(residual_rows, dtype=torch.float32)[None]  # (1, L+1, D)
    zeros = torch.zeros(1, res.shape[1] - 1, res.shape[2])
    return shift.CacheTrace(torch.zeros(3), 0.0, res, zeros, zeros)


def test_token_shift_formulas_on_a_hand_made_trace():
    # L = 3, window = layer 0 → k0 = 1. Native residual 0; the mixed one moves to e1 at k0, then to 0.5·e1 + 0.3·e2.
    native = _synthetic([[0, 0], [1, 0], [2, 0], [3, 0]])
    mixed = _synthetic([[0, 0], [2, 0], [2.5, 0.3], [3.5, 0.3]])
    (t,), skipped = shift.token_shifts(native, mixed, window_start=0, k0=1)
    assert skipped == 0 and t.initial_shift == pytest.approx(1.0)
    assert t.window_input_norm == 0.0 and t.final_shift == pytest.approx(math.hypot(0.5, 0.3))
    assert t.rho == pytest.approx([1.0, math.hypot(0.5, 0.3), math.hypot(0.5, 0.3)])
    assert t.alpha == pytest.approx(0.5) and t.beta == pytest.approx(0.3)  # c_L = (−0.5, 0.3): opposes the shift
    assert t.cos == pytest.approx(0.5 / math.hypot(0.5, 0.3))
    assert t.initial_rel_shift == pytest.approx(1.0) and t.final_rel_shift == pytest.approx(math.hypot(0.5, 0.3) / 3)
    amplified = _synthetic([[0, 0], [2, 0], [4, 0], [6, 0]])
    (a,), _ = shift.token_shifts(native, amplified, 0, 1)
    assert a.final_shrink == pytest.approx(3.0) and a.alpha == pytest.approx(-2.0) and a.cos == pytest.approx(-1.0)


def test_summary_aggregates():
    native = _synthetic([[0, 0], [1, 0], [2, 0], [3, 0]])
    shrink = shift.token_shifts(native, _synthetic([[0, 0], [2, 0], [2.5, 0], [3.5, 0]]), 0, 1)[0]
    grow = shift.token_shifts(native, _synthetic([[0, 0], [2, 0], [4, 0], [6, 0]]), 0, 1)[0]
    s = shift.summarize(shrink + grow + shrink, n_skipped=2)
    assert s.n_tokens == 3 and s.n_skipped == 2
    assert s.final_shrink == pytest.approx((0.5 + 3 + 0.5) / 3) and s.median_final_shrink == pytest.approx(0.5)
    assert s.shrink_fraction == pytest.approx(2 / 3)
    adv = shift.structural_advantage(shift.summarize(shrink), shift.summarize(grow))
    assert adv["shrink_advantage"] == pytest.approx(2.5) and adv["cos_advantage"] == pytest.approx(2.0)
    traj = shift.trajectory_summary(shift.trajectory_rows(shrink + grow, k0=1))
    assert list(traj["k"]) == [1, 2, 3] and traj["median_rho"].tolist() == pytest.approx([1.0, 1.25, 1.75])


def test_kl_divergence():
    p = torch.tensor([0.5, 0.25, 0.25]).log()
    q = torch.tensor([0.25, 0.5, 0.25]).log()
    assert shift.kl_divergence(p, p) == 0
    assert shift.kl_divergence(p, q) == pytest.approx(0.5 * math.log(2) + 0.25 * math.log(0.5))


def test_sweep_covers_every_valid_start_and_round_trips(tmp_path):
    target = tiny_model("llama", layers=5)
    cases = [shift.case_from_example(target, EXAMPLE)]
    res = shift.sweep(target, cases, shift.SweepConfig(window=2, task_metric=True, max_new_tokens=2))
    assert res.summary["start"].tolist() == [0, 1, 2, 3] and res.meta["starts"] == [0, 1, 2, 3]
    assert res.summary["k0"].tolist() == [2, 3, 4, 5] and res.summary["num_upper_layers"].tolist() == [3, 2, 1, 0]
    assert {"f1_native", "f1_full_mix", "f1_dir_only", "f1_mag_only", "delta_full_mix"} <= set(res.summary)
    assert (res.summary["mode"] == "perturbation").all() and res.meta["mode"] == "perturbation"
    top = res.summary.iloc[-1]  # window at the top: no upper layer, the shift reaches the output untouched
    assert top["full_mix_final_shrink"] == pytest.approx(1.0)
    assert set(res.trajectories["start"]) == {0, 1, 2, 3}
    back = shift.SweepResult.load(res.save(tmp_path / "sweep"))
    assert back.meta == res.meta and back.summary.shape == res.summary.shape
    assert back.summary["full_mix_final_shrink"].tolist() == pytest.approx(res.summary["full_mix_final_shrink"].tolist())


def test_valid_starts_respect_the_source_depth():
    assert shift.valid_starts(18, 4) == list(range(15))
    assert shift.valid_starts(18, 4, num_source_layers=30) == list(range(15))
    assert shift.valid_starts(6, 2, num_source_layers=3) == [3, 4]  # earlier starts map below source layer 0
    with pytest.raises(ConfigError):
        shift.valid_starts(3, 4)


def test_random_control_matches_the_app_random_cache():
    source = tiny_model("gpt2", vocab_size=280, layers=4, seed=1)
    target = tiny_model("qwen2", layers=4)
    mot = MoT.build(source.spec, target.spec, Channels((1, 2), (1, 2)), ReplayConfig(topk_sparse_attn=4), dim=16, heads=2)
    case = shift.case_from_example(target, EXAMPLE)
    tr = translate(mot, source, target, case.context_text)
    ws, run = shift.analyse_translation(mot, source, target, case, tr, seed=3)
    assert {t.condition for t in ws.shifts} == {"full_mix", "random"} and ws.k0 == 3
    nk, nv = tr.native_window_blocks(mot.channels)
    ours = shift.window_caches(shift._mot_replay(mot, target, tr), nk, nv, tr.translated.keys, tr.translated.values,
                               ("random",), seed=3)["random"]
    theirs = random_control_cache(mot, target, tr, seed=3)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ours, theirs))
    assert set(run.kl) == {"native||full_mix"}
    # the app hands the answers' random control in instead of replaying it again: the same analysis, and the cache
    # handed in is the one used (another seed's control changes the random rows, not the MoT ones)
    shared, _ = shift.analyse_translation(mot, source, target, case, tr, seed=3, random_kv=theirs)
    assert shared.summary_frame().equals(ws.summary_frame())
    other, _ = shift.analyse_translation(mot, source, target, case, tr, seed=3,
                                         random_kv=random_control_cache(mot, target, tr, seed=4))
    by_condition = lambda w: w.summary_frame().set_index("condition")
    assert by_condition(other).loc["full_mix"].equals(by_condition(ws).loc["full_mix"])
    assert not by_condition(other).loc["random"].equals(by_condition(ws).loc["random"])


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_traces_equal_one_by_one(family):
    """native, a perturbed and a noisy cache traced in one batched forward read what each reads alone."""
    target = tiny_model(family, layers=4)
    case = shift.case_from_example(target, EXAMPLE)
    native = hf.run(target.model, case.target_ids).kv
    g = torch.Generator().manual_seed(0)
    noisy = [(k + torch.randn(k.shape, generator=g), v + torch.randn(v.shape, generator=g)) for k, v in native]
    scaled = [(0.5 * k, 2 * v) for k, v in native]
    kvs = [native, noisy, scaled]
    together = shift.trace_caches(target, kvs, case.suffix_ids, case.answer_ids)
    for kv, t in zip(kvs, together):
        alone = shift.trace_cache(target, kv, case.suffix_ids, case.answer_ids)
        scale = alone.residual.abs().max()
        for a, b in ((t.residual, alone.residual), (t.attn, alone.attn), (t.mlp, alone.mlp)):
            assert a.shape == b.shape and (a - b).abs().max() <= 1e-4 * scale
        assert (t.seed_logprobs - alone.seed_logprobs).abs().max() <= 1e-4
        assert t.answer_logprob == pytest.approx(alone.answer_logprob, abs=1e-4)
    assert (together[0].residual - together[1].residual).abs().max() > 1e-3 * together[0].residual.abs().max()
    # without the answer likelihood the output layer runs at the seed only: the same seed distribution and residuals
    seed_only = shift.trace_caches(target, kvs, case.suffix_ids, case.answer_ids, answer_likelihood=False)
    for t, s in zip(together, seed_only):
        assert torch.equal(t.residual, s.residual) and math.isnan(s.answer_logprob)
        assert (t.seed_logprobs - s.seed_logprobs).abs().max() <= 1e-5


def test_error_profile_window_reproduces_the_checkpoint_relative_error():
    source = tiny_model("gpt2", vocab_size=280, layers=4, seed=1)
    target = tiny_model("llama", layers=4)
    mot = MoT.build(source.spec, target.spec, Channels((2, 3), (2, 3)), ReplayConfig(topk_sparse_attn=None), dim=16, heads=2)
    case = shift.case_from_example(target, EXAMPLE)
    tr = translate(mot, source, target, case.context_text)
    ek, ev = shift.error_profile(tr, mot.channels)  # (1, N, 2, 1) each
    nk, nv = tr.native_window_blocks(mot.channels)
    wk, wv = shift.perturbed_window(nk, nv, ek, ev, seed=0)
    rel = (wk - nk).norm(dim=-1, keepdim=True) / nk.norm(dim=-1, keepdim=True)
    assert torch.allclose(rel, ek, rtol=1e-4)
    # on a 3-layer window the 2-layer profile is spread by relative position: first, first-or-last, last
    mapped = shift._map_profile(ek, 3)
    assert torch.equal(mapped[:, :, 0], ek[:, :, 0]) and torch.equal(mapped[:, :, 2], ek[:, :, 1])
    res = shift.sweep(target, [case], shift.SweepConfig(mode="checkpoint-error-profile", window=2, task_metric=False),
                      source=source, profile_mot=mot)
    assert res.summary["start"].tolist() == [0, 1, 2] and res.meta["mode"] == "checkpoint-error-profile"


def test_trained_mode_uses_each_start_translator():
    source = tiny_model("gpt2", vocab_size=280, layers=4, seed=1)
    target = tiny_model("qwen2", layers=4)  # no sliding window: every start reaches the answer tokens
    mots = {s: MoT.build(source.spec, target.spec, injection_channels(4, 4, s, 2), ReplayConfig(topk_sparse_attn=None),
                         dim=16, heads=2) for s in (1, 2)}
    case = shift.case_from_example(target, EXAMPLE)
    res = shift.sweep(target, [case], shift.SweepConfig(mode="trained", window=2, starts=(1, 2), task_metric=False),
                      source=source, mot_for_start=mots.__getitem__)
    assert res.summary["start"].tolist() == [1, 2] and (res.summary["mode"] == "trained").all()
    assert (res.summary["kl_native||full_mix"] > 0).all()
    with pytest.raises(ConfigError, match="injects"):
        shift.sweep(target, [case], shift.SweepConfig(mode="trained", window=2, starts=(0,), task_metric=False),
                    source=source, mot_for_start=lambda s: mots[1])


def test_find_sweeps_lists_a_pairs_trained_sweep_first(tmp_path):
    import json

    from mot_viz.analysis.shift import find_sweeps

    for name, mode, target in [("a-perturbation", "perturbation", "t"), ("b-trained", "trained", "t"),
                               ("c-profile", "checkpoint-error-profile", "t"), ("d-other", "trained", "other")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text(json.dumps({"mode": mode, "source": "s", "target": target}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "meta.json").write_text("{not json")
    assert list(find_sweeps(tmp_path, "s", "t")) == ["b-trained", "a-perturbation", "c-profile"]
    assert find_sweeps(tmp_path / "missing") == {}


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_the_answers_batch_prompt_step_feeds_the_trace_and_the_first_token_kl(family):
    """The answers batch's rows after their prompt step (answers.PromptedCache) give the Shift analysis and the
    first-token log-probs of a separate run: the same shifts, KL and log-probs up to float rounding, where the
    batch's padded no-context row is left out and rows of other conditions (a noise cache) are not mixed up."""
    from mot_viz.eval.answers import answers_from_caches, first_answer_logprobs
    from mot_viz.sharing.caches import condition_caches

    source = tiny_model("gpt2", vocab_size=280, layers=4, seed=1)
    target = tiny_model(family, layers=4, bos=True)
    mot = MoT.build(source.spec, target.spec, Channels((1, 2), (1, 2)), ReplayConfig(topk_sparse_attn=4), dim=16, heads=2)
    case = shift.case_from_example(target, EXAMPLE)
    built = condition_caches(mot, source, target, EXAMPLE, seed=3, conditions=CONDITIONS)
    tr = built.translation
    suffix = target.tokenizer.decode(case.suffix_ids[0])
    prompted = {}
    answers_from_caches(target, built.kv, EXAMPLE, max_new_tokens=4, suffix_text=suffix, prompted=prompted)
    assert set(prompted) == {"native", "mot", "random"}  # no_context was padded: left out
    alone = first_answer_logprobs(target, [tr.native_kv, tr.mixed_kv, built.kv["random"]], suffix)
    for row, condition in enumerate(("native", "mot", "random")):
        assert close(prompted[condition].first_logprobs, alone[row], rtol=2e-5), condition
    own, own_run = shift.analyse_translation(mot, source, target, case, tr, seed=3, random_kv=built.kv["random"],
                                             answer_likelihood=False)
    shared, shared_run = shift.analyse_translation(mot, source, target, case, tr, seed=3, random_kv=built.kv["random"],
                                                   answer_likelihood=False, prompted=prompted)
    a, b = own.summary_frame(), shared.summary_frame()
    numeric = a.select_dtypes("number").columns
    assert list(a.columns) == list(b.columns) and len(numeric) > 0
    assert torch.allclose(torch.tensor(a[numeric].to_numpy(float)), torch.tensor(b[numeric].to_numpy(float)),
                          atol=1e-4, rtol=1e-3, equal_nan=True)
    assert shared_run.kl["native||full_mix"] == pytest.approx(own_run.kl["native||full_mix"], abs=1e-5)
    # the MoT row really comes from the MoT cache: swapping in the random row's changes the analysis
    swapped = dict(prompted, mot=prompted["random"])
    other, _ = shift.analyse_translation(mot, source, target, case, tr, seed=3, random_kv=built.kv["random"],
                                         answer_likelihood=False, prompted=swapped)
    assert not torch.allclose(torch.tensor(other.summary_frame()[numeric].to_numpy(float)),
                              torch.tensor(a[numeric].to_numpy(float)), atol=1e-4, equal_nan=True)
