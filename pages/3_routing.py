"""Expert routing: which expert translator each token was sent to, for the K and the V mixture."""

import pandas as pd
import streamlit as st

from mot_viz import app_state
from mot_viz.cache_metrics import expert_usage, gate_table, token_routing_table
from mot_viz.figures import entropy_figure, expert_usage_figure, gates_heatmap
from mot_viz.translator import gate_balance


def main() -> None:
    st.title("Expert routing")
    app_state.explain(
        "A MoT checkpoint has, for K and for V separately, several **expert** translators and a **router**. For every "
        "token, the router scores the experts from the token's aligned source K/V, keeps the **top-k** scores and turns "
        "them into **gates** that sum to 1; the token's translation is the gate-weighted sum of the experts' outputs. "
        "A gate of 0 means top-k dropped that expert for that token.\n\n"
        "- **Entropy** per token: 0 = one expert did everything, log k = the kept experts shared evenly.\n"
        "- **Importance** of an expert = the sum of its gates over the context; **load** = how many tokens kept it. "
        "The dotted line is a perfectly even share. The CV² values (squared coefficient of variation) are the balance "
        "numbers logged in training: 0 = perfectly balanced."
    )
    run = app_state.current_run()
    app_state.run_caption(run)
    cfg = run.mot.translator.config
    out = run.translation.translated
    if out.key_routing is None or out.value_routing is None:
        what = ("a closed-form linear map of the window (ridge regression)" if cfg.variant == "linear"
                else "one translator per K/V path")
        st.info(f"This checkpoint uses the **{cfg.variant}** variant: {what} and no router, "
                "so there is no routing to show. Choose a MoT checkpoint (variant 'mot') in the sidebar.")
        st.stop()

    st.markdown(f"{cfg.num_experts} experts per path, top-{cfg.top_k} kept per token."
                + (" Every token also gets the **linear path** (the closed-form map the experts were initialised to "
                   "refine): its translation is that map's output plus the gate-weighted experts." if cfg.linear_residual
                   else ""))
    balance = pd.DataFrame([{"mixture": kv, **gate_balance(r.gates)}
                            for kv, r in (("K", out.key_routing), ("V", out.value_routing))])
    st.dataframe(balance, hide_index=True)

    for kv, routing in (("K", out.key_routing), ("V", out.value_routing)):
        gates = gate_table(routing.gates, run.target_tokens)
        app_state.show_figure(gates_heatmap(gates, f"{kv} router gates per token"), gates, f"gates_{kv}")

    per_token = token_routing_table(out.key_routing.gates, out.value_routing.gates, run.target_tokens)
    app_state.show_figure(entropy_figure(per_token, cfg.top_k), per_token, "routing_entropy")

    usage = pd.concat([expert_usage(r.gates).assign(kv=kv) for kv, r in (("K", out.key_routing), ("V", out.value_routing))])
    app_state.show_figure(expert_usage_figure(usage), usage, "expert_usage")
    with st.expander("Experts kept per token"):
        st.dataframe(per_token, hide_index=True, width="stretch")


app_state.run_page(main)
