"""The engine on the real bundled pair: SmolLM2-135M (llama) → Gemma-3-270m (gemma3_text)."""

from __future__ import annotations

import pytest
import torch

from mot_viz.engine import hf
from mot_viz.engine.alignment import encode
from mot_viz.engine.channels import injection_channels, terminal_channels
from mot_viz.engine.layout import window_blocks
from mot_viz.engine.mot import (MoT, ReplayConfig, native_cache, prepare_source, replay, sparse_indices,
                                target_context_ids, translate, translate_window)

PASSAGE = (
    "The Amazon rainforest covers much of the Amazon basin of South America. This basin encompasses seven "
    "million square kilometres, of which five and a half million square kilometres are covered by the rainforest. "
    "The region includes territory belonging to nine nations. The majority of the forest is contained within "
    "Brazil, with 60% of the rainforest, followed by Peru with 13%, Colombia with 10%, and with minor amounts in "
    "Venezuela, Ecuador, Bolivia, Guyana, Suriname and French Guiana. "
)


def _context(target, n_tokens: int) -> str:
    text = PASSAGE * 4
    ids = encode(target.tokenizer, text)[:n_tokens]
    return target.tokenizer.decode(ids)


@pytest.mark.parametrize("which", ["real_source", "real_target"])
def test_native_injection_reproduces_native_logits_on_real_models(which, request):
    lm = request.getfixturevalue(which)
    ids = target_context_ids(lm, _context(lm, 64))
    layers = lm.spec.num_layers
    native = native_cache(lm, ids)
    suffix = torch.tensor([encode(lm.tokenizer, " Which country has most of the forest?")])
    reference = hf.run(lm.model, suffix, native).logits
    channels = injection_channels(layers, layers, start=layers // 3, window=4)
    mot = MoT.build(lm.spec, lm.spec, channels, ReplayConfig(topk_sparse_attn=None), dim=16, heads=2)
    # Gemma's caches start with BOS, which is never translated
    k, v = window_blocks(native, channels.target_layers, len(lm.prefix_ids))
    mixed = replay(lm, ids, channels.target_layers, k, v, sparse=None)
    assert (hf.run(lm.model, suffix, mixed).logits - reference).abs().max() <= 1e-4
    # a perturbed window: nothing below it moves, every layer above it does
    perturbed = replay(lm, ids, channels.target_layers, k * 1.5, v * 1.5, sparse=None)
    for layer in range(layers):
        moved = (perturbed[layer][0] - native[layer][0]).abs().max().item()
        assert (moved == 0) if layer <= channels.start else (moved > 1e-3), layer


def test_gradients_reach_every_translator_parameter_on_the_real_pair(real_source, real_target):
    torch.manual_seed(0)
    channels = terminal_channels(real_source.spec.num_layers, real_target.spec.num_layers, 0.3)
    mot = MoT.build(real_source.spec, real_target.spec, channels, dim=32, heads=2, num_experts=2, top_k=2,
                    output_activation="none")
    ids = target_context_ids(real_target, _context(real_target, 32))
    src = prepare_source(mot, real_source, real_target, ids)
    out = translate_window(mot, src, real_source, real_target)
    mixed = replay(real_target, ids, channels.target_layers, out.keys, out.values, sparse_indices(mot, src))
    logits = hf.run(real_target.model, torch.tensor([encode(real_target.tokenizer, " Brazil")]), mixed).logits
    logits.float().log_softmax(-1)[..., 0].mean().backward()
    missing = [n for n, p in mot.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


def test_random_mot_translates_a_200_token_context_and_the_target_generates(real_source, real_target):
    torch.manual_seed(0)
    channels = terminal_channels(real_source.spec.num_layers, real_target.spec.num_layers, 0.3)
    mot = MoT.build(real_source.spec, real_target.spec, channels, dim=64, output_activation="none")
    tr = translate(mot, real_source, real_target, _context(real_target, 200))
    n_t = tr.target_ids.shape[1]
    assert 195 <= n_t <= 205  # the decoded 200-token prefix re-encodes to about 200 tokens
    assert tr.source.alignment.weights.shape == (1, n_t, tr.source.source_ids.shape[1])
    assert tr.translated.keys.shape == (1, n_t, channels.window, real_target.spec.kv_hidden)
    assert len(tr.mixed_kv) == real_target.spec.num_layers
    # layers below the window replay sparsely (from layer 2 up), so they differ from dense native, but stay close
    low = channels.start - 1
    assert torch.nn.functional.cosine_similarity(tr.mixed_kv[low][0].flatten(), tr.native_kv[low][0].flatten(), 0) > 0.9
    prompt = torch.tensor([encode(real_target.tokenizer, "\nQuestion: Which country has most of the forest?\nAnswer:")])
    stop = hf.eos_ids(real_target.model, real_target.tokenizer)
    tokens = hf.greedy_generate(real_target.model, tr.mixed_kv, prompt, 8, stop)
    assert 1 <= len(tokens) <= 8 and all(0 <= t < real_target.spec.vocab_size for t in tokens)
    native_answer = real_target.tokenizer.decode(hf.greedy_generate(real_target.model, tr.native_kv, prompt, 8, stop))
    assert "Brazil" in native_answer  # the native baseline reads the context


def test_only_the_instruct_model_wraps_prompts_in_its_chat_template(real_source, real_target):
    assert real_target.chat_frame is None  # Gemma-3-270m is a base model: the method's plain prompts
    head, foot = real_source.chat_frame  # SmolLM2-135M-Instruct: ChatML with its default system turn
    assert head.startswith("<|im_start|>system\n") and head.endswith("<|im_start|>user\n")
    assert foot == "<|im_end|>\n<|im_start|>assistant\n"
    im_start = real_source.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert encode(real_source.tokenizer, head)[0] == im_start  # the markup is encoded as its special tokens


def test_logit_lens_on_the_real_pair_reads_the_models_own_output(real_source, real_target):
    """The lens at Gemma-3's last layer is its own output distribution (soft-cap and all): native's KL to itself is
    0, and the shipped mid checkpoint's is the first-token KL the reuse verdict reads."""
    from pathlib import Path

    from mot_viz.analysis.logit_lens import logit_lens, translation_lens_trace
    from mot_viz.analysis.shift.metrics import kl_divergence
    from mot_viz.data.eval_data import load_dataset
    from mot_viz.engine.checkpoint import load_checkpoint
    from mot_viz.engine.prompts import build_prompt
    from mot_viz.eval.answers import first_answer_logprobs

    checkpoint = Path(__file__).resolve().parents[2] / "pretrained" / "smollm2-to-gemma3-mid"
    mot, _ = load_checkpoint(str(checkpoint), real_source, real_target)
    prompt = build_prompt(load_dataset("squad", n=5, seed=0)[0], real_target.chat_frame)
    translation = translate(mot, real_source, real_target, prompt.context_text)
    trace = translation_lens_trace(mot, real_source, real_target, translation, prompt.suffix_text)
    lens = logit_lens(real_target, trace, 0).layers.set_index(["condition", "layer"])
    last = real_target.spec.num_layers - 1
    assert lens.loc[("native", last), "kl_to_native_final"] == pytest.approx(0, abs=1e-5)
    assert lens.loc[("native", last), "token_rank"] == 1
    native_lp, mot_lp = first_answer_logprobs(real_target, [translation.native_kv, translation.mixed_kv],
                                              prompt.suffix_text)
    assert lens.loc[("mot", last), "kl_to_native_final"] == pytest.approx(kl_divergence(native_lp, mot_lp),
                                                                          rel=1e-3, abs=1e-5)
    # the early layers are far from the final prediction under every cache; no context is further at the end
    assert lens.loc[("native", 0), "kl_to_native_final"] > 1.0
    assert lens.loc[("no_context", last), "kl_to_native_final"] > lens.loc[("mot", last), "kl_to_native_final"]
