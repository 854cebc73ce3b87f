"""Pure tensor metrics the app shows: cache errors against the native cache, routing, cache-space projections.

Tensors in, tensors or DataFrames out; no Streamlit. One token's K (or V) in one layer is the vector of all
its KV heads concatenated, ``H = n_kv·d_h`` — the translator's block layout (mot_viz.engine.layout).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ..engine.alignment import apply_alignment
from ..engine.cache_errors import (COMPARISONS, KV_NAMES, compared_caches, layer_errors, per_token_errors,
                                   token_vectors)
from ..engine.channels import Channels
from ..engine.layout import context_positions, to_block
from ..engine.mot import Translation

_EPS = 1e-12


def span_error_table(candidate: list[tuple[torch.Tensor, torch.Tensor]], native: list[tuple[torch.Tensor, torch.Tensor]],
                     spans: dict[str, tuple[int, int]]) -> pd.DataFrame:
    """Per span of positions (label -> [start, end) in the caches), layer and K/V: the mean over the span's tokens of
    the candidate cache's relative L2 error to the native one (e.g. the shards of a document a hub composed)."""
    rows = []
    for layer, (cand, ref) in enumerate(zip(candidate, native, strict=True)):
        for j, kv in enumerate(KV_NAMES):
            errors = per_token_errors(token_vectors(cand[j]), token_vectors(ref[j]))["rel_l2"]
            rows += [{"span": label, "layer": layer, "kv": kv, "rel_l2": float(errors[a:b].mean())}
                     for label, (a, b) in spans.items()]
    return pd.DataFrame(rows)


def cache_error_table(translation: Translation, channels: Channels) -> pd.DataFrame:
    """One row per (comparison, K/V, target layer): mse, rel_l2, cosine, and whether the layer is in the window."""
    rows = []
    window = set(channels.target_layers)
    for comparison in COMPARISONS:
        for layer, (cand, ref) in compared_caches(translation, channels, comparison).items():
            for j, kv in enumerate(KV_NAMES):
                rows.append({"comparison": comparison, "kv": kv, "layer": layer, "in_window": layer in window,
                             **layer_errors(token_vectors(cand[j]), token_vectors(ref[j]))})
    return pd.DataFrame(rows)


def cache_error_grid(translation: Translation, channels: Channels, comparison: str, kv: str,
                     metric: str) -> pd.DataFrame:
    """Per-token `metric` of one comparison as a long table: layer, token, value (one row per cell)."""
    j = KV_NAMES.index(kv)
    frames = []
    for layer, (cand, ref) in compared_caches(translation, channels, comparison).items():
        values = per_token_errors(token_vectors(cand[j]), token_vectors(ref[j]))[metric]
        frames.append(pd.DataFrame({"layer": layer, "token": np.arange(len(values)), "value": values.cpu().numpy()}))
    return pd.concat(frames, ignore_index=True)


# ----- routing ---------------------------------------------------------------------------------------


def routing_entropy(gates: torch.Tensor) -> torch.Tensor:
    """Per-token entropy (nats) of the gates [1, N, E] -> [N]; 0 = one expert, log(top_k) = an even split."""
    g = gates[0].float()
    return -(g * g.clamp(min=_EPS).log()).sum(-1)


def expert_usage(gates: torch.Tensor) -> pd.DataFrame:
    """Per expert: importance (sum of its gates), load (tokens that kept it) and their shares of the total."""
    g = gates[0].float()
    importance = g.sum(0)
    load = (g > 0).float().sum(0)
    return pd.DataFrame({
        "expert": list(range(g.shape[1])),
        "importance": importance.tolist(),
        "load": load.tolist(),
        "importance_share": (importance / importance.sum().clamp(min=_EPS)).tolist(),
        "load_share": (load / load.sum().clamp(min=_EPS)).tolist(),
    })


def kept_experts(gates: torch.Tensor) -> list[tuple[int, ...]]:
    """Per token, the experts whose gate survived the top-k (largest gate first)."""
    g = gates[0].float()
    return [tuple(int(e) for e in row.argsort(descending=True) if row[e] > 0) for row in g]


# ----- cache space ---------------------------------------------------------------------------------


