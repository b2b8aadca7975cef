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
"""

from __future__ import annotations

import plotly.graph_objects as go

from dtlab.trace import KINDS, Span, Trace
from dtlab.trace.analysis import overlap_of, union_of
from dtlab.viz.chart import describe
from dtlab.viz.labels import format_bytes, format_duration_ns, format_labels
from dtlab.viz.theme import DTLAB_TEMPLATE, GROUP_COLORS, KIND_COLORS

ROW_FILL = 0.8  # fraction of a rank's row the bars occupy; the rest separates ranks
TRANSFER_KINDS = ("comm", "memcpy")


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


def legend_key(span: Span, color_by: str) -> str:
    """The legend entry a span is drawn under: its kind, or for comm its group (mesh dim)."""
    if color_by == "group" and span.kind == "comm":
        return f"comm · {span.labels.get('group', 'world')}"
    return span.kind


def _color(key: str) -> str:
    if key.startswith("comm · "):
        return GROUP_COLORS.get(key.removeprefix("comm · "), KIND_COLORS["comm"])
    return KIND_COLORS[key]


def timeline(
    trace: Trace,
    title: str = "Timeline per rank",
    show_idle: bool = True,
    color_by: str = "kind",
    caption: str = "One row per rank on one clock: grey gaps are time a rank waited.",
) -> go.Figure:
    """A per-rank Gantt chart of ``trace``: one ``go.Bar`` trace per span kind (the legend
    reads by kind), bars placed with ``base`` = start and ``x`` = duration, in ms.

    ``show_idle`` fills each rank's untraced gaps with grey "idle" bars (``Trace.with_idle``);
    with ``show_idle=False`` no idle bars are drawn, not even recorded ones. ``color_by="group"``
    colours communication by the group it ran in (the ``group`` label the communication layer
    puts on every span: dp, tp, pp, cp, ep), so a 3D-parallel step shows which dimension talks.
    ``caption`` is the one line under the title that says what to look for.
    """
    if color_by not in ("kind", "group"):
        raise ValueError(f"color_by={color_by!r}: choose 'kind' or 'group'")
    trace = trace.with_idle() if show_idle else trace.filter(kind=[k for k in KINDS if k != "idle"])
    fig = go.Figure()
    bars: dict[str, dict[str, list]] = {}
    two_lanes = transfers_overlap_work(trace)
    width = ROW_FILL / 2 if two_lanes else ROW_FILL
    for rank, spans in trace.by_rank().items():
        for s in spans:
            lane = 1 if two_lanes and s.kind in TRANSFER_KINDS else 0
            bar = bars.setdefault(
                legend_key(s, color_by),
                {"x": [], "base": [], "y": [], "offset": [], "width": [], "text": []},
            )
            bar["x"].append((s.end_ns - s.start_ns) / 1e6)
            bar["base"].append((s.start_ns - trace.origin_ns) / 1e6)
            bar["y"].append(rank_label(rank))
            bar["offset"].append(-ROW_FILL / 2 + lane * width)
            bar["width"].append(width)
            bar["text"].append(hover_text(s, trace.origin_ns))
    for kind in sorted(bars, key=lambda k: (KINDS.index(k.split(" · ")[0]), k)):
        bar = bars[kind]
        fig.add_trace(
            go.Bar(
                name=kind,
                orientation="h",
                x=bar["x"],
                base=bar["base"],
                y=bar["y"],
                offset=bar["offset"],
                width=bar["width"],
                marker={
                    "color": _color(kind),
                    "line": {"width": 0.5, "color": "rgba(255, 255, 255, 0.7)"},
                },
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
        xaxis={"title": {"text": "time since the run started (ms)"}},
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
