"""Forward passes on plain-tensor caches: rotary keys, cache conversion, run, generation, continuation scores (the
residual trace is hf.trace)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from .attention import (_CACHE_ONLY_STOP, _STOP_AFTER, KV, AttentionPlan, LayerStart, _CacheBuilt, active_plan,
                        decoder_layers)


FEW_ROWS = 8  # the output layer of a prepared model multiplies at most this many positions as weight @ hidden.T
VOCAB_CHUNK = 8192  # output-layer rows multiplied at once when continuation_scores reads many positions


def install_output_layer(model: torch.nn.Module) -> None:
    """Let the model's output layer multiply a few positions (2–FEW_ROWS) as weight @ hidden.T on CPU.

    The same product; only the kernel differs. For a handful of rows the stock x @ weight.T takes 2–7x longer on
    these CPUs (Gemma-3-270m's 262k × 640 output layer, two threads: 3 rows 139 ms against 20 ms, 4 rows 85 ms
    against 36 ms; one row or 9+ rows about the same either way), and the app reads logits of 2–4 rows at a time:
    each decoding step of the Answers batch, the first answer token of two caches, the Shift page's seed.
    """
    head = model.get_output_embeddings()
    if isinstance(head, torch.nn.Linear) and not getattr(head, "_mot_viz_few_rows", False):
        head.forward = functools.partial(_output_layer_forward, head)
        head._mot_viz_few_rows = True


def _output_layer_forward(head: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if not 1 < rows <= FEW_ROWS or x.device.type != "cpu":
        return torch.nn.functional.linear(x, head.weight, head.bias)
    out = torch.mm(head.weight, x.reshape(rows, x.shape[-1]).T).T  # (rows, vocab)
    if head.bias is not None:
        out = out + head.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


# ----- rotary position embeddings (the pre-RoPE key space, method.md §12) ---------------------------


def _rotary_module(model: torch.nn.Module) -> torch.nn.Module | None:
    base = getattr(model, "model", model)
    return getattr(base, "rotary_emb", None)


def has_rope(model: torch.nn.Module) -> bool:
    """Whether the model's cached keys are rotated by a rotary position embedding (GPT-2 and OPT: no)."""
    return _rotary_module(model) is not None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rotate_keys(model: torch.nn.Module, layer: int, keys: torch.Tensor, positions: torch.Tensor,
                inverse: bool = False) -> torch.Tensor:
    """Apply (or undo, with inverse) layer `layer`'s rotary embedding to keys [B, n_kv, N, d_h] at `positions` [N].

    The cached keys of a RoPE model are its pre-RoPE keys (after q/k-norm where the family has one)
    rotated per position; rotation is orthogonal, so undoing it recovers them exactly up to rounding.
    Gemma 3's sliding and global layers use their own rotary bases (the layer's type picks the table).
    Models without RoPE get their keys back unchanged.
    """
    rotary = _rotary_module(model)
    if rotary is None:
        return keys
    pos = positions.to(keys.device).view(1, -1)
    layer_types = getattr(getattr(model, "config", None), "layer_types", None)
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        cos, sin = rotary(keys, pos, layer_types[layer])
    else:
        cos, sin = rotary(keys, pos)
    if cos.shape[-1] != keys.shape[-1]:
        raise NotImplementedError("partial rotary embeddings are not supported by the pre-RoPE key space")
    cos, sin = cos[:, None].to(keys.dtype), sin[:, None].to(keys.dtype)  # (1, 1, N, d_h)
    if inverse:  # the transpose rotation, divided by the table's scale (1 for plain RoPE)
        return (keys * cos - _rotate_half(keys) * sin) / (cos * cos + sin * sin)
    return keys * cos + _rotate_half(keys) * sin


# ----- caches as plain tensors ---------------------------------------------------------------------


def new_cache() -> DynamicCache:
    # Plain (non-sliding) layers keep every position, so a cache can be copied and extended exactly;
    # sliding-window models still get their sliding masks from the mask functions.
    return DynamicCache()


def cache_from_kv(kv: list[KV]) -> DynamicCache:
    """A fresh cache holding the given per-layer K/V (autograd history is kept)."""
    cache = new_cache()
    for layer, (k, v) in enumerate(kv):
        cache.update(k, v, layer)
    return cache


def kv_from_cache(cache: DynamicCache) -> list[KV]:
    """Per-layer (K, V), each [B, n_kv, N, d_h]."""
    return [(layer.keys, layer.values) for layer in cache.layers]


