"""Methods: the ways of sharing one context side by side (method.md §15), on the sidebar's context and question."""

import pandas as pd
import streamlit as st

from mot_viz import app
from mot_viz.analysis.method_figures import kv_error_figure, quality_time_figure, stages_figure
from mot_viz.analysis.methods import cache_methods_shown, combine, method_labels, relays, summary_table
from mot_viz.app.methods import cached_methods, cached_relays, methods_offer, results_root, shipped_method_points
from mot_viz.sharing.kvcomm import KVCOMM_FRACTION
from mot_viz.sharing.relay import LOOP_TOKENS, RELAY_TOKENS


def main() -> None:
    st.title("Methods")
    app.explain(
        "The same context handed to the *target* in each way the field compares MoT against (method.md §15), and "
        "the target's answer to the sidebar's question from each:\n\n"
        "- **native** — the target reads the context itself (the reference).\n"
        "- **no context** — only the question.\n"
        "- **MoT** — the sidebar's checkpoint: the source reads the context, its K/V over the window are translated, "
        "and the target runs one forward pass over every context token (the **replay**) whose attention reads the "
        "translated K/V inside the window; every layer caches the K/V it computes itself. It does not spare the "
        "target reading the text: it changes what the cache holds and the attention work (sparse over the source's "
        "top-k positions above the bottom layers).\n"
        "- **linear map** — the closed-form map of the same window on the same source context, replayed as the "
        "MoT's is (offered when a `-linear` checkpoint of this pair and window exists).\n"
        "- **direct map** — a full-depth map without replay: every target layer's K and V translated from the "
        "source's and used as the cache as it is; the target never runs over the context. Its cost is the mapping "
        "alone; every layer's error reaches the answer uncorrected, where the MoT's replay computes every layer's "
        "K/V with the target's own weights, the translation entering only through what the window's attention reads "
        "(offered when a direct map of this pair exists).\n"
        "- **KVComm** — same architecture only: the source's own K/V of the context go straight into the target's "
        "cache at the selected layers, and every other layer keeps only token 0 (the attention sink). Layers are "
        "scored by the attention mass of the question's positions on the context (the sink excluded), mixed with a "
        f"Gaussian prior over depth, and the top {KVCOMM_FRACTION:.0%} kept; here the calibration set is this "
        "context (a set of size 1, KVComm's default size).\n"
        f"- **text relay** (tick *Include the text relay*) — the source reads the instruction, then the passage, and "
        f"writes a message (greedy, in its chat template when it has one) until it ends its turn or {RELAY_TOKENS} "
        f"tokens, or until it begins to repeat itself ({LOOP_TOKENS} of its own tokens said again: the message ends "
        "before the repeat); the target reads only that message, in the prompt it answers *native* in. *relay* "
        "(KVComm's "
        "natural-language baseline): a summary of the passage written before any question exists, so its writing "
        "is work done ahead of the question. *relay_q* (C2C's protocol): the source sees the question and writes "
        "the background needed to solve it (unlike C2C's, this source also has the passage).\n\n"
        "Only the direct map, KVComm and the relays answer without the target running over the context; native, "
        "the MoT and the linear map run it over every context token.\n\n"
        "Extractive questions are scored by token F1 against the gold answers, closed ones by whether the likeliest "
        "choice label is the correct one. Every cache and answer is built by the evaluations' own code "
        "(`mot_viz.eval.answers`, `relay`, `kvcomm`), the code behind the shipped results below."
    )
    run = app.current_run()
    app.run_caption(run)
    sel = run.selection
    app.question_header(sel.example)
    metric = "correct" if sel.example.kind == "closed" else ("F1" if sel.example.answers else None)

    offer = methods_offer(run)
    for method, why in offer.missing.items():
        st.caption(f"**{method_labels()[method]}** is not offered: {app.escape_markdown(why)}")
    app.widget_default("pg.methods.relay", False)
    with_relay = st.checkbox("Include the text relay", key="pg.methods.relay",
                             help=f"The source writes two messages of up to {RELAY_TOKENS} tokens each: tens of "
                                  "seconds on two CPU cores. Computed once per context.")
    with st.spinner("Building every method's cache of the context and answering from it …"):
        result = cached_methods(run, offer, app.DEFAULT_MAX_NEW_TOKENS)
    if with_relay:
        with st.spinner("The source writes its messages and the target reads them (seconds to tens of seconds) …"):
            result = combine(result, cached_relays(run, app.DEFAULT_MAX_NEW_TOKENS))

    table = summary_table(result, metric)
    _answers(table, metric)
    _time(result)
    _bytes(result)
    _kv_error(result)
    if with_relay:
        _messages(result)
    _scatter(run, table, metric)


def _answers(table: pd.DataFrame, metric: str | None) -> None:
    st.subheader("Answers")
    shown = table.drop(columns=["method", "handed over", "bytes handed over", "seconds to the first answer token",
                                "seconds after the question"])
    shown = shown.rename(columns={"label": "method", "exact_match": "EM"})
    formats = {c: st.column_config.NumberColumn(format="%.3f") for c in (metric, "EM") if c in shown}
    st.dataframe(shown, hide_index=True, width="stretch", column_config=formats)


