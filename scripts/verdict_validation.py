"""Validate the reuse verdict (mot_viz.eval.verdict) against QA: does "reuse" agree with "MoT keeps >= 90% of the
native answer's F1"? Thresholds are tuned on the first half of the SQuAD examples of
docs/results/single-passages.md and the agreement is reported on the second half, and on other genres never
used for tuning (--held_out).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/verdict_validation.py signals \\
        --checkpoint pretrained/smollm2-to-gemma3-mid --n 300 --out results/verdict/smollm2-to-gemma3-mid
    OMP_NUM_THREADS=1 .venv/bin/python scripts/verdict_validation.py signals --dataset coqa \\
        --checkpoint pretrained/smollm2-to-gemma3-mid --n 150 --out results/verdict/smollm2-to-gemma3-mid/coqa
    OMP_NUM_THREADS=1 .venv/bin/python scripts/verdict_validation.py signals --dataset stacks:512 \\
        --checkpoint pretrained/smollm2-to-gemma3-mid --n 102 --out results/verdict/smollm2-to-gemma3-mid/stacks512
    .venv/bin/python scripts/verdict_validation.py report --out results/verdict/smollm2-to-gemma3-mid \\
        --eval results/eval/smollm2-to-gemma3-mid-squad300 \\
        --held_out results/verdict/smollm2-to-gemma3-mid/coqa results/verdict/smollm2-to-gemma3-mid/stacks512

`signals` computes each example's verdict signals exactly as the app does (same truncation as the evaluator)
and appends them to signals.csv (resumable). On SQuAD the F1s come from the evaluator's run (`report --eval`); on
the other datasets (`coqa`: the first turn of CoQA conversations, a story and its first question, stories of at
most --max_context_tokens; `stacks:B`: the long-context distractor stacks of B target tokens) signals.csv also
records native's and MoT's greedy answers and their F1. `report` joins signals and F1s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd

from mot_viz.analysis.shift.metrics import kl_divergence
from mot_viz.analysis.logit_lens import attention_shares, lens_trace, logit_lens
from mot_viz.data.coqa import coqa_conversations
from mot_viz.data.eval_data import load_dataset
from mot_viz.data.long_context import distractor_stacks
from mot_viz.engine.alignment import encode
from mot_viz.engine.checkpoint import load_checkpoint, read_config
from mot_viz.engine.models import load_model
from mot_viz.engine.mot import translate
from mot_viz.engine.prompts import build_prompt
from mot_viz.eval.answers import answers_from_caches, first_answer_logprobs
from mot_viz.eval.conversation import turn_example
from mot_viz.sharing.registry import REFERENCE, TRANSLATED
from mot_viz.eval.qa_settings import truncate_context
from mot_viz.train.window_fidelity import translation_fidelity
from mot_viz.train.mean_vector import reference_means
from mot_viz.eval.verdict import VerdictThresholds, layer_signals, reuse_verdict
from mot_viz.cli import run_cli
from mot_viz.fsutil import check_out_place

GRID = {"attn_out_cos": [0.0, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95],
        "centered_cos_k": [0.0, 0.3, 0.5, 0.6, 0.7, 0.8],
        "centered_cos_v": [0.0, 0.3, 0.4, 0.5, 0.6, 0.7],
        "first_token_kl": [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, float("inf")]}


def examples(dataset: str, target, n: int, max_context_tokens: int) -> list:
    """The QA examples of one signals run: SQuAD (seed 0, as the evaluator samples them, cut as it cuts them), the
    first turns of CoQA conversations, or the distractor stacks of one budget ("stacks:512")."""
    if dataset == "squad":
        return [truncate_context(target, e, max_context_tokens) for e in load_dataset("squad", n=n, seed=0)]
    if dataset == "coqa":
        conversations = coqa_conversations(target.tokenizer, n, turns=1, seed=0, max_story_tokens=max_context_tokens)
        return [turn_example(c, 0) for c in conversations]
    if dataset.startswith("stacks:"):
        return [d.example for d in distractor_stacks(target.tokenizer, int(dataset.split(":")[1]), n, seed=0)]
    raise SystemExit(f"unknown --dataset {dataset!r}: use squad, coqa or stacks:<budget> (e.g. stacks:512)")


WRITTEN = ("signals.csv", "report.md", "validation.json", "tuned_thresholds.json")  # what --out holds


def signals(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "signals.csv"
    done = set(pd.read_csv(path, dtype={"id": str}).id) if path.is_file() else set()
    config = read_config(args.checkpoint)
    source, target = load_model(config["source"]["name"]), load_model(config["target"]["name"])
    mot, _ = load_checkpoint(args.checkpoint, source, target)
    means = reference_means(target, mot.channels.target_layers)
    from tqdm import tqdm

    for example in tqdm(examples(args.dataset, target, args.n, args.max_context_tokens), desc="signals"):
        if example.id in done:
            continue
        prompt = build_prompt(example, target.chat_frame)
        translation = translate(mot, source, target, prompt.context_text)
        rows = pd.DataFrame(translation_fidelity(translation, target, mot.channels, means))
        native_lp, mot_lp = first_answer_logprobs(target, [translation.native_kv, translation.mixed_kv],
                                                  prompt.suffix_text)
        layers = layer_signals(rows, "translator")
        record = {"id": example.id, "dataset": args.dataset, "first_token_kl": kl_divergence(native_lp, mot_lp),
                  "tokens": int(translation.target_ids.shape[1]), "layers": json.dumps(layers.to_dict(orient="records")),
                  **lens_signals(target, translation, prompt.suffix_text, int(native_lp.argmax()))}
        if args.dataset != "squad":  # no evaluator run to join: answer here, as the evaluator does
            answers = answers_from_caches(target, {"native": translation.native_kv, "mot": translation.mixed_kv},
                                          example, suffix_text=prompt.suffix_text)
            record.update({f"{c}_answer": a.text for c, a in answers.items()})
            record.update({f"{c}_f1": a.score for c, a in answers.items()})
        pd.DataFrame([record]).to_csv(path, mode="a", header=not path.is_file(), index=False)


def lens_signals(target, translation, suffix_text: str, first_token: int) -> dict[str, str]:
    """The logit lens of the translated cache at the question's last position (mot_viz.analysis.logit_lens), per
    target layer as JSON lists: KL to native's final distribution, KL to native's same layer, the rank of native's
    first answer token, and the relative V error the question's attention reads from the context (head mean)."""
    caches = {"native": translation.native_kv, "mot": translation.mixed_kv}
    trace = lens_trace(target, caches, encode(target.tokenizer, suffix_text), [first_token], translation.prefix_len)
    lens = logit_lens(target, trace, 0).layers
    mot = lens[lens["condition"] == TRANSLATED].sort_values("layer")
    shares = attention_shares(trace, 0)
    read = shares[shares["condition"] == TRANSLATED].groupby("layer").read_error_v.mean()
    return {"lens_kl_final": json.dumps(mot.kl_to_native_final.round(6).tolist()),
            "lens_kl_layer": json.dumps(mot.kl_to_native_layer.round(6).tolist()),
            "lens_rank": json.dumps(mot.token_rank.tolist()),
            "read_error_v": json.dumps(read.round(6).tolist())}