@dataclass
class ForwardResult:
    logits: torch.Tensor | None  # [B, N, vocab] (the kept positions); None when no output layer ran
    kv: list[KV]  # the cache after the forward pass, per layer
    topk: dict[int, torch.Tensor]  # the plan's record_topk results, layer -> key positions [B, 1, N_q - offset, k]
    start: LayerStart | None = None  # where a later forward of the same ids can start (the plan's keep_start)
    # the plan's record_queries results, layer -> (query [B, H, N_q, d_h], scaling, sliding window or None)
    queries: dict[int, tuple[torch.Tensor, float, int | None]] = field(default_factory=dict)


def run(model, ids: torch.Tensor | None, kv: list[KV] | None = None, plan: AttentionPlan | None = None,
        logits_to_keep: int | torch.Tensor | None = 0, embeds: torch.Tensor | None = None) -> ForwardResult:
    """One forward pass of `ids` [B, N] on top of the (copied, never mutated) cache `kv`, under `plan`; or, with
    `embeds` [B, N, hidden] (ids None), of those input embeddings in the tokens' place (a latent hand-off).

    logits_to_keep: 0 keeps all logits, n > 0 only the last n, a tensor of positions only those (each saves the
    big output layer's time); None runs no output layer at all (logits None): a prefill that only builds a cache,
    which also stops once the last layer's K/V are cached (its attention output and MLP would feed only the output
    layer), except under whole_last_layer (residual_trace records the last layer's output).
    The output layer reads its whole weight even for one position (Gemma-3's 262k × 640 rows: ~0.7 GB, ~40 ms of
    memory traffic on these machines, a tenth of a 128-token prefill), so a cache-only prefill skips it.
    """
    cache = cache_from_kv(kv) if kv else new_cache()
    keep: int | torch.Tensor | None = logits_to_keep
    inputs = {"input_ids": ids} if embeds is None else {"inputs_embeds": embeds}
    ids = ids if embeds is None else embeds[..., 0]  # its [B, N] shape is what the kept positions read
    if isinstance(logits_to_keep, int) and logits_to_keep > 1 and ids.shape[0] > 1:
        # kept positions as a tensor: transformers then copies those rows, where the strided slice of a batch would
        # run the output layer as a batched matmul at half the speed (Gemma-3's 262k-row output layer: 2x). Not for
        # one position: at two threads that measured slower for two rows (a 25-token question: 0.20 s against 0.16 s),
        # before install_output_layer gave 2-8 rows their faster kernel (not measured again since)
        keep = torch.arange(max(ids.shape[1] - logits_to_keep, 0), ids.shape[1], device=ids.device)
    with active_plan(plan):
        if keep is None:  # the decoder alone, up to the last layer's K/V: no later work, no output layer
            logits = None
            stop = _STOP_AFTER.set(len(decoder_layers(model)) - 1 if _CACHE_ONLY_STOP.get() else None)
            try:
                model.base_model(**inputs, cache=cache, use_cache=True)
            except _CacheBuilt:
                pass
            finally:
                _STOP_AFTER.reset(stop)
        else:
            logits = model(**inputs, cache=cache, use_cache=True, logits_to_keep=keep).logits
    computed = kv_from_cache(cache)
    if plan is None:
        return ForwardResult(logits=logits, kv=computed, topk={})
    if plan.start is not None:  # the layers below the start did not run: their entries come with the start
        computed = list(plan.start.kv) + computed[plan.start.layer:]
    start = None
    if plan.keep_start is not None:
        start = LayerStart(plan.keep_start, plan.start_input, tuple(computed[: plan.keep_start]))
    return ForwardResult(logits=logits, kv=computed, topk=dict(plan.topk), start=start, queries=dict(plan.queries))


