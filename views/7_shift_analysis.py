"""Shift analysis: how far an injected window moves the target's residual stream, and what the upper layers do about it."""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from mot_viz import app
from mot_viz.analysis import shift
from mot_viz.analysis.shift.figures import (correction_split_figure, correction_trajectory_figure,
                                            correction_vs_start_figure, metric_kl_figure, rho_trajectory_figure,
                                            shift_vs_start_figure)
from mot_viz.errors import MotVizError

# saved sweeps (scripts/shift_sweep.py); $MOT_VIZ_SHIFT_RESULTS points elsewhere (tests)
RESULTS_DIR = Path(os.environ.get("MOT_VIZ_SHIFT_RESULTS", app.REPO_ROOT / "results" / "shift"))


def main() -> None:
    st.title("Shift analysis")
    app.explain(
        "The translated window changes the replay's hidden states from the window up, and through them the cached "
        "K/V of every layer above the window's first layer, which the answer tokens attend to; so at every answer "
        "token the target's **residual stream** (the running sum each layer adds to) ends up somewhere else than on "
        "its native cache. We teacher-force the first answer tokens (the gold answer) on top of each cache and read "
        "the residual "
        "state **h_k** at every layer boundary k.\n\n"
        "- **Initial shift ‖s‖** — how far the state has moved just after the injected window (boundary k0).\n"
        "- **ρ_k = ‖Δh_k‖/‖s‖** — the shift trajectory over the layers above the window. Above 1 the upper layers "
        "*amplify* the shift (it propagates), below 1 they *correct* it.\n"
        "- **Last-state shift ‖Δh_L‖** — what is left at the top, where the next token is read out.\n"
        "- **α** — the part of the upper layers' correction that pushes straight back against the shift; **β** — the "
        "part that moves it sideways; **cosine** = α/‖correction‖. α splits exactly into an **attention** and an "
        "**MLP** share.\n"
        "- **Random control** — the same replay with a random window of the same per-vector distance from the native "
        "one. If the translated window is corrected more than random noise of the same size, the target 'recognises' "
        "its structure.\n\n"
        "Early windows leave many layers to correct the shift but also to amplify it; late windows leave none, so "
        "their initial shift reaches the output untouched. The sweep below shows both failure modes against the "
        "window start. Definitions: method.md §9.1–§9.2."
    )
    run = app.current_run()
    app.run_caption(run)
    _checkpoint_window(run)
    _live_sweep(run)
    _shipped_sweep(run.selection)


# ----- 1. the checkpoint's own window on this context ------------------------------------------------------------


def _checkpoint_window(run: app.Run) -> None:
    """§9.2 traced on this context: the shift's summary, its trajectory over the layers, and the correction split."""
    st.header("This checkpoint's window on this context")
    sel = run.selection
    if not sel.suffix:
        st.info("Free text without a question has no answer to trace. Type a question (and ideally its gold answer) "
                "in the sidebar, then press **Translate**.", icon="ℹ️")
        return
    (ws, window_run), case = _traced(sel)
    tokens = [run.target.tokenizer.decode([t]) for t in case.answer_ids]
    _window_summary(ws, window_run, case, tokens)
    token_index = _answer_token(tokens)
    trajectories, summary = ws.trajectories(), ws.summary_frame()
    app.show_figure(rho_trajectory_figure(trajectories, token_index), trajectories, "shift_rho_trajectory")
    app.show_figure(correction_trajectory_figure(trajectories, token_index), trajectories,
                    "shift_correction_trajectory")
    app.show_figure(correction_split_figure(summary), summary, "shift_correction_split")
    st.number_input("Random-control seed", min_value=0, step=1, key="pg.shift.seed")
    # the layers whose correction or amplification the figures trace; a window at the top leaves none
    app.method_picture(run, "above" if ws.num_upper_layers else "window")


def _traced(sel: app.Selection) -> tuple[shift.WindowAnalysis, shift.ContextCase]:
    """The residual stream traced on the native, MoT and random-control caches at the control seed's widget value;
    an error is shown and stops the page."""
    app.widget_default("pg.shift.seed", app.CONTROL_SEED)
    seed = int(st.session_state["pg.shift.seed"])
    try:
        with st.spinner("Tracing the residual stream on the native, MoT and random-control caches …"):
            return app.window_analysis(sel, seed)
    except MotVizError as exc:
        app.show_error(exc)
        st.stop()


