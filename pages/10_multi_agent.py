"""Multi-agent: one read, many questions: a translated cache kept over a whole CoQA conversation."""

import streamlit as st

from mot_viz import app
from mot_viz.analysis.figures import conversation_figure
from mot_viz.app.multi_agent import CONVERSATIONS
from mot_viz.errors import MotVizError


def main() -> None:
    st.title("Multi-agent")
    app.explain(
        "The paper's second case study: agents share what they have read by handing over translated caches instead "
        "of text. Here one *source* agent reads a CoQA story once; its KV cache over the window is translated, and "
        "the *target* (the hub) runs one forward pass over the story's tokens (the **replay**: inside the window its "
        "attention reads the translated K/V instead of its own; every layer caches the K/V it computes itself). The "
        "hub then answers a whole conversation from the cache it keeps: after each turn, the turn's question and its "
        "reference answer are appended to every kept cache (the history CoQA itself carries), so every cache reads "
        "the same history and only the story's cache differs.\n\n"
        "- **native** — the hub read the story itself (the ceiling);\n"
        "- **mot** — the replayed cache of the source's translated window;\n"
        "- **no_context** — no story at all.\n\n"
        "**Cumulative seconds** start with what each cache cost (MoT: alignment + translator + replay; native: the "
        "hub's own prefill of the story), then add each turn; the source's own prefill is not counted, since it "
        "read the story for its own work. **Memory** counts fp16 bytes: the hub's cache, and for MoT the "
        "translator's weights; *retain* also keeps the source's cache of the story, *free* drops it once handed over."
    )
    run = app.current_run()  # the sidebar's pair and checkpoint; the conversation is this page's own
    app.run_caption(run)
    cols = st.columns(2)
    app.widget_default("pg.agents.conversation", 0)
    index = cols[0].number_input("Conversation number", 0, CONVERSATIONS - 1, step=1, key="pg.agents.conversation",
                                 help="CoQA validation stories of at most 512 target tokens (seed 0), as the "
                                      "shipped evaluation samples them.")
    app.widget_default("pg.agents.turns", 5, list(range(1, 11)))
    turns = cols[1].selectbox("Turns", list(range(1, 11)), key="pg.agents.turns")
    try:
        with st.status(f"Reading, translating and answering {turns} turns …", expanded=False) as status:
            view = app.conversation_view(run, int(index), int(turns), status.write)
            status.update(label=f"{turns} turns answered from each cache", state="complete")
    except MotVizError as exc:
        app.show_error(exc)
        st.stop()
    st.markdown(f"**Story** ({view.conversation.source}):")
    with st.expander("The story"):
        st.text(view.conversation.story)
    st.subheader("The conversation")
    table = view.rows.pivot_table(index="turn", columns="condition", values="answer", aggfunc="first")
    table.insert(0, "question", [t.question for t in view.conversation.turns])
    table.insert(1, "references", view.rows.groupby("turn")["gold"].first())
    st.dataframe(table.reset_index(), hide_index=True)  # every cell shown as plain text
    st.subheader("F1, time and memory, turn by turn")
    shipped = app.shipped_conversation_results(run.selection.checkpoint)
    if shipped is None:
        st.caption("No shipped conversation results for this checkpoint: only this conversation is drawn. "
                   "`python -m mot_viz.eval.conversation` measures them.")
    else:
        st.caption(f"Dashed: the shipped results ({int(shipped['n'].max())} conversations, mean F1 with its 95% "
                   "bootstrap interval); points: this conversation.")
    app.show_figure(conversation_figure(view.summary, shipped), view.summary, "conversation_turns")
    st.caption(f"Translator weights: {view.translator_mb:.1f} MB (fp16). Cumulative seconds are one run on this "
               "machine.")


app.run_page(main)