def window_vectors(translation: Translation, channels: Channels, position: int, kv: str) -> dict[str, torch.Tensor]:
    """The per-token vectors of window channel `position`, each [N_t, H]: aligned source, native, translated, replayed.

    The source vectors are the source layer's K/V averaged onto the target grid by the alignment weights
    (the translator's input, its keys as cached: a pre-RoPE checkpoint reads them un-rotated); they live in the source's
    own space (H_S), the other three in the target's (H_T).
    """
    j = KV_NAMES.index(kv)
    s_layer, t_layer = channels.pairs()[position]
    src = translation.source
    source = apply_alignment(to_block([src.source_kv[s_layer][j]]), src.alignment)[0, :, 0].float()  # (N_t, H_S)
    translated = translation.translated.keys if kv == "K" else translation.translated.values
    out = {"source (aligned)": source, "translated": translated[0, :, position].float()}
    p = translation.prefix_len
    if translation.native_kv is not None:
        out["native target"] = token_vectors(context_positions(translation.native_kv[t_layer], p)[j])
    out["replayed target"] = token_vectors(context_positions(translation.mixed_kv[t_layer], p)[j])
    return out


def pca_fit(x: np.ndarray, dims: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PCA of the rows of `x` [n, H]: (mean [H], signed components [k, H], explained variance ratios [k]).

    A thin SVD of the centred rows in float64 (no scikit-learn: its first import alone costs the app ~0.8 s).
    Each axis is signed so that its largest loading is positive, so reruns and other machines agree.
    """
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(axis=0)
    k = min(dims, *x.shape)
    _, s, vt = np.linalg.svd(x - mean, full_matrices=False)
    signs = np.sign(vt[np.arange(k), np.abs(vt[:k]).argmax(axis=1)])
    signs[signs == 0] = 1.0
    total = float((s ** 2).sum())
    ratios = (s[:k] ** 2) / total if total > 0 else np.zeros(k)
    return mean, vt[:k] * signs[:, None], ratios


def pca_project(x: np.ndarray, dims: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """PCA of the rows of `x` [n, H] to `dims` coordinates; returns (coords, explained variance ratios)."""
    mean, components, ratios = pca_fit(x, dims)
    return (np.asarray(x, dtype=np.float64) - mean) @ components.T, ratios


def umap_project(x: np.ndarray, dims: int = 2, seed: int = 0, extra: np.ndarray | None = None):
    """UMAP of rows of `x` [n, H] to `dims` coordinates (cosine metric, fixed seed, so reruns agree).

    With `extra` [m, H], those rows are placed in the same embedding afterwards (UMAP's transform) and the
    coordinates of both are returned as a tuple.
    """
    import umap

    neighbours = max(2, min(15, x.shape[0] - 1))
    reducer = umap.UMAP(n_components=dims, n_neighbors=neighbours, metric="cosine", random_state=seed, n_jobs=1)
    coords = reducer.fit_transform(x)
    return coords if extra is None else (coords, reducer.transform(extra))


FIT_ON = ("native target", "translated")  # the target-space projection is fitted on these kinds together


def cache_space_table(vectors: dict[str, torch.Tensor], tokens: Sequence[str], method: str = "pca",
                      fit_on: Sequence[str] = FIT_ON) -> pd.DataFrame:
    """2-D coordinates of every kind's vectors, one row per (kind, token), with the space each was projected in.

    Kinds in the target space (native, translated, replayed, a linear map's, a second translator's) share ONE
    projection, fitted on the `fit_on` kinds together (all target kinds when none of them is given) and applied to
    the others, so their
    distances are comparable and the axes do not move when a kind is shown or hidden. The source lives in
    another space with another width, so it gets its own projection: its coordinates show the source's own
    geometry, not closeness to the target points.
    """
    frames = []
    target_kinds = [k for k in vectors if k != "source (aligned)"]
    groups = [("target space", target_kinds)]
    if "source (aligned)" in vectors:
        groups.append(("source space", ["source (aligned)"]))
    for space, kinds in groups:
        if not kinds:
            continue
        fitted = [k for k in kinds if k in fit_on] or kinds
        rest = [k for k in kinds if k not in fitted]
        fit_x = torch.cat([vectors[k] for k in fitted]).cpu().numpy()
        rest_x = torch.cat([vectors[k] for k in rest]).cpu().numpy() if rest else None
        on = " + ".join(fitted) if space == "target space" else space
        if method == "pca":
            mean, components, ratio = pca_fit(fit_x)
            coords = (np.concatenate([fit_x] + ([rest_x] if rest else [])).astype(np.float64) - mean) @ components.T
            note = f"PCA fitted on {on}, {100 * ratio.sum():.0f}% of its variance"
        elif method == "umap":
            out = umap_project(fit_x, extra=rest_x)
            coords = np.concatenate(out) if rest else out
            note = f"UMAP (cosine) fitted on {on}"
        else:
            raise ValueError(f"method must be 'pca' or 'umap', got {method!r}")
        n = vectors[kinds[0]].shape[0]
        for i, kind in enumerate(fitted + rest):
            block = coords[i * n:(i + 1) * n]
            frames.append(pd.DataFrame({"space": space, "projection": note, "kind": kind, "token_index": range(n),
                                        "token": list(tokens), "x": block[:, 0],
                                        "y": block[:, 1] if block.shape[1] > 1 else 0.0}))
    return pd.concat(frames, ignore_index=True)


def token_annotations(translation: Translation, channels: Channels, position: int, kv: str) -> pd.DataFrame:
    """Per context token of one window channel: the expert holding its largest gate (mixtures only) and the
    relative L2 error of its translated vector against native (the Cache space page's colourings)."""
    vectors = window_vectors(translation, channels, position, kv)
    out = pd.DataFrame({"token_index": range(vectors["translated"].shape[0])})
    if "native target" in vectors:
        out["rel_l2"] = per_token_errors(vectors["translated"], vectors["native target"])["rel_l2"].cpu().numpy()
    routing = translation.translated.key_routing if kv == "K" else translation.translated.value_routing
    if routing is not None:
        out["expert"] = routing.gates[0].argmax(-1).cpu().numpy()
    return out


def gate_table(gates: torch.Tensor, tokens: Sequence[str]) -> pd.DataFrame:
    """Long table of one mixture's gates [1, N, E]: token_index, token, expert, gate, kept (survived the top-k)."""
    g = gates[0].float().cpu().numpy()
    n, e = g.shape
    return pd.DataFrame({"token_index": np.repeat(np.arange(n), e), "token": np.repeat(list(tokens), e),
                         "expert": np.tile(np.arange(e), n), "gate": g.reshape(-1), "kept": g.reshape(-1) > 0})


def token_routing_table(key_gates: torch.Tensor, value_gates: torch.Tensor, tokens: Sequence[str]) -> pd.DataFrame:
    """Per token: routing entropy and kept experts of the K and the V mixture."""
    return pd.DataFrame({
        "token_index": range(len(tokens)), "token": list(tokens),
        "K_entropy": routing_entropy(key_gates).tolist(), "V_entropy": routing_entropy(value_gates).tolist(),
        "K_kept": [" ".join(map(str, k)) for k in kept_experts(key_gates)],
        "V_kept": [" ".join(map(str, k)) for k in kept_experts(value_gates)],
    })


# ----- what a translation costs ---------------------------------------------------------------------------

# stage -> its label, in the order they run (method.md §6: the replay is a forward pass of the target)
COST_STAGES = {"source_prefill": "source prefill", "alignment": "alignment", "translator": "translator",
               "replay": "replay (target forward pass)"}
TARGET_SIDE = "translator + replay"
NATIVE = "native prefill (target reads the text)"


def cost_table(timings: dict[str, float]) -> pd.DataFrame:
    """Seconds per stage of one translation beside the target's own prefill of the same text, measured in one run.

    The last column divides each stage by the native prefill; "translator + replay" is what the target side
    spends instead of its own prefill.
    """
    native = timings.get("native_prefill")
    rows = [{"stage": label, "seconds": timings[key]} for key, label in COST_STAGES.items() if key in timings]
    rows.append({"stage": TARGET_SIDE, "seconds": timings.get("translator", 0.0) + timings.get("replay", 0.0)})
    if native is not None:
        rows.append({"stage": NATIVE, "seconds": native})
    df = pd.DataFrame(rows)
    df["× native prefill"] = df["seconds"] / native if native else np.nan
    return df