def _window_summary(ws: shift.WindowShift, window_run: shift.WindowRun, case: shift.ContextCase,
                    tokens: list[str]) -> None:
    """Where the window lies, the answer tokens traced, and the headline numbers with what qualifies them."""
    st.caption(f"Window: target layers {ws.window_start}–{ws.window_end} of {ws.num_layers}; k0 = {ws.k0}, "
               f"{ws.num_upper_layers} layer(s) above it. Teacher-forced answer tokens: "
               f"{' · '.join(repr(t) for t in tokens)}"
               f"{'' if case.example is not None else ' (the native greedy answer: no gold answer was given)'}.")
    cols = st.columns(4)
    full = ws.summary("full_mix")
    rnd = ws.summary("random")
    cols[0].metric("Initial shift ‖s‖ (MoT)", f"{full.initial_shift:.4g}",
                   help="Mean over answer tokens, at the boundary just after the window.")
    cols[1].metric("Last-state shift ‖Δh_L‖ (MoT)", f"{full.final_shift:.4g}")
    cols[2].metric("Median ρ_L (MoT / random)", f"{full.median_final_shrink:.3g} / {rnd.median_final_shrink:.3g}")
    cols[3].metric("KL(native ‖ MoT) next token", f"{window_run.kl.get('native||full_mix', float('nan')):.4g}")
    if ws.num_upper_layers == 0:
        st.info("This checkpoint injects into the target's top layers, so no layer is left above the window: "
                "the shift at the top *is* the initial shift (ρ = 1 trivially). The sweep below moves a window "
                "of the same kind down the target to show what the upper layers would do.", icon="ℹ️")
    if full.pre_window_shift > 0:
        st.caption(f"The MoT cache is replayed with sparse top-k attention, so the residual stream moves already "
                   f"below the window (mean ‖Δh_t0‖ = {full.pre_window_shift:.4g}); ‖s‖ includes that part.")


def _answer_token(tokens: list[str]) -> int:
    """The answer token whose trajectory is drawn (a slider where there are several)."""
    if len(tokens) <= 1:
        return 0
    positions = list(range(len(tokens)))
    app.widget_default("pg.shift.token", 0, positions)
    return st.select_slider("Answer token", options=positions, key="pg.shift.token",
                            format_func=lambda j: f"{j}: {tokens[j]!r}")


# ----- 2. a training-free sweep on this context ------------------------------------------------------------------


def _live_sweep(run: app.Run) -> None:
    """§9.1 on this context alone: the window start swept with a perturbation or the checkpoint's error profile."""
    st.header("Sweep the window start on this context (training-free)")
    st.markdown(
        "Instead of training a translator per start, inject the **native** window plus a random direction of a chosen "
        "relative size (*perturbation*), or with this checkpoint's own per-token, per-layer relative error moved to each "
        "start (*checkpoint error profile*). This isolates what the layers above the window do with a shift of that size. "
        "In these modes the random control is a second draw of the same noise, so MoT-vs-random differences are noise. "
        "The replay is dense; the task metric is left out (the KL and the gold-answer likelihood are shown) to keep it "
        "to seconds per start."
    )
    if not run.selection.suffix:
        return
    params = _sweep_settings(run.target.spec.num_layers)
    if st.button("Run the sweep", key="shift.run"):
        st.session_state["pg.shift.live"] = params
    if st.session_state.get("pg.shift.live") == params:
        _swept(run.selection, params)
    elif st.session_state.get("pg.shift.live") is not None:
        st.info("The settings changed. Press **Run the sweep** to apply them.", icon="ℹ️")