def eos_ids(model, tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids |= set(gen_eos) if isinstance(gen_eos, (list, tuple)) else {gen_eos}
    return ids


def greedy_generate(model, kv: list[KV] | None, prompt_ids: torch.Tensor, max_new_tokens: int,
                    stop_ids: set[int], stop_when=None) -> list[int]:
    """Greedy decoding for one example: append prompt_ids [1, n] to (a copy of) the cache, then decode.

    Stops at a stop id (not included), when stop_when(generated tokens so far) is true (the last token included),
    or after max_new_tokens. A batch of one for :func:`greedy_generate_batch`.
    """
    return greedy_generate_batch(model, [kv], prompt_ids, max_new_tokens, stop_ids, stop_when)[0]


def stack_caches(kvs: list[list[KV]]) -> list[KV]:
    """Caches of one example each, all layers of equal length, -> one cache with a batch row per cache."""
    if len({tuple(k.shape[2] for k, _ in kv) for kv in kvs}) != 1:
        raise ValueError("caches decoded as one batch must hold the same number of positions at every layer")
    return [(torch.cat([kv[l][0] for kv in kvs]), torch.cat([kv[l][1] for kv in kvs])) for l in range(len(kvs[0]))]


def left_padded(kvs: list[list[KV] | None]) -> tuple[list[list[KV] | None], torch.Tensor | None]:
    """Caches of different lengths (None: no cache) -> caches of the longest one's length, each shorter one
    left-padded with zeros, and the key mask [B, N] (1 = a real position; None when no cache needed padding).

    A cache's layers must all hold the same number of positions (MoT Viz's caches keep every position)."""
    lengths = [0 if kv is None else kv[0][0].shape[2] for kv in kvs]
    longest = max(lengths)
    if len(set(lengths)) == 1:
        return list(kvs), None
    template = next(kv for kv in kvs if kv is not None)
    padded = []
    for kv, n in zip(kvs, lengths):
        layers = []
        for layer, (k_ref, v_ref) in enumerate(template):
            pad_k = k_ref.new_zeros(1, k_ref.shape[1], longest - n, k_ref.shape[3])
            pad_v = v_ref.new_zeros(1, v_ref.shape[1], longest - n, v_ref.shape[3])
            k, v = kv[layer] if kv is not None else (pad_k[:, :, :0], pad_v[:, :, :0])
            layers.append((torch.cat([pad_k, k], dim=2), torch.cat([pad_v, v], dim=2)))
        padded.append(layers)
    mask = (torch.arange(longest)[None, :] >= torch.tensor([longest - n for n in lengths])[:, None]).long()
    return padded, mask.to(template[0][0].device)


@torch.no_grad()
def greedy_generate_batch(model, kvs: list[list[KV] | None], prompt_ids: torch.Tensor, max_new_tokens: int,
                          stop_ids: set[int], stop_when=None,
                          on_prompt: Callable[[list[KV], torch.Tensor], None] | None = None) -> list[list[int]]:
    """greedy_generate for several caches at once (one forward pass per step for all).

    Caches of one length are stacked as they are; caches of different lengths (None: no cache, as in the
    no-context condition of a model without a BOS prefix) are left-padded with masked zeros, and each row's
    positions continue from its own length, so every row computes what it would alone (up to float rounding).
    Each row stops on its own rule, and a stopped row's later tokens are discarded. Returns one token list per cache.
    on_prompt(cache, logprobs): called once after the prompt's forward with the batch's cache then (rows left-padded
    to the longest, as above) and the float32 log-probabilities [B, V] of every row's first new token.
    """
    b = len(kvs)
    padded, key_mask = left_padded(kvs)
    cache = cache_from_kv(stack_caches(padded)) if padded[0] else new_cache()
    ids = prompt_ids.expand(b, -1)
    extra = {}
    if key_mask is not None:  # per-row positions and the mask over the padding
        n = prompt_ids.shape[1]
        lengths = key_mask.sum(dim=1, keepdim=True)
        extra = {"attention_mask": torch.cat([key_mask, key_mask.new_ones(b, n)], dim=1),
                 "position_ids": lengths + torch.arange(n, device=key_mask.device)[None, :]}
    generated: list[list[int]] = [[] for _ in range(b)]
    running = [True] * b
    for _ in range(max_new_tokens):
        logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1, **extra).logits
        if on_prompt is not None:
            on_prompt(kv_from_cache(cache), logits[:, -1].float().log_softmax(-1))
            on_prompt = None
        tokens = logits[:, -1].argmax(-1).tolist()
        for i, token in enumerate(tokens):
            if not running[i]:
                continue
            if token in stop_ids:
                running[i] = False
                continue
            generated[i].append(token)
            if stop_when is not None and stop_when(generated[i]):
                running[i] = False
        if not any(running):
            break
        ids = torch.tensor(tokens, device=prompt_ids.device).view(b, 1)
        if extra:
            extra = {"attention_mask": torch.cat([extra["attention_mask"], key_mask.new_ones(b, 1)], dim=1),
                     "position_ids": extra["position_ids"][:, -1:] + 1}
    return generated


@torch.no_grad()
def continuation_logprob(model, kv: list[KV] | None, prompt_ids: torch.Tensor, continuation: list[int],
                         plan: AttentionPlan | None = None) -> float:
    """Mean log p(continuation | cache + prompt) per token (method.md §8 rule a, length-normalised), under `plan`."""
    return continuation_logprobs(model, [kv], prompt_ids, continuation, plan)[0]


