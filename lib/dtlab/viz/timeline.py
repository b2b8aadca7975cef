"""The per-rank timeline (a Gantt chart): what every rank was doing, when, on one clock.

One row per rank, time in milliseconds from the start of the run along x, one colour per span
kind (compute, comm, idle, ...), so the things to look for jump out: orange comm bars sliding
under blue compute (overlap), grey idle at the end of a fast rank (waiting for the slowest), a
staircase of idle in a pipeline (the bubble).

Communication often runs *while* a rank computes (an async all-reduce during backward), so when
any rank's transfers (comm, memcpy) overlap its other spans, every rank's row splits into two
lanes, as a profiler shows a compute stream above a communication stream: work on top,
transfers below. Spans that overlap within one lane (a "forward" span around its "matmul"
spans, or several all-reduces in flight) are drawn over one another, later ones on top, with a
thin outline so the inner ones stay visible.

Ranks start the same work at different wall-clock moments (process start-up, a busy machine):
tens of milliseconds apart on a shared CPU. On one clock, a rank that started early shows that
gap as grey idle, or as one long wait inside the first collective. Four things make the span a
lab talks about findable anyway:

* ``align="step"``: for ranks that do not talk to each other during the traced work (each
  running its own recomputed step, say), every rank's row starts at 0 at its own first span,
  and idle is only the gaps between its own spans.
* ``align="latest_start"``: for ranks that do talk, one clock still, but starting when the last
  rank began (spans that began earlier are clipped there): the early ranks' wait for the late
  one is cut off, and every exchange after it lines up as it ran. The default ``align="run"``
  draws everything. To drop the rest of the run, pass ``trace.filter(step=0).cropped()`` (or
  ``trace.window(a, b)``) first.
* ``highlight=("moe_experts",)``: spans with these names get their own legend entry and a
  colour no kind uses, drawn on top with a dark outline and at least
  :data:`MIN_HIGHLIGHT_FRACTION` of the time axis wide; every other bar is dimmed.
* Every other bar is at least :data:`MIN_BAR_FRACTION` of the time axis wide, so a 5-µs copy in
  a 20-ms step is a visible tick, not a sub-pixel line. Hover still gives the true duration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import plotly.graph_objects as go

from dtlab.trace import KINDS, Span, Trace
from dtlab.trace.analysis import overlap_of, union_of
from dtlab.viz.chart import describe
from dtlab.viz.labels import format_bytes, format_duration_ns, format_labels
from dtlab.viz.theme import DTLAB_TEMPLATE, GROUP_COLORS, HIGHLIGHT_COLORS, KIND_COLORS

ROW_FILL = 0.8  # fraction of a rank's row the bars occupy; the rest separates ranks
TRANSFER_KINDS = ("comm", "memcpy")
MIN_BAR_FRACTION = 0.004  # of the time axis: about 3 px on a notebook-wide figure
MIN_HIGHLIGHT_FRACTION = 0.01  # about 8 px: a highlighted span must be seen at a glance
DIMMED = 0.45  # opacity of the bars that are not highlighted
X_TITLES = {
    "run": "time since the run started (ms)",
    "step": "time since each rank's first span (ms)",
    "latest_start": "time since the last rank started (ms)",
}


def rank_label(rank: int) -> str:
    return f"rank {rank}"


def transfers_overlap_work(trace: Trace) -> bool:
    """True when, on some rank, a comm or memcpy span overlaps a span of another kind."""
    for spans in trace.by_rank().values():
        moving = union_of(s for s in spans if s.kind in TRANSFER_KINDS)
        other = union_of(s for s in spans if s.kind not in TRANSFER_KINDS)
        if overlap_of(moving, other) > 0:
            return True
    return False


def aligned_to_step(trace: Trace) -> Trace:
    """Each rank's spans shifted so that its first span starts at 0 (see ``align="step"``)."""
    first = {rank: spans[0].start_ns for rank, spans in trace.by_rank().items()}
    shifted = [
        dataclasses.replace(s, start_ns=s.start_ns - first[s.rank], end_ns=s.end_ns - first[s.rank])
        for s in trace.spans
    ]
    return Trace(shifted, origin_ns=0)


def from_latest_start(trace: Trace) -> Trace:
    """The part of ``trace`` after its last rank's first span, on one clock starting there."""
    start = max(spans[0].start_ns for spans in trace.by_rank().values())
    clipped = trace.window((start - trace.origin_ns) / 1e6)
    return Trace(clipped.spans, start, trace.end_ns, origin_ns=start)


def each_ranks_own_idle(trace: Trace) -> Trace:
    """``trace`` plus idle only between each rank's own first and last span (no waiting for a
    rank that is not on the same clock)."""
    gaps = [g for rank in trace.ranks for g in trace.filter(rank=rank).cropped().idle_gaps()]
    return Trace(trace.spans + gaps, trace.start_ns, trace.end_ns, trace.origin_ns)


def hover_text(span: Span, origin_ns: int) -> str:
    """What the mouse shows over a bar: name, rank and kind, when and how long, bytes, labels."""
    lines = [
        f"<b>{span.name}</b>",
        f"{rank_label(span.rank)} · {span.kind}",
        f"start {(span.start_ns - origin_ns) / 1e6:.3f} ms · "
        f"duration {format_duration_ns(span.end_ns - span.start_ns)}",
    ]
    if span.nbytes:
        lines.append(f"bytes {format_bytes(span.nbytes)} ({span.nbytes:,} B)")
    if span.labels:
        lines.append(format_labels(span.labels))
    return "<br>".join(lines)


