"""Window fidelity of a translator against the target's native cache (method.md §13): per context and window layer,
raw and centered cosine of K and V to the native window, relative error, and the cosine between the window layer's
attention output with the translated K/V and with the native K/V on the same queries (the native prefill's by default,
the replay's own on request), the mean-vector baseline (mot_viz.train.mean_vector) scored beside it. What a fit
reports on held-out text (mot_viz.train.quickfit), what ``python -m mot_viz.eval.fidelity`` measures and records
into a checkpoint's config.json (metrics.fidelity), and what the app's pages show. All comparisons are in the
cache's (post-RoPE) space, whatever the translator's key space.
"""

from __future__ import annotations

import json

import pandas as pd
import torch
from tqdm import tqdm

from ..engine import hf
from ..engine.channels import Channels
from ..engine.layout import from_block, window_blocks
from ..engine.models import LoadedModel
from ..engine.mot import MoT, Translation, native_cache, translate
from .bank import CORPORA
from .mean_vector import MeanVectors

QUERY_SOURCES = ("native", "replay")  # whose queries the attention-output cosine uses (translation_fidelity)
METRICS = ("raw_cos_k", "centered_cos_k", "rel_err_k", "raw_cos_v", "centered_cos_v", "rel_err_v", "attn_out_cos")
_EPS = 1e-12


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp(min=_EPS)


def vector_fidelity(candidate: torch.Tensor, native: torch.Tensor) -> dict[str, float]:
    """Raw cosine, centered cosine and relative error of per-token vectors [N, H] against native [N, H].

    Centered: each set minus its own mean over tokens, so a vector shared by every token (which attention
    logits ignore for keys) does not count; a constant candidate scores 0.
    """
    c, n = candidate.float(), native.float()
    centered_c, centered_n = c - c.mean(0), n - n.mean(0)
    # a token whose centered vector is only rounding error (a constant candidate) has no direction: cosine 0
    has_direction = centered_c.norm(dim=-1) > 1e-5 * c.norm(dim=-1).clamp(min=_EPS)
    centered = torch.where(has_direction, _cos(centered_c, centered_n), torch.zeros((), device=c.device))
    return {
        "raw_cos": float(_cos(c, n).mean()),
        "centered_cos": float(centered.mean()),
        "rel_err": float(((c - n).norm(dim=-1) / n.norm(dim=-1).clamp(min=_EPS)).mean()),
    }


def attention_output_cosine(query: torch.Tensor, scaling: float, sliding: int | None, keys: torch.Tensor,
                            values: torch.Tensor, native_keys: torch.Tensor, native_values: torch.Tensor,
                            native_output: torch.Tensor | None = None) -> float:
    """Mean per-token cosine of the attention output [B, H, N_q, d] with (keys, values) vs with the native ones.

    All K/V are [1, n_kv, N_kv, d_h] over the whole sequence (prefix included); the queries are the
    native queries of the context positions, so only the cache differs between the two outputs.
    native_output: the native attention output of these queries if already computed (several candidates, one layer).
    """
    a = hf.attention_output(query, keys, values, scaling, sliding)
    b = native_output if native_output is not None else hf.attention_output(query, native_keys, native_values,
                                                                             scaling, sliding)
    flat = lambda x: x[0].transpose(0, 1).reshape(x.shape[2], -1)  # (N_q, H·d)
    return float(_cos(flat(a), flat(b)).mean())


@torch.no_grad()
def translation_fidelity(translation: Translation, target: LoadedModel, channels: Channels,
                         means: MeanVectors | None = None, candidate: str = "translator",
                         others: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
                         queries: str = "native") -> list[dict]:
    """One row per (candidate, window layer) of a computed translation; the mean vector too if given.

    others: more candidates' window K/V blocks [1, N, W, H] for the same context and window (e.g. a linear map's
    translate_window output on this translation's source context), scored on the same native forward pass.
    queries: whose queries every candidate's attention output is computed on: "native" (the native prefill's, the
    project's default) or "replay" (the translation's replay, the ones that read the translated K/V; method.md §13).
    """
    if queries not in QUERY_SOURCES:
        raise ValueError(f"queries must be one of {QUERY_SOURCES}, not {queries!r}")
    p, layers = translation.prefix_len, channels.target_layers
    native, native_queries = translation.native_kv, translation.native_queries
    if native is None or native_queries is None or not set(layers) <= native_queries.keys():  # one native pass
        plan = hf.AttentionPlan(record_queries=set(layers))
        native, native_queries = native_cache(target, translation.target_ids, plan), plan.queries
    if queries == "native":
        queries = native_queries
    elif translation.replay_queries is None or not set(layers) <= translation.replay_queries.keys():
        raise ValueError("this translation kept no replay queries of its window layers: translate it again")
    else:
        queries = translation.replay_queries
    nk, nv = window_blocks(native, layers, p)  # (1, N, W, H)
    n = nk.shape[1]
    candidates = {candidate: (translation.translated.keys, translation.translated.values)}
    candidates.update(others or {})
    if means is not None:
        candidates["mean vector"] = means.blocks(n)
    rows = []
    n_kv = target.spec.num_kv_heads
    native_outputs = {}  # layer -> native attention output, shared by every candidate
    for name, (ck, cv) in candidates.items():
        for w, (layer, k_l, v_l) in enumerate(zip(layers, from_block(ck, n_kv), from_block(cv, n_kv))):
            row = {"candidate": name, "layer": layer, "window_index": w, "tokens": n}
            for kv, cand, ref in (("k", ck, nk), ("v", cv, nv)):
                for metric, value in vector_fidelity(cand[0, :, w], ref[0, :, w]).items():
                    row[f"{metric}_{kv}"] = value
            query, scaling, sliding = queries[layer]
            if layer not in native_outputs:
                native_outputs[layer] = hf.attention_output(query[:, :, p:], *native[layer], scaling, sliding)
            full_k = torch.cat([native[layer][0][:, :, :p], k_l.to(native[layer][0].dtype)], dim=2)
            full_v = torch.cat([native[layer][1][:, :, :p], v_l.to(native[layer][1].dtype)], dim=2)
            row["attn_out_cos"] = attention_output_cosine(query[:, :, p:], scaling, sliding, full_k, full_v,
                                                          *native[layer], native_output=native_outputs[layer])
            rows.append(row)
    return rows


