"""Cache space: native, translated and source K/V vectors of one window layer, projected to 2-D."""

import streamlit as st

from mot_viz import app_state
from mot_viz.cache_metrics import cache_space_table, window_vectors
from mot_viz.figures import cache_space_figure


def main() -> None:
    st.title("Cache space")
    app_state.explain(
        "Every dot is one token's K (or V) vector in one layer of the injection window, projected to two dimensions.\n\n"
        "- **Left, target space:** the target's own (**native**) vectors, the **translated** ones the translator wrote, "
        "and the **replayed** ones the target kept after injection. They have the same width, so they share **one** "
        "projection: a translated dot near its native dot means a good translation, a separate cloud means a "
        "systematic offset.\n"
        "- **Right, source space:** the source's vectors, averaged onto the target's tokens (the translator's input). "
        "They have another width and no shared coordinates with the target, so they get their **own** projection; "
        "compare shapes, not positions, across the two panels.\n\n"
        "**PCA** is a linear projection (its axes keep global distances; the share of variance it keeps is in the "
        "title). **UMAP** is nonlinear: it keeps neighbourhoods, not distances, and is slower. Hover a dot for its token."
    )
    run = app_state.current_run()
    app_state.run_caption(run)
    pairs = run.mot.channels.pairs()

    cols = st.columns(3)
    app_state.widget_default("pg.space.position", len(pairs) - 1, list(range(len(pairs))))
    position = cols[0].selectbox("Window layer", list(range(len(pairs))), key="pg.space.position",
                                 format_func=lambda i: f"target layer {pairs[i][1]} ← source layer {pairs[i][0]}")
    app_state.widget_default("pg.space.kv", "K")
    kv = cols[1].radio("Tensor", ["K", "V"], key="pg.space.kv", horizontal=True)
    app_state.widget_default("pg.space.method", "pca")
    method = cols[2].radio("Projection", ["pca", "umap"], key="pg.space.method", horizontal=True,
                           format_func=str.upper)

    vectors = window_vectors(run.translation, run.mot.channels, position, kv)
    with st.spinner(f"Projecting {sum(v.shape[0] for v in vectors.values())} vectors with {method.upper()} …"):
        points = cache_space_table(vectors, run.target_tokens, method)
    app_state.show_figure(cache_space_figure(points), points, f"cache_space_{kv}_layer{pairs[position][1]}_{method}")


app_state.run_page(main)
