"""Expert routing: which expert translator each token was sent to, for the K and the V mixture."""

from pathlib import Path

import pandas as pd
import streamlit as st

from mot_viz import app
from mot_viz.analysis.cache_metrics import expert_usage, gate_table, token_routing_table
from mot_viz.analysis.routing_figures import entropy_figure, expert_usage_figure, gates_heatmap, what_if_figure
from mot_viz.analysis.whatif import expert_error_table
from mot_viz.engine.translator import gate_balance, linear_inputs_text

WHAT_IF_MODES = {"force one expert": "force", "drop one expert": "drop", "uniform gates": "uniform"}


def main() -> None:
    st.title("Expert routing")
    app.explain(
        "A MoT checkpoint has, for K and for V separately, several **expert** translators and a **router**. For every "
        "token, the router scores the experts from the token's aligned source K/V, keeps the **top-k** scores and turns "
        "them into **gates** that sum to 1; the token's translation is the gate-weighted sum of the experts' outputs. "
        "A gate of 0 means top-k dropped that expert for that token.\n\n"
        "- **Entropy** per token: 0 = one expert did everything, log k = the kept experts shared evenly.\n"
        "- **Importance** of an expert = the sum of its gates over the context; **load** = how many tokens kept it. "
        "The dotted line is a perfectly even share. The CV² values (squared coefficient of variation) are the balance "
        "numbers logged in training: 0 = perfectly balanced.\n\n"
        "**What if** below overrides every token's gates — one expert forced, one dropped (the router's top-k among "
        "the others) or uniform — and shows what that does to the replayed cache and the answer: how much the "
        "router's choice matters on this context."
    )
    run = app.current_run()
    app.run_caption(run)
    cfg = run.mot.translator.config
    out = run.translation.translated
    if out.key_routing is None or out.value_routing is None:
        what = (f"a closed-form linear map of the window (ridge regression on {linear_inputs_text(cfg)})"
                if cfg.variant == "linear" else "one translator per K/V path")
        st.info(f"This checkpoint uses the **{cfg.variant}** variant: {what} and no router, "
                "so there is no routing to show. Choose a MoT checkpoint (variant 'mot') in the sidebar.")
        st.stop()

    st.markdown(f"{cfg.num_experts} experts per path, top-{cfg.top_k} kept per token."
                + (" Every token also gets the **linear path** (the closed-form map the experts were initialised to "
                   f"refine; it reads {linear_inputs_text(cfg)}): its translation is that map's output plus the "
                   "gate-weighted experts." if cfg.linear_residual else ""))
    balance_weight = float((run.config.get("training") or {}).get("balance_weight") or 0.0)
    if balance_weight > 0:
        st.markdown(f"This checkpoint's routers were also trained with a Switch-style load-balancing term "
                    f"(`balance_weight` {balance_weight:g}), which the method does not have (method.md §5: no "
                    "auxiliary load-balancing loss): the balance below partly reflects that term.")
    routed = {Path(run.selection.checkpoint).name: out}
    second = app.second_run(run, "pg.routing.second")
    if second is not None and second.translation.translated.key_routing is None:
        st.info(f"The second checkpoint `{second.name}` is a **{second.mot.translator.config.variant}** translator: it "
                "has no router, so only this checkpoint's routing is shown.")
    elif second is not None:
        routed[f"{second.name} (2nd)"] = second.translation.translated
    balance = pd.DataFrame([{"checkpoint": name, "mixture": kv, **gate_balance(r.gates)}
                            for name, o in routed.items() for kv, r in (("K", o.key_routing), ("V", o.value_routing))])
    st.dataframe(balance if len(routed) > 1 else balance.drop(columns="checkpoint"), hide_index=True)

    for kv, routing in (("K", out.key_routing), ("V", out.value_routing)):
        gates = gate_table(routing.gates, run.target_tokens)
        app.show_figure(gates_heatmap(gates, f"{kv} router gates per token"), gates, f"gates_{kv}")

    per_token = token_routing_table(out.key_routing.gates, out.value_routing.gates, run.target_tokens)
    app.show_figure(entropy_figure(per_token, cfg.top_k), per_token, "routing_entropy")

    for column, (name, o) in zip(st.columns(len(routed)), routed.items()):
        with column:
            if len(routed) > 1:
                st.markdown(f"**`{name}`**")
            usage = pd.concat([expert_usage(r.gates).assign(kv=kv) for kv, r in (("K", o.key_routing),
                                                                                 ("V", o.value_routing))])
            app.show_figure(expert_usage_figure(usage), usage, "expert_usage" if o is out else "expert_usage_second")
    with st.expander("Experts kept per token"):
        st.dataframe(per_token, hide_index=True, width="stretch")

    st.subheader("How each expert's tokens are translated")
    st.caption("Tokens grouped by the expert holding their largest gate: how many, and the mean relative L2 error and "
               "cosine of their translated window (all window layers) against native.")
    st.dataframe(expert_error_table(run.translation, run.mot).round(4), hide_index=True)

    _what_if_section(run)
    app.method_picture(run, "experts")


@app.fragment
def _what_if_section(run) -> None:
    """Gates overridden for every token (its options rerun only this section)."""
    cfg, sel = run.mot.translator.config, run.selection
    st.subheader("What if the router chose differently?")
    st.caption("The same context translated again with every token's gates overridden, for K and V alike; the "
               "experts, the alignment and the replay stay the checkpoint's own. Compared with the router's own "
               "choice: the replayed cache per layer, the first answer token's KL to the native distribution, and "
               "the answer.")
    app.widget_default("pg.routing.whatif", "force one expert")
    app.widget_default("pg.routing.expert", 0)
    choice = st.radio("Gates", list(WHAT_IF_MODES), key="pg.routing.whatif", horizontal=True)
    mode = WHAT_IF_MODES[choice]
    expert = None
    if mode != "uniform":
        expert = int(st.number_input("Expert", min_value=0, max_value=cfg.num_experts - 1, step=1,
                                     key="pg.routing.expert"))
    results = app.what_if_pair(sel, mode, expert, app.DEFAULT_MAX_NEW_TOKENS)
    errors = pd.concat([r.errors.assign(choice=r.label) for r in results])
    app.show_figure(what_if_figure(errors, run.mot.channels.target_layers), errors, f"what_if_{mode}")

    def mean_cosine(e: pd.DataFrame, comparison: str, kvs=("K", "V")) -> float:
        return e[(e.comparison == comparison) & e.kv.isin(kvs)].cosine.mean()

    summary = pd.DataFrame([{
        "gates": r.label,
        **{f"translated {kv} cosine (window)": mean_cosine(r.errors, "translated", (kv,)) for kv in ("K", "V")},
        "replayed cosine (all layers)": mean_cosine(r.errors, "replayed"),
        "first-token KL to native": r.first_token_kl,
        "answer": None if r.answer is None else r.answer.text,
        "score": None if r.answer is None else r.answer.score,
    } for r in results])
    st.dataframe(summary.round(4), hide_index=True, width="stretch")
    if results[0].answer is None:
        st.info("Free text without a question: the KL and the answer need a question (type one in the sidebar).")


app.run_page(main)
