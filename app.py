"""MoT Viz: watch a Mixture-of-Translators carry one LLM's KV cache into another's.

    .venv/bin/streamlit run app.py

The entry point draws the shared sidebar and declares the navigation (st.navigation). Every page is a
``main()`` run by ``mot_viz.app.run_page``, the one place an error becomes a message (it draws the sidebar
too when Streamlit runs a page file on its own), and reads the one cached translation through
``app.current_run()``. The page files live in views/, a folder Streamlit does not discover by itself (it would
run a pages/ folder through its legacy multipage mode first); a file added to views/ is listed after the built-in
pages, titled by its name.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from mot_viz import app
from mot_viz.analysis.cache_metrics import cost_table
from mot_viz.analysis.method_diagram import diagram_caption, diagram_of
from mot_viz.app.openings import why_default_context
from mot_viz.engine.models import kv_cache_bytes

PAGES_DIR = Path(__file__).parent / "views"
# file -> title, in the order a reader follows the data: answers first, then why they look like that
PAGES = {
    "14_lesson.py": "Lesson",
    "1_answers.py": "Answers",
    "2_cache_error.py": "Per-layer cache error",
    "3_routing.py": "Expert routing",
    "4_alignment.py": "Token alignment",
    "5_cache_space.py": "Cache space",
    "6_training.py": "Training",
    "7_shift_analysis.py": "Shift analysis",
    "8_long_context.py": "Long context",
    "9_logit_lens.py": "Logit lens",
    "10_multi_agent.py": "Multi-agent",
    "11_evaluations.py": "Evaluations",
    "12_methods.py": "Methods",
    "13_layer_patching.py": "Layer patching",
}
# every page in the order a reader follows the data (text → tokens → translator → cache → answer → beyond one
# context), with the question it answers
GUIDE = {
    "14_lesson.py": "the method in eight steps on this translation, for a class (with a presenter mode and a "
                    "file to hand out)",
    "4_alignment.py": "the two models cut one text into different tokens: how are they matched?",
    "3_routing.py": "which expert translates each token, and does the router's choice matter?",
    "5_cache_space.py": "where do the translated K/V vectors sit beside the target's own?",
    "2_cache_error.py": "how far is each layer of the translated and the replayed cache from native, beside simpler "
                        "baselines?",
    "7_shift_analysis.py": "where does the window move the target's hidden states, and do the layers above correct it?",
    "9_logit_lens.py": "layer by layer, what would the target predict next under each cache?",
    "1_answers.py": "does the target answer as well from the translated cache as from its own?",
    "13_layer_patching.py": "which layer's error costs the answer?",
    "12_methods.py": "how do the other ways of sharing a context compare, in quality, time and bytes?",
    "8_long_context.py": "on a long document, what does the translation keep and what time does it save?",
    "10_multi_agent.py": "one read, many questions: a conversation answered turn by turn from one translated cache",
    "6_training.py": "how was this checkpoint trained, and how well does it fit held-out text?",
    "11_evaluations.py": "the shipped evaluations over many examples, with the commands that reproduce them",
}


def overview() -> None:
    """The landing page: what MoT does, and the headline facts of the current translation."""
    app.run_page(_overview)


def _overview() -> None:
    st.title("MoT Viz")
    run = app.current_run()
    st.markdown("A **Mixture-of-Translators (MoT)** lets a *target* language model reuse a *source* model's key/value "
                "(KV) cache of a context. This checkpoint, drawn:")
    mot = run.mot
    st.plotly_chart(diagram_of(mot), width="stretch", key="fig.method_diagram")
    st.caption(diagram_caption(mot.translator.config, mot.replay))
    app.run_caption(run)
    why = why_default_context(run.selection)
    if why:
        st.caption(why)
    spec = run.mot.translator.config
    cols = st.columns(4)
    cols[0].metric("Target tokens", len(run.target_tokens))
    cols[1].metric("Source tokens", len(run.source_tokens))
    cols[2].metric("Window (layers)", run.mot.channels.window)
    cols[3].metric("Translator", f"{spec.num_experts} experts, top-{spec.top_k}" if spec.variant == "mot" else "single")
    left, right = st.columns(2)
    with left:
        st.markdown("**Injection window** (source layer → target layer)")
        st.dataframe(pd.DataFrame(run.mot.channels.pairs(), columns=["source layer", "target layer"]),
                     hide_index=True)
    with right:
        _cost_panel(run)
    with st.expander("The translated context"):
        st.text(run.selection.text)
    st.markdown("**Pages**, in the order the data flows (the sidebar picks the pair, the checkpoint and the context "
                "every page shows)")
    for file, question in GUIDE.items():
        st.page_link(f"views/{file}", label=f"{PAGES[file]} — {question}")


def _cost_panel(run) -> None:
    """What this translation cost, stage by stage, beside the target's own prefill, and what the caches weigh."""
    st.markdown("**What it costs** (this context, measured once in this run and shared by every page)")
    costs = cost_table(run.translation.timings)
    st.dataframe(costs.round({"seconds": 3, "× native prefill": 2}), hide_index=True)
    sizes = pd.DataFrame([{"model": f"{role}: {spec.name}", "layers × KV width": f"{spec.num_layers} × {spec.kv_hidden}",
                           "MB per 1,000 tokens (fp16)": round(kv_cache_bytes(spec) / 1e6, 1)}
                          for role, spec in (("source", run.source.spec), ("target", run.target.spec))])
    st.dataframe(sizes, hide_index=True)
    replay = run.mot.replay
    attention = ("dense attention at every layer" if replay.topk_sparse_attn is None else
                 f"sparse top-{replay.topk_sparse_attn} attention (key positions chosen from the source's own "
                 f"attention) from layer {replay.num_bottom_full_attn} up and in every window layer")
    st.caption(
        "Source prefill: the source reads the text (in a multi-model system its cache exists already). Alignment: "
        "the character spans of both tokenizations. Translator: the experts and router (or the linear map) over "
        "the window's aligned source K/V (a map may also read other source layers: the Training page says which). "
        "The replay is one forward pass of the target over the context tokens, so MoT does not skip the target's "
        "prefill: the target computes every layer itself, and inside the window its attention reads the translated "
        f"K/V instead of its own. This checkpoint replays with {attention}. Sparse attention is where a replay can "
        "save time on long contexts — per token it needs only k key positions instead of the whole context. MoT Viz "
        "computes it as dense attention under a mask of those positions, a chunk of queries at a time over only the "
        "keys that chunk may see (faster than gathering k keys per query on two CPU cores), so the replay costs about "
        "what the target's own prefill costs on short contexts and less on long ones (on the bundled pair 0.95–0.98 "
        "of it at 512 tokens and 0.76–0.79 at 2,048 in the last three runs of benchmarks/engine.md). Every prefill "
        "timed here only builds a cache, so "
        "it stops once the top layer's K/V are stored: the rest of that layer would feed only next-token logits. "
        "Cache sizes count K and V at every layer (a "
        "sliding-window layer at most its window)."
    )


def main() -> None:
    pages = [st.Page(overview, title="Overview", default=True)]
    pages += [st.Page(f"views/{file}", title=title) for file, title in PAGES.items()]
    # a page file added to views/ appears after the built-in ones, titled by its file name
    pages += [st.Page(f"views/{p.name}") for p in sorted(PAGES_DIR.glob("*.py"))
              if p.name not in PAGES and not p.name.startswith("_")]
    with app.navigation_frame():
        st.navigation(pages).run()


main()