def _per_example(table: pd.DataFrame) -> pd.DataFrame:
    """Each example's weakest window layer per signal: a verdict passes every layer iff it passes the weakest."""
    layers = table.layers.map(json.loads)
    return pd.DataFrame({
        "attn_out_cos": layers.map(lambda rows: min(r["attn_out_cos"] for r in rows)),
        "centered_cos_k": layers.map(lambda rows: min(r["centered_cos_k"] for r in rows)),
        "centered_cos_v": layers.map(lambda rows: min(r["centered_cos_v"] for r in rows)),
        "beats_mean_vector": layers.map(lambda rows: all(r.get("beats_mean_vector", True) for r in rows)),
        "first_token_kl": table.first_token_kl,
    })


def _verdicts(weakest: pd.DataFrame, t: VerdictThresholds) -> np.ndarray:
    ok = ((weakest.attn_out_cos >= t.attn_out_cos) & (weakest.centered_cos_k >= t.centered_cos_k)
          & (weakest.centered_cos_v >= t.centered_cos_v) & (weakest.first_token_kl <= t.first_token_kl))
    if t.require_beating_mean:
        ok &= weakest.beats_mean_vector
    return ok.to_numpy()


def _library_verdicts(table: pd.DataFrame, t: VerdictThresholds) -> np.ndarray:
    """The same verdicts from mot_viz.eval.verdict itself (checks that _verdicts is its vectorised twin)."""
    return np.array([reuse_verdict(_fidelity_rows(r), r.first_token_kl, thresholds=t).reuse
                     for r in table.itertuples()])


