"""Bandwidth curves: measured algbw or busbw against message size, one line per algorithm, with
the fitted alpha-beta model drawn dashed beside each.

The x axis is logarithmic (1 KiB … 64 MiB). On the left every curve climbs — latency-bound, each
message pays ``α`` — and on the right it flattens at the link's bandwidth — bandwidth-bound. Where
two algorithms' curves cross is the size at which a library like NCCL switches between them.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from dtlab.cost.bandwidth import busbw_factor
from dtlab.cost.collectives import collective_time
from dtlab.viz.chart import describe
from dtlab.viz.theme import EXTRA_COLORS, KIND_COLORS

_PALETTE = (KIND_COLORS["compute"], KIND_COLORS["comm"], *EXTRA_COLORS, KIND_COLORS["memcpy"])


def _size_label(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def bandwidth_curve(
    records: Sequence,
    summary: dict | None = None,
    metric: str = "busbw",
    world_size: int | None = None,
    title: str | None = None,
    caption: str = (
        "Left: every message pays the latency α, so bandwidth climbs; right: it flattens at the "
        "link's bandwidth. Dashed: the fitted α-β model."
    ),
) -> go.Figure:
    """Measured ``metric`` ("busbw" or "algbw", GB/s) vs size per algorithm, with the model.

    ``records`` are :class:`dtlab.bench.collectives.BenchRecord` (or dicts with the same keys);
    ``summary`` is :func:`dtlab.bench.collectives.summarize`'s result, whose fitted link per world
    size draws the dashed model lines (the built-in collective is modelled as a ring).
    ``world_size`` picks one world size when records hold several (default: the smallest).
    """
    if metric not in ("busbw", "algbw"):
        raise ValueError(f"metric {metric!r} must be 'busbw' or 'algbw'")
    rows = [r if isinstance(r, dict) else r.__dict__ for r in records]
    if not rows:
        raise ValueError(
            "no benchmark records to draw: run dtlab.bench.collectives.run_sweep first"
        )
    n = world_size if world_size is not None else min(r["world_size"] for r in rows)
    rows = [r for r in rows if r["world_size"] == n]
    link = (summary or {}).get(n, {}).get("link")
    fig = go.Figure()
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    for i, algorithm in enumerate(algorithms):
        color = _PALETTE[i % len(_PALETTE)]
        points = sorted((r for r in rows if r["algorithm"] == algorithm), key=lambda r: r["nbytes"])
        sizes = [r["nbytes"] for r in points]
        fig.add_scatter(
            x=sizes,
            y=[r[f"{metric}_gbps"] for r in points],
            mode="lines+markers",
            name=algorithm,
            line={"color": color, "width": 3 if algorithm == "torch" else 2},
            text=[_size_label(s) for s in sizes],
            hovertemplate="%{text}: %{y:.3f} GB/s<extra>" + algorithm + "</extra>",
        )
        if link is not None:
            op = points[0]["op"]
            model_algorithm = "ring" if algorithm == "torch" else algorithm
            factor = busbw_factor(op, n) if metric == "busbw" else 1.0
            fig.add_scatter(
                x=sizes,
                y=[
                    s / collective_time(op, model_algorithm, s, n, link) * factor / 1e9
                    for s in sizes
                ],
                mode="lines",
                name=f"{algorithm} (model)",
                line={"color": color, "dash": "dash", "width": 1},
                showlegend=algorithm != "torch",
                hoverinfo="skip",
            )
    op = rows[0]["op"]
    sizes = sorted({r["nbytes"] for r in rows})
    ticks = sizes[:: max(1, len(sizes) // 8)]  # readable labels (1 KiB, 64 KiB, ...), at most ~8
    fig.update_layout(
        template="dtlab",
        title=title or f"{op}: measured {metric} vs size on {n} ranks ({rows[0]['backend']})",
        xaxis={
            "type": "log",
            "title": "message size (bytes, log scale)",
            "tickvals": ticks,
            "ticktext": [_size_label(t) for t in ticks],
        },
        yaxis={"title": f"{metric} (GB/s)", "rangemode": "tozero"},
        legend={"title": "algorithm"},
        height=max(420, 140 + 22 * sum(t.showlegend is not False for t in fig.data)),
    )
    return describe(fig, caption=caption)
