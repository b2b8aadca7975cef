"""The rules every dtlab chart follows, applied in one place and checked in one place.

A learner reads a chart in seconds, so each one carries:

* a title that says what is plotted;
* axis titles with units on every axis that has data ("time since the run started (ms)",
  "memory per rank (MiB)");
* a legend outside the plotting area (right of it), so it never covers data;
* a one-line "what to see" caption, shown as the title's subtitle and kept in
  ``fig.layout.meta["caption"]``;
* room for all of it: the title and caption pinned to the top of the figure with a margin under
  them (subplot titles fit there), and a plot area at least as tall as the legend and as the
  longest y-axis title. Plotly clips a legend taller than the plot area (it scrolls), and centres
  a y-axis title on the plot area however long it is, so a long title on a short plot runs up
  into the caption. :func:`describe` raises ``height`` until both fit.

:func:`describe` applies them to a figure; :func:`chart_problems` lists what a figure still
lacks (the tests and the browser test use it, so a chart without units fails).

The heights are estimates from the fonts of :data:`~dtlab.viz.theme.DTLAB_TEMPLATE`, checked
against Chromium's rendering (a legend entry is 19 px, an axis-title character about 7.5 px);
they err on the side of room.
"""

from __future__ import annotations

import plotly.graph_objects as go

LEGEND_OUTSIDE = {"x": 1.02, "xanchor": "left", "y": 1.0, "yanchor": "top"}
TITLE_AT_TOP = {"yref": "container", "y": 1.0, "yanchor": "top", "pad": {"t": 12}}
TOP_MARGIN_PX = 96  # title + caption (~60 px from the top), then room for subplot titles
BELOW_PLOT_PX = 100  # x tick labels and the x-axis title, which plotly adds under the plot
PLOTLY_DEFAULT_HEIGHT = 450  # what plotly draws when a figure sets no height
LEGEND_TITLE_PX, LEGEND_ITEM_PX = 30, 20
AXIS_TITLE_PX_PER_CHAR, AXIS_TITLE_SLACK_PX = 8, 16


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
        title=TITLE_AT_TOP,
        margin={"t": TOP_MARGIN_PX},
    )
    for axis, text in (("xaxis", x), ("yaxis", y)):
        if text is None:
            continue
        for name in _axes(fig, axis):
            layout_axis = fig.layout[name]
            if not (layout_axis.title.text or "").strip():
                layout_axis.title.text = text
    needed = plot_height_needed(fig)
    if plot_height(fig) < needed:
        fig.update_layout(height=needed + _top_margin(fig) + BELOW_PLOT_PX)
    return fig


def _top_margin(fig: go.Figure) -> int:
    return fig.layout.margin.t if fig.layout.margin.t is not None else TOP_MARGIN_PX


def plot_height(fig: go.Figure) -> int:
    """About how tall the plot area is (px): the figure less the title and the x axis."""
    height = fig.layout.height or PLOTLY_DEFAULT_HEIGHT
    return height - _top_margin(fig) - BELOW_PLOT_PX


def legend_height(fig: go.Figure) -> int:
    """About how tall the vertical legend is (px): its title and one row per entry (plotly
    shows no legend for a lone trace unless ``showlegend`` is set)."""
    entries = [t for t in fig.data if t.name and t.showlegend is not False]
    shown = fig.layout.showlegend if fig.layout.showlegend is not None else len(entries) > 1
    if not entries or not shown or fig.layout.legend.orientation == "h":
        return 0
    return LEGEND_TITLE_PX + LEGEND_ITEM_PX * len(entries)


def y_title_length(fig: go.Figure) -> int:
    """About how long the longest y-axis title is (px), drawn vertically beside the plot."""
    texts = [(fig.layout[name].title.text or "") for name in _axes(fig, "yaxis")]
    longest = max((len(t) for t in texts), default=0)
    return longest * AXIS_TITLE_PX_PER_CHAR + AXIS_TITLE_SLACK_PX if longest else 0


def plot_height_needed(fig: go.Figure) -> int:
    """The plot area the legend and the y-axis titles need, so neither is clipped nor overlaps
    the caption. Subplots stacked in rows are not divided out: it errs on the side of room."""
    return max(legend_height(fig), y_title_length(fig))


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
    room = plot_height(fig)
    if legend_height(fig) > room:
        problems.append(
            f"the legend (~{legend_height(fig)} px) is taller than the plot area (~{room} px): "
            "plotly clips it; raise height"
        )
    if y_title_length(fig) > room:
        problems.append(
            f"a y-axis title (~{y_title_length(fig)} px) is longer than the plot area is tall "
            f"(~{room} px): it runs into the caption; raise height or shorten it"
        )
    return problems


def _unitless(text: str) -> bool:
    # categorical axes (ranks, stages, algorithms, parallel degrees) need no unit
    words = ("rank", "stage", "step", "layer", "algorithm", "degree")
    return any(word in text.lower() for word in words)
