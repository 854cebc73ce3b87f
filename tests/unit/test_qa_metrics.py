"""Known-case tests of the QA metrics (SQuAD F1 / EM, post-processing, bootstrap, retained, gap closed)."""

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from mot_viz.eval.qa_metrics import (
                                     bootstrap_ci,
                                     condition_ratios,
                                     exact_match,
                                     normalize_answer,
                                     paired_ratios,
                                     postprocess_generation,
                                     retained,
                                     squad_f1,
                                     )
from mot_viz.sharing.names import FLOOR, REFERENCE


def test_normalize_answer_drops_case_punctuation_articles_and_extra_space():
    assert normalize_answer("  The  Eiffel-Tower, in PARIS! ") == "eiffeltower in paris"
    assert normalize_answer("An apple a day") == "apple day"
    # articles only count as whole words
    assert normalize_answer("theatre anthem") == "theatre anthem"


def test_exact_match_ignores_articles_and_case():
    assert exact_match("the Eiffel Tower", ["Eiffel Tower"]) == 1.0
    assert exact_match("Eiffel Tower.", "eiffel tower") == 1.0
    assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    # maximum over golds
    assert exact_match("Denver Broncos", ["Carolina Panthers", "denver broncos"]) == 1.0


def test_squad_f1_partial_overlap_hand_computed():
    # prediction tokens {denver, broncos, won}, gold {denver, broncos}: P = 2/3, R = 1, F1 = 0.8
    assert squad_f1("The Denver Broncos won", ["Denver Broncos"]) == pytest.approx(0.8)
    # P = 1/2 (in, 1858 vs 1858), R = 1 -> 2/3
    assert squad_f1("in 1858", ["1858"]) == pytest.approx(2 / 3)
    # tokens are a multiset: "paris paris" vs "paris" overlaps once, P = 1/2, R = 1
    assert squad_f1("paris paris", ["paris"]) == pytest.approx(2 / 3)


def test_squad_f1_takes_max_over_golds_and_handles_empty():
    assert squad_f1("Saint Bernadette Soubirous", ["Bernadette", "Saint Bernadette Soubirous"]) == 1.0
    assert squad_f1("nothing shared", ["Denver Broncos"]) == 0.0
    # both sides normalise to nothing -> 1; only one side empty -> 0
    assert squad_f1("the", ["a"]) == 1.0
    assert squad_f1("", ["Denver"]) == 0.0
    assert squad_f1("Denver", [""]) == 0.0
    with pytest.raises(ValueError):
        squad_f1("x", [])


def test_postprocess_generation_cuts_at_first_stop_marker():
    assert postprocess_generation("  Saint Bernadette\nQuestion: next") == "Saint Bernadette"
    assert postprocess_generation("1858\r\nmore") == "1858"
    assert postprocess_generation(" Paris Question: what else") == "Paris"
    assert postprocess_generation("yes Context: blah") == "yes"
    assert postprocess_generation("no Answer: yes") == "no"
    # the text is stripped before cutting, so a leading newline does not empty the answer
    assert postprocess_generation("\n  Denver Broncos  ") == "Denver Broncos"
    assert postprocess_generation("") == ""


def test_bootstrap_ci_contains_mean_and_is_deterministic():
    values = np.random.default_rng(3).random(200)
    mean, lo, hi = bootstrap_ci(values, n_boot=500, seed=7)
    assert mean == pytest.approx(values.mean())
    assert lo < mean < hi
    # a 95% interval of a mean of 200 uniforms is about ±0.04 wide
    assert 0.02 < hi - lo < 0.12
    assert bootstrap_ci(values, n_boot=500, seed=7) == (mean, lo, hi)
    assert bootstrap_ci(values, n_boot=500, seed=8) != (mean, lo, hi)


