"""The attention function MoT Viz registers with transformers, and the plans it follows (inject, sparse, keep, start)."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

ATTN_NAME = "mot_viz"

KV = tuple[torch.Tensor, torch.Tensor]  # (K, V), each [B, n_kv, N, d_h]

@dataclass
class AttentionPlan:
    """What the registered attention function does differently, per target layer, during one forward."""

    inject: dict[int, KV] = field(default_factory=dict)  # layer -> K/V replacing the last positions' computed K/V
    sparse: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> key indices [B, 1, N, k]
    # layer -> (k, offset): keep the top-k key positions of each query's head-averaged attention, over the
    # queries and keys from `offset` on (a BOS prefix excluded), as positions counted from `offset`; for a
    # prefill without a cache (queries and keys are the same positions)
    record_topk: dict[int, tuple[int, int]] = field(default_factory=dict)
    topk: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> key positions [B, 1, N_q - offset, k]
    record_queries: set[int] = field(default_factory=set)  # layers whose post-RoPE queries are kept
    queries: dict[int, tuple[torch.Tensor, float, int | None]] = field(default_factory=dict)
    # layer -> (query [B, H, N_q, d_h], scaling, sliding window or None)
    # layer -> (start, end): key positions [start, end) no query of this layer attends to (the cache holds them, every
    # other layer reads them): a layer whose cache keeps fewer positions than the others (mot_viz.sharing.kvcomm)
    hide: dict[int, tuple[int, int]] = field(default_factory=dict)
    keep_start: int | None = None  # keep the hidden state entering this layer (ForwardResult.start)
    start: "LayerStart | None" = None  # do not run the layers below start.layer: take their result from it
    start_input: torch.Tensor | None = None  # keep_start's hidden state, once the forward reached that layer


@dataclass(frozen=True)
class LayerStart:
    """Where a forward of the same ids can start instead of at layer 0: the hidden state entering ``layer`` and the
    cache entries of the layers below it, both from an earlier forward of the same ids over a cache that was the
    same below ``layer`` (or none), whose plan below ``layer`` was the same (the same sparse indices, nothing
    injected there); a batch's rows may start from different forwards. The layers below ``layer`` are then not run
    at all; the model's own forward still builds the embeddings, masks and rotary tables and runs every layer from
    ``layer`` up.
    """

    layer: int
    hidden: torch.Tensor  # [B, N, D], the input of `layer`
    kv: tuple[KV, ...]  # the cache entries of layers 0 … layer-1


_ACTIVE_PLAN: contextvars.ContextVar[AttentionPlan | None] = contextvars.ContextVar("mot_viz_plan", default=None)
# the last layer of a cache-only prefill (run with logits_to_keep=None): once its K/V are in the cache, nothing it
# computes after them (attention output, MLP, the final norm) is read, so its attention stops the forward there
_STOP_AFTER: contextvars.ContextVar[int | None] = contextvars.ContextVar("mot_viz_stop_after", default=None)
_CACHE_ONLY_STOP: contextvars.ContextVar[bool] = contextvars.ContextVar("mot_viz_cache_only_stop", default=True)


@contextlib.contextmanager
def whole_last_layer():
    """Cache-only prefills in this block run their last layer whole (residual_trace records its output; the engine
    benchmark times what the stop saves)."""
    token = _CACHE_ONLY_STOP.set(False)
    try:
        yield
    finally:
        _CACHE_ONLY_STOP.reset(token)


class _CacheBuilt(Exception):
    """Raised by the attention of a cache-only prefill's last layer, after the layer has cached its K/V."""


@contextlib.contextmanager
def active_plan(plan: AttentionPlan | None):
    """Run the enclosed forward passes under `plan`."""
    token = _ACTIVE_PLAN.set(plan)
    try:
        yield plan
    finally:
        _ACTIVE_PLAN.reset(token)