def _fidelity_rows(record) -> pd.DataFrame:
    """layer_signals' rows back as fidelity rows, with a mean-vector row that the translator beats (or not) as
    recorded."""
    layers = pd.DataFrame(json.loads(record.layers))
    rows = layers.assign(candidate="translator")
    if "beats_mean_vector" in layers:
        mean_err = np.where(layers.beats_mean_vector, np.inf, 0.0)
        rows = pd.concat([rows, layers.assign(candidate="mean vector", rel_err_k=mean_err, rel_err_v=mean_err)])
    return rows


LENS_SIGNALS = {"lens_kl_final": "lens KL to native's final distribution", "lens_kl_layer":
                "lens KL to native's same layer", "lens_rank": "log rank of native's first answer token",
                "read_error_v": "relative V error read by the question's attention (head mean)"}


def lens_candidates(table: pd.DataFrame, window: list[int]) -> pd.DataFrame:
    """Every lens signal at every target layer as one column (higher = further from native), its means over the
    window's layers and over the layers from the window up, and the first-token KL (the lens KL at the last
    layer); signals that do not vary (layers the translation cannot reach) are left out."""
    columns = {}
    for name in LENS_SIGNALS:
        per_layer = np.array(table[name].map(json.loads).tolist(), dtype=float)  # (examples, layers)
        if name == "lens_rank":
            per_layer = np.log(per_layer)
        for layer in range(per_layer.shape[1]):
            columns[f"{name}@{layer}"] = per_layer[:, layer]
        columns[f"{name}@window"] = per_layer[:, window].mean(1)
        columns[f"{name}@window+"] = per_layer[:, min(window):].mean(1)
    columns["first_token_kl"] = table.first_token_kl.to_numpy()
    return pd.DataFrame({k: v for k, v in columns.items() if np.ptp(v) > 0})


def _auc(score: np.ndarray, positive: np.ndarray) -> float:
    """P(a positive scores above a negative), ties counted half (Mann-Whitney U / (n+ · n-))."""
    from scipy.stats import rankdata

    ranks = rankdata(score)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _best_threshold(score: np.ndarray, keeps: np.ndarray) -> tuple[float, float]:
    """The threshold t ("reuse when score <= t") of best balanced accuracy, and that accuracy."""
    best = (float("inf"), -1.0)
    for t in np.unique(score):
        accuracy = _confusion(score <= t, keeps)["balanced_accuracy"]
        if accuracy > best[1]:
            best = (float(t), accuracy)
    return best


