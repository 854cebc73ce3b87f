"""Presenter mode for a projector: no sidebar and no explanation boxes, larger text and figures, and the keyboard's
arrow keys pressing a page's "← Back" and "Next →" buttons."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

BACK, NEXT = "← Back", "Next →"  # the buttons the arrow keys press
MARKER = "mot-presenter"  # the element whose presence turns the keys on: they act on the page that draws it
_STYLE = """<style>
section[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], [data-testid="stExpandSidebarButton"],
header[data-testid="stHeader"], [data-testid="stExpander"] { display: none !important; }
.stMainBlockContainer { max-width: 100% !important; padding: 1rem 3rem !important; }
.stMainBlockContainer p, .stMainBlockContainer li, .stMainBlockContainer label,
.stMainBlockContainer [data-testid="stCaptionContainer"] { font-size: 1.6rem !important; line-height: 1.45 !important; }
.stMainBlockContainer h1 { font-size: 3rem !important; } .stMainBlockContainer h2 { font-size: 2.5rem !important; }
.stMainBlockContainer button p { font-size: 1.4rem !important; }
</style>"""
_KEYS = """<div id="%(marker)s"></div><script>
if (!window.motPresenterKeys) {
  window.motPresenterKeys = true;
  document.addEventListener("keydown", (event) => {
    if (!document.getElementById("%(marker)s")) return;  // presenter mode is off, or another page is shown
    const target = event.target;
    if (target && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName))) return;
    const label = {ArrowRight: "%(next)s", ArrowLeft: "%(back)s"}[event.key];
    if (!label) return;
    const button = [...document.querySelectorAll("button")].find((b) => b.innerText.trim() === label);
    if (button && !button.disabled) { event.preventDefault(); button.click(); }
  });
}
</script>"""


def presenter_mode() -> None:
    """Hide the sidebar and the explanation boxes, enlarge the text, and let the arrow keys move between steps."""
    st.html(_STYLE)
    st.html(_KEYS % {"marker": MARKER, "next": NEXT, "back": BACK}, unsafe_allow_javascript=True)


def enlarge(fig: go.Figure) -> go.Figure:
    """A figure's text and height for the back of a room (1920 × 1080)."""
    fig.update_layout(font_size=18, legend_font_size=16, height=max(fig.layout.height or 450, 640))
    fig.update_annotations(font_size=16)
    return fig
