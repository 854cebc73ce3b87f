"""The residual stream, layer by layer (method.md §9.2): one forward pass with what each decoder layer's attention and
MLP add to it recorded by forward hooks, the continuation's states read from such a pass, and each model's own path
from its last layer to the logits (the logit lens applies it to earlier layers)."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .attention import KV, AttentionPlan, decoder_layers, whole_last_layer
from .forward import ForwardResult, continuation_ids, run, soft_capped, stack_caches


@dataclass
class ResidualTrace:
    """One forward pass with the target's residual stream recorded at every layer boundary.

    For every family h_{l+1} = h_l + attn_l + mlp_l holds (up to float rounding), where attn_l and mlp_l
    are what block l adds to the residual stream from its attention and its MLP sub-block: the raw
    sub-block outputs for pre-LN blocks (GPT-2, OPT-125m…, Llama, Qwen2), the post-norm outputs for Gemma's
    sandwich-norm blocks, and the change across each sub-block (post-norm included) for post-LN OPT.
    """

    result: ForwardResult
    residual: torch.Tensor  # [L+1, B, N, D]: h_0 (input of layer 0) … h_L (output of the last layer, before the final norm)
    attn: torch.Tensor  # [L, B, N, D]
    mlp: torch.Tensor  # [L, B, N, D]


def _block_parts(layer: torch.nn.Module) -> tuple[str, torch.nn.Module, torch.nn.Module]:
    """(kind, module giving the attention addition, module giving the MLP addition) of one decoder layer.

    kind "add": the modules' outputs are the additions; kind "post": their outputs are the residual
    states after each sub-block (post-LN), so the additions are differences.
    """
    if hasattr(layer, "post_feedforward_layernorm"):  # Gemma 2/3: residual += post_norm(sub-block)
        return "add", layer.post_attention_layernorm, layer.post_feedforward_layernorm
    if hasattr(layer, "fc2"):  # OPT: the MLP's last projection is what gets added
        if getattr(layer, "do_layer_norm_before", True):
            return "add", layer.self_attn, layer.fc2
        return "post", layer.self_attn_layer_norm, layer.final_layer_norm  # OPT-350m: post-LN
    attn = getattr(layer, "self_attn", None) or getattr(layer, "attn", None)
    mlp = getattr(layer, "mlp", None)
    if attn is None or mlp is None:
        raise ValueError(f"do not know how {type(layer).__name__} adds to the residual stream")
    return "add", attn, mlp


_ACTIVE_TRACE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("mot_viz_trace", default=None)


def _first(output) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


def residual_trace(model, ids: torch.Tensor, kv: list[KV] | None = None, plan: AttentionPlan | None = None,
                   logits_to_keep: int | torch.Tensor = 0) -> ResidualTrace:
    """:func:`run` with the residual stream and each block's attention/MLP additions recorded (no grad).

    Hooks only record while this call's context is active, so other threads' forwards on the same
    (shared, cached) model are unaffected; they are removed before returning.
    """
    layers = decoder_layers(model)
    rec: dict = {"in": {}, "out": {}, "a": {}, "m": {}}
    handles = []

    def store(slot: str, index: int, tensor: torch.Tensor) -> None:
        if _ACTIVE_TRACE.get() is rec:
            rec[slot][index] = tensor.detach().clone()

    for i, layer in enumerate(layers):
        kind, attn_mod, mlp_mod = _block_parts(layer)
        handles.append(layer.register_forward_pre_hook(
            lambda m, args, kwargs, i=i: store("in", i, args[0] if args else kwargs["hidden_states"]),
            with_kwargs=True))
        handles.append(layer.register_forward_hook(lambda m, args, out, i=i: store("out", i, _first(out))))
        handles.append(attn_mod.register_forward_hook(lambda m, args, out, i=i: store("a", i, _first(out))))
        handles.append(mlp_mod.register_forward_hook(lambda m, args, out, i=i: store("m", i, _first(out))))
        rec.setdefault("kind", {})[i] = kind
    token = _ACTIVE_TRACE.set(rec)
    try:
        with torch.no_grad(), whole_last_layer():
            result = run(model, ids, kv, plan, logits_to_keep)
    finally:
        _ACTIVE_TRACE.reset(token)
        for h in handles:
            h.remove()
    n = len(layers)
    h_in = [rec["in"][i] for i in range(n)]  # each [B, N, D]
    shape = h_in[0].shape
    residual = torch.stack(h_in + [rec["out"][n - 1].reshape(shape)])  # (L+1, B, N, D)
    attn, mlp = [], []
    for i in range(n):
        a, m = rec["a"][i].reshape(shape), rec["m"][i].reshape(shape)  # OPT's fc2 output is (B·N, D)
        if rec["kind"][i] == "post":  # outputs are states after each sub-block: take differences
            a, m = a - residual[i], m - a  # m − a uses the state after attention, before a is rebound
        attn.append(a)
        mlp.append(m)
    return ResidualTrace(result, residual, torch.stack(attn), torch.stack(mlp))


@torch.no_grad()
def continuation_trace(model, kvs: list[list[KV]], prompt_ids: torch.Tensor,
                       continuation: list[int]) -> tuple[torch.Tensor, ResidualTrace]:
    """continuation_states of several caches of one length, with the forward's residual stream recorded: the state
    entering each layer l (trace.residual[l]) and the cache entries below it (trace.result.kv[:l]) make the
    LayerStart of a later reading of the same ids over a cache that differs from this one only from layer l up.
    No output layer runs (continuation_scores reads the states)."""
    ids, keep = continuation_ids(prompt_ids, continuation)
    trace = residual_trace(model, ids.expand(len(kvs), -1), kvs[0] if len(kvs) == 1 else stack_caches(kvs),
                           logits_to_keep=None)
    return final_norm(model)(trace.residual[-1][:, keep]), trace


def final_norm(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """The model's own path from its last layer's output to the output layer's input, as a function of residual
    states [..., D]: the final norm (GPT-2 ``ln_f``; OPT ``final_layer_norm`` when the model has one, then
    ``project_out`` when it has one; Llama, Qwen2 and Gemma 3 ``norm``)."""
    base = model.base_model
    decoder = getattr(base, "decoder", base)  # OPT keeps its layers and final norm in .decoder
    steps = [m for m in (getattr(decoder, "ln_f", None), getattr(decoder, "final_layer_norm", None),
                         getattr(decoder, "norm", None), getattr(decoder, "project_out", None)) if m is not None]
    if not any(hasattr(decoder, name) for name in ("ln_f", "final_layer_norm", "norm")):
        raise ValueError(f"do not know the final norm of {type(model).__name__}")

    def normed(hidden: torch.Tensor) -> torch.Tensor:
        for step in steps:
            hidden = step(hidden)
        return hidden

    return normed


def final_readout(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """The model's own path from its last layer's output to the next-token logits, as a function of residual states
    [..., D]: the final norm (final_norm), the output layer, and Gemma's final logit soft-cap when the config sets
    one. Applied to ResidualTrace.residual[L] it gives the model's logits; applied to an earlier layer's output it is
    the logit lens of that layer."""
    norm, head = final_norm(model), model.get_output_embeddings()

    def readout(hidden: torch.Tensor) -> torch.Tensor:
        return soft_capped(model, head(norm(hidden)))

    return readout
