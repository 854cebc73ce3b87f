"""The app's pure functions: cache-error metrics, routing statistics, cache-space projections and figures."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from mot_viz.analysis import cache_metrics as cm
from mot_viz.analysis import figures, training_figures
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.mot import translate
from mot_viz.engine.testing import load_test_model
from tolerance import assert_close

TEXT = "The Eiffel Tower is in Paris. It was built by Gustave Eiffel, whose company designed it.\n"


def test_per_token_errors_on_known_vectors():
    ref = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    same = cm.per_token_errors(ref, ref)
    assert same["mse"].abs().max() == 0 and same["rel_l2"].abs().max() == 0
    torch.testing.assert_close(same["cosine"], torch.ones(2))
    doubled = cm.per_token_errors(2 * ref, ref)
    torch.testing.assert_close(doubled["rel_l2"], torch.ones(2))
    torch.testing.assert_close(doubled["mse"], torch.tensor([12.5, 0.5]))
    torch.testing.assert_close(cm.per_token_errors(-ref, ref)["cosine"], -torch.ones(2))
    layer = cm.layer_errors(2 * ref, ref)
    assert layer["rel_l2"] == pytest.approx(1.0) and layer["mse"] == pytest.approx(6.5) and layer["cosine"] == 1.0


def test_token_vectors_concatenate_heads_per_token():
    x = torch.arange(2 * 3 * 4, dtype=torch.float32).view(1, 2, 3, 4)  # [1, n_kv=2, N=3, d=4]
    v = cm.token_vectors(x)
    assert v.shape == (3, 8)
    torch.testing.assert_close(v[1], torch.cat([x[0, 0, 1], x[0, 1, 1]]))


def test_routing_statistics():
    gates = torch.tensor([[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.25, 0.75]]])  # [1, N=3, E=3]
    entropy = cm.routing_entropy(gates)
    assert entropy[0] == pytest.approx(0.0, abs=1e-6) and entropy[1] == pytest.approx(math.log(2))
    assert cm.kept_experts(gates) == [(0,), (0, 1), (2, 1)]
    usage = cm.expert_usage(gates)
    assert list(usage["importance"]) == [1.5, 0.75, 0.75] and list(usage["load"]) == [2.0, 2.0, 1.0]
    assert usage["importance_share"].sum() == pytest.approx(1.0) and usage["load_share"].sum() == pytest.approx(1.0)
    table = cm.gate_table(gates, ["a", "b", "c"])
    assert len(table) == 9 and table["kept"].sum() == 5
    per_token = cm.token_routing_table(gates, gates, ["a", "b", "c"])
    assert list(per_token["K_kept"]) == ["0", "0 1", "2 1"]


def test_cache_space_shares_one_projection_in_the_target_space_only():
    gen = torch.Generator().manual_seed(0)
    native = torch.randn(20, 8, generator=gen)
    vectors = {"source (aligned)": torch.randn(20, 5, generator=gen), "translated": native.clone(),
               "native target": native}
    table = cm.cache_space_table(vectors, [f"t{i}" for i in range(20)])
    target = table[table["space"] == "target space"]
    a = target[target["kind"] == "translated"][["x", "y"]].to_numpy()
    b = target[target["kind"] == "native target"][["x", "y"]].to_numpy()
    assert_close(a, b, rtol=1e-5)  # identical vectors land on identical points
    source = table[table["space"] == "source space"]
    assert set(source["kind"]) == {"source (aligned)"} and len(source) == 20
    assert target["projection"].iloc[0].startswith("PCA fitted on translated + native target, ")


def test_kinds_outside_the_fit_are_placed_in_the_same_projection():
    gen = torch.Generator().manual_seed(1)
    native, translated = torch.randn(12, 6, generator=gen), torch.randn(12, 6, generator=gen)
    tokens = [f"t{i}" for i in range(12)]
    alone = cm.cache_space_table({"native target": native, "translated": translated}, tokens)
    more = cm.cache_space_table({"native target": native, "translated": translated,
                                 "replayed target": native.clone()}, tokens)
    key = ["kind", "token_index"]
    shared = more[more.kind != "replayed target"].sort_values(key)[["x", "y"]].to_numpy()
    np.testing.assert_allclose(shared, alone.sort_values(key)[["x", "y"]].to_numpy())  # the axes did not move
    replayed = more[more.kind == "replayed target"][["x", "y"]].to_numpy()
    assert_close(replayed, more[more.kind == "native target"][["x", "y"]].to_numpy(), rtol=1e-7)


def test_whitespace_is_visible_and_axis_labels_unique():
    assert figures.show_whitespace(" a\n\tb") == "␣a↵⇥b" and figures.show_whitespace("") == "∅"
    labels = figures.axis_labels(["␣the", "␣the"])
    assert labels == ["0 ␣the", "1 ␣the"] and len(set(labels)) == 2


@pytest.fixture(scope="module")
def tiny_translation(checkpoints):
    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(checkpoints["smollm2-to-gemma3"], source, target)
    return mot, translate(mot, source, target, TEXT), target


def test_cache_error_table_covers_every_layer_and_the_window(tiny_translation):
    mot, translation, target = tiny_translation
    assert translation.prefix_len == 1  # the tiny target starts its caches with BOS, like Gemma
    table = cm.cache_error_table(translation, mot.channels)
    replayed = table[table["comparison"] == "replayed"]
    translated = table[table["comparison"] == "translated"]
    assert sorted(set(replayed["layer"])) == list(range(target.spec.num_layers))
    assert sorted(set(translated["layer"])) == list(mot.channels.target_layers)
    assert translated["in_window"].all() and len(table) == 2 * (target.spec.num_layers + mot.channels.window)
    # the first layer's K/V come from the embeddings alone, which the replay does not touch
    first = replayed[replayed["layer"] == 0]
    assert (first["mse"] == 0).all() and (first["cosine"] > 0.9999).all()
    # the translated window is the translator's output, compared with the native window blocks
    k_native, _ = translation.native_window_blocks(mot.channels)
    direct = cm.layer_errors(translation.translated.keys[0, :, 0].float(), k_native[0, :, 0].float())
    row = translated[(translated["kv"] == "K") & (translated["layer"] == mot.channels.start)].iloc[0]
    assert row["mse"] == pytest.approx(direct["mse"]) and row["rel_l2"] == pytest.approx(direct["rel_l2"])
    grid = cm.cache_error_grid(translation, mot.channels, "translated", "V", "cosine")
    assert len(grid) == mot.channels.window * translation.target_ids.shape[1]


def test_window_vectors_give_the_translator_input_and_output(tiny_translation):
    mot, translation, _ = tiny_translation
    vectors = cm.window_vectors(translation, mot.channels, 0, "V")
    n = translation.target_ids.shape[1]
    assert vectors["source (aligned)"].shape == (n, mot.source.kv_hidden)
    assert vectors["translated"].shape == vectors["native target"].shape == (n, mot.target.kv_hidden)
    torch.testing.assert_close(vectors["translated"], translation.translated.values[0, :, 0].float())


def test_figures_mark_the_window_and_keep_exact_values():
    table = pd.DataFrame([{"comparison": c, "kv": kv, "layer": l, "in_window": l >= 2, "mse": 0.1 * l,
                           "rel_l2": 0.2, "cosine": 0.9}
                          for c in ("translated", "replayed") for kv in ("K", "V") for l in range(4)
                          if c == "replayed" or l >= 2])
    fig = figures.layer_error_figure(table, [2, 3])
    assert len(fig.data) == 2 * 2 * 3  # comparisons x K/V x metrics
    assert len(fig.layout.shapes) == 6 and fig.layout.shapes[0].x0 == 1.5 and fig.layout.shapes[0].x1 == 3.5
    # a direct map keeps its translation as the cache: one curve per panel, named so, not a "replayed" one
    direct = figures.layer_error_figure(table, [0, 1, 2, 3], direct=True)
    assert {t.name for t in direct.data} == {"translated = kept (no replay)"} and len(direct.data) == 2 * 3
    assert "replayed (2nd)" in {t.name for t in figures.layer_error_figure(table, [2, 3], table, direct=True).data}
    grid = pd.DataFrame({"layer": [2, 2, 3, 3], "token": [0, 1, 0, 1], "value": [0.5, 0.25, 0.125, 1.0]})
    heat = figures.error_heatmap(grid, ["a", "b"], [2, 3], "rel_l2", "t")
    np.testing.assert_array_equal(heat.data[0].z, [[0.5, 0.25], [0.125, 1.0]])
    assert list(heat.data[0].x) == ["0 a", "1 b"]
    log = pd.DataFrame({"step": [1, 2], "ce": [3.0, 2.0], "lr": [0.1, 0.2]})
    training = training_figures.training_figure(log)
    assert [t.name for t in training.data] == ["ce", "lr"]  # panels without columns are left out


def test_pca_matches_scikit_learn_up_to_sign():
    from sklearn.decomposition import PCA

    from mot_viz.analysis.cache_metrics import pca_project

    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 8)) * np.array([5, 3, 1, 1, 1, 1, 1, 1.0])  # two dominant directions
    coords, ratios = pca_project(x)
    ref = PCA(n_components=2).fit(x)
    expected = ref.transform(x)
    for axis in range(2):  # the same axes, each possibly flipped
        sign = np.sign(coords[:, axis] @ expected[:, axis])
        np.testing.assert_allclose(coords[:, axis] * sign, expected[:, axis], atol=1e-8)
    np.testing.assert_allclose(ratios, ref.explained_variance_ratio_, rtol=1e-10)
    assert ratios[0] > ratios[1] > 0.1
    np.testing.assert_array_equal(pca_project(x)[0], coords)  # deterministic
    flat, flat_ratios = pca_project(np.ones((5, 3)))  # no variance: zeros, not NaN
    assert np.all(flat == 0) and np.all(flat_ratios == 0)


def test_kv_cache_bytes_counts_k_and_v_at_every_layer_and_caps_sliding_layers():
    from mot_viz.analysis.cache_metrics import cost_table
    from mot_viz.engine.models import ModelSpec, kv_cache_bytes

    dense = ModelSpec("s", "llama", 30, 9, 3, 64, 576, 100, 8192, None, (), "x")
    assert kv_cache_bytes(dense, 1000) == 2 * 30 * 192 * 2 * 1000  # 23.04 MB, SmolLM2-135M in fp16
    gemma = ModelSpec("g", "gemma3_text", 18, 4, 1, 256, 640, 100, 32768, 512,
                      tuple(i for i in range(18) if i % 6 != 5), "y")
    assert kv_cache_bytes(gemma, 1000) == 2 * 256 * 2 * (3 * 1000 + 15 * 512)
    assert kv_cache_bytes(gemma, 400) == 2 * 256 * 2 * 18 * 400  # shorter than the window: every token kept
    costs = cost_table({"source_prefill": 0.2, "alignment": 0.01, "translator": 0.05, "replay": 0.3,
                        "native_prefill": 0.25})
    assert costs["seconds"].tolist()[-2:] == pytest.approx([0.35, 0.25])
    assert costs["× native prefill"].tolist()[-2:] == pytest.approx([1.4, 1.0])
