"""Training: the checkpoint's loss curves, learning rate and gate balance, and how it was trained."""

from pathlib import Path

import pandas as pd
import streamlit as st

from mot_viz import app_state
from mot_viz.checkpoint import read_config
from mot_viz.errors import MotVizError
from mot_viz.fidelity import recorded_fidelity_table
from mot_viz.figures import training_figure

app_state.page_setup()
st.title("Training")
app_state.explain(
    "The translator is trained with the **Context Correction Loss**: the target's next-token cross-entropy on "
    "text that follows the translated context (**ce**), plus the mean squared error between the translated and "
    "native K and V of the window layers (**mse_k**, **mse_v**); **loss** is their weighted sum. **lr** is the "
    "learning rate (linear warm-up). The gate-balance curves are the routers' CV² of importance and load "
    "(0 = every expert used equally) and the importance entropy. Each point is an average over the logged steps."
)
checkpoint = app_state.applied_selection().checkpoint
try:
    config = read_config(checkpoint) if checkpoint else None
except MotVizError as exc:
    app_state.show_error(exc)
    st.stop()
if config is None:
    st.info("No checkpoint is selected. Choose one in the sidebar.")
    st.stop()

st.caption(f"Checkpoint `{Path(checkpoint).name}` ({checkpoint})")
log = app_state.read_training_log(checkpoint)
if log is None:
    st.info("This checkpoint has no log.jsonl, so there are no curves to show.")
else:
    app_state.show_figure(training_figure(log), log, f"training_{Path(checkpoint).name}")

evaluation = app_state.evaluation_table(config)
if evaluation is not None:
    st.subheader("Measured quality")
    st.caption("QA results recorded in config.json (metrics.evaluation): greedy SQuAD F1 or closed-set accuracy per "
               "condition on the same examples, with 95% bootstrap intervals; the commands are in docs/RESULTS.md.")
    st.dataframe(evaluation, hide_index=True, width="stretch")

fidelity = recorded_fidelity_table(config)
if fidelity is not None:
    st.subheader("Window fidelity on held-out text")
    st.caption("Recorded in config.json (metrics.fidelity) by `python -m mot_viz.fidelity --record`: the mean over "
               "held-out passages and window layers of each metric (cosines to the native window, relative error, "
               "attention-output cosine), beside the mean-vector baseline. Per layer: Per-layer cache error page.")
    st.dataframe(fidelity, hide_index=True, width="stretch")

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
