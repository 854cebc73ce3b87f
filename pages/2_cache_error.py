"""Per-layer cache error: translated and replayed K/V against the target's native K/V, per layer and token."""

import streamlit as st

from mot_viz import app_state
from mot_viz.cache_metrics import COMPARISONS, cache_error_grid, cache_error_table
from mot_viz.figures import METRIC_TITLES, error_heatmap, layer_error_figure

app_state.page_setup()
st.title("Per-layer cache error")
app_state.explain(
    "Each target layer keeps a key (K) and a value (V) vector per token. We compare two caches with the one the "
    "target builds when it reads the text itself (**native**):\n\n"
    "- **translated** — what the translator wrote for the injection-window layers (shaded): its direct output.\n"
    "- **replayed** — the cache the target actually keeps after the replay with the translation injected. Layers "
    "below the window are only touched by the sparse top-k attention of the replay; layers above it inherit the "
    "injected information through the hidden states.\n\n"
    "**MSE** is the mean squared difference per number, **relative L2 error** is ‖candidate − native‖ / ‖native‖ "
    "(0 = identical, 1 = as large as the native vector itself), **cosine** compares directions (1 = same direction). "
    "One token's vector is all its KV heads concatenated. Hover any point or cell for the exact value."
)
run = app_state.current_run()
app_state.run_caption(run)
window = run.mot.channels.target_layers

table = cache_error_table(run.translation, run.mot.channels)
st.subheader("Per layer")
app_state.show_figure(layer_error_figure(table, window), table, "cache_error_per_layer")

st.subheader("Per layer and token")
cols = st.columns(3)
app_state.widget_default("pg.error.kv", "K")
kv = cols[0].radio("Tensor", ["K", "V"], key="pg.error.kv", horizontal=True)
app_state.widget_default("pg.error.comparison", "replayed")
comparison = cols[1].radio("Compare", list(COMPARISONS), key="pg.error.comparison", horizontal=True,
                           format_func=lambda c: f"{c} vs native")
app_state.widget_default("pg.error.metric", "rel_l2")
metric = cols[2].radio("Metric", list(METRIC_TITLES), key="pg.error.metric", horizontal=True,
                       format_func=METRIC_TITLES.get)
grid = cache_error_grid(run.translation, run.mot.channels, comparison, kv, metric)
title = f"{kv}: {METRIC_TITLES[metric]}, {COMPARISONS[comparison]}"
grid_csv = grid.assign(token_text=[run.target_tokens[i] for i in grid["token"]], metric=metric, kv=kv,
                       comparison=comparison)
app_state.show_figure(error_heatmap(grid, run.target_tokens, window, metric, title), grid_csv,
                      f"cache_error_{kv}_{comparison}_{metric}")