def _sweep_settings(n_layers: int) -> tuple:
    """The sweep's widgets: (mode, window size, relative size, controls, seed), as live_sweep takes them."""
    cols = st.columns(4)
    app.widget_default("pg.shift.mode", "perturbation")
    mode = cols[0].radio("Window", ["perturbation", "checkpoint-error-profile"], key="pg.shift.mode",
                         format_func=lambda m: {"perturbation": "perturbation",
                                                "checkpoint-error-profile": "checkpoint error profile"}[m])
    app.widget_default("pg.shift.window", min(4, n_layers))
    window = int(cols[1].number_input("Window size W", min_value=1, max_value=n_layers, step=1, key="pg.shift.window"))
    app.widget_default("pg.shift.size", 0.5)
    size = float(cols[2].number_input("Relative size ‖δ‖/‖N‖", min_value=0.0, max_value=10.0, step=0.1,
                                      key="pg.shift.size", disabled=mode != "perturbation"))
    app.widget_default("pg.shift.controls", False)
    controls = cols[3].checkbox("dir_only / mag_only controls (slower)", key="pg.shift.controls")
    return mode, window, size, controls, int(st.session_state.get("pg.shift.seed", 0))


def _swept(sel: app.Selection, params: tuple) -> None:
    """The sweep computed with a progress bar (once per settings), its shift and KL against the window start."""
    bar = st.empty()
    try:
        live = app.live_sweep(sel, *params, progress=lambda f, what: bar.progress(min(f, 1.0), text=what))
    except MotVizError as exc:
        app.show_error(exc)
        live = None
    bar.empty()
    if live is not None:
        mode = params[0]
        st.caption(f"{shift.MODE_LABELS[mode]} · {len(live.summary)} starts · {live.meta['seconds']} s")
        app.show_figure(shift_vs_start_figure(live.summary), live.summary, "shift_live_vs_start")
        app.show_figure(metric_kl_figure(live.summary), live.summary, "shift_live_kl")


# ----- 3. the shipped sweep --------------------------------------------------------------------------------------


def _shipped_sweep(sel: app.Selection) -> None:
    """A saved sweep of this pair (scripts/shift_sweep.py): its settings, its curves against the window start, and
    the trajectory at one start."""
    st.header("Shipped sweep (results/shift)")
    sweeps = shift.find_sweeps(RESULTS_DIR, sel.source, sel.target)
    if not sweeps:
        st.info(f"No saved sweep for {app.escape_markdown(sel.source)} → {app.escape_markdown(sel.target)} in "
                f"{app.escape_markdown(RESULTS_DIR)}. Make one with "
                "`python scripts/shift_sweep.py --source ... --target ...`.", icon="ℹ️")
        return
    app.widget_default("pg.shift.shipped", next(iter(sweeps)), list(sweeps))
    name = st.selectbox("Sweep", list(sweeps), key="pg.shift.shipped")
    result = shift.SweepResult.load(sweeps[name])
    meta = result.meta
    st.caption(f"**{meta['mode_label']}** · {meta['dataset']}/{meta['split']}, n = {meta['n']} examples "
               f"(data seed {meta.get('data_seed')}) · window W = {meta['config']['window']}"
               + (f", relative size {meta['config']['perturbation_size']}" if meta["mode"] == "perturbation" else "")
               + (f", {meta['train_steps']} training steps per start" if meta.get("train_steps") else "")
               + f" · {meta.get('date', '')} · `{meta.get('command', '')}`")
    app.widget_default("pg.shift.relative", False)
    relative = st.toggle("Shift relative to the native residual norm ‖Δh‖/‖h‖", key="pg.shift.relative")
    app.show_figure(shift_vs_start_figure(result.summary, relative=relative), result.summary,
                    f"{name}_shift_vs_start")
    app.show_figure(correction_vs_start_figure(result.summary), result.summary, f"{name}_correction_vs_start")
    app.show_figure(metric_kl_figure(result.summary, meta.get("metric")), result.summary, f"{name}_metric_kl")
    _start_trajectory(result, name)


def _start_trajectory(result: shift.SweepResult, name: str) -> None:
    """ρ_k over the layers at one window start of a saved sweep (its first answer token)."""
    starts = sorted(result.trajectories["start"].unique().tolist())
    app.widget_default("pg.shift.start", starts[len(starts) // 2], starts)
    start = st.select_slider("Window start for the trajectories", options=starts, key="pg.shift.start")
    traj = result.trajectories[result.trajectories["start"] == start]
    app.show_figure(rho_trajectory_figure(traj, 0, title=f"ρ_k at window start {start}, answer token 0"),
                    traj, f"{name}_rho_start{start}")


app.run_page(main)
