"""Layer patching: which target layer's translated K/V cost the answer, on the sidebar's context and gold answer."""

from dataclasses import replace

import streamlit as st

from mot_viz import app
from mot_viz.analysis.methods import method_labels
from mot_viz.analysis.patching import MEASURES, group_table, scan_figure
from mot_viz.app.methods import methods_offer
from mot_viz.app.openings import WHY_OPENS_ON_DIRECT, opens_on
from mot_viz.app.patching import gold_answer_text, long_selection, offered_methods, scan
from mot_viz.engine.patching import ANSWER_SENTENCE, REST, layer_groups
from mot_viz.errors import MotVizError
from mot_viz.sharing.registry import TRANSLATED

CONTEXTS = {"sidebar": "the sidebar's context", "long": "the Long context page's document"}


def main() -> None:
    st.title("Layer patching")
    app.explain(
        "The Per-layer page says how *far* each layer's K/V are from native; this page says how much each layer's "
        "error *costs the answer* — activation patching, done on caches. Two caches of the same context hold the "
        "same positions: the target's own (**native**) and the chosen method's (**translated**). The target then "
        "reads the question and the **gold answer**, teacher-forced, over a cache, and the reading is the gold "
        "answer's mean log-probability per token. Between the two ends lies the **gap** (native − translated).\n\n"
        "- **Restoring** layer l: the translated cache with the native K and V at layer l only. What comes back, "
        "as a share of the gap, is what the translation's error at that layer costs when every other layer keeps "
        "its error.\n"
        "- **Breaking** layer l: the native cache with the translated K and V at layer l only. What is lost, as a "
        "share of the gap, is what that layer's error costs on its own.\n\n"
        "Both read 1 when every layer is patched and 0 when none is. Each reading re-runs only the question and the "
        "answer over the patched cache; the caches are built once.\n\n"
        "What it does not say: patching one layer at a time misses layers that only matter together (two layers "
        "each of which the other can compensate for read near 0 alone): the **groups** below patch several at once — "
        "the injection window, Gemma's global (full-attention) layers, its sliding-window layers, or a set you pick. "
        "Shares can fall below 0 or rise above 1 where layers interact, and are noisy where the gap is small. A layer "
        "is patched as its stored K/V, not as the computation that made them. In the MoT's cache (method.md §6) the "
        "target replays every context token: inside the window its attention reads the translated K/V, and every "
        "layer caches the K/V it computes itself from its hidden state, so the window's effect reaches the cache "
        "through the hidden states — restoring layer l puts back what layer l would have cached natively, while the "
        "layers above keep what the shifted states gave them. A direct map's cache is every layer's translated K/V "
        "as they are, with no replay; KVComm's is the source's own K/V at its shared layers, with the context hidden "
        "past token 0 at the others (restoring such a layer also shows it)."
    )
    run = app.current_run()
    app.widget_default("pg.patch.context", "sidebar", list(CONTEXTS))
    context = st.radio("Context", list(CONTEXTS), key="pg.patch.context", format_func=CONTEXTS.get, horizontal=True,
                       help="The Long context page's document: the kind, length and number (or your own text, with "
                            "its question and gold answer) chosen there, read with the sidebar's pair and checkpoint. "
                            "Its translation and caches are built here once (about 20 s at 512 tokens on two CPU "
                            "cores); longer documents take longer.")
    try:
        if context == "long":
            run = replace(run, selection=long_selection(run))
        app.run_caption(run, document=run.selection.label if context == "long" else None)
        sel = run.selection
        app.question_header(sel.example)
        gold = gold_answer_text(sel)
    except MotVizError as exc:  # a context without a gold answer (nothing to read), a document that cannot be built
        app.show_error(exc)
        st.stop()
    offer = methods_offer(run)
    methods = offered_methods(offer)
    for method, why in offer.missing.items():
        st.caption(f"**{method_labels()[method]}** is not offered: {app.escape_markdown(why)}")
    spec = run.target.spec
    window = tuple(run.mot.channels.target_layers)
    default_groups = layer_groups(spec, window)
    global_layers = default_groups.get("global", ())

    cols = st.columns([2, 2, 1])
    first = opens_on(methods)
    app.widget_default("pg.patch.method", first, methods)
    method = cols[0].radio("Method", methods, key="pg.patch.method", horizontal=True,
                           format_func=lambda m: method_labels().get(m, m))
    if method == first != TRANSLATED:
        st.caption(WHY_OPENS_ON_DIRECT)
    app.widget_default("pg.patch.measure", "share", list(MEASURES))
    measure = cols[1].radio("Measure", list(MEASURES), key="pg.patch.measure", format_func=MEASURES.get,
                            horizontal=True)
    closed = sel.example.kind == "closed"
    app.widget_default("pg.patch.buckets", False)
    buckets = cols[2].toggle("Answer's sentence vs the rest", key="pg.patch.buckets", disabled=closed,
                             help="Also patch only the context positions of the sentence holding the gold answer, "
                                  "and only the rest (extractive questions whose answer is in the passage).")
    app.widget_default("pg.patch.custom", [])
    custom = st.multiselect("Your own group of layers (patched together)", list(range(spec.num_layers)),
                            key="pg.patch.custom")
    groups = {**default_groups, **({"your group": tuple(sorted(custom))} if custom else {})}

    with st.spinner(f"Patching {spec.num_layers} layers and {len(groups)} groups both ways …"):
        frame = scan(run, offer, method, groups, buckets and not closed)
    native, translated = frame["native"].iloc[0], frame["translated"].iloc[0]
    cols = st.columns(3)
    cols[0].metric("Native log p (gold, per token)", f"{native:.3f}")
    cols[1].metric(f"{method} log p", f"{translated:.3f}")
    cols[2].metric("Gap (nats)", f"{native - translated:.3f}")
    if abs(native - translated) < 0.05 and measure == "share":
        st.warning("The gap is under 0.05 nats: shares of so small a gap are mostly noise. Switch the measure to "
                   "nats, or pick a context where the method loses more.", icon="⚠️")
    st.caption(f"Gold answer read: {app.escape_markdown(gold or sel.example.answers[0])!s} · window layers "
               f"{', '.join(map(str, window))} (shaded)"
               + (f" · global layers {', '.join(map(str, global_layers))}" if global_layers else ""))
    app.show_figure(scan_figure(frame, window, global_layers, measure), frame, f"layer_patching_{method}")
    st.subheader("Groups: layers patched together")
    st.dataframe(group_table(frame).round(3), hide_index=True, width="stretch")
    if buckets and not closed:
        st.subheader("The answer's sentence against the rest of the context")
        st.caption(f"**{ANSWER_SENTENCE}**: the positions of the sentence holding the gold answer; **{REST}**: every "
                   "other context position (the BOS token is never patched). Each bar patches one layer at those "
                   "positions only.")
        for bucket in (ANSWER_SENTENCE, REST):
            app.show_figure(scan_figure(frame, window, global_layers, measure, bucket),
                            frame[frame["bucket"] == bucket], f"layer_patching_{method}_{bucket.replace(' ', '_')}")
    app.method_picture(run, "global" if global_layers else "window")


app.run_page(main)
