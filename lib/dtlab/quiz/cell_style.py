"""How a quiz cell looks: colours, the scoped CSS that lets options wrap, Markdown text boxes.

Kept apart from :mod:`dtlab.quiz.widgets` (the cell's behaviour) so the layout rules live in one
place; the browser test (``tests/test_browser.py``) checks them in Chromium.
"""

from __future__ import annotations

import ipywidgets as w

from dtlab.quiz.feedback import markdown_to_html

GREEN, RED, AMBER = "#1a7f37", "#cf222e", "#9a6700"

# Scoped to the cell's root box (class ``dtlab-quiz``). ipywidgets gives radio labels a fixed
# height and HTML content ``white-space: nowrap``: long options overlapped or were clipped. Here
# every option is one row — its own control, then its text as wrapping Markdown — so each option
# keeps its control and takes the height it needs, whatever it says and whether it is right.
QUIZ_CSS = """<style>
.dtlab-quiz { width: 100%; max-width: 60em; }
.dtlab-quiz .dtlab-text, .dtlab-quiz .dtlab-text .widget-html-content,
.dtlab-quiz .dtlab-text .jupyter-widget-html-content {
  white-space: normal; overflow-wrap: anywhere; overflow: visible; height: auto;
  line-height: 1.45; min-width: 0; flex: 1 1 auto; }
.dtlab-quiz .dtlab-text p { margin: 0.2em 0; }
.dtlab-quiz .dtlab-option { align-items: flex-start; width: 100%; margin: 2px 0; }
.dtlab-quiz .dtlab-control { flex: 0 0 auto; width: auto; margin-right: 0.3em; }
.dtlab-quiz .dtlab-control label { white-space: nowrap; overflow: visible; }
.dtlab-quiz .dtlab-feedback { width: 100%; }
.dtlab-quiz a { color: var(--jp-content-link-color, #1a5fb4); text-decoration: underline; }
</style>"""


def text_box(markdown: str, css_class: str = "dtlab-text") -> w.HTMLMath:
    box = w.HTMLMath(value=markdown_to_html(markdown), layout=w.Layout(width="auto"))
    box.add_class(css_class)
    return box


def feedback_html(markdown: str, colour: str) -> str:
    return (
        f"<div style='border-left:4px solid {colour};padding:4px 10px;white-space:normal'>"
        f"<div style='color:inherit'>{markdown_to_html(markdown)}</div></div>"
    )
