"""The lab's charts: the roofline with a step's ops on it, time per op, allocator segments.

Each follows :mod:`dtlab.viz.chart`'s rules (title, units, caption, legend outside), and each
says in its title or caption whether it shows a measurement or a model.
"""

from __future__ import annotations

import plotly.graph_objects as go

from dtlab.cost.caching_allocator import MiB
from dtlab.viz.chart import describe


def roofline_chart(roofline, placed=(), datasheet=None) -> go.Figure:
    """Measured roofs (log-log), the GEMM sweep's points and each op at its counted intensity
    and measured FLOP/s (ops with no counted FLOPs sit at their achieved bandwidth instead)."""
    lo, hi = 1e-2, max(1e3, 10 * roofline.ridge)
    xs = [lo * (hi / lo) ** (i / 60) for i in range(61)]
    fig = go.Figure()
    fig.add_scatter(x=xs, y=[roofline.attainable(x) / 1e9 for x in xs], mode="lines",
                    name="measured roofline", line={"color": "#333"})  # fmt: skip
    if datasheet is not None:
        ys = [
            min(datasheet.bf16_dense_flops, x * datasheet.hbm_bandwidth_bytes_per_s) / 1e9
            for x in xs
        ]
        fig.add_scatter(x=xs, y=ys, mode="lines", name=f"{datasheet.name} datasheet (BF16)",
                        line={"dash": "dash", "color": "#999"})  # fmt: skip
    for bound, color in (("compute", "#4c78a8"), ("memory", "#e45756")):
        ops = [p for p in placed if p.bound == bound and p.flops and p.seconds]
        if ops:
            fig.add_scatter(
                x=[p.intensity for p in ops], y=[p.achieved_flops / 1e9 for p in ops],
                mode="markers+text", text=[p.name for p in ops], textposition="top center",
                name=f"{bound}-bound op (measured)", marker={"color": color, "size": 9},
            )  # fmt: skip
    fig.update_xaxes(type="log", dtick=1)  # one label per decade
    fig.update_yaxes(type="log", dtick=1)
    return describe(
        fig,
        title=f"Roofline of {roofline.device}: measured roofs and one step's ops",
        caption=f"Ridge point {roofline.ridge:.1f} FLOP/byte; ops without counted FLOPs "
        "(elementwise) sit far left, on the memory roof.",
        x="arithmetic intensity (FLOP/byte)",
        y="throughput (GFLOP/s)",
    )


def time_per_op_chart(points, floor_s: float) -> go.Figure:
    """Measured seconds of one elementwise add against its size, and the per-op floor."""
    fig = go.Figure()
    fig.add_scatter(x=[n for n, _ in points], y=[s * 1e6 for _, s in points],
                    mode="lines+markers", name="measured a + b")  # fmt: skip
    fig.add_scatter(x=[points[0][0], points[-1][0]], y=[floor_s * 1e6] * 2, mode="lines",
                    name="per-op floor", line={"dash": "dot"})  # fmt: skip
    fig.update_xaxes(type="log", dtick=1)
    fig.update_yaxes(type="log", dtick=1)
    return describe(
        fig,
        title="Time of one op as it shrinks",
        caption="Below some size the time stops falling: what is left is the per-op overhead.",
        x="elements (count)",
        y="time per op (µs)",
    )


def segments_chart(segments: list[list[tuple[int, bool]]], source: str) -> go.Figure:
    """One horizontal bar per segment, its blocks in address order: in use or cached (free)."""
    fig = go.Figure()
    shown = set()
    for row, blocks in enumerate(segments):
        for size, used in blocks:
            name = "in use (allocated)" if used else "cached (reserved, free)"
            fig.add_bar(
                y=[f"segment {row}"], x=[size / MiB], orientation="h", name=name,
                marker_color="#4c78a8" if used else "#e45756", showlegend=name not in shown,
                legendgroup=name, hovertemplate=f"{name}: %{{x:.1f}} MiB<extra></extra>",
            )  # fmt: skip
            shown.add(name)
    fig.update_layout(barmode="stack", height=max(300, 120 + 26 * len(segments)))
    fig.update_yaxes(type="category", autorange="reversed")
    return describe(
        fig,
        title=f"Allocator segments — {source}",
        caption="Red is reserved but free: memory held from the device that no tensor uses.",
        x="memory (MiB)",
        y="segment",
    )


def syncs_chart(trace) -> go.Figure:
    """The steps of a trace as bars and every ``sync:*`` span on them as a marker (a sync lasts
    µs and would be invisible as a bar on a step's ms axis), one row per call."""
    spans = sorted(trace, key=lambda s: s.start_ns)
    if not spans:
        raise ValueError(
            "the trace has no spans: run the step under SyncCounter inside cluster.run"
        )
    origin = spans[0].start_ns
    fig = go.Figure()
    steps = [s for s in spans if not s.name.startswith("sync:")]
    fig.add_bar(
        y=["step"] * len(steps), x=[(s.end_ns - s.start_ns) / 1e6 for s in steps],
        base=[(s.start_ns - origin) / 1e6 for s in steps], orientation="h", name="training step",
        marker_color="#c7d7ea", hovertemplate="%{x:.2f} ms<extra>step</extra>",
    )  # fmt: skip
    syncs = [s for s in spans if s.name.startswith("sync:")]
    for name in dict.fromkeys(s.name for s in syncs):
        mine = [s for s in syncs if s.name == name]
        fig.add_scatter(
            y=[name] * len(mine), x=[(s.start_ns - origin) / 1e6 for s in mine], mode="markers",
            name=name, marker={"size": 11, "symbol": "diamond"},
            text=[f"{s.labels.get('where', '')}: {(s.end_ns - s.start_ns) / 1e3:.1f} µs" for s in mine],
            hovertemplate="%{text}<extra>" + name + "</extra>",
        )  # fmt: skip
    fig.update_yaxes(type="category")
    fig.update_layout(height=max(300, 140 + 30 * (1 + len({s.name for s in syncs}))))
    return describe(
        fig,
        title=f"Host syncs on the timeline: {len(syncs)} in {len(steps)} steps",
        caption="Each diamond is a host read found by the counter; on a GPU each waits for the queue.",
        x="time since the first step started (ms)",
        y="span",
    )
