"""Lesson: the method in eight steps on the applied translation, for a class; a presenter mode; a file to hand out."""

import streamlit as st

from mot_viz import app
from mot_viz.app.lesson import STEPS, lesson_document, lesson_work
from mot_viz.app.links import view_address
from mot_viz.app.presenter import BACK, NEXT, enlarge, presenter_mode
from mot_viz.errors import MotVizError

STEP_NUMBERS = list(range(1, len(STEPS) + 1))
POLL_SECONDS = 0.5  # how often a step still computing asks whether it is done


def _move(by: int) -> None:
    st.session_state["pg.lesson.step"] = min(max(st.session_state["pg.lesson.step"] + by, 1), len(STEPS))


@st.fragment(run_every=POLL_SECONDS)
def _computing(work, index: int, wait: str) -> None:
    """A heavy step's progress line, asking again every POLL_SECONDS; the whole page reruns once the step is built."""
    if work.ask(index) is not None:
        st.rerun()
    share, line = work.progress(index)
    st.progress(share, text=f"{wait} {line} · {share * work.heavy:.0f} of {work.heavy} computed steps ready")


def _built(step, run):
    try:
        return step.build(run)
    except MotVizError as exc:  # e.g. a context without a gold answer on the patching step
        app.show_error(exc)
        return None


def main() -> None:
    app.widget_default("pg.lesson.presenter", False)
    app.widget_default("pg.lesson.step", 1, STEP_NUMBERS)
    presenter = st.session_state["pg.lesson.presenter"]
    if presenter:
        presenter_mode()
    st.title("Lesson")  # the page's title in the navigation, as every page's
    st.markdown("How a Mixture-of-Translators carries one model's cache into another's, in eight steps.")
    app.explain(
        "Eight steps through the method on the sidebar's translation, each drawn by its own page's figure for this "
        "context: two models and their caches, the tokens, the translator and router, the replay, the answers, "
        "where the error sits, what it costs, and the other ways of sharing. Each step has one thing to try, and a "
        "button that opens its page with that option set. The step is in the address, so a link opens on it.\n\n"
        "**Presenter mode** hides the sidebar and these boxes, enlarges text and figures for a projector, and the "
        "← and → keys move between steps (its switch is in the address too). **Download this lesson** writes one "
        "HTML file with every step's text and interactive figures, the context and the numbers of this run, and "
        "how to reproduce it: it opens in a browser with no server and no network."
    )
    run = app.current_run()
    app.run_caption(run)
    top = st.columns([8, 1.2, 1.2, 2.5])
    number = top[0].radio("Step", STEP_NUMBERS, key="pg.lesson.step", horizontal=True,
                          help="; ".join(f"{i}. {s.title}" for i, s in enumerate(STEPS, 1)))
    top[1].button(BACK, on_click=_move, args=(-1,), disabled=number == 1, key="lesson.back")
    top[2].button(NEXT, on_click=_move, args=(1,), disabled=number == len(STEPS), key="lesson.next")
    top[3].toggle("Presenter mode", key="pg.lesson.presenter", help="For a projector: no sidebar, larger text, "
                  "← / → move between steps.")

    step = STEPS[number - 1]
    st.header(f"{number}. {step.title}")
    st.markdown(step.text(run))
    work = lesson_work(run)  # the heavy steps, in the background, once the first translation is done
    if step.wait is None:
        shown, error = _built(step, run), None
    else:
        shown, error = work.ask(number - 1) or (None, None)
        if shown is None and error is None:  # still computing: the text, a progress line, and "try this" meanwhile
            _computing(work, number - 1, step.wait)
    if isinstance(error, MotVizError):
        app.show_error(error)
    elif error is not None:
        raise error
    if shown is not None:
        if shown.note:
            st.markdown(app.escape_markdown(shown.note))
        for fig, data, name in shown.figures:
            app.show_figure(enlarge(fig) if presenter else fig, data, name)
        for caption, table in shown.tables:
            st.markdown(f"**{caption}**")
            st.dataframe(table, hide_index=True, width="stretch")
    st.info(f"**Try this:** {step.try_this}", icon="👉")
    if st.button("Try it on its page" if step.tries else "Open this step's page", key="lesson.try"):
        st.session_state.update(step.tries or {})  # the page's options, kept while it opens (pg.* keys)
        st.switch_page(f"views/{step.page}")
    if not presenter:
        _download(run)


def _download(run) -> None:
    st.subheader("Download this lesson")
    st.caption("One HTML file: every step's text and interactive figures (plotly inside, about 5 MB), this run's "
               "context and numbers, and how to reproduce it. It opens in any browser with no server and no network.")
    key = ("lesson.file", run.selection)
    if st.session_state.get("lesson.file", (None,))[0] != key and st.button("Prepare the lesson file",
                                                                          key="lesson.prepare"):
        bar = st.progress(0.0)
        document = lesson_document(
            run, view_address(__file__, app.link_params()), app.python_code(run.selection),
            lambda i, title: bar.progress(i / len(STEPS), text=f"Step {i + 1}: {title} …"))
        bar.empty()
        st.session_state["lesson.file"] = (key, document.encode("utf-8"))
    if st.session_state.get("lesson.file", (None,))[0] == key:
        st.download_button("Download this lesson (HTML)", st.session_state["lesson.file"][1],
                           file_name="mot_lesson.html", mime="text/html", key="lesson.download", on_click="ignore")


app.run_page(main, view_download=False)  # its own download holds every step