def lens_report(table: pd.DataFrame, keeps: np.ndarray, ratio: pd.Series, tune: slice, test: slice,
                window: list[int]) -> tuple[list[str], pd.DataFrame]:
    """Which lens signal predicts "keeps >= 90% of native F1": chosen on the tuning half, checked on the other.
    Returns the report's lines and every signal's row (ranked by the first half's AUC)."""
    from scipy.stats import spearmanr

    candidates = lens_candidates(table, window)
    lost = ~keeps  # a signal that is high when the answer is lost: AUC of the score for "lost"
    rows = []
    for name in candidates:
        score = candidates[name].to_numpy()
        threshold, tuned = _best_threshold(score[tune], keeps[tune])
        rows.append({"signal": name, "spearman": float(spearmanr(score, ratio).statistic),
                     "auc_tune": _auc(score[tune], lost[tune]), "auc_test": _auc(score[test], lost[test]),
                     "threshold": threshold, "bacc_tune": tuned,
                     "bacc_test": _confusion(score[test] <= threshold, keeps[test])["balanced_accuracy"]})
    result = pd.DataFrame(rows).sort_values("auc_tune", ascending=False)
    shown = pd.concat([result.head(8), result[result.signal == "first_token_kl"]]).drop_duplicates("signal")
    best = result.iloc[0]
    kl = result.set_index("signal").loc["first_token_kl"]
    lines = ["Logit-lens signals of the translated cache at the question's last position (mot_viz.analysis.logit_lens), "
             "per target layer (`name@layer`): AUC for telling lost from kept answers, and the balanced accuracy of "
             "\"reuse when the signal is at most t\" with t chosen on the first half. Signals ranked by the first "
             f"half's AUC; the first-token KL is the lens KL at the last layer. Spearman ρ with the retained share "
             f"over all {len(table)} examples (negative: a higher signal, less kept).", "",
             "| signal | Spearman ρ | AUC first half | AUC held out | t | balanced acc. first half | balanced acc. "
             "held out |", "|---|---|---|---|---|---|---|"]
    for r in shown.itertuples():
        lines.append(f"| {r.signal} | {r.spearman:+.2f} | {r.auc_tune:.2f} | {r.auc_test:.2f} | {r.threshold:.3g} | "
                     f"{r.bacc_tune:.2f} | {r.bacc_test:.2f} |")
    lines += ["", f"Best on the first half: `{best.signal}` (held-out AUC {best.auc_test:.2f}, balanced accuracy "
                  f"{best.bacc_test:.2f}) against the first-token KL (held-out AUC {kl.auc_test:.2f}, balanced accuracy "
                  f"{kl.bacc_test:.2f})."]
    return lines, result


def _confusion(verdict: np.ndarray, keeps: np.ndarray) -> dict:
    tp, tn = int((verdict & keeps).sum()), int((~verdict & ~keeps).sum())
    fp, fn = int((verdict & ~keeps).sum()), int((~verdict & keeps).sum())
    sens = tp / max(tp + fn, 1)
    spec = tn / max(tn + fp, 1)
    return {"n": len(keeps), "agreement": (tp + tn) / max(len(keeps), 1), "balanced_accuracy": (sens + spec) / 2,
            "precision": tp / (tp + fp) if tp + fp else float("nan"), "recall": sens,
            "reuse_and_keeps": tp, "reuse_but_loses": fp, "reprefill_but_keeps": fn, "reprefill_and_loses": tn}


def describe(dataset: str) -> str:
    """A dataset of `signals` in words (the app quotes it)."""
    if dataset.startswith("stacks:"):
        return f"distractor stacks of {dataset.split(':')[1]} target tokens"
    return {"coqa": "CoQA stories (their first question)", "squad": "SQuAD passages"}.get(dataset, dataset)


def _scored_signals(path: Path) -> pd.DataFrame:
    """A signals run that recorded its own answers (--dataset other than squad), with native and MoT F1 as the
    columns `native` and `mot`, kept where native answered (F1 > 0)."""
    table = pd.read_csv(path / "signals.csv", dtype={"id": str})
    if "native_f1" not in table:
        raise SystemExit(f"{path}/signals.csv has no answers: run signals with --dataset coqa or stacks:<budget>")
    table = table.rename(columns={"native_f1": "native", "mot_f1": "mot"})
    return table[table.native > 0].reset_index(drop=True)


