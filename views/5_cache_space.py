"""Cache space: native, translated and source K/V vectors of one window layer, projected to 2-D."""

import streamlit as st

from mot_viz import app
from mot_viz.analysis.cache_metrics import FIT_ON, cache_space_table, token_annotations, window_vectors
from mot_viz.analysis.figures import cache_space_figure


def main() -> None:
    st.title("Cache space")
    app.explain(
        "Every dot is one token's K (or V) vector in one layer of the injection window, projected to two dimensions.\n\n"
        "- **Left, target space:** the target's own (**native**) vectors, the **translated** ones the translator wrote, "
        "and the **replayed** ones the target kept after injection. They have the same width, so they share **one** "
        "projection: a translated dot near its native dot means a good translation, a separate cloud means a "
        "systematic offset.\n"
        "- **Right, source space:** the source's vectors, averaged onto the target's tokens (the translator's input; "
        "a pre-RoPE checkpoint reads the keys before rotation, shown here after it, as cached). "
        "They have another width and no shared coordinates with the target, so they get their **own** projection; "
        "compare shapes, not positions, across the two panels.\n\n"
        "Lines join each token's native point to its translated one (and the replayed or linear-map one when shown): "
        "their length and direction are that token's translation error in this projection. The translated points can "
        "be coloured by their error to native or by the expert that carried most of their gate.\n\n"
        "**PCA** is a linear projection (its axes keep global distances; the share of variance it keeps is in the "
        "title). **UMAP** is nonlinear: it keeps neighbourhoods, not distances, and is slower. Hover a dot for its token."
    )
    run = app.current_run()
    app.run_caption(run)
    _projection(run)


@app.fragment
def _projection(run) -> None:
    """The options and the projection (changing an option redraws only this part, not the page)."""
    pairs = run.mot.channels.pairs()

    cols = st.columns(3)
    app.widget_default("pg.space.position", len(pairs) - 1, list(range(len(pairs))))
    position = cols[0].selectbox("Window layer", list(range(len(pairs))), key="pg.space.position",
                                 format_func=lambda i: f"target layer {pairs[i][1]} ← source layer {pairs[i][0]}")
    app.widget_default("pg.space.kv", "K")
    kv = cols[1].radio("Tensor", ["K", "V"], key="pg.space.kv", horizontal=True)
    app.widget_default("pg.space.method", "pca")
    method = cols[2].radio("Projection", ["pca", "umap"], key="pg.space.method", horizontal=True,
                           format_func=str.upper)

    options = st.columns(3)
    app.widget_default("pg.space.kinds", ["native target", "translated", "source (aligned)"])
    linear = app.linear_baseline_for(run.selection.checkpoint, run.mot) if run.mot.translator.config.variant != "linear" \
        else None
    second = app.second_run(run, "pg.space.second")
    if second is not None and second.mot.channels.target_layers != run.mot.channels.target_layers:
        st.info(f"The second checkpoint `{second.name}` writes another window (target layers "
                f"{list(second.mot.channels.target_layers)}), so it has no vectors in this layer to compare.")
        second = None
    translation2 = None if second is None else second.translation
    offered = ["native target", "translated", "replayed target", "source (aligned)"] + (["linear map"] if linear else []) \
        + (["second translator"] if translation2 is not None else [])
    kinds = options[0].multiselect("Show", offered, key="pg.space.kinds")
    app.widget_default("pg.space.join", True)
    join = options[1].checkbox("Join each token's native and translated points", key="pg.space.join")
    routed = run.translation.translated.key_routing is not None
    app.widget_default("pg.space.colour", "kind")
    colour = options[2].radio("Colour translated points by", ["kind", "rel_l2"] + (["expert"] if routed else []),
                              key="pg.space.colour", horizontal=True,
                              format_func={"kind": "kind", "rel_l2": "error to native", "expert": "routed expert"}.get)

    vectors = window_vectors(run.translation, run.mot.channels, position, kv)
    if linear:
        lin = app.get_translation(run.selection, linear).translated
        vectors["linear map"] = (lin.keys if kv == "K" else lin.values)[0, :, position].float()
    if translation2 is not None:
        other = translation2.translated
        vectors["second translator"] = (other.keys if kv == "K" else other.values)[0, :, position].float()
    vectors = {k: v for k, v in vectors.items() if k in kinds}
    if not vectors:
        st.info("Choose at least one kind of vector to show.")
        st.stop()
    with st.spinner(f"Projecting {sum(v.shape[0] for v in vectors.values())} vectors with {method.upper()} …"):
        points = cache_space_table(vectors, run.target_tokens, method)
    points = points.merge(token_annotations(run.translation, run.mot.channels, position, kv), on="token_index",
                          how="left")
    joined = [k for k in ("translated", "replayed target", "linear map", "second translator") if join and k in kinds]
    app.show_figure(cache_space_figure(points, joined, colour), points,
                    f"cache_space_{kv}_layer{pairs[position][1]}_{method}")
    st.caption(f"The target-space projection is fitted on {' + '.join(k for k in FIT_ON if k in kinds) or 'the kinds shown'} "
               "together; every other target-space kind is placed in that same projection, so the axes stay put "
               "when a kind is shown or hidden." + (f" Linear map: `{linear}` on the same context." if linear else "")
               + (f" Second translator: `{second.name}` on the same context." if translation2 is not None else ""))


app.run_page(main)
