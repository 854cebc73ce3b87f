"""Multi-agent: one read, many questions: a translated cache kept over a whole CoQA conversation."""

import streamlit as st

from mot_viz import app
from mot_viz.analysis.multi_agent_figures import conversation_figure, shard_error_figure
from mot_viz.app.long_context import take_upload
from mot_viz.app.multi_agent import CONVERSATIONS, SHARD_BUDGET, SHARD_DOCUMENTS, your_conversation_view
from mot_viz.app.openings import DEFAULT_CONVERSATION, WHY_DEFAULT_CONVERSATION, on_measured_checkpoint
from mot_viz.data.user_documents import UPLOAD_TYPES, document_label, questions_text
from mot_viz.errors import MotVizError
from mot_viz.sharing.registry import FLOOR, REFERENCE

STORIES = {"coqa": "CoQA story", "yours": "your text (paste or upload)"}


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
        "\n\n**Your text**: paste a story (or upload a `.txt` file) and type its questions, one per line, each with "
        "its reference answer after `|`; or upload a `.jsonl` file of `context`, `question`, `answers` lines (one "
        "story, its questions in order)."
    )
    run = app.current_run()  # the sidebar's pair and checkpoint; the conversation is this page's own
    caption = st.empty()  # names the story shown, once it is chosen
    cols = st.columns(3)
    app.widget_default("pg.agents.story", "coqa", list(STORIES))
    yours = cols[0].selectbox("Story", list(STORIES), format_func=STORIES.get, key="pg.agents.story") == "yours"
    app.widget_default("pg.agents.conversation", DEFAULT_CONVERSATION)
    index = cols[1].number_input("Conversation number", 0, CONVERSATIONS - 1, step=1, key="pg.agents.conversation",
                                 disabled=yours, help="CoQA validation stories of at most 512 target tokens (seed 0), "
                                                      "as the shipped evaluation samples them.")
    app.widget_default("pg.agents.turns", 5, list(range(1, 11)))
    turns = cols[2].selectbox("Turns", list(range(1, 11)), key="pg.agents.turns", disabled=yours,
                              help="Your own text: one turn per question.")
    for key in ("pg.agents.text", "pg.agents.questions"):  # kept (and linked) while a CoQA story is shown
        app.widget_default(key, "")
    if not yours and index == DEFAULT_CONVERSATION and turns == 5 and on_measured_checkpoint(run.selection):
        st.caption(WHY_DEFAULT_CONVERSATION)
    try:
        if yours:
            _your_text()
        label = (document_label(st.session_state["pg.agents.text"]) if yours
                 else f"CoQA story #{int(index)}, its first {turns} turns")
        with caption:
            app.run_caption(run, document=label)
        with st.status("Reading, translating and answering the conversation …", expanded=False) as status:
            view = (your_conversation_view(run, st.session_state["pg.agents.text"],
                                           st.session_state["pg.agents.questions"], status.write) if yours
                    else app.conversation_view(run, int(index), int(turns), status.write))
            status.update(label=f"{len(view.conversation.turns)} turns answered from each cache", state="complete")
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
    _several_readers(run)


def _your_text() -> None:
    """The user's story and questions: pasted, or filled in from an uploaded file (then editable)."""
    upload = st.file_uploader("Upload a story (.txt), or a story with its questions (.jsonl)",
                              type=list(UPLOAD_TYPES), key="agents.upload",
                              help="A .jsonl file holds one story: every line {\"context\": …, \"question\": …, "
                                   "\"answers\": […]} with the same context, the questions in the order asked.")
    take_upload(upload, lambda f: {"pg.agents.text": f.text,
                                   **({"pg.agents.questions": questions_text(f.questions)} if f.questions else {})},
                "agents.upload_taken")
    st.text_area("Story (read whole)", key="pg.agents.text", height=200)
    st.text_area("Questions, one per line, in order: question | reference answer (| another reference …)",
                 key="pg.agents.questions", height=120, placeholder="Who built the tower? | Gustave Eiffel")


SETTINGS = {REFERENCE: "the hub read the whole document itself", "whole": "one source agent read it all",
            FLOOR: "no document"}


@app.fragment
def _several_readers(run) -> None:
    st.header("Several readers, one hub")
    st.markdown(
        f"A {SHARD_BUDGET}-token distractor stack (a SQuAD paragraph holding the answer among other paragraphs) is "
        "split at paragraph boundaries into shards; each shard is read by its own source agent, which never sees "
        "the others. Each agent's window is translated; the hub places every shard's translation at the shard's "
        "position (keys are translated before the rotary embedding, so the target's own rotation moves them there) "
        "and runs one replay over the whole document. Beside it: the hub reading the document itself, one source "
        "agent reading all of it, and the hub with only the shard that holds the answer. What the hub loses: no "
        "source attended across shards, so each shard's translation stays inside the shard"
        + (f", and so do its sparse top-k keys: in the replay only the {run.mot.replay.num_bottom_full_attn} dense "
           "bottom layers and the question read across shards." if run.mot.replay.topk_sparse_attn else
           "; this checkpoint replays densely, so the replay's layers read across shards."))
    cols = st.columns(3)
    app.widget_default("pg.agents.sharded", False)
    chosen = cols[0].toggle("Read a document in shards", key="pg.agents.sharded",
                        help="Several translations and replays of one document: about a minute on two CPU cores.")
    app.widget_default("pg.agents.shards", 2, [2, 4])
    shards = cols[1].selectbox("Shards", [2, 4], key="pg.agents.shards")
    app.widget_default("pg.agents.doc", 0)
    index = cols[2].number_input("Document number", 0, SHARD_DOCUMENTS - 1, step=1, key="pg.agents.doc")
    if not chosen:
        return
    try:
        with st.status(f"Reading a document in {shards} shards …", expanded=False) as status:
            view = app.shard_view(run, int(index), int(shards), status.write)
            status.update(label=f"{view.document.tokens} target tokens read in {shards} shards and answered",
                          state="complete")
    except MotVizError as exc:
        app.show_error(exc)
        return
    st.markdown("**Question:**")
    st.text(view.document.example.question)
    shards_at = ", ".join(f"{label} at positions {a}–{b - 1}" for label, (a, b) in view.spans.items())
    st.caption(f"Shards in the hub's cache: {shards_at}.")
    labels = {**SETTINGS, f"shards_{shards}": f"the hub composed the {shards} agents' translations",
              f"evidence_{shards}": "the hub with only the answer's shard"}
    table = view.rows[["condition", "answer", "score", "source_mb", "source_max_mb", "hub_mb"]].rename(columns={
        "condition": "setting", "score": "F1", "source_mb": "agents' caches (MB)",
        "source_max_mb": "largest agent's cache (MB)", "hub_mb": "hub's cache (MB)"})
    table.insert(1, "what", table["setting"].map(labels))
    table.insert(4, "gold", view.rows["gold"])
    st.dataframe(table, hide_index=True)
    app.widget_default("pg.agents.kv", "K", ["K", "V"])
    kv = st.radio("Keys or values", ["K", "V"], key="pg.agents.kv", horizontal=True)
    app.show_figure(shard_error_figure(view.errors, run.mot.channels.target_layers, kv), view.errors,
                    f"shard_error_{kv}")


app.run_page(main)
