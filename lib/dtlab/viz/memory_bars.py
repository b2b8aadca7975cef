"""Memory per rank, stacked by what holds it, beside what the formula predicts.

The figure behind every "where did my memory go" question: for each rank a stacked bar of
parameters, gradients, optimizer state, activations and communication buffers in MiB, and next
to it (hatched) the same stack from the formula — e.g. mixed-precision Adam's 16 bytes per
parameter split 2/2/12 across parameters, gradients and optimizer state, divided by N for the
parts a ZeRO stage shards (Rajbhandari et al., "ZeRO", SC 2020). A gap between the two bars is
either a bug or a buffer the formula forgot, and both are worth finding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from dtlab.viz.chart import describe
from dtlab.viz.labels import MIB
from dtlab.viz.theme import DTLAB_TEMPLATE, EXTRA_COLORS, MEMORY_CATEGORIES, MEMORY_COLORS

_ALIASES = {
    "params": "parameters",
    "param": "parameters",
    "parameter": "parameters",
    "weights": "parameters",
    "grads": "gradients",
    "grad": "gradients",
    "gradient": "gradients",
    "optimizer": "optimizer state",
    "optim": "optimizer state",
    "optimizer states": "optimizer state",
    "optim state": "optimizer state",
    "activation": "activations",
    "acts": "activations",
    "buffers": "communication buffers",
    "buffer": "communication buffers",
    "comm": "communication buffers",
    "comm buffers": "communication buffers",
    "communication": "communication buffers",
    "others": "other",
    "misc": "other",
}


def category_name(key: str) -> str:
    """``"optimizer_state"``, ``"optim"`` -> ``"optimizer state"``; unknown keys pass through."""
    spoken = str(key).strip().lower().replace("_", " ").replace("-", " ")
    return _ALIASES.get(spoken, spoken if spoken in MEMORY_CATEGORIES else str(key))


def bytes_by_category(entry) -> dict[str, float]:
    """A mapping category->bytes, or an object with a ``.by_category`` one, in canonical names."""
    mapping = getattr(entry, "by_category", entry)
    if not isinstance(mapping, Mapping):
        raise TypeError(
            f"expected a mapping category->bytes (or an object with .by_category), "
            f"got {type(entry).__name__}"
        )
    out: dict[str, float] = {}
    for key, nbytes in mapping.items():
        name = category_name(key)
        out[name] = out.get(name, 0.0) + float(nbytes)
    return out


def _per_rank(predicted, n_ranks: int) -> list[dict[str, float]]:
    if isinstance(predicted, Sequence) and not isinstance(predicted, (str, bytes)):
        if len(predicted) != n_ranks:
            raise ValueError(
                f"predicted has {len(predicted)} entries but measured has {n_ranks} ranks; "
                f"give one mapping per rank, or a single mapping that holds for every rank"
            )
        return [bytes_by_category(p) for p in predicted]
    return [bytes_by_category(predicted)] * n_ranks


def _three_digits(mib: float) -> str:
    """A bar total with three significant digits and at least one decimal: 19.0, 1.10, 0.347."""
    decimals = 1 if mib <= 0 else max(1, 2 - math.floor(math.log10(mib)))
    return f"{mib:.{decimals}f}"


def memory_bars(
    measured: Sequence,
    predicted=None,
    title: str = "Memory per rank",
    caption: str = "Each bar stacks one rank's memory by category; hatched bars are the formula.",
    compact: bool = False,
) -> go.Figure:
    """Stacked MiB per rank by category; with ``predicted``, a hatched "formula" bar beside each.

    ``compact`` is for many bars in little width (e.g. four ranks in one panel of several): the
    bars are labelled ``m`` (measured) and ``f`` (formula) and the totals show on hover only.

    ``measured``: one entry per rank, each a mapping category->bytes or an object with a
    ``.by_category`` mapping (e.g. a ``dtlab.memory`` measurement). ``predicted``: the same
    shape, or one mapping for all ranks. Keys such as ``params``/``grads``/``optimizer`` are
    read as the standard categories; any other key becomes its own segment.
    """
    bars = {"measured": [bytes_by_category(m) for m in measured]}
    if predicted is not None:
        bars["formula"] = _per_rank(predicted, len(bars["measured"]))
    ranks = [f"rank {r}" for r in range(len(bars["measured"]))]
    # Categories that are zero in every bar would only clutter the legend.
    seen = {n for per_rank in bars.values() for entry in per_rank for n, b in entry.items() if b}
    extras = sorted(seen - set(MEMORY_CATEGORIES))
    colors = dict(MEMORY_COLORS)
    colors.update({name: EXTRA_COLORS[i % len(EXTRA_COLORS)] for i, name in enumerate(extras)})
    categories = [c for c in MEMORY_CATEGORIES if c in seen] + extras

    def x_for(which: str) -> list:
        # Two-level axis (rank, measured|formula) when there is a prediction to stand beside.
        label = which[0] if compact else which
        return [ranks, [label] * len(ranks)] if predicted is not None else ranks

    fig = go.Figure()
    for category in categories:
        for which, per_rank in bars.items():
            mib = [entry.get(category, 0.0) / MIB for entry in per_rank]
            totals = [sum(entry.values()) / MIB for entry in per_rank]
            fig.add_trace(
                go.Bar(
                    name=category,
                    x=x_for(which),
                    y=mib,
                    legendgroup=category,
                    showlegend=which == "measured",
                    marker={
                        "color": colors[category],
                        "pattern": {"shape": "/" if which == "formula" else ""},
                    },
                    customdata=[[rank, total] for rank, total in zip(ranks, totals, strict=True)],
                    hovertemplate=(
                        f"%{{customdata[0]}} · {which}<br>{category}: %{{y:.2f}} MiB<br>"
                        "bar total: %{customdata[1]:.2f} MiB<extra></extra>"
                    ),
                )
            )
    for which, per_rank in bars.items() if not compact else ():
        totals = [sum(entry.values()) / MIB for entry in per_rank]
        fig.add_trace(
            go.Scatter(
                x=x_for(which),
                y=totals,
                mode="text",
                text=[_three_digits(t) for t in totals],
                textposition="top center",
                showlegend=False,
                hoverinfo="skip",
                name=f"{which} total",
            )
        )
    fig.update_layout(
        template=DTLAB_TEMPLATE,
        title=title,
        barmode="stack",
        height=420,
        yaxis={"title": {"text": "memory per rank (MiB)"}, "rangemode": "tozero"},
        legend={"title": {"text": "category"}, "traceorder": "normal"},
    )
    x = "rank · measured | formula" if predicted is not None else "rank"
    return describe(fig, caption=caption, x=x)