@torch.no_grad()
def continuation_logprobs(model, kvs: list[list[KV] | None], prompt_ids: torch.Tensor, continuation: list[int],
                          plan: AttentionPlan | None = None) -> list[float]:
    """continuation_logprob after each of several caches of one length (or all None), run as one batch."""
    return continuation_scores(model, continuation_states(model, kvs, prompt_ids, continuation, plan), continuation)


@torch.no_grad()
def continuation_states(model, kvs: list[list[KV] | None], prompt_ids: torch.Tensor, continuation: list[int],
                        plan: AttentionPlan | None = None) -> torch.Tensor:
    """The last hidden states (after the final norm) [B, J, D] whose output-layer logits predict the continuation's
    J tokens after each of several caches of one length (or all None), run as one batch without the output layer:
    continuation_scores reads them, so the readings of many batches can share one output-layer pass."""
    if any(kv is None for kv in kvs) and not all(kv is None for kv in kvs):
        raise ValueError("caches scored as one batch must all hold the same positions (or all be None)")
    kv = kvs[0] if len(kvs) == 1 else stack_caches(kvs)
    ids, keep = continuation_ids(prompt_ids, continuation)
    cache = cache_from_kv(kv) if kv else new_cache()
    with active_plan(plan):
        hidden = model.base_model(input_ids=ids.expand(len(kvs), -1), cache=cache, use_cache=True).last_hidden_state
    return hidden[:, keep]


@torch.no_grad()
def continuation_scores(model, states: torch.Tensor, continuation: list[int]) -> list[float]:
    """Per row of states [B, J, D] (continuation_states), the continuation's mean log p per token.

    Up to FEW_ROWS positions go through the model's own output layer. More are multiplied VOCAB_CHUNK rows of the
    output layer at a time, each chunk's logsumexp taken at once, and the gold tokens' logits alone: the
    [B·J, vocab] logits are never written whole (Gemma-3-270m's 262k × 640 output layer, one thread: 528 positions
    ~2.3 s against ~3 s written whole; and one pass over many readings' positions reads the weight once: 4 ms a
    position at 528 positions against ~20 ms at 12, benchmarks/patching.md)."""
    head = model.get_output_embeddings()
    b, j, d = states.shape
    if b * j <= FEW_ROWS or not isinstance(head, torch.nn.Linear):
        return _mean_logprobs(soft_capped(model, head(states)), continuation)
    x = states.reshape(b * j, d).to(head.weight.dtype)
    weight, bias = head.weight, head.bias
    lse = torch.stack([soft_capped(model, torch.nn.functional.linear(
        x, weight[at : at + VOCAB_CHUNK], None if bias is None else bias[at : at + VOCAB_CHUNK])).float().logsumexp(-1)
        for at in range(0, weight.shape[0], VOCAB_CHUNK)]).logsumexp(0)
    gold = torch.tensor(continuation, device=x.device).repeat(b)
    gold_logits = (x * weight[gold]).sum(-1) + (0 if bias is None else bias[gold])
    return (soft_capped(model, gold_logits).float() - lse).view(b, j).mean(-1).tolist()


def soft_capped(model, logits: torch.Tensor) -> torch.Tensor:
    """The output layer's logits as the model returns them: Gemma's final logit soft-cap when its config sets one."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    cap = getattr(config, "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def continuation_ids(prompt_ids: torch.Tensor, continuation: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt + continuation ids [1, S + J], the positions whose logits predict the continuation [J])."""
    ids = torch.cat([prompt_ids, torch.tensor([continuation], device=prompt_ids.device)], dim=1)
    n = prompt_ids.shape[1]  # the logits of the prompt's last position and of each continuation token but the last
    return ids, torch.arange(n - 1, n - 1 + len(continuation), device=ids.device)


def _mean_logprobs(logits: torch.Tensor, continuation: list[int]) -> list[float]:
    """Per row, the mean log p of the continuation's tokens under logits [B, J, vocab] (log-softmax at the J tokens
    only: the logsumexp of each row, no [B, J, vocab] log-probabilities written)."""
    logits = logits.float()
    target = torch.tensor(continuation, device=logits.device)[None, :, None].expand(logits.shape[0], -1, -1)
    logp = logits.gather(-1, target)[..., 0] - logits.logsumexp(-1)  # (B, J)
    return logp.mean(-1).tolist()
