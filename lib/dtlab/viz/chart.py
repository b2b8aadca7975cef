"""The rules every dtlab chart follows, applied in one place and checked in one place.

A learner reads a chart in seconds, so each one carries:

* a title that says what is plotted;
* axis titles with units on every axis that has data ("time since the run started (ms)",
  "memory per rank (MiB)");
* a legend outside the plotting area (right of it), so it never covers data;
* a one-line "what to see" caption, shown as the title's subtitle and kept in
  ``fig.layout.meta["caption"]``.

:func:`describe` applies them to a figure; :func:`chart_problems` lists what a figure still
lacks (the tests and the browser test use it, so a chart without units fails).
"""

from __future__ import annotations

import plotly.graph_objects as go

LEGEND_OUTSIDE = {"x": 1.02, "xanchor": "left", "y": 1.0, "yanchor": "top"}


def describe(
    fig: go.Figure,
    *,
    caption: str,
    title: str | None = None,
    x: str | None = None,
    y: str | None = None,
) -> go.Figure:
    """Give ``fig`` its title, axis titles (``x``/``y`` apply to every x/y axis that has no title
    yet), the legend outside the plot, and the caption. Returns ``fig`` for chaining."""
    if not caption or not caption.strip():
        raise ValueError("a chart needs a one-line caption saying what to see in it")
    if title is not None:
        fig.update_layout(title={"text": title})
    if not (fig.layout.title.text or "").strip():
        raise ValueError("a chart needs a title: pass title=... (what is plotted)")
    try:  # plotly >= 5.23 draws a subtitle under the title
        fig.update_layout(title={"subtitle": {"text": caption, "font": {"size": 12}}})
    except ValueError:
        fig.update_layout(title={"text": f"{fig.layout.title.text}<br><sup>{caption}</sup>"})
    fig.update_layout(
        meta={"caption": caption},
        legend=LEGEND_OUTSIDE,
        margin={"t": 90},
    )
    for axis, text in (("xaxis", x), ("yaxis", y)):
        if text is None:
            continue
        for name in _axes(fig, axis):
            layout_axis = fig.layout[name]
            if not (layout_axis.title.text or "").strip():
                layout_axis.title.text = text
    return fig


def _axes(fig: go.Figure, prefix: str) -> list[str]:
    """The layout names (``xaxis``, ``xaxis2`` ...) of the axes traces are drawn on."""
    letter = prefix[0]
    used = set()
    for trace in fig.data:
        ref = getattr(trace, f"{letter}axis", None) or letter
        used.add(prefix + ref[1:])
    present = {name for name in fig.layout if name.startswith(prefix)}
    return sorted(used | present, key=lambda n: (len(n), n))


def chart_problems(fig: go.Figure) -> list[str]:
    """What ``fig`` lacks of the chart rules: [] when it has them all."""
    problems = []
    title = (fig.layout.title.text or "").strip()
    if not title:
        problems.append("no title")
    if not (fig.layout.meta or {}).get("caption"):
        problems.append("no caption (describe(fig, caption=...))")
    for prefix in ("xaxis", "yaxis"):
        for name in _axes(fig, prefix):
            axis = fig.layout[name]
            text = (axis.title.text or "").strip()
            if not text:
                problems.append(f"{name} has no title")
            elif axis.type != "category" and "(" not in text and not _unitless(text):
                problems.append(f"{name} title {text!r} names no unit in parentheses")
    legend = fig.layout.legend
    inside_x = legend.x is not None and 0 <= legend.x <= 1
    inside_y = legend.y is not None and 0 <= legend.y <= 1 and legend.orientation != "h"
    if inside_x and inside_y:
        problems.append(f"the legend sits inside the plot area (x={legend.x}, y={legend.y})")
    return problems


def _unitless(text: str) -> bool:
    # categorical axes (ranks, stages, algorithms) need no unit
    return any(word in text.lower() for word in ("rank", "stage", "step", "layer", "algorithm"))