def held_out_report(folders: list[str], tuned: VerdictThresholds, lens: pd.DataFrame,
                    window: list[int]) -> tuple[list[str], list[dict]]:
    """The verdict on genres never used for tuning: the shipped thresholds, those tuned on SQuAD's first half, and
    single signals at the threshold SQuAD's first half chose (the first-token KL and the best lens signal there)."""
    best_lens = lens.iloc[0]
    kl = lens.set_index("signal").loc["first_token_kl"]
    lines = ["Other genres, never used for tuning: each folder's examples with a native F1 > 0, the verdict with "
             "the thresholds above and single signals at the threshold SQuAD's first half chose (reuse when the "
             "signal is at most t). Precision: of the caches it reuses, the share that keep ≥ 90% of native F1; "
             "recall: of the caches that keep it, the share it reuses.", "",
             "| genre | n | keeps | rule | balanced accuracy | precision | recall | agreement |",
             "|---|---|---|---|---|---|---|---|"]
    summary = []
    for folder in folders:
        table = _scored_signals(Path(folder))
        genre = describe(str(table.dataset.iloc[0]))
        keeps = (table.mot >= 0.9 * table.native).to_numpy()
        weakest = _per_example(table)
        candidates = lens_candidates(table, window)
        rules = {"shipped defaults": _verdicts(weakest, VerdictThresholds()),
                 "tuned on SQuAD's first half": _verdicts(weakest, tuned),
                 f"first_token_kl ≤ {kl.threshold:.3g}": table.first_token_kl.to_numpy() <= kl.threshold}
        if best_lens.signal in candidates:
            log = "log " if best_lens.signal.startswith("lens_rank") else ""  # lens_candidates takes rank's log
            rules[f"{log}{best_lens.signal} ≤ {best_lens.threshold:.3g}"] = (candidates[best_lens.signal].to_numpy()
                                                                           <= best_lens.threshold)
        for rule, verdict in rules.items():
            c = _confusion(verdict, keeps)
            lines.append(f"| {genre} | {c['n']} | {int(keeps.sum())} | {rule} | "
                         f"{c['balanced_accuracy']:.2f} | {c['precision']:.2f} | {c['recall']:.2f} | "
                         f"{c['agreement']:.2f} |")
            if rule == "shipped defaults":
                summary.append({"genre": genre, "examples": c["n"], "keeps": int(keeps.sum()),
                                **{k: None if np.isnan(c[k]) else round(float(c[k]), 3)
                                   for k in ("balanced_accuracy", "precision", "recall", "agreement")}})
    return lines, summary