def _time(result) -> None:
    st.subheader("Time to the first answer token")
    app.show_figure(stages_figure(result.stages), result.stages, "methods_first_token")
    st.caption(
        "Stage by stage, from the text to the first answer token: the source's prefill (it reads the context; in "
        "MoT's use case it holds its cache already), the alignment of the two tokenizations, the translation, the "
        "replay, the assembly of a direct cache (the target's BOS and the translated layers), the relay's message "
        "writing (the source's reading of its prompt included), the target's prefill (native: of the context; no "
        "context: of its BOS; relay: of the message), and the first answer token (the target reads the question over "
        "the cache). The source's prefill and relay's message writing (its message needs no question) can run "
        "before the question arrives: the shipped results' times, and this context's star below, leave them out; "
        "relay_q's writing, for the question, stays in. Measured once per context in this app (the MoT's stages "
        "when its translation was first computed, shared with the other pages); KVComm's layer choice is not timed "
        "(calibrated once per run). On two CPU cores shared with other work only the ratios mean much.")


def _bytes(result) -> None:
    st.subheader("What is handed to the target")
    sizes = result.handed_over.assign(label=result.handed_over["method"].map(method_labels()),
                                      kB=result.handed_over["bytes"] / 1e3)
    st.dataframe(sizes[["label", "what", "bytes", "kB", "full_cache_bytes"]].rename(
        columns={"label": "method", "full_cache_bytes": "a full target cache (bytes)"}), hide_index=True,
        width="stretch", column_config={"kB": st.column_config.NumberColumn(format="%.1f")})
    st.caption("Caches in fp16: the translated window is its target layers' K and V at every context position; the "
               "direct map every layer's; KVComm the source's own K/V of the context at the shared layers; "
               "native the full target cache handing a cache over instead of the text would move (the target reads "
               "the text itself). The relay hands over its message in UTF-8.")


@app.fragment
def _kv_error(result) -> None:
    st.subheader("Per-layer K/V error against native")
    errors = result.kv_error
    cols = st.columns(2)
    app.widget_default("pg.methods.kv", "K", ["K", "V"])
    kv = cols[0].radio("Keys or values", ["K", "V"], key="pg.methods.kv", horizontal=True)
    app.widget_default("pg.methods.metric", "rel_l2", ["rel_l2", "cosine"])
    metric = cols[1].radio("Measure", ["rel_l2", "cosine"], key="pg.methods.metric", horizontal=True,
                           format_func={"rel_l2": "relative L2 error", "cosine": "cosine"}.get)
    part = errors[errors["kv"] == kv]
    app.show_figure(kv_error_figure(errors, kv, metric), part, f"methods_kv_error_{kv}_{metric}")
    shown = [method_labels()[m] for m in cache_methods_shown() if m in set(errors["method"])]
    st.caption(
        f"Methods with a cache of the context: {', '.join(shown)}. Each cache against the target's own over the "
        "context positions, layer by layer. MoT and the linear map: the replayed cache (filled markers: the window "
        "layers); direct: every layer (all translated); KVComm: its shared layers only (at the others the target "
        "reads token 0 alone). Native is the reference, and no context has no context positions. The text relay "
        "produces no cache of the context: the target's cache holds the message's positions, not the context's, so "
        "there is nothing to compare.")


def _messages(result) -> None:
    st.subheader("The relay's messages")
    for condition in relays():
        if condition in result.messages:
            app.show_text(method_labels()[condition], result.messages[condition])


def _scatter(run, table: pd.DataFrame, metric: str | None) -> None:
    st.subheader("Quality against time: the shipped results")
    points = shipped_method_points(str(results_root()))
    pair = (run.source.spec.name, run.target.spec.name)
    mine = points[(points["source"] == pair[0]) & (points["target"] == pair[1])]
    if mine.empty:
        st.caption(f"No shipped results for {app.escape_markdown(' → '.join(pair))}: every pair's are drawn.")
        mine = points
    live = pd.DataFrame({"method": table["method"], "score": table[metric] if metric else float("nan"),
                         "seconds": table["seconds after the question"]})
    app.show_figure(quality_time_figure(mine, live), pd.concat([mine.assign(context="shipped"),
                                                                live.assign(context="this context")]),
                    "methods_quality_time")
    st.caption(
        "One point per method and results folder and setting (dataset, or document kind and length): the mean "
        "score against the mean seconds per example from the question's arrival (the source's prefill and relay's "
        "writing, done ahead, left out). The long-context runs time the first answer token (circles); the QA runs "
        "time the whole answer (squares: building the cache plus the example's batch decoding shared evenly among "
        "its conditions, so within one folder the methods differ by their cache alone; in QA runs written before "
        "the work done ahead was recorded apart, the cache methods' seconds still hold the source's prefill). "
        "Stars: this context, timed to the first answer token" + ("." if metric else " (not drawn: no gold answer to score)."))


app.run_page(main)
