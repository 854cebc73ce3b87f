"""A lesson as one self-contained HTML file: every step's text, its interactive figures (plotly's own JavaScript
bundled in the file), the context and the numbers of the run, and how to reproduce it. It opens in a browser with
no server and no network. Pure: figures and tables in, a string out; no Streamlit.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go
import plotly.offline

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-top: 1px solid #ddd; padding-top: 1em; }
.try { background: #eef6ff; border-left: 4px solid #1f77b4; padding: 0.5em 1em; }
.note { color: #555; } pre { white-space: pre-wrap; background: #f6f6f6; padding: 0.8em; }
table { border-collapse: collapse; font-size: 0.9em; } td, th { border: 1px solid #ddd; padding: 2px 6px; }
nav a { margin-right: 1em; }
"""


@dataclass
class LessonStep:
    """What one step shows for one run: figures (with the data behind each, and a file name), tables, a note."""

    figures: list[tuple[go.Figure, pd.DataFrame, str]] = field(default_factory=list)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    note: str = ""


@dataclass
class LessonPage:
    """One step as the file writes it: its title, text and thing to try, and what it showed."""

    title: str
    text: str
    try_this: str
    shown: LessonStep | None  # None: the step could not be drawn for this run (`error` says why)
    error: str = ""


def markdown_html(text: str) -> str:
    """The little Markdown a step's text uses (**bold**, `code`) as HTML, everything else escaped."""
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def lesson_html(title: str, pages: list[LessonPage], facts: dict[str, str], context: str, reproduce: str,
                link: str) -> str:
    """The lesson file: `facts` (pair, checkpoint, sizes …) and the `context` of the run, every step, and the
    `reproduce` command and `link` (the app's address of this view)."""
    parts = [f"<h1>{html.escape(title)}</h1>", "<nav>" + "".join(
        f'<a href="#step{i}">{i}. {html.escape(p.title)}</a>' for i, p in enumerate(pages, 1)) + "</nav>",
        "<h2>This run</h2><table>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                                             for k, v in facts.items()) + "</table>",
        f"<details><summary>The context</summary><pre>{html.escape(context)}</pre></details>"]
    for i, page in enumerate(pages, 1):
        parts.append(f'<section id="step{i}"><h2>{i}. {html.escape(page.title)}</h2>'
                     + (f"<p>{markdown_html(page.text)}</p>" if page.text else ""))
        if page.shown is None:
            parts.append(f'<p class="note">Not drawn for this run: {html.escape(page.error)}</p>')
        else:
            if page.shown.note:
                parts.append(f'<p class="note">{markdown_html(page.shown.note)}</p>')
            for fig, _, name in page.shown.figures:
                parts.append(fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{i}-{name}",
                                         default_width="100%"))
            for caption, table in page.shown.tables:
                parts.append(f"<p><b>{html.escape(caption)}</b></p>" + table.to_html(index=False, na_rep=""))
        if page.try_this:
            parts.append(f'<p class="try"><b>Try this</b> (in the app): {markdown_html(page.try_this)}</p>')
        parts.append("</section>")
    parts.append(f"<h2>Reproduce it</h2><p>Run the app (<code>streamlit run app.py</code> in the repository) and open "
                 f"this view:</p><pre>{html.escape(link)}</pre><p>Or the same translation with the library:</p>"
                 f"<pre>{html.escape(reproduce)}</pre>")
    # plotly's bundle once, before the figures' own scripts run: the file needs no network
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style><script type='text/javascript'>{plotly.offline.get_plotlyjs()}</script></head>"
            f"<body>{''.join(parts)}</body></html>")
