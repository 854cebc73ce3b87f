"""Which layers separate lost answers from kept ones: the per-layer means, intervals and lost − kept of
mot_viz.analysis.layer_separation on tables whose answer is known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mot_viz.analysis.layer_separation import (layer_separation, lost_and_kept, separation_figure,
                                               separation_text)
from mot_viz.eval.layer_error_file import METRICS

LAYERS = 6
WINDOW = (2, 3)


def wide(n_lost: int = 30, n_kept: int = 40, n_wrong: int = 10) -> pd.DataFrame:
    """A wide table: lost (native right, mot wrong), kept (both right) and native-wrong examples."""
    native = [1.0] * (n_lost + n_kept) + [0.0] * n_wrong
    mot = [0.0] * n_lost + [0.8] * n_kept + [1.0] * n_wrong
    names = [f"lost{i}" for i in range(n_lost)] + [f"kept{i}" for i in range(n_kept)] + \
            [f"wrong{i}" for i in range(n_wrong)]
    return pd.DataFrame({"example": names, "group": "squad", "native score": native, "mot score": mot})


def errors(table: pd.DataFrame, shift_at: int | None) -> pd.DataFrame:
    """Every example's error per layer drawn from one distribution; at layer `shift_at` the lost examples' error is
    0.2 higher. The native-wrong examples carry a huge error, which must not reach either group."""
    rng = np.random.default_rng(1)
    rows = []
    for name in table["example"]:
        for layer in range(LAYERS):
            value = 0.3 + 0.05 * rng.standard_normal()
            value += 0.2 if layer == shift_at and name.startswith("lost") else 0.0
            value += 100.0 if name.startswith("wrong") else 0.0
            rows.append({"example": name, "group": "squad", "layer": layer, "in_window": layer in WINDOW,
                         **{m: value for m in METRICS}})
    return pd.DataFrame(rows)


def test_lost_and_kept_follow_the_pages_filter():
    lost, kept = lost_and_kept(wide(3, 4, 2), "mot")
    assert lost == ["lost0", "lost1", "lost2"] and kept == ["kept0", "kept1", "kept2", "kept3"]


def test_the_layer_that_separates_is_found_and_only_it():
    table = wide()
    err = errors(table, shift_at=3)
    sep = layer_separation(err, table, "mot", "K_rel_l2", n_boot=500, seed=0)
    assert sep["layer"].tolist() == list(range(LAYERS)) and (sep["n_lost"] == 30).all() and (sep["n_kept"] == 40).all()
    assert sep["in_window"].tolist() == [i in WINDOW for i in range(LAYERS)]
    at3 = sep.set_index("layer").loc[3]
    lost = err[(err["layer"] == 3) & err["example"].str.startswith("lost")]["K_rel_l2"]
    kept = err[(err["layer"] == 3) & err["example"].str.startswith("kept")]["K_rel_l2"]
    assert at3["lost_mean"] == pytest.approx(lost.mean(), rel=1e-12)
    assert at3["kept_mean"] == pytest.approx(kept.mean(), rel=1e-12)
    assert at3["diff"] == pytest.approx(lost.mean() - kept.mean(), rel=1e-12)
    assert at3["diff_low"] > 0.1 and at3["separates"]  # a 0.2 shift with a spread of 0.05 per example
    assert sep["separates"].tolist() == [layer == 3 for layer in range(LAYERS)]
    for mean, low, high in (("lost_mean", "lost_low", "lost_high"), ("kept_mean", "kept_low", "kept_high"),
                            ("diff", "diff_low", "diff_high")):
        assert ((sep[low] <= sep[mean]) & (sep[mean] <= sep[high])).all()
    text = separation_text(sep, "K_rel_l2")
    assert text.startswith("30 lost (native right, MoT wrong) and 40 kept")
    assert f"at 1 of {LAYERS} layers" in text and f"layer 3 {at3['diff']:+.4f} [{at3['diff_low']:+.4f}" in text
    fig = separation_figure(sep, "K_rel_l2")
    assert any(t.name == "lost − kept" for t in fig.data)


def test_no_layer_separates_when_both_groups_share_one_distribution():
    table = wide()
    sep = layer_separation(errors(table, shift_at=None), table, "mot", "V_cosine", n_boot=500, seed=0)
    assert not sep["separates"].any()
    assert ((sep["diff_low"] < 0) & (sep["diff_high"] > 0)).all()
    assert "No layer's 95% interval of lost − kept (V cosine) excludes 0." in separation_text(sep, "V_cosine")


def test_a_slice_without_lost_examples_says_so():
    table = wide(0, 20, 5)
    sep = layer_separation(errors(table, shift_at=2), table, "mot", "K_rel_l2", n_boot=100)
    assert (sep["n_lost"] == 0).all() and sep["diff"].isna().all() and not sep["separates"].any()
    assert "Both groups are needed" in separation_text(sep, "K_rel_l2")
    with pytest.raises(ValueError, match="metric must be one of"):
        layer_separation(errors(table, None), table, "mot", "mse")