def context_fidelity(mot: MoT, source: LoadedModel, target: LoadedModel, text: str,
                     means: MeanVectors | None = None, queries: str = "native") -> list[dict]:
    """`translation_fidelity` of a fresh translation of `text` (its prefills record the queries it needs)."""
    return translation_fidelity(translate(mot, source, target, text), target, mot.channels, means, queries=queries)


def fidelity_verdicts(rows: pd.DataFrame, candidate: str = "translator") -> list[str]:
    """Plain-language warnings about one candidate's window, judged against the mean-vector and linear rows beside it."""
    mine = rows[rows.candidate == candidate]
    out = []
    for kv in ("k", "v"):
        centered = mine[f"centered_cos_{kv}"].mean()
        if centered < 0.1:
            out.append(f"The {candidate}'s {kv.upper()} carries no token structure: its centered cosine to native "
                       f"is {centered:.2f} (0 is what one shared vector for every token scores).")
    means = rows[rows.candidate == "mean vector"]
    if len(means):
        for kv in ("k", "v"):
            if mine[f"rel_err_{kv}"].mean() > means[f"rel_err_{kv}"].mean():
                out.append(f"The {candidate}'s {kv.upper()} errs more than the mean vector: relative error "
                           f"{mine[f'rel_err_{kv}'].mean():.2f} vs {means[f'rel_err_{kv}'].mean():.2f}.")
    linear = rows[rows.candidate == "linear"]
    if len(linear) and candidate != "linear":
        below = [(kv.upper(), mine[f"centered_cos_{kv}"].mean(), linear[f"centered_cos_{kv}"].mean()) for kv in "kv"
                 if mine[f"centered_cos_{kv}"].mean() < linear[f"centered_cos_{kv}"].mean()]
        if below:
            scores = ", ".join(f"{kv} {a:.4f} vs {b:.4f}" for kv, a, b in below)
            out.append(f"On this context the closed-form linear map is closer to native than the {candidate} "
                       f"(centered cosine, window mean: {scores}): what the trained parts add does not help here.")
    return out


def fidelity_table(mot: MoT, source: LoadedModel, target: LoadedModel, texts: list[str],
                   means: MeanVectors | None = None, progress: bool = True, queries: str = "native") -> pd.DataFrame:
    """Per-context rows (context index added) of `context_fidelity` over `texts`."""
    rows = []
    for i, text in enumerate(tqdm(texts, desc="fidelity", disable=not progress, dynamic_ncols=True)):
        rows += [{"context": i, **r} for r in context_fidelity(mot, source, target, text, means, queries)]
    return pd.DataFrame(rows)


def summarize_fidelity(table: pd.DataFrame) -> pd.DataFrame:
    """Mean of every metric per (candidate, layer) over contexts, plus each candidate's mean over the window."""
    per_layer = table.groupby(["candidate", "layer"], sort=False)[list(METRICS)].mean().reset_index()
    overall = table.groupby("candidate", sort=False)[list(METRICS)].mean().reset_index()
    overall["layer"] = "window"
    return pd.concat([per_layer, overall], ignore_index=True)


def fidelity_record(table: pd.DataFrame, corpus: str, means: MeanVectors) -> dict:
    """What `--record` stores per corpus under metrics.fidelity: the setup and the per-layer and window means."""
    translator = table[table.candidate != "mean vector"]
    return {"description": CORPORA.get(corpus, corpus), "contexts": int(table.context.nunique()),
            "tokens": int(translator.groupby("context").tokens.first().sum()),
            "mean_vector_reference": f"{means.tokens} tokens of {means.corpus}",
            "rows": json.loads(summarize_fidelity(table).to_json(orient="records"))}


def recorded_fidelity_table(config: dict, per_layer: bool = False) -> pd.DataFrame | None:
    """The fidelity recorded in a checkpoint's config.json (metrics.fidelity): one row per corpus × candidate with
    the window averages, or with per_layer one row per corpus × candidate × window layer."""
    recorded = (config.get("metrics") or {}).get("fidelity")
    if not isinstance(recorded, dict):
        return None
    rows = []
    for corpus, entry in recorded.items():
        if not isinstance(entry, dict) or "rows" not in entry:
            continue
        for row in entry["rows"]:
            if (row.get("layer") == "window") != per_layer:
                rows.append({"held-out text": corpus, "n": entry.get("contexts"), "candidate": row["candidate"],
                             **({"layer": row["layer"]} if per_layer else {}),
                             **{m: round(row[m], 3) for m in METRICS if m in row}})
    return pd.DataFrame(rows) if rows else None
