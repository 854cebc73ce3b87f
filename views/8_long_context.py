"""Long context: a long document read by the source, its cache translated, and the target answering from it."""

import pandas as pd
import streamlit as st

from mot_viz import app
from mot_viz.app.long_context import LONG_DOCUMENTS, take_upload, your_long_document
from mot_viz.app.openings import DEFAULT_LONG_DOCUMENT, WHY_DEFAULT_LONG_DOCUMENT, on_measured_checkpoint
from mot_viz.analysis.long_context import (first_token_figure, first_token_table, position_error_figure,
                                           retention_curve_figure)
from mot_viz.data.long_context import BUDGETS, DEPTHS
from mot_viz.data.user_documents import UPLOAD_TYPES, document_label
from mot_viz.errors import MotVizError

SOURCES = {"stacks": "distractor stack (SQuAD)", "qasper": "Qasper paper (yes / no)",
           "yours": "your text (paste or upload)"}


def main() -> None:
    st.title("Long context")
    app.explain(
        "The case the method is for: the *source* model has read a long document and holds its KV cache; the "
        "*target* answers from a cache built with its translation. The source's K/V over the window are translated, "
        "the target still runs one forward pass over every token of the document (the **replay**: inside the window "
        "its attention reads the translated K/V instead of its own; under the sparse replay, above the bottom layers "
        "it attends over the source's top-k positions only; every layer caches the K/V it computes itself), and "
        "answers from that cache. So the translation changes what the cache holds and the attention work, not the "
        "target's pass over the text.\n\n"
        "- **Distractor stack** — one SQuAD paragraph that holds the answer, at the start, the middle or the end "
        "of other SQuAD paragraphs, until the budget is filled (document *i* puts its evidence at "
        f"{' / '.join(DEPTHS)} by *i* mod 3).\n"
        "- **Qasper paper** — an NLP paper cut to the budget, with a yes/no question about it.\n"
        "- **Your text** — a document you paste or upload (a `.txt` file, or a `.jsonl` file of `context`, "
        "`question`, `answers` lines: its first question is asked), read at its own length, with your question and, "
        "to score the answers, the gold answer(s).\n\n"
        "The answers come from five caches of the same document: **native** (the target read it: the ceiling), "
        "**no context**, **MoT**, the closed-form **linear map** on the same source context, and the **mean-vector "
        "window** (no context in the window). *Retention* is a score ÷ native, *gap closed* (score − no context) ÷ "
        "(native − no context). Time to the first answer token of the translated path is alignment + translator + "
        "replay + first token; the source's own prefill is shown apart, since in this use case the source holds "
        "its cache already. The replay is a full forward pass of the target over the document, so it costs about "
        "what the target's own prefill costs."
    )
    run = app.current_run()  # the sidebar's pair and checkpoint; the document is this page's own
    caption = st.empty()  # names the document shown, once it is chosen
    cols = st.columns(3)
    app.widget_default("pg.long.source", "stacks", list(SOURCES))
    source = cols[0].selectbox("Document", list(SOURCES), format_func=SOURCES.get, key="pg.long.source")
    yours = source == "yours"
    app.widget_default("pg.long.budget", BUDGETS[0], list(BUDGETS))
    budget = cols[1].selectbox("Length (target tokens)", list(BUDGETS), key="pg.long.budget", disabled=yours,
                               help="Longer documents take longer: on two CPU cores about 20 s at 512 tokens and "
                                    "a few minutes at 4,096. Your own text is read at its own length.")
    # a linked number out of range is named and dropped
    app.widget_default("pg.long.doc", DEFAULT_LONG_DOCUMENT, range(LONG_DOCUMENTS))
    index = cols[2].number_input("Document number", 0, LONG_DOCUMENTS - 1, step=1, key="pg.long.doc", disabled=yours)
    for key in ("pg.long.text", "pg.long.question", "pg.long.gold"):  # kept (and linked) while another is shown
        app.widget_default(key, "")
    if source == "stacks" and index == DEFAULT_LONG_DOCUMENT and on_measured_checkpoint(run.selection):
        st.caption(WHY_DEFAULT_LONG_DOCUMENT)
    try:
        if yours:
            _your_text()
            label = document_label(st.session_state["pg.long.text"])
        else:
            label = f"{SOURCES[source]} #{int(index)} at {budget} target tokens"
        with caption:
            app.run_caption(run, document=label)
        with st.status("Reading, translating and answering the document …", expanded=False) as status:
            view = (your_long_document(run, st.session_state["pg.long.text"], st.session_state["pg.long.question"],
                                       st.session_state["pg.long.gold"], status.write) if yours
                    else app.long_document(run, source, budget, int(index), status.write))
            status.update(label=f"{view.document.tokens} target tokens translated and answered", state="complete")
    except MotVizError as exc:
        app.show_error(exc)
        st.stop()
    _document(view)
    _answers(view)
    _curve(run, view, source)
    _cost(view)
    _positions(run, view)


