"""Plotly figures for the labs, one look for all of them.

* :func:`timeline` — per-rank Gantt of a run's spans (compute, comm, idle, ...).
* :func:`memory_bars` — memory per rank stacked by category, beside the formula's prediction.
* :func:`bandwidth_curve` — measured vs alpha-beta bandwidth of a collective over message sizes.
* :func:`memory_calculator` — widgets: model size, N, ZeRO stage, precision → bytes per rank.
* :func:`describe` — give any figure the chart rules: title, axis units, legend outside the plot,
  a one-line "what to see" caption (:func:`chart_problems` lists what a figure lacks).
* :func:`setup_notebook` — pin the renderer and template so saved notebooks are deterministic.
"""

from dtlab.viz.bandwidth import bandwidth_curve
from dtlab.viz.chart import chart_problems, describe
from dtlab.viz.memory_bars import memory_bars
from dtlab.viz.memory_calculator import memory_calculator
from dtlab.viz.theme import (
    DTLAB_TEMPLATE,
    KIND_COLORS,
    MEMORY_CATEGORIES,
    MEMORY_COLORS,
    setup_notebook,
)
from dtlab.viz.timeline import timeline

__all__ = [
    "timeline",
    "memory_bars",
    "bandwidth_curve",
    "chart_problems",
    "describe",
    "memory_calculator",
    "setup_notebook",
    "DTLAB_TEMPLATE",
    "KIND_COLORS",
    "MEMORY_CATEGORIES",
    "MEMORY_COLORS",
]