def legend_key(span: Span, color_by: str, highlight: tuple[str, ...] = ()) -> str:
    """The legend entry a span is drawn under: its name if highlighted, else its kind, or for
    comm its group (mesh dim)."""
    if span.name in highlight:
        return span.name
    if color_by == "group" and span.kind == "comm":
        return f"comm · {span.labels.get('group', 'world')}"
    return span.kind


def _color(key: str, highlight: tuple[str, ...]) -> str:
    if key in highlight:
        return HIGHLIGHT_COLORS[highlight.index(key) % len(HIGHLIGHT_COLORS)]
    if key.startswith("comm · "):
        return GROUP_COLORS.get(key.removeprefix("comm · "), KIND_COLORS["comm"])
    return KIND_COLORS[key]


def _draw_order(key: str, highlight: tuple[str, ...]) -> tuple:
    """Kinds in KINDS order, then the highlighted names last, so they are drawn on top."""
    if key in highlight:
        return (1, highlight.index(key), key)
    return (0, KINDS.index(key.split(" · ")[0]), key)


def timeline(
    trace: Trace,
    title: str = "Timeline per rank",
    show_idle: bool = True,
    color_by: str = "kind",
    caption: str = "One row per rank on one clock: grey gaps are time a rank waited.",
    align: str = "run",
    highlight: str | Iterable[str] = (),
) -> go.Figure:
    """A per-rank Gantt chart of ``trace``: one ``go.Bar`` trace per span kind (the legend
    reads by kind), bars placed with ``base`` = start and ``x`` = duration, in ms.

    ``show_idle`` fills each rank's untraced gaps with grey "idle" bars (``Trace.with_idle``);
    with ``show_idle=False`` no idle bars are drawn, not even recorded ones. ``color_by="group"``
    colours communication by the group it ran in (the ``group`` label the communication layer
    puts on every span: dp, tp, pp, cp, ep), so a 3D-parallel step shows which dimension talks.
    ``caption`` is the one line under the title that says what to look for. ``align`` picks the
    clock ("run", "step" or "latest_start"), ``highlight`` names the spans to pick out (both in
    the module docstring).
    """
    if color_by not in ("kind", "group"):
        raise ValueError(f"color_by={color_by!r}: choose 'kind' or 'group'")
    if align not in X_TITLES:
        raise ValueError(
            f"align={align!r}: choose 'run' (one clock), 'step' (each rank from its first span) "
            "or 'latest_start' (one clock from the moment every rank has started)"
        )
    highlight = (highlight,) if isinstance(highlight, str) else tuple(highlight)
    trace = trace.filter(kind=[k for k in KINDS if k != "idle"]) if not show_idle else trace
    if align == "step" and trace.spans:
        trace = aligned_to_step(trace)
        trace = each_ranks_own_idle(trace) if show_idle else trace
    else:
        trace = from_latest_start(trace) if align == "latest_start" and trace.spans else trace
        trace = trace.with_idle() if show_idle else trace
    axis_ms = (trace.end_ns - trace.start_ns) / 1e6
    fig = go.Figure()
    bars: dict[str, dict[str, list]] = {}
    two_lanes = transfers_overlap_work(trace)
    width = ROW_FILL / 2 if two_lanes else ROW_FILL
    for rank, spans in trace.by_rank().items():
        for s in spans:
            lane = 1 if two_lanes and s.kind in TRANSFER_KINDS else 0
            bar = bars.setdefault(
                legend_key(s, color_by, highlight),
                {"x": [], "base": [], "y": [], "offset": [], "width": [], "text": []},
            )
            least = MIN_HIGHLIGHT_FRACTION if s.name in highlight else MIN_BAR_FRACTION
            bar["x"].append(max((s.end_ns - s.start_ns) / 1e6, least * axis_ms))
            bar["base"].append((s.start_ns - trace.origin_ns) / 1e6)
            bar["y"].append(rank_label(rank))
            bar["offset"].append(-ROW_FILL / 2 + lane * width)
            bar["width"].append(width)
            bar["text"].append(hover_text(s, trace.origin_ns))
    for key in sorted(bars, key=lambda k: _draw_order(k, highlight)):
        bar = bars[key]
        picked = key in highlight
        fig.add_trace(
            go.Bar(
                name=key,
                orientation="h",
                x=bar["x"],
                base=bar["base"],
                y=bar["y"],
                offset=bar["offset"],
                width=bar["width"],
                marker={
                    "color": _color(key, highlight),
                    "line": {"width": 1, "color": "#222222"}
                    if picked
                    else {"width": 0.5, "color": "rgba(255, 255, 255, 0.7)"},
                },
                opacity=DIMMED if highlight and not picked else None,
                hovertext=bar["text"],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    ranks = [rank_label(r) for r in trace.ranks]
    fig.update_layout(
        template=DTLAB_TEMPLATE,
        title=title,
        barmode="overlay",
        height=140 + 50 * max(1, len(ranks)),
        xaxis={"title": {"text": X_TITLES[align]}},
        yaxis={"categoryorder": "array", "categoryarray": ranks, "autorange": "reversed"},
        legend={"title": {"text": "kind"}, "traceorder": "normal"},
    )
    describe(fig, caption=caption, y="rank")
    if not trace.spans:
        fig.add_annotation(
            text="no spans recorded: wrap work in dtlab.trace.span(...) inside the function",
            showarrow=False,
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
        )
    return fig
