"""Replay through the attention registry on tiny models of every supported family (method.md §6, §12)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conftest import CORPUS, FAMILIES, tiny_model
from mot_viz.engine import hf
from mot_viz.engine.channels import Channels, injection_channels
from mot_viz.engine.layout import window_blocks
from mot_viz.engine.mot import (MoT, ReplayConfig, native_cache, prepare_source, replay, replay_window, sparse_indices,
                                target_context_ids, translate, translate_again, translate_window, unread_window_layers)
from mot_viz.engine.translator import GateOverride
from tolerance import close

TEXT = CORPUS[0] + " " + CORPUS[1]


def _logits(model, kv, ids):
    return hf.run(model, ids, kv).logits


@pytest.mark.parametrize("family", FAMILIES)
def test_injecting_native_kv_reproduces_native_logits(family):
    target = tiny_model(family, layers=5)
    ids = target_context_ids(target, TEXT)
    reference = hf.run(target.model, ids)  # a plain forward pass
    channels = injection_channels(5, 5, start=1, window=3)
    k, v = window_blocks(reference.kv, channels.target_layers)
    mixed = replay(target, ids, channels.target_layers, k, v, sparse=None)
    for (km, vm), (kn, vn) in zip(mixed, reference.kv):
        assert (km - kn).abs().max() <= 1e-5 and (vm - vn).abs().max() <= 1e-5
    # the target continues identically from the mixed cache and from its own
    suffix = torch.tensor([[5, 6, 7]])
    assert (_logits(target.model, mixed, suffix) - _logits(target.model, reference.kv, suffix)).abs().max() <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_a_cache_only_prefill_skips_the_output_layer_and_builds_the_same_cache(family):
    target = tiny_model(family, layers=3)
    ids = target_context_ids(target, TEXT)
    full = hf.run(target.model, ids, logits_to_keep=1)
    cache_only = hf.run(target.model, ids, logits_to_keep=None)
    assert cache_only.logits is None and full.logits.shape[1] == 1
    for (ka, va), (kb, vb) in zip(full.kv, cache_only.kv, strict=True):
        assert torch.equal(ka, kb) and torch.equal(va, vb)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_cache_only_prefill_stops_at_the_last_layers_kv_unless_traced(family):
    """The last layer's MLP feeds only the output layer: a cache-only prefill runs every MLP but that one; a residual
    trace (it records the last layer's output), a forward with logits and one under whole_last_layer run them all,
    and the cache is the same."""
    target = tiny_model(family, layers=3)
    ids = target_context_ids(target, TEXT)
    calls = []
    hooks = [hf.trace._block_parts(layer)[2].register_forward_hook(lambda m, a, o, i=i: calls.append(i))
             for i, layer in enumerate(hf.decoder_layers(target.model))]
    try:
        hf.run(target.model, ids, logits_to_keep=None)
        assert calls == [0, 1]
        calls.clear()
        trace = hf.residual_trace(target.model, ids, logits_to_keep=None)
        assert calls == [0, 1, 2] and trace.residual.shape[0] == 4
        calls.clear()
        hf.run(target.model, ids, logits_to_keep=1)
        assert calls == [0, 1, 2]
        calls.clear()
        with hf.whole_last_layer():
            whole = hf.run(target.model, ids, logits_to_keep=None)
        assert calls == [0, 1, 2]
        assert all(torch.equal(a, b) for kv_a, kv_b in zip(whole.kv, hf.run(target.model, ids, logits_to_keep=None).kv)
                   for a, b in zip(kv_a, kv_b))
    finally:
        for h in hooks:
            h.remove()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_output_layer_gives_the_stock_logits_for_any_number_of_rows(family):
    """A prepared model's output layer multiplies 2–FEW_ROWS positions as weight @ hidden.T (a faster kernel on CPU):
    the logits of a batch of any size, one position or several, are the stock layer's (bias included)."""
    target = tiny_model(family, layers=2)
    head = target.model.get_output_embeddings()
    assert head._mot_viz_few_rows
    g = torch.Generator().manual_seed(0)
    for shape in [(1, 1), (2, 1), (3, 1), (1, 3), (2, 4), (hf.FEW_ROWS + 1, 1), (4, 5)]:
        x = torch.randn(*shape, head.in_features, generator=g)
        stock = torch.nn.functional.linear(x, head.weight, head.bias)
        got = head(x)
        assert got.shape == stock.shape and close(got, stock), shape
    if head.bias is None:  # no family here has an output bias: check it on a copy that has one
        biased = torch.nn.Linear(head.in_features, 7)
        x = torch.randn(3, 1, head.in_features, generator=g)
        assert close(hf.forward._output_layer_forward(biased, x), biased(x))


@pytest.mark.parametrize("family", FAMILIES)
def test_perturbed_window_changes_only_what_lies_above(family):
    target = tiny_model(family, layers=6)
    ids = target_context_ids(target, TEXT)
    native = native_cache(target, ids)
    channels = injection_channels(6, 6, start=2, window=2)
    k, v = window_blocks(native, channels.target_layers)
    mixed = replay(target, ids, channels.target_layers, k + 0.5 * torch.randn_like(k), v + 0.5 * torch.randn_like(v),
                   sparse=None)
    for layer in range(6):
        dk = (mixed[layer][0] - native[layer][0]).abs().max().item()
        dv = (mixed[layer][1] - native[layer][1]).abs().max().item()
        if layer <= channels.start:
            # below the window nothing moves; the first window layer caches native-like K/V computed
            # from its (still unperturbed) input, so it is unchanged too (method.md §6 step 3)
            assert dk == 0 and dv == 0, layer
        else:
            assert dk > 1e-4 and dv > 1e-4, layer
    injected = replay(target, ids, channels.target_layers, k + 1.0, v + 1.0, sparse=None, cache_injected_window=True)
    for t in channels.target_layers:
        assert (injected[t][0] - native[t][0]).abs().max() > 0.5  # the heat-map variant stores the injected K/V


@pytest.mark.parametrize("family", FAMILIES)
def test_sparse_attention_with_every_position_equals_dense(family):
    model = tiny_model(family, layers=3)
    ids = target_context_ids(model, TEXT)
    n = ids.shape[1]
    dense = hf.run(model.model, ids)
    all_positions = torch.arange(n).view(1, 1, 1, n).expand(1, 1, n, n)
    sparse = hf.run(model.model, ids, plan=hf.AttentionPlan(sparse={l: all_positions for l in range(3)}))
    assert (sparse.logits - dense.logits).abs().max() <= 1e-4
    # keeping only the diagonal makes each token attend to itself alone: a real change
    diag = torch.arange(n).view(1, 1, n, 1)
    self_only = hf.run(model.model, ids, plan=hf.AttentionPlan(sparse={1: diag}))
    assert (self_only.logits - dense.logits).abs().max() > 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_reach_every_translator_parameter(family):
    source = tiny_model("llama", vocab_size=280, layers=4, seed=1)
    target = tiny_model(family, layers=4)
    channels = Channels((1, 2, 3), (1, 2, 3))
    mot = MoT.build(source.spec, target.spec, channels, ReplayConfig(topk_sparse_attn=4, num_bottom_full_attn=1),
                    dim=16, heads=2, num_experts=3, top_k=3)
    ids = target_context_ids(target, TEXT)
    src = prepare_source(mot, source, target, ids)
    out = translate_window(mot, src, source, target)
    mixed = replay(target, ids, channels.target_layers, out.keys, out.values, sparse_indices(mot, src))
    native = native_cache(target, ids)
    logits = hf.run(target.model, torch.tensor([[3, 4, 5]]), mixed).logits
    loss = logits.logsumexp(-1).mean() + sum(((m[0] - n[0]) ** 2).mean() for m, n in zip(mixed[1:], native[1:]))
    loss.backward()
    no_grad = [name for name, p in mot.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not no_grad


@pytest.mark.parametrize("family", FAMILIES)
def test_a_replay_started_at_the_window_equals_the_full_replay(family):
    """Controls and what-ifs replay from the translation's state entering the window: the layers below it are not
    run again, and every cache entry and the first layer's input are bit-identical to a replay from layer 0."""
    source = tiny_model("llama", vocab_size=280, layers=5, seed=1)
    target = tiny_model(family, layers=5, bos=family == "gemma3_text")
    channels = Channels((2, 3), (2, 3))
    mot = MoT.build(source.spec, target.spec, channels, ReplayConfig(topk_sparse_attn=4, num_bottom_full_attn=1),
                    dim=16, heads=2, num_experts=3, top_k=2)
    tr = translate(mot, source, target, TEXT)
    assert tr.window_start.layer == 2 and len(tr.window_start.kv) == 2
    assert tr.window_start.hidden.shape[:2] == (1, tr.prefix_len + tr.target_ids.shape[1])
    k, v = tr.native_window_blocks(channels)
    k, v = k + 0.3 * torch.randn_like(k), v + 0.3 * torch.randn_like(v)
    full = replay(target, tr.target_ids, channels.target_layers, k, v, tr.sparse_indices)
    started = replay_window(mot, target, tr, k, v)
    for (kf, vf), (ks, vs) in zip(full, started, strict=True):
        assert torch.equal(kf, ks) and torch.equal(vf, vs)
    assert not torch.equal(full[3][0], tr.mixed_kv[3][0])  # another window: a real change above it
    # below the window the entries are the translation's own; layers 0, 1 are never run (a poisoned start shows it)
    poisoned = replace(tr, window_start=replace(tr.window_start, hidden=tr.window_start.hidden + 1.0))
    assert not torch.equal(replay_window(mot, target, poisoned, k, v)[2][0], full[2][0])
    # the what-if path: gates overridden, the translation redone from the translator on
    forced = translate_again(mot, source, target, tr, GateOverride("force", 1))
    again = translate(mot, source, target, TEXT, override=GateOverride("force", 1))
    assert torch.equal(forced.translated.keys, again.translated.keys)
    for (ka, va), (kb, vb) in zip(forced.mixed_kv, again.mixed_kv, strict=True):
        assert torch.equal(ka, kb) and torch.equal(va, vb)
    with pytest.raises(ValueError, match="starts at layer 3, not 2"):
        replay(target, tr.target_ids, (3, 4), k, v, tr.sparse_indices, start=tr.window_start)


def test_translate_end_to_end_on_tiny_pair_with_different_tokenizers():
    source = tiny_model("gpt2", vocab_size=280, layers=4, seed=1)
    target = tiny_model("gemma3_text", vocab_size=300, layers=4)
    mot = MoT.build(source.spec, target.spec, Channels((2, 3), (2, 3)), dim=16, heads=2)
    tr = translate(mot, source, target, TEXT)
    n_t = tr.target_ids.shape[1]
    assert tr.source.source_ids.shape[1] != n_t  # the two tokenizers cut the text differently
    assert tr.translated.keys.shape == (1, n_t, 2, target.spec.kv_hidden)
    assert tr.translated.key_routing.gates.shape == (1, n_t, 4)
    assert len(tr.mixed_kv) == 4 and tr.mixed_kv[3][0].shape == tr.native_kv[3][0].shape
    assert set(tr.sparse_indices) == {2, 3}  # nb=2: layers 0,1 dense
    assert set(tr.timings) >= {"alignment", "source_prefill", "translator", "replay", "native_prefill"}


def test_bos_prefix_is_kept_native_and_never_translated():
    source = tiny_model("gemma3_text", vocab_size=280, layers=4, seed=1, bos=True)  # BOS on both sides
    target = tiny_model("gemma3_text", layers=4, bos=True)
    assert target.prefix_ids == [target.tokenizer.bos_token_id] and tiny_model("llama").prefix_ids == []
    channels = Channels((2, 3), (2, 3))
    mot = MoT.build(source.spec, target.spec, channels, ReplayConfig(topk_sparse_attn=3, num_bottom_full_attn=1),
                    dim=16, heads=2)
    tr = translate(mot, source, target, TEXT)
    n_t = tr.target_ids.shape[1]
    assert tr.prefix_len == 1 and tr.target_ids[0, 0] != target.tokenizer.bos_token_id
    assert tr.source.source_kv[0][0].shape[2] == tr.source.source_ids.shape[1]  # source BOS dropped too
    assert tr.translated.keys.shape[1] == n_t  # only context tokens are translated
    for (km, vm), (kn, vn) in zip(tr.mixed_kv, tr.native_kv):
        assert km.shape[2] == n_t + 1
        assert torch.equal(km[:, :, :1], kn[:, :, :1]) and torch.equal(vm[:, :, :1], vn[:, :, :1])  # BOS untouched
    # every context query keeps BOS (the attention sink) among its sparse keys; BOS queries see only BOS
    idx = tr.sparse_indices[2]
    assert idx.shape == (1, 1, n_t + 1, 1 + 3)
    assert (idx[0, 0, 1:, 0] == 0).all() and idx[0, 0, 0, 0] == 0 and (idx[0, 0, 0, 1:] == n_t + 1).all()
    # the source prefill chose them: the top-3 of each context query's head-averaged attention over the context,
    # recomputed here from the source's own queries and cached keys
    plan = hf.AttentionPlan(record_queries={1})
    ids = torch.cat([source.ids_tensor(source.prefix_ids), tr.source.source_ids], dim=1)
    kv = hf.run(source.model, ids, plan=plan).kv
    query, scaling, window = plan.queries[1]
    probs = hf.causal_probs(query, kv[1][0], scaling, window).mean(dim=1, keepdim=True)[..., 1:, 1:]
    assert torch.equal(tr.source.source_topk[1], probs.topk(3, dim=-1).indices)
    # injecting the native window reproduces the native cache with the prefix in place
    k, v = tr.native_window_blocks(channels)
    mixed = replay(target, tr.target_ids, channels.target_layers, k, v, sparse=None)
    assert all((m[0] - n[0]).abs().max() <= 1e-5 for m, n in zip(mixed, tr.native_kv))



@pytest.mark.parametrize("chunk", [3, 128])
@pytest.mark.parametrize("per_head, window, own", [(False, None, False), (True, None, False), (False, 5, False),
                                                   (False, 5, True), (True, 4, True)])
def test_masked_dense_sparse_attention_equals_the_gather_path(per_head, window, own, chunk):
    """The SDPA-under-a-mask path (used by default: faster on CPU) keeps the same keys and the same softmax as
    the gather path of method.md §6, with GQA groups, per-head indices, duplicate sentinels and a sliding window,
    whether the queries go in one SDPA call or in chunks over only the keys each chunk may see."""
    g = torch.Generator().manual_seed(0)
    b, h, n_kv, n, d, k = 1, 4, 2, 12, 8, 4
    q, key, value = (torch.randn(b, heads, n, d, generator=g) for heads in (h, n_kv, n_kv))
    rows = (b, h if per_head else 1, n)
    others = torch.rand(*rows, n - 1, generator=g).argsort(-1)[..., : k - 2] + 1  # distinct, as top-k indices are
    # every query keeps position 0 (a BOS sink) or, with `own`, itself (a sliding window cannot hide it)
    first = torch.arange(n).view(1, 1, n, 1).expand(*rows, 1) if own else torch.zeros(*rows, 1, dtype=torch.long)
    if own:  # keep the others distinct from the query's own position
        others = torch.where(others == first, torch.full_like(others, n), others)
    idx = torch.cat([first, others, torch.full((*rows, 1), n)], dim=-1)  # and the sentinel of a removed duplicate
    module = type("Attn", (), {"sliding_window": window})()
    masked = hf.sparse_mask_attention(module, q, key, value, idx, 0.35, chunk=chunk)
    gathered = hf.sparse_attention(module, q, key, value, idx, 0.35)
    if window is None or own:
        assert masked is not None and close(masked, gathered)
    else:  # the window hides position 0 from late queries: some keep no key, so the gather path's fallback rules
        assert masked is None


def _sparse_reference(q, key, value, idx, scaling, window):
    """Sparse attention one query row at a time, as method.md §6 states it: the softmax over the row's own keys that
    are neither after the query, outside its window nor the duplicate sentinel; a row that keeps none averages its
    k gathered (clamped) entries uniformly."""
    b, h, n, d = q.shape
    rep, length = h // key.shape[1], key.shape[2]
    out = torch.zeros(b, n, h, d)
    for bi in range(b):
        for head in range(h):
            rows = idx[bi, 0] if idx.shape[1] == 1 else idx[bi, head - head % rep]  # per head: its group's first
            for i in range(n):
                pos, q_at = rows[i], length - n + i
                keep = (pos <= q_at) & ((q_at - pos < window) if window else True)
                at = pos.clamp(max=length - 1)
                keys, values = key[bi, head // rep, at], value[bi, head // rep, at]
                w = torch.full((len(pos),), 1.0 / len(pos)) if not keep.any() else \
                    ((keys @ q[bi, head, i]) * scaling).masked_fill(~keep, float("-inf")).softmax(-1)
                out[bi, i, head] = w @ values
    return out


@pytest.mark.parametrize("per_head, window, own, batch", [
    (False, None, False, 1), (True, None, False, 2), (False, 5, True, 2), (True, 4, True, 1), (False, 3, False, 1)])
def test_chunked_gather_equals_the_masked_path_and_the_row_by_row_reference(per_head, window, own, batch, monkeypatch):
    """The gather path (O(N·k): each query's k keys gathered, a chunk of queries at a time), its attention fused into
    one SDPA call per chunk (the default) or not, equals the masked path and a row-by-row reference, with GQA groups, per-head indices, a batch, sliding windows, duplicate sentinels,
    queries that see one key only, and (window 3 without the own position) queries that see none, which both the
    gather path and the reference average uniformly while the masked path hands them over (None)."""
    g = torch.Generator().manual_seed(1)
    h, n_kv, n, d, k = 4, 2, 13, 8, 5
    q, key, value = (torch.randn(batch, heads, n, d, generator=g) for heads in (h, n_kv, n_kv))
    rows = (batch, h if per_head else 1, n)
    others = torch.rand(*rows, n - 1, generator=g).argsort(-1)[..., : k - 2] + 1
    first = torch.arange(n).view(1, 1, n, 1).expand(*rows, 1) if own else torch.zeros(*rows, 1, dtype=torch.long)
    if own:
        others = torch.where(others == first, torch.full_like(others, n), others)
    idx = torch.cat([first, others, torch.full((*rows, 1), n)], dim=-1)
    idx[..., 3, 1:] = n  # query 3 keeps its first key alone: the others are duplicate sentinels
    module = type("Attn", (), {"sliding_window": window})()
    reference = _sparse_reference(q, key, value, idx, 0.35, window)
    masked = hf.sparse_mask_attention(module, q, key, value, idx, 0.35, chunk=4)
    for fused in (True, False):
        monkeypatch.setattr(hf.attention, "SPARSE_GATHER_FUSED", fused)
        for chunk in (1, 4, 64, 0):  # one query per step, steps that do not divide N, one step, all at once
            gathered = hf.sparse_attention(module, q, key, value, idx, 0.35, chunk=chunk)
            assert gathered.shape == (batch, n, h, d) and close(gathered, reference)
            if masked is not None:
                assert close(gathered, masked)
    assert (masked is None) == (window == 3)  # late queries lose position 0 to the window and keep nothing else


def test_the_sparse_path_is_chosen_by_the_span_of_keys_a_query_may_see(monkeypatch):
    """Gather where a query may see at least SPARSE_GATHER_RATIO·k keys (its sliding window, else every key), the
    masked path below that; the masked path's "no key kept" still falls back to the gather path."""
    ratio, k = hf.attention.SPARSE_GATHER_RATIO, 33
    assert hf.attention.gather_pays(k, 4097, None) and hf.attention.gather_pays(k, 8193, 512)  # Gemma-3 at length
    assert hf.attention.gather_pays(k, ratio * k, None) and not hf.attention.gather_pays(k, ratio * k - 1, None)
    assert not hf.attention.gather_pays(k, 4097, ratio * k - 1)  # a window narrower than the rule: masked
    assert not hf.attention.gather_pays(k, 257, 512)  # short contexts: masked
    calls = []
    for name in ("sparse_attention", "sparse_mask_attention"):
        original = getattr(hf.attention, name)
        monkeypatch.setattr(hf.attention, name, lambda *a, _f=original, _n=name, **kw: calls.append(_n) or _f(*a, **kw))
    model = tiny_model("llama", layers=2)
    ids = target_context_ids(model, TEXT)
    n = ids.shape[1]
    idx = torch.zeros(1, 1, n, 1, dtype=torch.long)  # every query keeps position 0 (k = 1)
    plan = hf.AttentionPlan(sparse={1: idx})
    for shipped_ratio, path in ((n, ["sparse_attention"]), (n + 1, ["sparse_mask_attention"])):
        monkeypatch.setattr(hf.attention, "SPARSE_GATHER_RATIO", shipped_ratio)  # span n ≥ n·1: gather
        calls.clear()
        hf.run(model.model, ids, plan=plan)
        assert calls == path
    calls.clear()
    hf.run(model.model, ids, plan=hf.AttentionPlan(sparse={1: torch.full((1, 1, n, 1), n)}))  # only sentinels
    assert calls == ["sparse_mask_attention", "sparse_attention"]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_replay_gives_the_same_logits_on_either_sparse_path(family, monkeypatch):
    """The same translation replayed with every sparse layer on the gather path and on the masked path: the same
    cache and the same next-token logits within float tolerance."""
    source = tiny_model("llama", vocab_size=280, layers=4, seed=1)
    target = tiny_model(family, layers=4, bos=family == "gemma3_text")
    channels = Channels((2, 3), (2, 3))
    mot = MoT.build(source.spec, target.spec, channels, ReplayConfig(topk_sparse_attn=4, num_bottom_full_attn=1),
                    dim=16, heads=2)
    tr = translate(mot, source, target, TEXT, with_native=False)
    suffix = torch.tensor([[5, 6, 7]])
    caches, logits = [], []
    for ratio in (0, float("inf")):  # every span pays for the gather path; none does
        monkeypatch.setattr(hf.attention, "SPARSE_GATHER_RATIO", ratio)
        caches.append(replay(target, tr.target_ids, channels.target_layers, tr.translated.keys, tr.translated.values,
                             tr.sparse_indices))
        logits.append(_logits(target.model, caches[-1], suffix))
    for (kg, vg), (km, vm) in zip(*caches, strict=True):
        assert (kg - km).abs().max() <= 1e-5 and (vg - vm).abs().max() <= 1e-5
    assert (logits[0] - logits[1]).abs().max() <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("bos", [False, True])
def test_left_padded_batch_decodes_each_row_as_alone(family, bos):
    """Caches of different lengths (the no-context cache among them: None, or the BOS prefix) decoded as one
    left-padded batch give every row the tokens it gets alone; a row of the same cache without the mask and
    its own positions would not (here: the padding is not ignored by accident)."""
    lm = tiny_model(family, bos=bos, seed=3)
    ids = lm.ids_tensor(lm.prefix_ids + list(range(5, 45)))
    full = hf.run(lm.model, ids).kv
    short = hf.run(lm.model, ids[:, :12]).kv
    empty = hf.run(lm.model, ids[:, :1]).kv if bos else None
    prompt = lm.ids_tensor([7, 8, 9])
    kvs = [full, empty, short, full]
    together = hf.greedy_generate_batch(lm.model, kvs, prompt, 8, stop_ids=set())
    alone = [hf.greedy_generate(lm.model, kv, prompt, 8, stop_ids=set()) for kv in kvs]
    assert together == alone
    assert len({tuple(t) for t in alone}) > 1  # the rows differ, so a mix-up of rows would show
    padded, mask = hf.left_padded(kvs)
    n = ids.shape[1]
    assert mask.tolist()[2] == [0] * (n - 12) + [1] * 12 and all(k.shape[2] == n for k, _ in padded[1])
    unmasked = hf.greedy_generate_batch(lm.model, padded[1:3], prompt, 8, stop_ids=set())
    assert unmasked != alone[1:3]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_last_layers_translation_reaches_no_cache_entry(family):
    """Whatever a window writes at the target's last layer, the replayed cache is the same (bit for bit); at the layer
    below it the cache changes (method.md §6: injected K/V act only through the layers above)."""
    target = tiny_model(family, layers=4)
    ids = target_context_ids(target, TEXT)
    channels = injection_channels(4, 4, start=2, window=2)  # target layers 2, 3: 3 is the last
    assert unread_window_layers(channels.target_layers, 4) == (3,)
    assert unread_window_layers((1, 2), 4) == ()
    k, v = window_blocks(native_cache(target, ids), channels.target_layers)
    base = replay(target, ids, channels.target_layers, k, v, sparse=None)
    g = torch.Generator().manual_seed(0)

    def noisy(layer: int) -> list:
        k2, v2 = k.clone(), v.clone()
        k2[:, :, layer] = 5 * torch.randn(k2[:, :, layer].shape, generator=g)
        v2[:, :, layer] = 5 * torch.randn(v2[:, :, layer].shape, generator=g)
        return replay(target, ids, channels.target_layers, k2, v2, sparse=None)

    assert all(torch.equal(a, b) for kv_a, kv_b in zip(base, noisy(1)) for a, b in zip(kv_a, kv_b))
    assert any(not torch.equal(a, b) for kv_a, kv_b in zip(base, noisy(0)) for a, b in zip(kv_a, kv_b))


@pytest.mark.parametrize("window", [None, 5])
def test_the_sparse_index_selection_in_query_chunks_is_the_whole_matrix_selection(monkeypatch, window):
    """topk_positions computes a chunk of queries at a time over the keys they may see; every row is the row of the
    whole probability matrix, so the chosen positions are the same (rows with fewer visible keys than k pad with
    positions they may not see, whose probability is 0: compared by the probabilities they pick)."""
    from mot_viz.engine.hf import attention

    g = torch.Generator().manual_seed(0)
    b, h, n_kv, n, d, k, offset = 1, 4, 2, 23, 8, 4, 1
    query = torch.randn(b, h, n, d, generator=g)
    key = torch.randn(b, n_kv, n, d, generator=g)
    module = type("Layer", (), {"sliding_window": window})()
    whole = hf.causal_probs(query, key, d ** -0.5, window).mean(dim=1, keepdim=True)[..., offset:, offset:]
    expected = whole.topk(k, dim=-1)
    for chunk in (3, 7, 512):
        monkeypatch.setattr(attention, "TOPK_QUERY_CHUNK", chunk)
        got = attention.topk_positions(module, query, key, d ** -0.5, k, offset)
        assert got.shape == expected.indices.shape
        assert torch.equal(whole.gather(-1, got), expected.values)  # the same probabilities, in the same order
        visible = (expected.values > 0)
        assert torch.equal(got[visible], expected.indices[visible])


@pytest.mark.parametrize("chunk", [5, 256])
def test_windowed_attention_equals_the_stock_masked_path(monkeypatch, chunk):
    """A sliding-window layer over only the keys its queries may see (hf.attention.windowed_attention) gives the
    stock SDPA-under-the-model's-mask results: a prefill, a continuation over a cache, a left-padded batch, and
    a replay; the windowed path is taken (it is not the stock one by accident)."""
    lm = tiny_model("gemma3_text", layers=4, bos=True, seed=3)
    window = lm.model.config.sliding_window
    ids = lm.ids_tensor(lm.prefix_ids + list(range(5, 5 + 6 * window)))
    prompt = lm.ids_tensor([7, 8, 9] * window)  # a continuation longer than two windows takes the path too
    calls = []
    original = hf.attention.windowed_attention
    monkeypatch.setattr(hf.attention, "windowed_attention",
                        lambda *a, **kw: calls.append(a[0].shape[2]) or original(*a, **kw, chunk=chunk))

    channels = injection_channels(4, 4, start=1, window=2)

    def outputs():
        whole = hf.run(lm.model, ids)
        continued = hf.run(lm.model, prompt, whole.kv)
        short = hf.run(lm.model, ids[:, :12]).kv
        batch = hf.greedy_generate_batch(lm.model, [whole.kv, short], prompt, 6, stop_ids=set())
        prefix = len(lm.prefix_ids)  # the replay puts the BOS prefix before the context itself
        k, v = window_blocks(whole.kv, channels.target_layers, prefix)
        mixed = replay(lm, ids[:, prefix:], channels.target_layers, k * 1.5, v, sparse=None)  # unlike native
        return whole.logits, continued.logits, batch, torch.cat([torch.cat(kv, -1) for kv in mixed], -1)

    windowed = outputs()
    assert calls and max(calls) == ids.shape[1]
    monkeypatch.setattr(hf.attention, "WINDOWED_MIN_WINDOWS", float("inf"))
    calls.clear()
    stock = outputs()
    assert not calls
    assert (windowed[0] - stock[0]).abs().max() <= 1e-5
    assert (windowed[1] - stock[1]).abs().max() <= 1e-5
    assert windowed[2] == stock[2]
    assert (windowed[3] - stock[3]).abs().max() <= 1e-5
    # without a mask from the model: causal sliding-window attention, as the eager reference computes it
    q, k, v = torch.randn(2, 4, 30, 8), torch.randn(2, 2, 40, 8), torch.randn(2, 2, 40, 8)
    alone = original(q, k, v, None, 0.3, window, chunk=chunk)
    assert (alone - hf.attention.attention_output(q, k, v, 0.3, window).transpose(1, 2)).abs().max() <= 1e-5