def test_bootstrap_ci_narrower_with_larger_alpha_and_degenerate_inputs():
    values = [0.0, 1.0] * 50
    _, lo95, hi95 = bootstrap_ci(values, alpha=0.05)
    _, lo50, hi50 = bootstrap_ci(values, alpha=0.5)
    assert lo95 <= lo50 < hi50 <= hi95
    assert bootstrap_ci([0.7]) == (0.7, 0.7, 0.7)
    assert all(math.isnan(v) for v in bootstrap_ci([]))
    with pytest.raises(ValueError):
        bootstrap_ci(values, alpha=1.5)


def test_retained():
    assert retained(0.3, 0.6) == pytest.approx(0.5)
    assert retained(0.9, 0.6) == pytest.approx(1.5)
    assert math.isnan(retained(0.3, 0.0))
    assert math.isnan(retained(0.3, math.nan))


@pytest.mark.parametrize("pieces", [
    ["\n", "The", " answer", " is", " Paris", ".\n", "Question", ":"],   # a blank line first (SmolLM2 does this)
    [" \n\n", " Denver", " Broncos", "\n", "more"],
    [" Paris", "\n", "Question:", " again"],
    [" 18", "58", "\r\n", "x"],
    ["\n", "\n", " "],                                                   # nothing but blank lines
])
def test_stopping_at_a_complete_answer_never_changes_the_scored_text(pieces):
    from mot_viz.eval.answers import answer_is_complete

    full = postprocess_generation("".join(pieces))
    stop = next((k for k in range(1, len(pieces) + 1) if answer_is_complete("".join(pieces[:k]))), len(pieces))
    assert postprocess_generation("".join(pieces[:stop])) == full
    assert not answer_is_complete("\n") and not answer_is_complete(" \n \r\n")  # a leading blank line goes on
    assert answer_is_complete(" Paris\n")


def test_gap_closed_reads_0_at_no_context_and_1_at_native_where_retention_reads_the_floor():
    rng = np.random.default_rng(0)
    native = rng.uniform(0.3, 1.0, 200)
    none = native * rng.uniform(0.0, 0.5, 200)
    floor = paired_ratios(native, none, none, n_boot=200, seed=1)
    # no better than no context: retention is no context's own share of native, gap closed is 0
    assert floor["retention"] == pytest.approx(none.mean() / native.mean(), rel=1e-12) and floor["retention"] > 0.1
    assert floor["gap_closed"] == 0.0 and floor["gap_closed_ci_low"] == floor["gap_closed_ci_high"] == 0.0
    top = paired_ratios(native, none, native, n_boot=200, seed=1)
    assert top["retention"] == pytest.approx(1.0, rel=1e-12) and top["gap_closed"] == pytest.approx(1.0, rel=1e-12)
    half = paired_ratios(native, none, (native + none) / 2, n_boot=200, seed=1)
    assert half["gap_closed"] == pytest.approx(0.5, rel=1e-12)
    assert half["gap_closed_ci_low"] < half["gap_closed_ci_high"] and half["retention_ci_low"] < half["retention"]
    # without no context there is no floor: gap closed is not a number
    assert math.isnan(paired_ratios(native, np.full(200, np.nan), native, n_boot=20)["gap_closed"])


def test_condition_ratios_read_the_reference_and_floor_and_the_metrics_load_no_model_library():
    wide = pd.DataFrame({REFERENCE: [1.0, 0.8, 0.6], FLOOR: [0.0, 0.2, 0.2], "x": [0.5, 0.5, 0.4]})
    ratios = condition_ratios(wide, "x", n_boot=50, seed=0)
    assert ratios["retention"] == pytest.approx(1.4 / 2.4, rel=1e-12)
    assert ratios["gap_closed"] == pytest.approx(0.5, rel=1e-12)  # (1.4 − 0.4) ÷ (2.4 − 0.4)
    assert math.isnan(condition_ratios(wide.drop(columns=FLOOR), "x", n_boot=50, seed=0)["gap_closed"])
    # the summaries read these metrics without a model: importing them (and the reference's name) loads no torch
    code = "import sys, mot_viz.eval.qa_metrics; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"
