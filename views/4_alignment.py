"""Token alignment: how the source's tokens are matched to the target's tokens of the same text."""

import streamlit as st

from mot_viz import app
from mot_viz.analysis.figures import alignment_heatmap, alignment_table


def main() -> None:
    st.title("Token alignment")
    app.explain(
        "The two models cut the same text into different tokens. Both tokenizations are placed on the text's "
        "characters; a cell is the number of **characters shared** by a target token (row) and a source token "
        "(column). The translator works on the *target's* token grid: each target token's source K/V is the average "
        "of the source tokens it overlaps, weighted by shared characters (the **weights** view, rows sum to 1). "
        "A target token that shares no character gets the source token with the nearest centre.\n\n"
        "Labels are `index token`; ␣ is a space, ↵ a newline, ⇥ a tab, so token boundaries are visible."
    )
    run = app.current_run()
    app.run_caption(run)
    alignment = run.translation.source.alignment
    if alignment.identity:
        st.info("Source and target share the tokenizer and the token ids: the alignment is the identity.")

    _alignment_view(run)


@app.fragment
def _alignment_view(run) -> None:
    alignment = run.translation.source.alignment
    app.widget_default("pg.align.view", "shared characters")
    view = st.radio("Show", ["shared characters", "weights"], key="pg.align.view", horizontal=True)
    matrix = alignment.overlap if view == "shared characters" else alignment.weights[0]
    table = alignment_table(matrix, run.target_tokens, run.source_tokens).rename(columns={"value": view})
    app.show_figure(alignment_heatmap(matrix, run.target_tokens, run.source_tokens, view), table,
                    f"alignment_{view.replace(' ', '_')}")


app.run_page(main)