def report(args) -> None:
    out = Path(args.out)
    sig = pd.read_csv(out / "signals.csv", dtype={"id": str})
    ex = pd.read_csv(Path(args.eval) / "examples.csv", dtype={"id": str})
    f1 = ex[ex.condition.isin([REFERENCE, TRANSLATED])].pivot_table(index="id", columns="condition", values="score")
    table = sig.merge(f1, left_on="id", right_index=True)
    table = table[table.native > 0].reset_index(drop=True)  # "keeps 90% of native" needs a native answer to keep
    keeps = (table.mot >= 0.9 * table.native).to_numpy()
    weakest = _per_example(table)
    assert (_verdicts(weakest, VerdictThresholds()) == _library_verdicts(table, VerdictThresholds())).all()
    half = len(table) // 2
    tune, test = slice(0, half), slice(half, None)
    best, best_score = VerdictThresholds(), -1.0
    for values in itertools.product(*GRID.values()):
        t = replace(VerdictThresholds(), **dict(zip(GRID, values)))
        score = _confusion(_verdicts(weakest[tune], t), keeps[tune])["balanced_accuracy"]
        if score > best_score:
            best, best_score = t, score
    default = VerdictThresholds()
    rows = []
    for name, t in (("tuned on the first half", best), ("shipped defaults", default)):
        for part, sl in (("first half (tuning)", tune), ("second half (held out)", test)):
            rows.append({"thresholds": name, "examples": part, **_confusion(_verdicts(weakest[sl], t), keeps[sl])})
    result = pd.DataFrame(rows)
    ratio = (table.mot / table.native).clip(upper=2.0)
    corr = {"min attn_out_cos": float(np.corrcoef(weakest.attn_out_cos, ratio)[0, 1]),
            "first_token_kl": float(np.corrcoef(table.first_token_kl, ratio)[0, 1])}
    lines = [f"Reuse verdict vs QA on {len(table)} SQuAD examples with a native F1 > 0 (of {len(sig)} scored; "
             f"checkpoint and F1 from `{args.eval}`). Label: MoT keeps ≥ 90% of native F1 "
             f"({int(keeps.sum())} of {len(keeps)} do).", "",
             "| thresholds | examples | n | agreement | balanced accuracy | precision | recall | reuse & keeps | "
             "reuse but loses | re-prefill but keeps | re-prefill & loses |", "|---" * 11 + "|"]
    for r in result.itertuples():
        lines.append(f"| {r.thresholds} | {r.examples} | {r.n} | {r.agreement:.2f} | {r.balanced_accuracy:.2f} | "
                     f"{r.precision:.2f} | {r.recall:.2f} | {r.reuse_and_keeps} | {r.reuse_but_loses} | "
                     f"{r.reprefill_but_keeps} | {r.reprefill_and_loses} |")
    lines += ["", f"Tuned thresholds: {asdict(best)}.",
              f"Pearson r with the retained share (mot/native F1, capped at 2): min-layer attention-output cosine "
              f"{corr['min attn_out_cos']:+.2f}, first-token KL {corr['first_token_kl']:+.2f}."]
    checkpoint = json.loads((Path(args.eval) / "summary.json").read_text())["settings"]["checkpoint"]
    held_out = result[(result.thresholds == "shipped defaults") & (result.examples == "second half (held out)")].iloc[0]
    validation = {"checkpoint": checkpoint, "eval": args.eval, "examples": len(table),
                  "held_out": int(held_out.n), "balanced_accuracy": round(float(held_out.balanced_accuracy), 3),
                  "agreement": round(float(held_out.agreement), 3), "label": "MoT keeps >= 90% of native F1"}
    if "lens_kl_final" in table:
        window = [c["dst_layer_idx"] for c in read_config(checkpoint)["channels"]]
        lens_lines, lens = lens_report(table, keeps, ratio, tune, test, window)
        lines += ["", *lens_lines]
        best_held_out = lens.sort_values("bacc_test", ascending=False).iloc[0]
        validation["best_signal_held_out"] = {"signal": best_held_out.signal,
                                              "balanced_accuracy": round(float(best_held_out.bacc_test), 3)}
        if args.held_out:
            genre_lines, validation["other_genres"] = held_out_report(args.held_out, best, lens, window)
            lines += ["", *genre_lines]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "validation.json").write_text(json.dumps(validation, indent=2) + "\n")
    (out / "tuned_thresholds.json").write_text(json.dumps(asdict(best), indent=2))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, help="what to run")
    s = sub.add_parser("signals", help="compute each example's verdict signals (resumable)")
    s.add_argument("--checkpoint", required=True, help="checkpoint folder")
    s.add_argument("--dataset", default="squad", help="squad, coqa (first turns) or stacks:<budget>")
    s.add_argument("--n", type=int, default=300, help="examples (seed 0, as the evaluator samples them)")
    s.add_argument("--max_context_tokens", type=int, default=448,
                   help="the evaluator's passage cut (SQuAD); the longest story kept (CoQA)")
    s.add_argument("--out", required=True, help="folder for signals.csv")
    r = sub.add_parser("report", help="tune thresholds on one half, report agreement on the other")
    r.add_argument("--out", required=True, help="folder holding signals.csv")
    r.add_argument("--eval", required=True, help="evaluator output folder with examples.csv (native and mot F1)")
    r.add_argument("--held_out", nargs="*", default=[],
                   help="signals folders of other genres (run with --dataset coqa / stacks:<budget>)")
    for command in (s, r):
        command.add_argument("--overwrite", action="store_true", help="write into an --out folder holding other files")
    args = parser.parse_args()
    # before any model loads: a folder holding files this script does not write, a read-only place, a file
    check_out_place(Path(args.out), ours=lambda path: path.name in WRITTEN, overwrite=args.overwrite)
    signals(args) if args.command == "signals" else report(args)


if __name__ == "__main__":
    sys.exit(run_cli(main))
