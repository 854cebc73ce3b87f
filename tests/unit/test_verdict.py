"""Reuse verdict (mot_viz.eval.verdict): each signal moves the decision the way its threshold says."""

from __future__ import annotations

import pandas as pd

from mot_viz.eval.verdict import VerdictThresholds, layer_signals, reuse_verdict


def _rows(attn=(0.9, 0.9), ck=(0.8, 0.8), cv=(0.6, 0.6), err=(0.3, 0.3), mean_err=(1.0, 1.0)):
    rows = []
    for i, layer in enumerate((5, 6)):
        rows.append({"candidate": "translator", "layer": layer, "attn_out_cos": attn[i], "centered_cos_k": ck[i],
                     "centered_cos_v": cv[i], "rel_err_k": err[i], "rel_err_v": err[i]})
        rows.append({"candidate": "mean vector", "layer": layer, "attn_out_cos": 0.4, "centered_cos_k": 0.0,
                     "centered_cos_v": 0.0, "rel_err_k": mean_err[i], "rel_err_v": mean_err[i]})
    return pd.DataFrame(rows)


def test_a_good_window_is_reused_and_each_failing_signal_names_its_layer():
    t = VerdictThresholds(attn_out_cos=0.8, centered_cos_k=0.5, centered_cos_v=0.3, first_token_kl=0.5)
    good = reuse_verdict(_rows(), 0.1, thresholds=t)
    assert good.reuse and good.reasons == [] and list(good.layers["layer verdict"]) == ["reuse", "reuse"]
    low_attn = reuse_verdict(_rows(attn=(0.9, 0.7)), 0.1, thresholds=t)
    assert not low_attn.reuse and low_attn.reasons == ["attn_out_cos fails its threshold at layer 6"]
    assert list(low_attn.layers["layer verdict"]) == ["reuse", "re-prefill"]
    worse_than_mean = reuse_verdict(_rows(err=(0.3, 1.2)), 0.1, thresholds=t)
    assert not worse_than_mean.reuse and "beats_mean_vector fails its threshold at layer 6" in worse_than_mean.reasons
    kl = reuse_verdict(_rows(), 0.9, thresholds=t)
    assert not kl.reuse and kl.reasons == ["first answer token KL 0.900 > 0.5"]
    assert reuse_verdict(_rows(), None, thresholds=t).reuse  # no question: no KL term
    assert reuse_verdict(_rows(err=(0.3, 1.2)), 0.1,
                         thresholds=VerdictThresholds(**{**t.__dict__, "require_beating_mean": False})).reuse


def test_layer_signals_compare_with_the_mean_vector_of_the_same_layer():
    table = layer_signals(_rows(err=(0.3, 1.2)), "translator")
    assert table.set_index("layer").beats_mean_vector.to_dict() == {5: True, 6: False}
