"""One look for every dtlab figure: fixed colours per span kind and memory category, a small
plotly template, and the notebook renderer.

Why ``plotly_mimetype``: a saved notebook should diff cleanly and open offline. Plotly's HTML
renderers ("notebook", "notebook_connected", "iframe") write a ``<div id="<random uuid>">`` and
either ~4 MB of inlined plotly.js or a CDN ``<script>``, so every run changes the output and
"connected" needs the internet. ``plotly_mimetype`` writes only the figure itself as
``application/vnd.plotly.v1+json`` — the same JSON for the same figure — which JupyterLab
(through the ``jupyterlab-plotly`` extension shipped inside the plotly wheel), Notebook 7 and
VS Code draw natively. The cost: GitHub's static notebook preview shows no figure.

The template is built here rather than taken from plotly's named ones because a figure embeds
its whole template: ours is a few hundred bytes, and it cannot change when plotly does.
"""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

KIND_COLORS = {
    "compute": "#4C78A8",  # blue
    "comm": "#F58518",  # orange
    "idle": "#D3D3D3",  # light grey: waiting is the absence of work
    "memcpy": "#54A24B",  # green
    "optimizer": "#B279A2",  # purple
    "other": "#9D755D",  # brown
}

GROUP_COLORS = {  # communication coloured by mesh dimension (timeline(color_by="group"))
    "dp": "#F58518",  # orange: the data-parallel family keeps comm's usual colour
    "tp": "#E45756",  # red
    "pp": "#72B7B2",  # teal
    "cp": "#EECA3B",  # yellow
    "ep": "#FF9DA6",  # pink
    "edp": "#BAB0AC",  # warm grey
    "embedding": "#17BECF",  # cyan: the tied embedding's copies on the first and last stage
    "world": "#393B79",  # indigo: communication outside any mesh group
}

HIGHLIGHT_COLORS = (  # timeline(highlight=...): spans picked out by name, unlike any kind or group
    "#D81B60",  # magenta
    "#1E1E8C",  # navy
    "#00A087",  # green-teal
)

MEMORY_CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer state",
    "activations",
    "communication buffers",
    "other",
)

MEMORY_COLORS = {
    "parameters": "#4C78A8",
    "gradients": "#F58518",
    "optimizer state": "#B279A2",
    "activations": "#54A24B",
    "communication buffers": "#E45756",
    "other": "#BAB0AC",
}

EXTRA_COLORS = ("#72B7B2", "#EECA3B", "#FF9DA6", "#9D755D", "#439894", "#83BCB6")

FONT = "Helvetica, Arial, sans-serif"

_axis = {
    "showgrid": True,
    "gridcolor": "#E8E8E8",
    "zeroline": False,
    "linecolor": "#888888",
    "ticks": "outside",
    "automargin": True,
}

DTLAB_TEMPLATE = go.layout.Template(
    layout={
        "font": {"family": FONT, "size": 13, "color": "#2A2A2A"},
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "colorway": list(MEMORY_COLORS.values()) + list(EXTRA_COLORS),
        "xaxis": _axis,
        "yaxis": _axis,
        "hoverlabel": {"align": "left", "font": {"family": FONT}},
        "hovermode": "closest",
        "margin": {"l": 70, "r": 20, "t": 60, "b": 50},
        "title": {"x": 0.01, "xanchor": "left"},
    }
)

pio.templates["dtlab"] = DTLAB_TEMPLATE

NOTEBOOK_RENDERER = "plotly_mimetype"


def setup_notebook(renderer: str = NOTEBOOK_RENDERER) -> None:
    """Pin the renderer and the template for this kernel (call once at the top of a lab).

    See the module docstring for why the default is ``plotly_mimetype``.
    """
    if renderer not in pio.renderers:
        raise ValueError(
            f"plotly has no renderer {renderer!r}; use {NOTEBOOK_RENDERER!r} (dtlab's default)"
        )
    pio.renderers.default = renderer
    pio.templates.default = "dtlab"
