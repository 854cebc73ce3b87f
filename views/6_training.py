"""Training: the checkpoint's loss curves, learning rate and gate balance, and how it was trained."""

from pathlib import Path

import pandas as pd
import streamlit as st

from mot_viz import app
from mot_viz.analysis.training_figures import training_figure
from mot_viz.engine.checkpoint import read_config
from mot_viz.engine.translator import TranslatorConfig, linear_inputs_text
from mot_viz.errors import MotVizError
from mot_viz.train.window_fidelity import recorded_fidelity_table
from mot_viz.eval.report import evaluation_table
from mot_viz.train.runs import read_training_log


def main() -> None:
    st.title("Training")
    app.explain(
        "The translator is trained with the **Context Correction Loss** (method.md §7): the target replays the context "
        "with the translated K/V injected in the window, then its next-token cross-entropy on the text that follows is "
        "**ce**; **mse_k**, **mse_v** are the mean squared error between the *replayed* cache and the native one over "
        "every layer from the window start to the top (the window layers' cached K/V are the ones the target recomputes "
        "there, not the translator's output). **tr_mse**, when its weight is above 0, is this project's translation term: "
        "the translator's own output against the native window K/V. **loss** is the weighted sum. **lr** is the "
        "learning rate (linear warm-up, then cosine). The gate-balance curves are the routers' CV² of importance and load "
        "(0 = every expert used equally), the importance entropy and, when trained with it, the Switch-style **balance** "
        "term, summed over the K and V routers (2 = both uniform, up to twice the number of experts). Each point is an average over the logged steps."
    )
    checkpoint = app.applied_selection().checkpoint
    try:
        config = read_config(checkpoint) if checkpoint else None
    except MotVizError as exc:
        app.show_error(exc)
        st.stop()
    if config is None:
        st.info("No checkpoint is selected. Choose one in the sidebar.")
        st.stop()

    st.caption(f"Checkpoint {app.escape_markdown(Path(checkpoint).name)} ({app.escape_markdown(checkpoint)})")
    log = read_training_log(checkpoint)
    bank_log = read_training_log(checkpoint, "bank_log.jsonl")
    if config["translator"].get("variant") == "linear":
        st.info("A closed-form linear map: fitted in one solve (ridge regression on the cached bank, λ chosen on held-out "
                "contexts; metrics.linear_fit below), so there are no training curves. It reads "
                f"{linear_inputs_text(TranslatorConfig(**config['translator']))}, and applies no output activation "
                "(the config's `output_activation` is read by the experts only).")
    elif log is None and bank_log is None:
        st.info("This checkpoint has no log.jsonl, so there are no curves to show.")
    if bank_log is not None:
        st.markdown("**Bank stage**: the translator trained on the cached bank against the native window directly "
                    "(**tr_mse_k/v** on training crops, **val_mse_k/v** on held-out bank contexts), before the replay stage.")
        app.show_figure(training_figure(bank_log, step="bank_step"), bank_log, f"bank_stage_{Path(checkpoint).name}")
    if log is not None:
        if bank_log is not None:
            st.markdown("**Replay stage**: the Context Correction Loss (plus **tr_mse**, the translation term, when its "
                        "weight is above 0).")
        app.show_figure(training_figure(log), log, f"training_{Path(checkpoint).name}")

    try:
        evaluation = evaluation_table(config)
    except MotVizError as exc:  # the rest of the page is still worth showing
        app.show_error(exc)
        evaluation = None
    if evaluation is not None:
        st.subheader("Measured quality")
        st.caption("QA results recorded in config.json (metrics.evaluation): greedy SQuAD F1 or closed-set accuracy per "
                   "condition on the same examples, with 95% bootstrap intervals; the commands are in"
                   " docs/results/single-passages.md.")
        st.dataframe(evaluation, hide_index=True, width="stretch")

    fidelity = recorded_fidelity_table(config)
    if fidelity is not None:
        st.subheader("Window fidelity on held-out text")
        st.caption("Recorded in config.json (metrics.fidelity) by `python -m mot_viz.eval.fidelity --record`: the mean over "
                   "held-out passages and window layers of each metric (cosines to the native window, relative error, "
                   "attention-output cosine), beside the mean-vector baseline. Per layer: Per-layer cache error page.")
        st.dataframe(fidelity, hide_index=True, width="stretch")
        with st.expander("Per window layer"):
            st.dataframe(recorded_fidelity_table(config, per_layer=True), hide_index=True, width="stretch")

    left, right = st.columns(2)
    with left:
        st.markdown("**How it was trained** (config.json → training)")
        training = config.get("training", {})
        st.dataframe(pd.DataFrame({"setting": list(training), "value": [str(v) for v in training.values()]}),
                     hide_index=True, width="stretch")
    with right:
        st.markdown("**Translator and replay**")
        st.json({"translator": config["translator"], "replay": config.get("replay", {}), "channels": config["channels"]},
                expanded=False)
        st.markdown("**Metrics** (config.json → metrics)")
        st.json(config.get("metrics", {}), expanded=False)


app.run_page(main)
