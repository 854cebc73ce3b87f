"""Per-layer cache error: translated and replayed K/V against the target's native K/V, per layer and token."""

from pathlib import Path

import pandas as pd
import streamlit as st

from mot_viz import app
from mot_viz.analysis.cache_metrics import cache_error_grid, cache_error_table
from mot_viz.analysis.figures import METRIC_TITLES, error_heatmap, layer_error_figure
from mot_viz.analysis.training_figures import FIDELITY_TITLES, fidelity_figure
from mot_viz.engine.cache_errors import COMPARISONS
from mot_viz.engine.checkpoint import read_config
from mot_viz.engine.mot import unread_window_layers
from mot_viz.engine.translator import TranslatorConfig, linear_inputs_text
from mot_viz.train.window_fidelity import fidelity_verdicts
from mot_viz.eval.verdict import VerdictThresholds, reuse_verdict


def main() -> None:
    st.title("Per-layer cache error")
    app.explain(
        "Each target layer keeps a key (K) and a value (V) vector per token. We compare two caches with the one the "
        "target builds from the text alone, dense attention and nothing injected (**native**):\n\n"
        "- **translated** — what the translator wrote for the injection-window layers (shaded): its direct output.\n"
        "- **replayed** — the cache the target actually keeps: the replay is the target's own forward pass over the "
        "context with the translation injected, and every layer, the window layers included, stores the K/V it "
        "computes from its own hidden states (the first window layer's stay native apart from sparse attention; each "
        "later window layer's differ because the window layers below it read the translated K/V). Layers below the "
        "window differ from native only through the replay's sparse top-k "
        "attention (a checkpoint that replays densely leaves them exactly native); layers above it inherit the "
        "injected information through the hidden states.\n\n"
        "**MSE** is the mean squared difference per number, **relative L2 error** is ‖candidate − native‖ / ‖native‖ "
        "(0 = identical, 1 = as large as the native vector itself), **cosine** compares directions (1 = same direction). "
        "One token's vector is all its KV heads concatenated. Hover any point or cell for the exact value."
    )
    run = app.current_run()
    app.run_caption(run)
    window = run.mot.channels.target_layers
    second = app.second_run(run, "pg.error.second")
    second_table = None if second is None else cache_error_table(second.translation, second.mot.channels)

    table = cache_error_table(run.translation, run.mot.channels)
    st.subheader("Per layer")
    if second is not None:
        st.caption(f"Solid: `{Path(run.selection.checkpoint).name}`; dashed: the second checkpoint `{second.name}` "
                   f"(its window: target layers {list(second.mot.channels.target_layers)}).")
    both = table if second_table is None else pd.concat([table.assign(checkpoint="selected"),
                                                         second_table.assign(checkpoint="second")])
    if run.mot.replay.direct:
        st.info("This checkpoint is a full-depth map without replay: every target layer's K/V is translated and used "
                "as the cache as it is, and the target computes nothing over the context. The translated and the kept "
                "cache are one cache, drawn once.", icon="ℹ️")
    app.show_figure(layer_error_figure(table, window, second_table, direct=run.mot.replay.direct), both,
                    "cache_error_per_layer")
    for layer in unread_window_layers(window, run.target.spec.num_layers):
        st.info(f"Layer {layer} is the target's last layer. What the translator writes there changes only that "
                "layer's attention output, which feeds the next-token logits and no cache entry: the replayed cache, "
                "and every answer read from it, is the same whatever the translator wrote at this layer "
                "(method.md §6). Its translated error is shown, but it costs nothing downstream.", icon="ℹ️")

    _token_heatmap(run)

    st.subheader("Window fidelity against its baselines")
    linear = app.linear_baseline_for(run.selection.checkpoint, run.mot)
    reads = ("" if linear is None else
             f" (the installed one reads {linear_inputs_text(TranslatorConfig(**read_config(linear)['translator']))})")
    st.markdown(
        "How close the translated window is to the native window on this context, beside what simpler "
        "\"translations\" score (method.md §13):\n\n"
        "- **centered cosine** — the cosine after removing each layer's own mean over this context's tokens. A vector "
        "added to every key leaves attention unchanged, so raw K cosine mostly rewards the shared mean; the centered "
        "cosine asks whether the token-to-token structure is right (0 = one shared vector for every token).\n"
        "- **attention-output cosine** — each window layer's attention output computed with the translated K/V versus "
        "with the native K/V, on the same queries: what attention reads from the window. The queries are the native "
        "prefill's (method.md §13 names the replay's own; the project's choice, recorded in docs/decisions.md, keeps "
        "every candidate on identical queries).\n"
        "- **mean vector** — every token's K/V replaced by the mean native K/V of that layer over LAMBADA prose: a "
        "window with no context-specific content.\n"
        "- **linear** — the closed-form ridge map into the same window, when a `linear` checkpoint for this pair and "
        f"window is installed{reads}: the floor a trained translator must clear to earn its cost."
    )
    fidelity = app.window_fidelity(run, None if second is None else second.path)
    own = fidelity["candidate"].iloc[0]
    for warning in fidelity_verdicts(fidelity, own):
        st.warning(warning, icon="⚠️")
    _fidelity_chart(fidelity)
    summary = fidelity.groupby("candidate", sort=False)[list(FIDELITY_TITLES)].mean().round(3)
    st.dataframe(summary.rename(columns=FIDELITY_TITLES), width="stretch")
    st.caption(f"This context only ({int(fidelity['tokens'].iloc[0])} target tokens); the held-out averages over 40 "
               "passages per corpus are on the Training page.")
    _verdict_section(run, fidelity, own, second)
    app.method_picture(run, "window")


