"""Long documents: the data builders (budget reached, evidence depth recorded, no training text), the scoring of
retention and gap closed, and the long-context evaluation's checks, resume and results on the tiny pair."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mot_viz.data.long_context import (DEPTHS, SEPARATOR, _squad_paragraphs, distractor_stacks, long_examples,
                                       qasper_question, qasper_yesno)
from mot_viz.engine.alignment import encode
from mot_viz.engine.testing import load_test_model, tiny_tokenizer
from mot_viz.errors import ConfigError, ContextError
from mot_viz.eval import long_context
from mot_viz.eval.long_context import summarize
from mot_viz.eval.long_settings import LongSettings
from run_settings import settings_of

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(400, bos=True)


def test_stacks_fill_the_budget_around_the_evidence_at_balanced_depths(tok):
    stacks = distractor_stacks(tok, 2000, 6, seed=3)
    assert [s.depth for s in stacks] == list(DEPTHS) * 2
    _, paragraphs = _squad_paragraphs()
    for s in stacks:
        text = s.example.context
        assert s.tokens == len(encode(tok, text)) and 2000 - 24 <= s.tokens <= 2000  # the budget is reached, not passed
        start, end = s.evidence
        evidence = text[start:end]
        assert evidence in paragraphs and any(g.lower() in evidence.lower() for g in s.example.answers)
        parts = text.split(SEPARATOR)
        at = parts.index(evidence)
        assert at == {"start": 0, "end": len(parts) - 1}.get(s.depth, at)  # start: first paragraph; end: last
        if s.depth == "middle":
            assert 0 < at < len(parts) - 1
        others = [p for i, p in enumerate(parts) if i != at]
        # only the evidence holds a gold answer; every other paragraph is SQuAD text (the last one may be cut)
        assert not any(g.lower() in p.lower() for p in others for g in s.example.answers)
        assert all(any(p in q for q in paragraphs) for p in others)
    assert [s.example.context for s in distractor_stacks(tok, 2000, 6, seed=3)] == [s.example.context for s in stacks]
    assert stacks[0].evidence_fraction == 0.0 and stacks[2].evidence_fraction > 0.3


def test_no_translator_or_bank_reads_the_stacks_text():
    """Stacks are SQuAD validation text; the shipped configs train on banks of other corpora only."""
    corpora = {json.loads(p.read_text()).get("bank_corpus", "lambada") for p in (REPO / "configs").glob("*.json")}
    assert corpora and not any("squad" in c for c in corpora)


def test_a_budget_below_the_evidence_paragraph_is_refused(tok):
    with pytest.raises(ContextError, match="SQuAD paragraphs fit three quarters"):
        distractor_stacks(tok, 64, 3, seed=0)
    with pytest.raises(ContextError, match="at least 64"):
        long_examples("stacks", tok, 10, 1)


def test_qasper_papers_are_cut_to_the_budget_and_scored_yes_no(tok):
    docs = qasper_yesno(tok, 1024, 4, seed=0)
    assert len({d.example.id for d in docs}) == 4
    for d in docs:
        assert 1024 * 0.98 <= d.tokens <= 1024 and d.example.choices == ("yes", "no")
        assert d.example.answers == (d.example.choices[d.example.label],)
        if d.evidence is not None:
            assert 0 <= d.evidence[0] < d.evidence[1] <= len(d.example.context)
    one = qasper_question(tok, docs[0].example.id.rsplit("-", 1)[0], 1024)
    assert one.example.context == docs[0].example.context
    with pytest.raises(ContextError, match="shorter than the budget"):
        qasper_question(tok, docs[0].example.id.rsplit("-", 1)[0], 10**7)
    with pytest.raises(ContextError, match="only .* Qasper"):
        qasper_yesno(tok, 10**6, 1)


def test_retention_and_gap_closed_are_paired_over_the_same_documents():
    rng = np.random.default_rng(0)
    native = rng.uniform(0.4, 1.0, 40)
    values = {"native": native, "no_context": native * 0.2, "mot": native * 0.9, "mean": native * 0.6}
    rows = [{"source": "stacks", "budget": 512, "id": f"d{i}", "condition": c, "score": v[i], "exact_match": 0.0,
             "first_token_seconds": 0.1, "build_seconds": 1.0, "context_tokens": 500, "text_bytes": 2000,
             "alignment": 0.01, "translator": 0.1, "replay": 0.5, "native_prefill": 0.6, "source_prefill": 1.0}
            for i in range(40) for c, v in values.items()]
    s = summarize(pd.DataFrame(rows), n_boot=200).set_index("condition")
    assert s.loc["mot", "retention"] == pytest.approx(0.9) and s.loc["mean", "retention"] == pytest.approx(0.6)
    # gap closed = (x − none) ÷ (native − none): 0.7 / 0.8 and 0.4 / 0.8 when every score scales with native
    assert s.loc["mot", "gap_closed"] == pytest.approx(0.875) and s.loc["mean", "gap_closed"] == pytest.approx(0.5)
    # the paired resamples keep a ratio that holds on every document exactly: zero-width intervals
    assert s.loc["mot", "retention_ci_low"] == pytest.approx(0.9) == s.loc["mot", "retention_ci_high"]
    assert s.loc["native", "mean"] == pytest.approx(native.mean()) and s.loc["mot", "n"] == 40
    assert s.loc["mot", "first_token_seconds"] == pytest.approx(0.01 + 0.1 + 0.5 + 0.1)  # target side + first token
    assert s.loc["native", "first_token_seconds"] == pytest.approx(0.6 + 0.1)


def settings_for(checkpoints, **kw) -> LongSettings:
    base = dict(checkpoint=str(checkpoints["smollm2-to-gemma3"]), linear=str(checkpoints["smollm2-to-gemma3-linear"]),
                source="stacks", budgets=(900,), n=2, seed=0, max_new_tokens=4, bootstrap=50)
    return settings_of(LongSettings, **{**base, **kw})


@pytest.mark.parametrize("change, message", [
    (dict(budgets=(5000,)), "does not fit the source model"),
    (dict(source="papers"), "use one of"),
    (dict(conditions=("mot", "no_context")), "include native"),
    (dict(linear=None), "needs the pair's closed-form map"),
])
def test_bad_settings_fail_before_a_model_loads(checkpoints, monkeypatch, change, message):
    monkeypatch.setattr(long_context, "load_model", lambda name: pytest.fail("a model was loaded"))
    with pytest.raises(ConfigError, match=message):
        long_context.run(settings_for(checkpoints, **change), Path("/nonexistent/out"))


def test_the_evaluation_writes_every_condition_and_resumes_only_the_missing_documents(checkpoints, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setattr(long_context, "load_model", load_test_model)
    out = tmp_path / "long"
    long_context.run(settings_for(checkpoints, n=1), out, progress=False)
    first = pd.read_csv(out / "examples.csv")
    assert set(first["condition"]) == set(long_context.CONDITIONS) and first["id"].nunique() == 1
    assert (first["context_tokens"] > 800).all() and (first["first_token_seconds"] > 0).all()
    with pytest.raises(ConfigError, match="--resume"):
        long_context.run(settings_for(checkpoints, n=2), out, progress=False)
    computed = []
    real = long_context.document_rows
    monkeypatch.setattr(long_context, "document_rows",
                        lambda *a, **k: computed.append(a[3].example.id) or real(*a, **k))
    summary = long_context.run(settings_for(checkpoints, n=2), out, resume=True, progress=False)
    both = pd.read_csv(out / "examples.csv")
    assert len(computed) == 1 and computed[0] not in set(first["id"]) and both["id"].nunique() == 2
    pd.testing.assert_frame_equal(both[both["id"].isin(first["id"])].reset_index(drop=True), first)  # kept as written
    assert set(summary["condition"]) == set(long_context.CONDITIONS) and (summary["n"] == 2).all()
    meta = json.loads((out / "summary.json").read_text())
    assert meta["settings"]["budgets"] == [900] and "retention" in (out / "summary.md").read_text()
    paired = pd.read_csv(out / "paired.csv").set_index(["a", "b"])
    wide = both.pivot_table(index="id", columns="condition", values="score")
    assert paired.loc[("mot", "linear"), "diff"] == pytest.approx((wide["mot"] - wide["linear"]).mean())
    assert paired.loc[("mot", "mean"), "n"] == 2
    with pytest.raises(ConfigError, match="other settings"):
        long_context.run(settings_for(checkpoints, seed=1), out, resume=True, progress=False)


def test_each_documents_question_is_encoded_once(checkpoints, tmp_path, monkeypatch):
    from mot_viz.engine.prompts import build_prompt
    from mot_viz.eval import answers

    monkeypatch.setattr(long_context, "load_model", load_test_model)
    encoded = []
    real = answers.encode
    counted = lambda tok, text: encoded.append(text) or real(tok, text)  # noqa: E731
    for module in (answers, long_context):  # the evaluation's own encoding, had it one, counts too
        monkeypatch.setattr(module, "encode", counted, raising=False)
    long_context.run(settings_for(checkpoints, n=1), tmp_path / "long", progress=False)
    target = load_test_model("gemma3-270m")
    doc = long_examples("stacks", target.tokenizer, 900, 1, 0)[0]
    suffix = build_prompt(doc.example, target.chat_frame).suffix_text
    assert encoded.count(suffix) == 1  # for the first answer token's time and the answers of every condition


# ----- the analysis behind the Long context page -------------------------------------------------------------------


def test_position_errors_are_the_per_token_errors_binned_along_the_document(checkpoints):
    from mot_viz.analysis.cache_metrics import cache_error_grid
    from mot_viz.analysis.long_context import evidence_token_range, layer_attention, position_error_table
    from mot_viz.engine.checkpoint import load_checkpoint
    from mot_viz.engine.mot import translate

    source, target = load_test_model("smollm2-135m"), load_test_model("gemma3-270m")
    mot, _ = load_checkpoint(checkpoints["smollm2-to-gemma3"], source, target)
    doc = distractor_stacks(target.tokenizer, 900, 2, seed=0)[1]
    text = "Read this. " + doc.example.context  # the document sits inside a longer translated text
    translation = translate(mot, source, target, text)
    table = position_error_table(translation, mot.channels, target.spec, bin_tokens=50)
    assert set(table["layer"]) == set(mot.channels.target_layers)
    grid = cache_error_grid(translation, mot.channels, "replayed", "K", "rel_l2")
    for layer in mot.channels.target_layers:
        per_token = grid[grid["layer"] == layer]["value"].to_numpy()
        rows = table[(table["layer"] == layer) & (table["comparison"] == "replayed") & (table["kv"] == "K")]
        assert rows["position"].tolist() == list(range(0, len(per_token), 50))
        assert rows["value"].to_numpy() == pytest.approx([per_token[i:i + 50].mean() for i in rows["position"]],
                                                        rel=1e-5)
        assert (rows["attention"] == layer_attention(target.spec, layer)).all()
    first, last = evidence_token_range(translation, doc.example.context, doc.evidence)
    spans = translation.source.alignment.target_spans
    offset = text.index(doc.example.context)
    evidence = text[offset + doc.evidence[0]:offset + doc.evidence[1]]
    covered = text[spans[first][0]:spans[last - 1][1]]
    assert evidence.strip() in covered and len(covered) < len(evidence) + 40  # the evidence's tokens, no more
    assert evidence_token_range(translation, doc.example.context, None) is None


def test_gemma3_sliding_layers_are_named_with_their_window():
    from mot_viz.analysis.long_context import layer_attention

    spec = load_test_model("gemma3-270m").spec
    kinds = {layer_attention(spec, i) for i in range(spec.num_layers)}
    assert "global" in kinds and any(k.startswith("sliding (") for k in kinds) == bool(spec.sliding_layers)


def test_retention_curve_marks_this_documents_point():
    from mot_viz.analysis.long_context import first_token_figure, first_token_table, retention_curve_figure

    summary = pd.DataFrame([{"condition": c, "budget": b, "retention": r, "retention_ci_low": r - 0.1,
                             "retention_ci_high": r + 0.1, "n": 12}
                            for b, r in ((512, 0.9), (1024, 0.8)) for c in ("mot", "linear", "mean", "native")])
    fig = retention_curve_figure(summary, {"mot": 0.5}, 1024)
    names = [t.name for t in fig.data]
    assert names == ["MoT", "MoT: this document", "linear map", "mean-vector window"]
    assert list(fig.data[0].y) == [0.9, 0.8] and list(fig.data[1].x) == [1024] and list(fig.data[1].y) == [0.5]
    table = first_token_table({"alignment": 0.1, "translator": 0.2, "replay": 1.0, "native_prefill": 1.5,
                               "source_prefill": 2.0}, {"mot": 0.3, "native": 0.3})
    paths = table.groupby("path", sort=False)["seconds"].sum()
    assert paths["translated cache"] == pytest.approx(1.6) and paths["target reads the text"] == pytest.approx(1.8)
    assert len(first_token_figure(table).data) == table["stage"].nunique()