@functools.lru_cache(maxsize=16)  # every sparse layer of a replay asks for the same one: built once, never mutated
def _allowed_positions(q_len: int, kv_len: int, sliding_window: int | None, device) -> torch.Tensor:
    """Causal (and sliding-window) visibility [q_len, kv_len] for queries at the end of the key sequence."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    k_pos = torch.arange(kv_len, device=device)[None, :]
    allowed = k_pos <= q_pos
    if sliding_window:
        allowed &= (q_pos - k_pos) < sliding_window
    return allowed


def _eager_probs(module, query, key, scaling) -> torch.Tensor:
    """Per-head causal (and sliding-window) attention probabilities [B, H, N_q, N_kv] in float32."""
    return causal_probs(query, key, scaling, getattr(module, "sliding_window", None))


TOPK_QUERY_CHUNK = 512  # query rows per step of the sparse index selection: probabilities [H, 512, N], not [H, N, N]


def topk_positions(module, query, key, scaling, k: int, offset: int) -> torch.Tensor:
    """The top-k key positions (counted from `offset`) of each query's head-averaged attention, for the queries
    from `offset` on: [B, 1, N - offset, min(k, N - offset)]. A chunk of queries at a time: each row's softmax is
    its own, so a chunk's rows over the keys they may see, padded with the zero probability of the keys they may
    not, are the rows of the whole matrix (4,096 tokens: 0.6 GB of probabilities per layer at once otherwise)."""
    n = key.shape[2]
    chosen = []
    for start in range(offset, n, TOPK_QUERY_CHUNK):
        end = min(n, start + TOPK_QUERY_CHUNK)
        probs = _eager_probs(module, query[:, :, start:end], key[:, :, :end], scaling).mean(dim=1, keepdim=True)
        probs = torch.nn.functional.pad(probs[..., offset:], (0, n - end))  # (B, 1, end - start, N - offset)
        chosen.append(probs.topk(min(k, n - offset), dim=-1).indices)
    return torch.cat(chosen, dim=2)


def causal_probs(query: torch.Tensor, key: torch.Tensor, scaling: float, sliding_window: int | None) -> torch.Tensor:
    """Causal (and sliding-window) attention probabilities [B, H, N_q, N_kv] (float32) of queries at the end."""
    key = repeat_kv(key, query.shape[1] // key.shape[1])
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scaling
    allowed = _allowed_positions(query.shape[2], key.shape[2], sliding_window, query.device)
    return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min).softmax(dim=-1)


def attention_output(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
                     sliding_window: int | None) -> torch.Tensor:
    """Causal attention output [B, H, N_q, d_h] (float32) of recorded queries over K/V [B, n_kv, N_kv, d_h]."""
    probs = causal_probs(query, key, scaling, sliding_window)
    return probs @ repeat_kv(value, query.shape[1] // value.shape[1]).float()


SPARSE_GATHER_CHUNK = 64  # queries per step of the gather path: the fastest of 16–1,024 at 512–4,096 tokens
# the gather path's attention as one fused scaled_dot_product_attention call per chunk (each query a batch of its own
# over its k gathered keys; flash or memory-efficient kernels on a GPU), rather than two einsums and a softmax
SPARSE_GATHER_FUSED = True
# the gather path is chosen where a query may see at least this many times k keys: per key it costs 5–6× what a
# masked SDPA does, and the masked path scores every key a query's chunk may see (equal near 8·k: 256 keys at k=33)
SPARSE_GATHER_RATIO = 8


def gather_pays(k: int, length: int, window: int | None) -> bool:
    """Whether sparse attention over `length` keys takes the gather path (O(N·k)) rather than the masked one (about
    O(N·span)): the span of keys a query may see (the sliding window, else every key) is ≥ SPARSE_GATHER_RATIO·k."""
    span = min(length, window) if window else length
    return span >= SPARSE_GATHER_RATIO * k


def sparse_attention(module, query, key, value, indices, scaling, chunk: int | None = None) -> torch.Tensor:
    """Attention of each query to its own top-k key positions (method.md §6, sparse attention): O(N·k) work.

    query [B, H, N, d]; key, value [B, n_kv, N, d]; indices [B, 1|H, N, k] (key positions, the sentinel N
    marks a removed duplicate). Entries after the query position (and outside a sliding window) are masked;
    the softmax runs in float32; a query that keeps no key attends uniformly to its k gathered entries. The
    queries go in chunks of `chunk` (default SPARSE_GATHER_CHUNK, read at the call; 0: all at once), so at most
    chunk·k key and value vectors per KV head are gathered at a time. Returns [B, N, H, d] like the stock
    attention functions.
    """
    b, h, n, d = query.shape
    n_kv, length, k = key.shape[1], key.shape[2], indices.shape[-1]
    rep = h // n_kv
    idx = indices.expand(b, n_kv, n, k) if indices.shape[1] == 1 else indices[:, ::rep]
    # rows of the flattened K/V [B·n_kv·N_kv, d]: index_select copies whole rows (a gather over d does not)
    rows = idx.clamp(0, length - 1) + (torch.arange(b * n_kv, device=query.device) * length).view(b, n_kv, 1, 1)
    flat_k, flat_v = key.reshape(-1, d), value.reshape(-1, d)
    q = query.reshape(b, n_kv, rep, n, d)  # GQA groups share gathered keys
    window = getattr(module, "sliding_window", None)
    out = query.new_empty(b, n, h, d)
    chunk = SPARSE_GATHER_CHUNK if chunk is None else chunk
    step = chunk if chunk > 0 else n
    for a in range(0, n, step):
        e = min(n, a + step)
        k_sel = flat_k.index_select(0, rows[:, :, a:e].reshape(-1)).view(b, n_kv, e - a, k, d)
        v_sel = flat_v.index_select(0, rows[:, :, a:e].reshape(-1)).view(b, n_kv, e - a, k, d)
        q_pos = torch.arange(length - n + a, length - n + e, device=query.device).view(1, 1, 1, e - a, 1)
        key_pos = idx[:, :, a:e].unsqueeze(2)  # (B, n_kv, 1, e - a, k)
        masked = key_pos > q_pos
        if window:
            masked |= (q_pos - key_pos) >= window
        if SPARSE_GATHER_FUSED:
            out[:, a:e] = _fused_gather(q[:, :, :, a:e], k_sel, v_sel, masked, scaling)
            continue
        scores = torch.einsum("bgrnd,bgnkd->bgrnk", q[:, :, :, a:e].float(), k_sel.float()) * scaling
        scores = scores.masked_fill(masked, torch.finfo(scores.dtype).min)  # all masked -> uniform softmax
        probs = scores.softmax(dim=-1).to(value.dtype)
        out[:, a:e] = torch.einsum("bgrnk,bgnkd->bgrnd", probs, v_sel).reshape(b, h, e - a, d).transpose(1, 2)
    return out


def _fused_gather(q: torch.Tensor, k_sel: torch.Tensor, v_sel: torch.Tensor, masked: torch.Tensor,
                  scaling: float) -> torch.Tensor:
    """One chunk of the gather path in one SDPA call: q [B, n_kv, rep, c, d] over its own gathered keys and values
    [B, n_kv, c, k, d], `masked` [B, n_kv, 1, c, k] left out by an additive bias of the dtype's lowest value (a row
    with every key masked then attends uniformly, as the unfused path's masked_fill does). Returns [B, c, H, d]."""
    b, n_kv, rep, c, d = q.shape
    k = k_sel.shape[3]
    queries = q.permute(0, 1, 3, 2, 4).reshape(b * n_kv * c, 1, rep, d)  # each query position a batch of its own
    bias = torch.zeros(masked.shape, dtype=q.dtype, device=q.device).masked_fill(masked, torch.finfo(q.dtype).min)
    out = torch.nn.functional.scaled_dot_product_attention(
        queries, k_sel.reshape(b * n_kv * c, 1, k, d), v_sel.reshape(b * n_kv * c, 1, k, d),
        attn_mask=bias.reshape(b * n_kv * c, 1, 1, k), scale=scaling)
    return out.view(b, n_kv, c, rep, d).permute(0, 2, 1, 3, 4).reshape(b, c, n_kv * rep, d)


