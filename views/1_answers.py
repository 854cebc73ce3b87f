"""Answers: what the target says from its own context, from none, from the MoT-translated cache and from noise."""

import html

import pandas as pd
import streamlit as st

from mot_viz import app
from mot_viz.analysis.figures import answers_figure
from mot_viz.app.openings import why_default_context
from mot_viz.errors import MotVizError
from mot_viz.eval.answers import CONDITIONS, TIE_LABELS, ties_with_mot


def main() -> None:
    st.title("Answers")
    app.explain(
        "The target model answers the same question from four caches of the same context (five with the "
        "mean-vector control):\n\n"
        "- **Native context** — the target read the text itself (the reference).\n"
        "- **No context** — only the question (what it knows without the passage).\n"
        "- **MoT-translated cache** — the *source* read the text and its K/V over the window were translated; the "
        "target then ran one forward pass over the same context tokens (the **replay**) in which its attention read "
        "the translated K/V inside the window instead of its own. Close to native alone does not show that the "
        "translation carried the passage: the replay runs the target's own layers over the context, so even a window "
        "with no context in it can stay close to native. The translation carries the passage where MoT beats such a "
        "window (the mean-vector control, below).\n"
        "- **Random-window control** — the translated window replaced by norm-matched noise: the native window plus a "
        "random vector as long as the translation's error. If MoT beats this, it carries information beyond noise.\n"
        "- **Mean-vector control** (tick *Also answer from the mean-vector window* below) — every window token's K/V "
        "replaced by that layer's mean native K/V over LAMBADA prose: a window with no context in it. Where MoT "
        "answers no better than this, the answer comes from the target's own replay of the context, not from the "
        "translation.\n\n"
        "Extractive questions (SQuAD) are scored by token F1 and exact match against the gold answers; closed "
        "questions (yes/no, multiple choice) by whether the likeliest choice label is the correct one. "
        "*Building the cache* is the time to make that cache; *answering* is the time to generate or score from it."
    )
    run = app.current_run()
    app.run_caption(run)
    sel = run.selection
    app.question_header(sel.example)
    why = why_default_context(sel)
    if why:
        st.caption(why)

    second = app.second_checkpoint(run, "pg.answers.second")
    app.widget_default("pg.answers.max_new", app.DEFAULT_MAX_NEW_TOKENS)
    max_new = st.slider("Longest generated answer (tokens)", 4, 64, key="pg.answers.max_new",
                        disabled=sel.example.kind == "closed", help="Closed questions score the choice labels instead.")

    app.widget_default("pg.answers.mean", False)
    with_mean = st.checkbox("Also answer from the mean-vector window", key="pg.answers.mean",
                            help="One more replay of the context, with the mean native K/V in the window (computed "
                                 "once per target and window from LAMBADA passages), decoded in the same batch.")
    jobs = [(None, f"the {len(CONDITIONS) + with_mean} conditions (one batch)")]
    if second is not None:
        jobs.append((second[1], f"the second checkpoint ({second[0]})"))
    rows = []
    progress = st.progress(0.0, text="Answering …")
    for i, (checkpoint, what) in enumerate(jobs):
        progress.progress(i / len(jobs), text=f"Answering: {what} …")
        try:
            rows += app.answer_rows(sel, max_new, checkpoint, with_mean=with_mean and checkpoint is None)
        except MotVizError as exc:  # e.g. the second checkpoint is for another pair
            app.show_error(exc)
    progress.empty()
    if not rows:  # every job failed, and its message (above) says why: there is no table to draw
        return

    table = pd.DataFrame(rows)
    score_name = "F1" if sel.example.kind == "extractive" else "correct"
    st.dataframe(
        table.rename(columns={"score": score_name, "exact_match": "EM", "seconds_cache": "building the cache (s)",
                              "seconds_answer": "answering (s)", "choice_logprobs": "mean log p per choice"})
        .drop(columns="key").dropna(axis=1, how="all"),
        hide_index=True, width="stretch",
        column_config={score_name: st.column_config.NumberColumn(format="%.3f"),
                       "building the cache (s)": st.column_config.NumberColumn(format="%.3f"),
                       "answering (s)": st.column_config.NumberColumn(format="%.3f")},
    )
    tied = ties_with_mot(dict(zip(table["key"], table["answer"])))
    if tied:  # the first view must not read as the translation's success where a window without the passage ties it
        names = " and the ".join(TIE_LABELS[c] for c in tied)
        st.warning(f"On this context the {names} {'give' if len(tied) > 1 else 'gives'} the MoT's answer: here the "
                   "answer does not show that the translation carried the passage (the replay runs the target's own "
                   "layers over every context token). The shipped results say where MoT beats these controls.")
    # plotly reads tags (<a href>, <b>) in hover text: a model's answer, which may copy the context, is shown as typed
    app.show_figure(answers_figure(table.assign(answer=table["answer"].map(html.escape))), table, "answers")


app.run_page(main)
