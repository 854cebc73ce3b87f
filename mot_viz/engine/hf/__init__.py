"""The one package that talks to the transformers cache and attention APIs.

Every supported family (GPT-2, OPT, Llama, Qwen2, Gemma 3) calls the attention function registered
under ``config._attn_implementation`` with the post-RoPE keys and values of the current forward pass
and ``module.layer_idx``. MoT Viz registers one function, ``mot_viz``, and installs it on every model it
loads. With no plan active it is exactly SDPA. With an :class:`AttentionPlan` active (a context
variable, so two Streamlit sessions in two threads never see each other's plan) it can, per layer:

* substitute injected K/V for the ones the layer computed (method.md §6, the replay),
* attend sparsely to top-k key positions per query (method.md §6, sparse attention),
* keep the top-k key positions of the head-averaged attention probabilities (the sparse index construction,
  done inside the source's prefill, so no N x N probabilities are kept);
* keep the hidden state entering one layer, and start a later forward of the same ids there
  (:class:`LayerStart`): replays that differ only from the window up skip the layers below it, and so do
  readings over caches that differ only from some layer up (layer patching).

No copy of a family's forward pass is kept (method.md §12). Everything else in the project works on
plain tensors in the Hugging Face layout ``[batch, kv_heads, seq, head_dim]``.

The package's three modules: ``attention`` (the registered attention function and the plans it follows),
``forward`` (forward passes, generation and continuation scores on plain-tensor caches) and ``trace`` (the residual
stream recorded layer by layer, and each model's path from its last layer to the logits).
"""

from .attention import (KV, SPARSE_QUERY_CHUNK, TOPK_QUERY_CHUNK, AttentionPlan, LayerStart, active_plan,
                        attention_output, causal_probs, decoder_layers, install_attention, mot_attention,
                        sparse_attention, sparse_mask_attention, topk_positions, whole_last_layer)
from .forward import (FEW_ROWS, ForwardResult, cache_from_kv, continuation_logprob, continuation_logprobs,
                      continuation_scores, continuation_states, eos_ids, greedy_generate, greedy_generate_batch,
                      has_rope, install_output_layer, kv_from_cache, left_padded, new_cache, rotate_keys, run,
                      stack_caches)
from .trace import ResidualTrace, continuation_trace, final_readout, residual_trace

__all__ = [
    "KV", "SPARSE_QUERY_CHUNK", "TOPK_QUERY_CHUNK", "topk_positions", "AttentionPlan", "LayerStart", "active_plan",
    "attention_output", "causal_probs", "decoder_layers", "install_attention", "mot_attention", "sparse_attention",
    "sparse_mask_attention", "whole_last_layer", "FEW_ROWS", "ForwardResult", "ResidualTrace", "cache_from_kv",
    "continuation_logprob", "continuation_logprobs", "continuation_scores", "continuation_states",
    "continuation_trace", "eos_ids", "greedy_generate",
    "greedy_generate_batch", "has_rope", "install_output_layer",
    "kv_from_cache", "left_padded", "new_cache", "residual_trace", "rotate_keys", "run", "stack_caches",
    "final_readout",
]