SPARSE_QUERY_CHUNK = 64  # queries per SDPA call of the masked sparse path (sparse_mask_attention); 0: one call


def sparse_mask_attention(module, query, key, value, indices, scaling,
                          chunk: int | None = None) -> torch.Tensor | None:
    """sparse_attention computed as dense SDPA under a boolean mask of each query's top-k key positions.

    The same set of keys and the same softmax (a row's indices are distinct: top-k positions, with remapped
    duplicates already turned into the sentinel), at the cost of ordinary attention instead of a gather of
    N·k key vectors. A mask keeps SDPA from skipping the keys after a query as causal attention does, so the
    queries go in chunks of `chunk` (default SPARSE_QUERY_CHUNK, read at the call; 0: all in one call), each over
    only the keys its last query may see (and, on a sliding-window layer, its first query). Short spans take this
    path, long ones the gather path (gather_pays; benchmarks/engine.md). Returns None when some query keeps no key
    (the gather path's uniform fallback, possible only after token remapping), so the caller falls back to it.
    """
    b, h, n, _ = query.shape
    n_kv, length = key.shape[1], key.shape[2]
    window = getattr(module, "sliding_window", None)
    idx = indices if indices.shape[1] == 1 else indices[:, :: h // n_kv]  # per query head group
    keep = torch.zeros(*idx.shape[:3], length + 1, dtype=torch.bool, device=query.device)
    keep.scatter_(-1, idx.clamp(0, length), True)  # the duplicate sentinel lands in the extra column
    keep = keep[..., :length] & _allowed_positions(n, length, window, query.device)
    if not keep.any(-1).all():
        return None
    if keep.shape[1] > 1:
        keep = keep.repeat_interleave(h // n_kv, dim=1)
    offset = length - n  # queries sit at the end of the keys
    chunk = SPARSE_QUERY_CHUNK if chunk is None else chunk
    step = chunk if chunk > 0 else n
    outputs = []
    for a in range(0, n, step):
        e = min(n, a + step)
        first = max(0, offset + a - window + 1) if window else 0  # keys no query of the chunk may see: left out
        last = offset + e
        outputs.append(torch.nn.functional.scaled_dot_product_attention(
            query[:, :, a:e], key[:, :, first:last], value[:, :, first:last], attn_mask=keep[:, :, a:e, first:last],
            scale=scaling, enable_gqa=n_kv < h))  # query groups share K/V, no copies
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
    return out.transpose(1, 2).contiguous()


WINDOWED_QUERY_CHUNK = 256  # queries per SDPA call of windowed_attention
# a sliding-window layer takes windowed_attention where its keys number at least this many windows (below that the
# stock SDPA under the model's mask does less bookkeeping for the same work); float("inf"): never
WINDOWED_MIN_WINDOWS = 2


def windowed_attention(query, key, value, attention_mask, scaling, window: int,
                       chunk: int | None = None) -> torch.Tensor:
    """Dense attention of a sliding-window layer over only the keys each chunk of queries may see: O(N·window)
    work where SDPA under the layer's [N, N] mask does O(N²). The same keys and the same softmax as the stock
    path: each chunk of `chunk` queries (default WINDOWED_QUERY_CHUNK) runs SDPA over the keys from the window
    of its first query to its last query, under that block of the model's own mask (padding included), or of the
    causal sliding-window mask when the model passes none. Queries sit at the end of the keys (a cache before
    them is fine). Returns [B, N, H, d] like the stock attention functions."""
    b, h, n, _ = query.shape
    n_kv, length = key.shape[1], key.shape[2]
    offset = length - n
    if attention_mask is not None:
        attention_mask = attention_mask[:, :, :, :length]
    chunk = WINDOWED_QUERY_CHUNK if chunk is None else chunk
    outputs = []
    for a in range(0, n, chunk):
        e = min(n, a + chunk)
        first, last = max(0, offset + a - window + 1), offset + e
        if attention_mask is None:
            mask = _allowed_positions(n, length, window, query.device)[a:e, first:last]
        else:
            mask = attention_mask[:, :, a:e, first:last]
        outputs.append(torch.nn.functional.scaled_dot_product_attention(
            query[:, :, a:e], key[:, :, first:last], value[:, :, first:last], attn_mask=mask, scale=scaling,
            enable_gqa=n_kv < h))
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
    return out.transpose(1, 2).contiguous()


def mot_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The attention function registered as ``mot_viz``: SDPA, unless the active plan says otherwise."""
    plan = _ACTIVE_PLAN.get()
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if kwargs.get("softcap") is not None:  # no supported family soft-caps attention (Gemma 3 does not)
        raise NotImplementedError("attention logit soft-capping is not supported by MoT Viz")
    if plan is not None:
        layer = module.layer_idx
        if layer in plan.inject:
            k_inj, v_inj = plan.inject[layer]
            n = k_inj.shape[2]  # positions before these (a BOS prefix) keep their computed K/V
            if k_inj.shape[:2] + k_inj.shape[3:] != key.shape[:2] + key.shape[3:] or n > key.shape[2]:
                raise ValueError(f"injected K {tuple(k_inj.shape)} does not fit layer {layer} K {tuple(key.shape)}")
            key = torch.cat([key[:, :, : key.shape[2] - n], k_inj.to(key.device, key.dtype)], dim=2)
            value = torch.cat([value[:, :, : value.shape[2] - n], v_inj.to(value.device, value.dtype)], dim=2)
        if layer in plan.record_queries:
            plan.queries[layer] = (query.detach(), float(scaling), getattr(module, "sliding_window", None))
        if layer in plan.record_topk:
            k_top, offset = plan.record_topk[layer]
            if query.shape[2] != key.shape[2]:
                raise ValueError("record_topk needs a prefill without a cache (queries at every key position)")
            plan.topk[layer] = topk_positions(module, query, key, scaling, k_top, offset)
    stop = _STOP_AFTER.get()
    if stop is not None and module.layer_idx == stop:  # a cache-only prefill's last layer: its K/V are cached by now
        raise _CacheBuilt
    if plan is not None and module.layer_idx in plan.sparse:
        indices = plan.sparse[module.layer_idx].to(query.device)  # chosen by the source prefill, maybe elsewhere
        out = None
        if not gather_pays(indices.shape[-1], key.shape[2], getattr(module, "sliding_window", None)):
            out = sparse_mask_attention(module, query, key, value, indices, scaling)  # None: a query keeps no key
        if out is None:
            out = sparse_attention(module, query, key, value, indices, scaling)
        return out, None
    window = getattr(module, "sliding_window", None)
    if plan is not None and module.layer_idx in plan.hide:
        return sdpa_attention_forward(module, query, key, value, _hidden_keys_mask(
            attention_mask, query.shape[2], key.shape[2], window, plan.hide[module.layer_idx], query.device),
            scaling=scaling, dropout=dropout, **kwargs)
    if window and query.shape[2] > 1 and key.shape[2] >= WINDOWED_MIN_WINDOWS * window and not (
            dropout and module.training):
        return windowed_attention(query, key, value, attention_mask, scaling, window), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)


def _hidden_keys_mask(attention_mask, q_len: int, kv_len: int, window: int | None, hidden: tuple[int, int],
                      device) -> torch.Tensor:
    """The layer's boolean mask [B|1, 1, q_len, kv_len] (the model's own, else causal and sliding) with the key
    positions [start, end) hidden from every query."""
    if attention_mask is None:
        mask = _allowed_positions(q_len, kv_len, window, device)[None, None].clone()
    elif attention_mask.dtype == torch.bool:
        mask = attention_mask[:, :, :, :kv_len].clone()
    else:  # an additive float mask: 0 where a key is seen
        mask = attention_mask[:, :, :, :kv_len] == 0
    mask[..., hidden[0]: hidden[1]] = False
    return mask


AttentionInterface.register(ATTN_NAME, mot_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_NAME, sdpa_mask)


def install_attention(model: torch.nn.Module) -> None:
    """Route the model's attention through :func:`mot_attention`; let a plan keep or start from a layer's input."""
    model.set_attn_implementation(ATTN_NAME)
    for index, layer in enumerate(decoder_layers(model)):
        if not getattr(layer, "_mot_viz_startable", False):
            layer.forward = functools.partial(_startable_forward, layer.forward, index)
            layer._mot_viz_startable = True


def _startable_forward(forward, index: int, *args, **kwargs):
    """A decoder layer's own forward, unless the active plan starts above it (then the start's hidden state is what
    the layer hands on; the model's loop feeds it to the next layer) or keeps its input."""
    plan = _ACTIVE_PLAN.get()
    if plan is not None:
        if plan.start is not None and index < plan.start.layer:
            return plan.start.hidden
        if plan.keep_start == index:
            plan.start_input = (args[0] if args else kwargs["hidden_states"]).detach()
    return forward(*args, **kwargs)



def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers in order (``transformer.h``, ``model.layers``, ``model.decoder.layers`` …)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer")
    for _, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n and \
                type(module[0]).__name__.endswith(("DecoderLayer", "Block")):
            return list(module)
    raise ValueError(f"no list of {n} decoder layers found in {type(model).__name__}")

