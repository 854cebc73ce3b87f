"""Logit lens: layer by layer, what the target would predict next under each cache, and where its question looks."""

import streamlit as st

from mot_viz import app
from mot_viz.analysis.figures import show_whitespace
from mot_viz.analysis.lens_figures import LENS_VALUES, attention_share_figure, lens_heatmap, lens_rank_figure
from mot_viz.analysis.logit_lens import LENS_ANSWER_TOKENS
from mot_viz.analysis.shift.cases import answer_token_ids
from mot_viz.sharing.registry import REFERENCE, TRANSLATED


def main() -> None:
    st.title("Logit lens")
    app.explain(
        "The Per-layer page shows how far the cache is from native; the Answers page shows the answer. The **logit "
        "lens** shows what lies between: after every target layer, the target's own residual stream at one question "
        "or answer position is read through the target's own final norm and output layer, as if the model stopped "
        "there — under each cache of the same context:\n\n"
        "- **native** — the target prefilled the text itself (the reference);\n"
        "- **mot** — the replayed cache (the target's own forward pass over the context with the translated window "
        "injected: every layer caches the K/V it computes itself, so the translation reaches the cache through the "
        "hidden states);\n"
        "- **linear** — the same replay with the closed-form linear map's window, when one is installed for this "
        "pair and window;\n"
        "- **no_context** — the question alone.\n\n"
        "Every cache reads the same question (and, when you follow the answer, the same answer tokens: the native "
        "cache's greedy answer, fed in turn), so a position predicts the same token under every cache. Per layer: the **KL** from native's final "
        "distribution (how far this layer's reading is from what native finally predicts) and from native's reading "
        "of the same layer, the **rank** of the token native answers with, and the top-5 tokens.\n\n"
        "What it cannot show: the lens reads only the question's and answer's positions; the context's cache is "
        "fixed input here, so it says nothing about how that cache was built. The model was never trained to predict "
        "from its middle layers, so early layers read as noise for every cache alike: compare the caches at one layer, "
        "not a layer's absolute values. **Attention on the context** below is where the question's attention goes at "
        "that position; on a sliding-window layer the question sees only the last positions of the context."
    )
    run = app.current_run()
    app.run_caption(run)
    sel = run.selection
    if sel.suffix is None:
        st.info("The logit lens reads the target's prediction of an answer: type a question in the sidebar (free text) "
                "or pick a dataset example.", icon="ℹ️")
        st.stop()
    window = run.mot.channels.target_layers
    chosen = app.second_checkpoint(run, "pg.lens.second")
    second = None if chosen is None else chosen[1]
    app.widget_default("pg.lens.follow", False)
    follow = st.toggle(f"Follow the native answer (its first {LENS_ANSWER_TOKENS} tokens)", key="pg.lens.follow",
                       help="Off: the question's last position only, which predicts the first answer token. On: the "
                            "native cache decodes its answer, and every cache reads it token by token (one decoding "
                            "step per token).")
    answer_tokens = LENS_ANSWER_TOKENS if follow else 0
    trace = app.lens_trace(sel, second, answer_tokens)
    tokenizer = run.target.tokenizer
    labels = [f"{i}: predicts {show_whitespace(tokenizer.decode([t]))!r}" for i, t in enumerate(trace.answer_ids)]
    app.widget_default("pg.lens.position", 0, list(range(trace.positions)))
    position = st.selectbox("Position", range(trace.positions), format_func=labels.__getitem__, key="pg.lens.position",
                            help="0 is the question's last token, which predicts the first answer token; i > 0 "
                                 "follows the native answer's token i − 1.", disabled=not follow)
    gold = None
    if position == 0 and sel.example is not None and (sel.example.answers or sel.example.kind == "closed"):
        gold = answer_token_ids(tokenizer, sel.example, 1)[0]
    lens, shares = app.lens_at(sel, position, second, gold, answer_tokens)
    if chosen is not None:
        st.caption(f"**second**: the replayed cache of the second checkpoint `{app.escape_markdown(chosen[0])}` on the "
                   "same context.")

    st.subheader("KL to native, layer by layer")
    app.widget_default("pg.lens.value", "kl_to_native_final", list(LENS_VALUES))
    value = st.radio("Compare with", list(LENS_VALUES), key="pg.lens.value", horizontal=True,
                     format_func=lambda v: "native's final distribution" if v == "kl_to_native_final"
                     else "native's reading of the same layer")
    app.show_figure(lens_heatmap(lens.layers, window, value), lens.layers, f"logit_lens_{value}_pos{position}")
    last = lens.layers[lens.layers.layer == lens.layers.layer.max()].set_index("condition")
    if TRANSLATED in last.index:
        st.caption(f"At the last layer the lens is the model's own output: KL(native ‖ mot) = "
                   f"{last.loc[TRANSLATED, 'kl_to_native_final']:.4f} nats here"
                   + (" — the first-token KL the reuse verdict on the Per-layer page reads." if position == 0 else "."))

    st.subheader("The answer token's rank")
    column = "token_rank"
    if "gold_rank" in lens.layers:
        app.widget_default("pg.lens.token", REFERENCE, [REFERENCE, "gold"])
        token = st.radio("Token", [REFERENCE, "gold"], key="pg.lens.token", horizontal=True,
                         format_func=lambda t: "native's answer token" if t == REFERENCE else
                         f"the gold answer's first token {show_whitespace(tokenizer.decode([gold]))!r}")
        column = "token_rank" if token == REFERENCE else "gold_rank"
    app.show_figure(lens_rank_figure(lens.layers, window, column), lens.layers, f"logit_lens_rank_pos{position}")
    first = lens.first_top1.assign(first_top1_layer=lens.first_top1.first_top1_layer.map(
        lambda v: "never" if v is None or v != v else str(int(v))))
    st.dataframe(first.rename(columns={"first_top1_layer": "first layer with the native token at top-1"}),
                 hide_index=True, width="stretch")

    with st.expander("Top-5 tokens per layer"):
        top = lens.top.assign(entry=lambda t: t.token.map(show_whitespace) + " (" + t.prob.map("{:.3f}".format) + ")")
        table = top.groupby(["layer", "condition"], sort=False).entry.agg(" · ".join).unstack("condition")
        st.dataframe(table[[c for c in lens.layers.condition.unique()]], width="stretch")
        st.download_button("Download the data (CSV): logit_lens_top5.csv", lens.top.to_csv(index=False).encode(),
                           file_name=f"logit_lens_top5_pos{position}.csv", mime="text/csv", key="dl.lens.top",
                           on_click="ignore")

    st.subheader("Attention on the context")
    sliding = sorted(shares[shares.sliding_window.notna()].layer.unique().tolist())
    st.markdown(
        "Left: the share of this position's attention that lands on the context's positions (the rest goes to the "
        "BOS token and to the question itself), averaged over heads. Right: for each non-native cache, the relative "
        "V error (to native) of the context positions it reads, weighted by that attention: how far from native what "
        "the question actually reads at each layer is."
        + (f" Layers {', '.join(map(str, sliding))} attend within a sliding window of "
           f"{int(shares.sliding_window.dropna().iloc[0])} positions: there the question sees only the context's last "
           "positions." if sliding else ""))
    app.show_figure(attention_share_figure(shares, window), shares, f"attention_on_context_pos{position}")


app.run_page(main)
