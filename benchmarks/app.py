"""Benchmark (not a test): time from "Translate" to every figure of each page being ready.

    .venv/bin/python benchmarks/app.py [--checkpoint pretrained/smollm2-to-gemma3] [--tokens 256]

With the models and the checkpoint already loaded (as in a running app), it calls the library functions the
pages call, in the order a visitor meets them: the translation, the random-window control cache and the four
answers decoded as one batch (Answers page; the one-by-one decoding of before is timed beside it, in the same
run), then each page's tables and figures, each figure serialised to JSON as st.plotly_chart does. Every page
is visited --rounds times (each round after a fresh Translate) and each step's median is reported. A page's
time is the shared translation plus its own work, against the app's targets (Answers 2.5 s, every other
page 1.5 s). UMAP is timed separately: it is opt-in on the Cache space page (PCA is the default).
Prints a table and writes benchmarks/app.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

REPO = Path(__file__).resolve().parent.parent

from mot_viz.analysis import shift
from mot_viz.analysis.cache_metrics import (cache_error_grid, cache_error_table, cache_space_table, expert_usage,
                                            gate_table, token_routing_table, window_vectors)
from mot_viz.analysis.figures import (alignment_heatmap, alignment_table, answers_figure, cache_space_figure,
                                      error_heatmap, layer_error_figure, token_labels)
from mot_viz.analysis.routing_figures import entropy_figure, expert_usage_figure, gates_heatmap
from mot_viz.analysis.training_figures import training_figure
from mot_viz.analysis.shift.figures import correction_split_figure, correction_trajectory_figure, rho_trajectory_figure
from mot_viz.analysis.shift.metrics import kl_divergence
from mot_viz.data.eval_data import load_dataset
from mot_viz.engine.alignment import encode
from mot_viz.engine.checkpoint import load_checkpoint
from mot_viz.engine.models import DEFAULT_SOURCE, DEFAULT_TARGET, load_model
from mot_viz.engine.mot import translate, translate_window
from mot_viz.engine.prompts import build_prompt
from mot_viz.engine.translator import gate_balance
from mot_viz.eval.answers import (CONDITIONS, MAX_NEW_TOKENS, answer_from_cache, answers_from_caches,
                                  first_answer_logprobs)
from mot_viz.sharing.caches import condition_caches
from mot_viz.train.window_fidelity import translation_fidelity
from mot_viz.train.mean_vector import reference_means
from mot_viz.train.runs import read_training_log

TARGET_SECONDS = {"Answers": 2.5}  # the app's targets; every other page: DEFAULT_TARGET_SECONDS
DEFAULT_TARGET_SECONDS = 1.5
MEAN_VECTOR_PASSAGES = 16  # as the app (mot_viz.app.settings): computed once per target at start


class Timer:
    """Wall-clock seconds per named step, in order."""

    def __init__(self):
        self.rows: list[tuple[str, str, float]] = []

    @contextmanager
    def step(self, page: str, name: str):
        start = time.perf_counter()
        yield
        self.rows.append((page, name, time.perf_counter() - start))

    def seconds(self, prefix: str) -> float:
        """The seconds of the first step whose name starts with prefix."""
        return next(s for _, name, s in self.rows if name.startswith(prefix))

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=["page", "step", "seconds"])


def pick_example(target, n_tokens: int):
    """The SQuAD example (of the app's 50) whose prompt context is closest to n_tokens target tokens."""
    examples = load_dataset("squad", n=50, seed=0)
    lengths = [len(encode(target.tokenizer, build_prompt(e, target.chat_frame).context_text)) for e in examples]
    best = min(range(len(examples)), key=lambda i: abs(lengths[i] - n_tokens))
    return examples[best], lengths[best]


def bench(checkpoint: Path, n_tokens: int, max_new_tokens: int, rounds: int = 3) -> tuple[pd.DataFrame, dict]:
    """Run every page's work `rounds` times on warm models; returns each step's median seconds and facts about the run."""
    source, target = load_model(DEFAULT_SOURCE), load_model(DEFAULT_TARGET)
    mot, _ = load_checkpoint(checkpoint, source, target)
    example, length = pick_example(target, n_tokens)
    text = build_prompt(example, target.chat_frame).context_text
    # a running app has used its models before this Translate: pay the one-time first-call costs on another text
    extra = Timer()
    warm_text = "The Eiffel Tower is in Paris. It was designed by the company of Gustave Eiffel.\n"
    with extra.step("(untimed warm-up)", "first translation + answer after loading the models (one-time)"):
        warm = translate(mot, source, target, warm_text)
        answer_from_cache(target, warm.mixed_kv, example, "mot", 2)
    linear_path = checkpoint.with_name(checkpoint.name + "-linear")
    with extra.step("(untimed warm-up)", "mean native window of the target and the linear checkpoint (once, cached)"):
        means = reference_means(target, tuple(mot.channels.target_layers), MEAN_VECTOR_PASSAGES)
        linear = load_checkpoint(linear_path, source, target)[0] if linear_path.is_dir() else None
    timers = []
    for round_index in range(rounds):  # every timed step once per round; the report keeps each step's median
        timers.append(Timer())
        translation, caches, answers, vectors, t_tokens = _timed_round(
            timers[-1], extra if round_index == 0 else None, mot, source, target, example, text, checkpoint, means,
            linear, max_new_tokens)
    t = Timer()
    t.rows = [(page, name, statistics.median(timer.rows[i][2] for timer in timers))
              for i, (page, name, _) in enumerate(timers[0].rows)]

    for attempt in ("first call (includes numba compilation)", "second call"):
        with extra.step("Cache space (opt-in)", f"UMAP projection + figure, {attempt}"):
            cache_space_figure(cache_space_table(vectors, t_tokens, "umap")).to_json()

    facts = {"example": f"SQuAD {example.id}", "target_tokens": translation.target_ids.shape[1],
             "source_tokens": translation.source.source_ids.shape[1], "requested_tokens": n_tokens,
             "closest_length": length, "checkpoint": str(checkpoint), "max_new_tokens": max_new_tokens,
             "rounds": rounds,
             "stages": {k: round(v, 3) for k, v in translation.timings.items()},
             "answers": {c: a.text for c, a in answers.items()}, "conditions": len(caches),
             "batched": t.seconds("answers:"), "one_by_one": extra.seconds(f"answers: {len(caches)} conditions one by one"),
             "no_context_alone": extra.seconds("answers: native, MoT"), "control_replay": t.seconds("random-window"),
             "kl_alone": extra.seconds("reuse verdict: first answer token's KL, the question"),
             "kl_shared": t.seconds("reuse verdict"), "shift_alone": extra.seconds("residual traces: the question"),
             "shift_shared": t.seconds("residual traces of native")}
    return pd.concat([t.table().assign(in_total=True), extra.table().assign(in_total=False)], ignore_index=True), facts


def _timed_round(t: Timer, extra: Timer | None, mot, source, target, example, text: str, checkpoint: Path, means, linear,
                 max_new_tokens: int):
    """One visit of every page after one Translate: the timed steps in `t`, the comparisons with before in `extra`
    (None: not run)."""

    with t.step("all pages", "translation (source prefill, alignment, translator, replay, native prefill)"):
        translation = translate(mot, source, target, text)
    with t.step("all pages", "token labels"):
        t_tokens = token_labels(target.tokenizer, translation.target_ids[0].tolist())
        s_tokens = token_labels(source.tokenizer, translation.source.source_ids[0].tolist())

    with t.step("Answers", "random-window control cache (one more replay)"):
        caches = condition_caches(mot, source, target, example, translation, conditions=CONDITIONS).kv
    with t.step("Answers", f"answers: {len(caches)} conditions decoded as one batch, the no-context cache left-padded"):
        prompted = {}  # as the app: the batch's prompt step, kept for the Per-layer KL and the Shift trace
        answers = answers_from_caches(target, caches, example, max_new_tokens, prompted=prompted)
    if extra is not None:  # the earlier ways of answering, timed once (the first round)
        with extra.step("Answers (no context alone)", "answers: native, MoT and random control as one batch, "
                        "no context decoded alone"):
            answers_from_caches(target, {c: kv for c, kv in caches.items() if c != "no_context"}, example,
                                max_new_tokens)
            answer_from_cache(target, caches["no_context"], example, "no_context", max_new_tokens)
        with extra.step("Answers (before)", f"answers: {len(caches)} conditions one by one (no batching)"):
            alone = {c: answer_from_cache(target, kv, example, c, max_new_tokens) for c, kv in caches.items()}
        assert {c: a.text for c, a in alone.items()} == {c: a.text for c, a in answers.items()}
    with t.step("Answers", "figure"):
        table = pd.DataFrame([{"key": c, "answer": a.text, "score": a.score, "seconds_cache": 0.0,
                               "seconds_answer": a.seconds} for c, a in answers.items()])
        answers_figure(table).to_json()

    with t.step("Per-layer cache error", "tables + 2 figures"):
        window = mot.channels.target_layers
        layer_error_figure(cache_error_table(translation, mot.channels), window).to_json()
        grid = cache_error_grid(translation, mot.channels, "replayed", "K", "rel_l2")
        error_heatmap(grid, t_tokens, window, "rel_l2", "K").to_json()
    with t.step("Per-layer cache error", "window fidelity + baselines (mean vector"
                + (", the linear map's window on the same source context)" if linear is not None else ")")):
        others = {}
        if linear is not None:  # as the app: the map reads this translation's source context
            with torch.no_grad():
                out = translate_window(linear, translation.source, source, target)
            others["linear"] = (out.keys, out.values)
        translation_fidelity(translation, target, mot.channels, means, others=others)
    with t.step("Per-layer cache error", "reuse verdict: first answer token's KL to native (log-probs from the "
                "Answers batch's prompt step)"):
        kl = kl_divergence(prompted["native"].first_logprobs, prompted["mot"].first_logprobs)
    if extra is not None:
        with extra.step("Per-layer cache error (visited before Answers)",
                        "reuse verdict: first answer token's KL, the question run over native and MoT caches"):
            suffix = build_prompt(example, target.chat_frame).suffix_text
            alone = kl_divergence(*first_answer_logprobs(target, [translation.native_kv, translation.mixed_kv], suffix))
        assert abs(alone - kl) <= 1e-4 * max(1.0, abs(alone)), (alone, kl)

    with t.step("Expert routing", "tables + 4 figures"):
        out = translation.translated
        if out.key_routing is not None:
            for routing in (out.key_routing, out.value_routing):
                gate_balance(routing.gates)
                gates_heatmap(gate_table(routing.gates, t_tokens), "gates").to_json()
            per_token = token_routing_table(out.key_routing.gates, out.value_routing.gates, t_tokens)
            entropy_figure(per_token, mot.translator.config.top_k).to_json()
            usage = pd.concat([expert_usage(r.gates).assign(kv=kv)
                               for kv, r in (("K", out.key_routing), ("V", out.value_routing))])
            expert_usage_figure(usage).to_json()

    with t.step("Token alignment", "table + figure"):
        overlap = translation.source.alignment.overlap
        alignment_table(overlap, t_tokens, s_tokens)
        alignment_heatmap(overlap, t_tokens, s_tokens, "shared characters").to_json()

    with t.step("Cache space", "PCA projection + figure"):
        vectors = window_vectors(translation, mot.channels, mot.channels.window - 1, "K")
        cache_space_figure(cache_space_table(vectors, t_tokens, "pca")).to_json()

    with t.step("Training", "log + figure"):
        log = read_training_log(str(checkpoint))
        if log is not None:
            training_figure(log).to_json()

    with t.step("Shift analysis", "residual traces of native, MoT and random control at the answer tokens in one "
                "batched forward (the caches and question states are the Answers page's)"):
        case = shift.case_from_text(target, text, build_prompt(example, target.chat_frame).suffix_text, example)
        ws, _ = shift.analyse_translation(mot, source, target, case, translation, random_kv=caches["random"],
                                          answer_likelihood=False, prompted=prompted)
    with t.step("Shift analysis", "3 figures"):
        trajectories = ws.trajectories()
        rho_trajectory_figure(trajectories, 0).to_json()
        correction_trajectory_figure(trajectories, 0).to_json()
        correction_split_figure(ws.summary_frame()).to_json()
    if extra is not None:
        with extra.step("Shift analysis (visited before Answers)",
                        "residual traces: the question and answer tokens over native, MoT and random control"):
            case = shift.case_from_text(target, text, build_prompt(example, target.chat_frame).suffix_text, example)
            alone, _ = shift.analyse_translation(mot, source, target, case, translation, random_kv=caches["random"],
                                                 answer_likelihood=False)
        numeric = alone.summary_frame().select_dtypes("number")
        shared = ws.summary_frame()[numeric.columns]
        same = ((numeric - shared).abs() <= 1e-3 * (1 + numeric.abs())) | (numeric.isna() & shared.isna())
        assert same.all().all(), "the shared trace disagrees with the Shift page's own"
    return translation, caches, answers, vectors, t_tokens


def target(page: str) -> float:
    return TARGET_SECONDS.get(page, DEFAULT_TARGET_SECONDS)


def report(rows: pd.DataFrame, facts: dict, load_before: tuple[float, float, float]) -> str:
    """The markdown written to benchmarks/app.md."""
    core = rows[rows["in_total"]]
    total = core["seconds"].sum()
    shared = core[core["page"] == "all pages"]["seconds"].sum()
    # what a visitor waits for on one page: the shared translation, then that page's own work
    per_page = core[core["page"] != "all pages"].groupby("page", sort=False)["seconds"].sum() + shared
    slowest = per_page.idxmax()
    lines = [
        "# App benchmark: from Translate to every figure ready",
        "",
        f"Written by `benchmarks/app.py` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
        "",
        f"* Machine: {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
        f"torch threads {torch.get_num_threads()}, float32. Load average before the run "
        f"(1/5/15 min): {load_before[0]:.2f} / {load_before[1]:.2f} / {load_before[2]:.2f}"
        + (" — other jobs were using the cores, so these times are upper bounds." if load_before[0] > 0.5 else "."),
        f"* Pair: {DEFAULT_SOURCE} → {DEFAULT_TARGET}, checkpoint `{facts['checkpoint']}`.",
        f"* Context: {facts['example']}, {facts['target_tokens']} target / {facts['source_tokens']} source tokens "
        f"(the app's SQuAD example closest to {facts['requested_tokens']} target tokens).",
        f"* Models and checkpoint loaded before timing (as in a running app); answers generate up to "
        f"{facts['max_new_tokens']} tokens (the evaluator's setting).",
        f"* Every page visited {facts['rounds']} times, each round after a fresh Translate of the same context; every "
        f"time below is the median of its step over the rounds.",
        "",
        f"**Slowest page: {slowest}, {per_page[slowest]:.2f} s** from Translate to every figure of the page. "
        f"Every page one after another, sharing one translation: {total:.2f} s.",
        "",
        "| page | Translate → every figure of the page (s) | target | met |",
        "|---|---:|---:|---|",
        *[f"| {page} | {s:.3f} | {target(page):.1f} | {'yes' if s <= target(page) else 'no'} |"
          for page, s in per_page.items()],
        "",
        f"Answers, decoding the {facts['conditions']} conditions' answers: one batch {facts['batched']:.3f} s, one by "
        f"one {facts['one_by_one']:.3f} s (the same answers; {facts['one_by_one'] / facts['batched']:.2f}× in this run); "
        f"with the no-context row decoded alone {facts['no_context_alone']:.3f} s "
        f"({facts['no_context_alone'] / facts['batched']:.2f}×).",
        "",
        f"The Answers page's work is shared with two pages: its random control's cache with Shift analysis, and its "
        f"batch's prompt step (the question run over the native, MoT and random caches, and the first answer token's "
        f"log-probs) with the Per-layer page's first-token KL and the Shift page's trace, which then runs only the "
        f"answer tokens. A page visited before Answers computes them itself (first round, one measurement): Shift "
        f"analysis pays the control's replay ({facts['control_replay']:.3f} s) and traces the question too "
        f"({facts['shift_alone']:.3f} s instead of {facts['shift_shared']:.3f} s of the step), "
        f"{per_page['Shift analysis'] + facts['control_replay'] + facts['shift_alone'] - facts['shift_shared']:.3f} s "
        f"in all; Per-layer cache error runs the question over two caches ({facts['kl_alone']:.3f} s instead of "
        f"{facts['kl_shared']:.3f} s), "
        f"{per_page['Per-layer cache error'] + facts['kl_alone'] - facts['kl_shared']:.3f} s in all.",
        "",
        "| page | step | seconds | in total |",
        "|---|---|---:|---|",
        *[f"| {r.page} | {r.step} | {r.seconds:.3f} | {'yes' if r.in_total else 'no'} |" for r in rows.itertuples()],
        "",
        f"Translation stages (s): {facts['stages']}.",
        "",
        "Rows not in the total: the warm-up is paid once after the models load (a running app "
        "has paid it), the one-by-one answers are the unbatched way of answering, and the Cache space page "
        "projects with PCA unless UMAP is chosen.",
        "Pages share one cached translation (the 'all pages' rows): a page's time is those rows plus its own; "
        "after the first page, the others only add their own rows.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=REPO / "pretrained" / "smollm2-to-gemma3",
                        help="checkpoint folder of the bundled pair")
    parser.add_argument("--tokens", type=int, default=256, help="target tokens of the benchmark context")
    parser.add_argument("--max_new_tokens", type=int, default=MAX_NEW_TOKENS, help="greedy answer length")
    parser.add_argument("--rounds", type=int, default=3, help="visits of every page (each step's median is reported)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "app.md", help="markdown file to write")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows, facts = bench(args.checkpoint, args.tokens, args.max_new_tokens, args.rounds)
    with pd.option_context("display.max_colwidth", 90, "display.width", 160):
        print(rows.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    text = report(rows, facts, load_before)
    args.out.write_text(text)
    print(f"\nanswers: {facts['answers']}\nwrote {args.out}")


if __name__ == "__main__":
    main()