def _your_text() -> None:
    """The user's document and question: pasted, or filled in from an uploaded file (then editable)."""
    upload = st.file_uploader("Upload a document (.txt), or a document with its questions (.jsonl)",
                              type=list(UPLOAD_TYPES), key="long.upload",
                              help="A .jsonl file holds one document: every line {\"context\": …, \"question\": …, "
                                   "\"answers\": […]} with the same context; its first question is asked here (the "
                                   "Multi-agent page asks them all, in turn).")
    take_upload(upload, lambda f: {"pg.long.text": f.text,
                                   **({"pg.long.question": f.questions[0].question,
                                       "pg.long.gold": " | ".join(f.questions[0].answers)} if f.questions else {})},
                "long.upload_taken")
    st.text_area("Document (read whole, at its own length)", key="pg.long.text", height=200)
    cols = st.columns(2)
    cols[0].text_input("Question", key="pg.long.question")
    cols[1].text_input("Gold answer(s), separated by | (optional: without, answers are not scored)", key="pg.long.gold")


def _document(view) -> None:
    doc = view.document
    where = f", evidence at the {doc.depth}" if doc.depth else ""
    st.markdown(f"**Question** ({doc.tokens} target tokens{where}):")
    st.text(doc.example.question)
    with st.expander("The document"):
        st.text(doc.example.context)


def _answers(view) -> None:
    st.subheader("Answers")
    table = view.rows[["condition", "answer", "score"]].rename(columns={"score": view.metric})
    table.insert(2, "gold", view.rows["gold"])
    st.dataframe(table, hide_index=True)  # a table shows every cell as plain text


def _curve(run, view, source: str) -> None:
    st.subheader("Retention against length")
    shipped = app.shipped_long_results(run.selection.checkpoint, "stacks" if source == "yours" else source)
    live = view.retention
    if pd.isna(view.native_score):  # no gold answer (your text) to score against
        st.caption("Your question has no gold answer, so the answers are not scored and this document has no "
                   "retention: give one (or more, separated by |) to place it on the curve.")
    if shipped is None:
        st.caption("No shipped long-context results for this checkpoint and document kind: only this document's "
                   "point is drawn. `python -m mot_viz.eval.long_context` measures them.")
        shipped = pd.DataFrame(columns=["condition", "budget", "retention", "retention_ci_low", "retention_ci_high",
                                        "n"])
    else:
        counts = sorted({int(n) for n in shipped["n"]})
        st.caption(f"Lines: the shipped results ({'–'.join(map(str, counts[::max(1, len(counts) - 1)]))} "
                   f"{'distractor stacks' if source == 'yours' else 'documents'} per length, paired 95% bootstrap "
                   "intervals). Stars: this document "
                   + ("(its native score is 0, so it has no retention)." if view.native_score == 0 else "."))
    app.show_figure(retention_curve_figure(shipped, live, view.document.budget), shipped, "long_retention")


def _cost(view) -> None:
    st.subheader("What it costs")
    table = first_token_table(view.timings, view.first_token)
    left, right = st.columns(2)
    with left:
        app.show_figure(first_token_figure(table), table, "long_first_token")
    with right:
        st.dataframe(view.sizes, hide_index=True)
        st.caption("Cache sizes count K and V at every layer in fp16; a sliding-window layer at most its window. "
                   "The translated cache is the target's own kind of cache, so it weighs what the native one weighs.")


@app.fragment
def _positions(run, view) -> None:
    st.subheader("Where along the document the window errs")
    spec = run.target.spec
    if spec.sliding_window:
        sliding = [i for i in run.mot.channels.target_layers if i in spec.sliding_layers]
        st.caption(f"{run.target.spec.name} attends within a {spec.sliding_window}-token sliding window in "
                   f"{len(spec.sliding_layers)} of its {spec.num_layers} layers ({len(sliding)} of this window's "
                   f"{run.mot.channels.window}). In a sliding layer the question reads directly only the K/V of the "
                   f"last {spec.sliding_window} positions (right of the dashed line); what the translation wrote "
                   "further back reaches the answer only through the hidden states that later positions and the "
                   "global layers computed from it.")
    cols = st.columns(2)
    app.widget_default("pg.long.comparison", "replayed", ["replayed", "translated"])
    comparison = cols[0].radio("Compare with native", ["replayed", "translated"], key="pg.long.comparison",
                               horizontal=True, help="translated: what the translator wrote into the window; "
                                                     "replayed: what the target's cache holds after the replay")
    app.widget_default("pg.long.kv", "K", ["K", "V"])
    kv = cols[1].radio("Keys or values", ["K", "V"], key="pg.long.kv", horizontal=True)
    fig = position_error_figure(view.positions, comparison, kv, view.document.tokens, spec.sliding_window,
                                view.evidence_tokens)
    part = view.positions[(view.positions["comparison"] == comparison) & (view.positions["kv"] == kv)]
    app.show_figure(fig, part, f"long_position_error_{comparison}_{kv}")


app.run_page(main)