@app.fragment
def _token_heatmap(run) -> None:
    """Layer × token error of one tensor and comparison (its options redraw only this figure)."""
    window = run.mot.channels.target_layers
    st.subheader("Per layer and token")
    cols = st.columns(3)
    app.widget_default("pg.error.kv", "K")
    kv = cols[0].radio("Tensor", ["K", "V"], key="pg.error.kv", horizontal=True)
    app.widget_default("pg.error.comparison", "replayed")
    comparison = cols[1].radio("Compare", list(COMPARISONS), key="pg.error.comparison", horizontal=True,
                               format_func=lambda c: f"{c} vs native")
    app.widget_default("pg.error.metric", "rel_l2")
    metric = cols[2].radio("Metric", list(METRIC_TITLES), key="pg.error.metric", horizontal=True,
                           format_func=METRIC_TITLES.get)
    grid = cache_error_grid(run.translation, run.mot.channels, comparison, kv, metric)
    title = f"{kv}: {METRIC_TITLES[metric]}, {COMPARISONS[comparison]}"
    grid_csv = grid.assign(token_text=[run.target_tokens[i] for i in grid["token"]], metric=metric, kv=kv,
                           comparison=comparison)
    app.show_figure(error_heatmap(grid, run.target_tokens, window, metric, title), grid_csv,
                    f"cache_error_{kv}_{comparison}_{metric}")


@app.fragment
def _fidelity_chart(fidelity) -> None:
    app.widget_default("pg.error.fidelity", ["centered_cos_k", "centered_cos_v", "attn_out_cos"])
    chosen = st.multiselect("Metrics", list(FIDELITY_TITLES), key="pg.error.fidelity", format_func=FIDELITY_TITLES.get)
    if chosen:
        app.show_figure(fidelity_figure(fidelity, chosen), fidelity, "window_fidelity")


@app.fragment
def _verdict_section(run, fidelity, candidate: str, second) -> None:
    st.subheader("Reuse verdict: use this translated cache, or the target's own prefill?")
    st.markdown(
        "The replay has already run the target over the context, so this is a question of quality, not of compute "
        "saved: answer from the MoT cache, or fall back to the target's own (native) prefill of the text, one more "
        "forward pass. A verdict from the measurable signals above, per window layer and overall. A layer passes when its "
        "attention-output cosine and its K and V centered cosines reach their thresholds and it errs less than the "
        "mean vector; the cache is reused when every window layer passes and the first answer token's distribution "
        "stays within a KL bound of the native one. Against QA (does MoT keep ≥ 90% of native F1?) none of these "
        "signals separates kept from lost answers well: on the shipped mid-depth checkpoint's SQuAD examples the "
        "first-token KL does best, and only a little better than chance, so the per-layer thresholds default to 0 "
        "and only the mean-vector check and the KL bound decide (docs/results/fidelity.md, \"The reuse verdict\"). "
        "Read the "
        "verdict as a hint. Raise the thresholds below to see what each signal would say."
    )
    validation = app.verdict_validation(run.selection.checkpoint)
    if validation is None:
        st.caption("This checkpoint's verdict has not been checked against QA (scripts/verdict_validation.py).")
    else:
        st.caption(f"Checked for this checkpoint: with the default thresholds the verdict agreed with \"keeps ≥ 90% "
                   f"of native F1\" on {validation['agreement']:.0%} of {validation['held_out']} held-out SQuAD "
                   f"examples (balanced accuracy {validation['balanced_accuracy']:.2f}; 0.5 is chance)"
                   + "".join(f"; on {g['examples']} {g['genre']}, never used for tuning, "
                             f"balanced accuracy {g['balanced_accuracy']:.2f}"
                             for g in validation.get("other_genres", []))
                   + f" — results/verdict/{Path(run.selection.checkpoint).name}/report.md.")
    defaults = VerdictThresholds()
    with st.expander("Thresholds"):
        c = st.columns(4)
        names = ("attn_out_cos", "centered_cos_k", "centered_cos_v", "first_token_kl")
        for name in names:
            app.widget_default(f"pg.error.verdict.{name}", float(getattr(defaults, name)))
        values = {name: c[i].number_input(name, step=0.05, key=f"pg.error.verdict.{name}", format="%.2f")
                  for i, name in enumerate(names)}
    sel = run.selection
    shown = [(Path(sel.checkpoint).name, None, candidate)] + ([(second.name, second.path, "second")] if second else [])
    for column, (name, path, who) in zip(st.columns(len(shown)), shown):
        with column:
            if second:
                st.markdown(f"**`{name}`**")
            kl = app.first_token_kl(sel, path)
            verdict = reuse_verdict(fidelity, kl, who, VerdictThresholds(**values))
            (st.success if verdict.reuse else st.warning)(
                f"**Verdict: {verdict.decision}.** " + ("Every signal is within its threshold." if verdict.reuse else
                                                         "Because: " + "; ".join(verdict.reasons) + "."))
            if kl is None:
                st.caption("No question is given, so the first-token KL is not part of this verdict.")
            else:
                st.caption(f"First answer token: KL(native ‖ translated) = {kl:.4f} nats "
                           f"(bound {values['first_token_kl']}).")
            st.dataframe(verdict.layers.round(3), hide_index=True, width="stretch")
    st.dataframe(verdict.thresholds_table(), hide_index=True, width="stretch")


app.run_page(main)
