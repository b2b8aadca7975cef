"""A memory calculator: model size, data-parallel ranks, ZeRO stage, precision → bytes per rank.

The ZeRO paper's accounting (Rajbhandari et al., "ZeRO", SC 2020, §3 and §5), live: pick a model
size Ψ, the number of data-parallel ranks N, a ZeRO stage and a precision/optimizer recipe, and
read each rank's model state — parameters, gradients, optimizer state — from
:func:`dtlab.memory.model_state_bytes`. With mixed-precision Adam (2 + 2 + 12 = 16 bytes per
parameter) a rank holds

=========  ==========================
DDP        ``16Ψ``
ZeRO-1     ``2Ψ + 2Ψ + 12Ψ/N``
ZeRO-2     ``2Ψ + (2 + 12)Ψ/N``
ZeRO-3     ``(2 + 2 + 12)Ψ/N``
=========  ==========================

The table lists every stage at the chosen N (the chosen one marked), the bars stack the three
categories per stage, and the dashed line is one device's memory: a bar above it does not fit
even before activations (which these formulas leave out; see :mod:`dtlab.memory.formulas`).
Sizes are decimal GB (10⁹ bytes), as interview numbers are quoted: 7B × 16 B = 112 GB. The
device line is the figure typed into ``device_gb``, in the same units; a datasheet's "80 GB" of
HBM is about 80 GiB, 85.5–85.9 of these GB (:mod:`dtlab.cost.hardware`), so the default of 80
errs 7 % on the safe side — type 85.9 to draw an A100's whole HBM.

    calc = memory_calculator(num_params=7e9, world_size=8)
    calc                    # in a notebook: the widgets, table and bars
    calc.zero_stage.value = 3; calc.state.total   # headless: set a widget, read the result
"""

from __future__ import annotations

import html

import plotly.graph_objects as go

from dtlab.memory import RECIPES, ZERO_STAGES, StateBytes, model_state_bytes
from dtlab.viz.chart import describe
from dtlab.viz.theme import DTLAB_TEMPLATE, MEMORY_COLORS

GB = 1e9
STAGE_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
PRESETS: dict[str, float] = {
    "GPT-2 small (124M)": 124_439_808,
    "1.3B": 1.3e9,
    "7B": 7e9,
    "13B": 13e9,
    "70B": 70e9,
    "175B (GPT-3)": 175e9,
}
_CATEGORIES = (("params", "parameters"), ("grads", "gradients"), ("optimizer", "optimizer state"))


def stage_table(num_params: int, world_size: int, recipe: str = "mixed_adam") -> list[dict]:
    """One row per ZeRO stage: bytes per rank by category and in total, from the formula."""
    rows = []
    for stage in ZERO_STAGES:
        state = model_state_bytes(num_params, world_size, stage, recipe)
        rows.append(
            {
                "stage": stage,
                "name": STAGE_NAMES[stage],
                "params": state.params,
                "grads": state.grads,
                "optimizer": state.optimizer,
                "total": state.total,
            }
        )
    return rows


def stage_bars(
    num_params: int,
    world_size: int,
    zero_stage: int,
    recipe: str = "mixed_adam",
    device_gb: float | None = 80.0,
) -> go.Figure:
    """Stacked GB per rank for every stage at ``world_size``; ``zero_stage`` drawn solid."""
    rows = stage_table(num_params, world_size, recipe)
    names = [row["name"] for row in rows]
    opacity = [1.0 if row["stage"] == zero_stage else 0.35 for row in rows]
    fig = go.Figure()
    for key, category in _CATEGORIES:
        fig.add_trace(
            go.Bar(
                name=category,
                x=names,
                y=[row[key] / GB for row in rows],
                marker={"color": MEMORY_COLORS[category], "opacity": opacity},
                hovertemplate=f"%{{x}}<br>{category}: %{{y:.2f}} GB<extra></extra>",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=names,
            y=[row["total"] / GB for row in rows],
            mode="text",
            text=[f"{row['total'] / GB:.1f}" for row in rows],
            textposition="top center",
            showlegend=False,
            hoverinfo="skip",
        )
    )
    if device_gb:
        fig.add_hline(
            y=device_gb,
            line={"dash": "dash", "color": "#444444"},
            annotation_text=f"one device: {device_gb:g} GB",
            annotation_position="top left",
        )
    fig.update_layout(
        template=DTLAB_TEMPLATE,
        barmode="stack",
        height=380,
        title=f"Model state per rank: {num_params / 1e9:g}B params, N = {world_size}, {recipe}",
        yaxis={"title": {"text": "model state per rank (GB)"}, "rangemode": "tozero"},
        legend={"title": {"text": "category"}},
    )
    return describe(
        fig,
        caption="Each ZeRO stage shards one more kind of state: the solid bar is the chosen stage.",
        x="ZeRO stage",
    )


def _table_html(rows: list[dict], zero_stage: int, device_gb: float | None) -> str:
    head = "".join(
        f"<th style='padding:2px 10px'>{h}</th>"
        for h in ("stage", "params GB", "grads GB", "optimizer GB", "total GB", "fits?")
    )
    body = []
    for row in rows:
        fits = "" if not device_gb else ("yes" if row["total"] <= device_gb * GB else "no")
        style = "font-weight:bold;background:#eef3fb" if row["stage"] == zero_stage else ""
        cells = [html.escape(row["name"])] + [
            f"{row[k] / GB:,.2f}" for k in ("params", "grads", "optimizer", "total")
        ]
        cells.append(fits)
        body.append(
            f"<tr style='{style}'>"
            + "".join(f"<td style='padding:2px 10px;text-align:right'>{c}</td>" for c in cells)
            + "</tr>"
        )
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


class MemoryCalculator:
    """The widgets, the table and the bars; every widget change redraws both.

    Widgets (set ``.value`` to drive it from code or a test): ``params_billions``, ``preset``,
    ``world_size``, ``zero_stage``, ``recipe``, ``device_gb``. Results: :attr:`state` (the
    chosen stage's :class:`~dtlab.memory.StateBytes`), :attr:`rows`, :attr:`figure`, ``table``.
    """

    def __init__(
        self,
        num_params: float = 7e9,
        world_size: int = 8,
        zero_stage: int = 0,
        recipe: str = "mixed_adam",
        device_gb: float = 80.0,
    ) -> None:
        import ipywidgets as w  # only notebooks need widgets; importing dtlab.viz stays light

        if recipe not in RECIPES:
            raise KeyError(f"no memory recipe {recipe!r}; choose one of {sorted(RECIPES)}")
        if zero_stage not in ZERO_STAGES:
            raise ValueError(f"ZeRO stage {zero_stage} does not exist; choose one of {ZERO_STAGES}")
        style = {"description_width": "150px"}
        # "custom" is the value 0 (not None: ipywidgets shows None as an empty selection).
        self.preset = w.Dropdown(
            options=[("custom", 0)] + [(name, n) for name, n in PRESETS.items()],
            value=0,
            description="model",
            style=style,
        )
        self.params_billions = w.BoundedFloatText(
            value=num_params / 1e9, min=1e-6, max=1e5, step=0.1,
            description="parameters (billions)", style=style,
        )  # fmt: skip
        self.world_size = w.BoundedIntText(
            value=world_size, min=1, max=1_000_000, description="data-parallel ranks N", style=style
        )
        self.zero_stage = w.ToggleButtons(
            options=[(STAGE_NAMES[s], s) for s in ZERO_STAGES],
            value=zero_stage,
            description="stage",
            style=style,
        )
        self.recipe = w.Dropdown(
            options=list(RECIPES), value=recipe, description="precision recipe", style=style
        )
        self.device_gb = w.BoundedFloatText(
            value=device_gb, min=0.0, max=1e6, description="device memory (GB)", style=style
        )
        self.table = w.HTML()
        self.plot = w.Output()
        self.figure: go.Figure = go.Figure()
        self.rows: list[dict] = []
        self.preset.observe(self._on_preset, names="value")
        for control in (
            self.params_billions, self.world_size, self.zero_stage, self.recipe, self.device_gb,
        ):  # fmt: skip
            control.observe(lambda _change: self.update(), names="value")
        self.widget = w.VBox(
            [
                w.HBox([w.VBox([self.preset, self.params_billions, self.world_size]),
                        w.VBox([self.recipe, self.device_gb])]),
                self.zero_stage,
                self.table,
                self.plot,
            ]
        )  # fmt: skip
        self.update()

    @property
    def num_params(self) -> int:
        return round(self.params_billions.value * 1e9)

    @property
    def state(self) -> StateBytes:
        """The chosen stage's bytes per rank."""
        return model_state_bytes(
            self.num_params, self.world_size.value, self.zero_stage.value, self.recipe.value
        )

    def _on_preset(self, change) -> None:
        if change["new"]:  # a preset, not "custom"
            self.params_billions.value = change["new"] / 1e9  # triggers update()

    def update(self) -> None:
        """Recompute the table and the bars from the widgets' current values."""
        n, stage, recipe = self.world_size.value, self.zero_stage.value, self.recipe.value
        device_gb = self.device_gb.value or None
        self.rows = stage_table(self.num_params, n, recipe)
        self.table.value = _table_html(self.rows, stage, device_gb)
        self.figure = stage_bars(self.num_params, n, stage, recipe, device_gb)
        self._draw()

    def _draw(self) -> None:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is None:  # headless (a script, a test): the figure is still in .figure
            return
        self.plot.clear_output(wait=True)
        with self.plot:
            display(self.figure)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def memory_calculator(
    num_params: float = 7e9,
    world_size: int = 8,
    zero_stage: int = 0,
    recipe: str = "mixed_adam",
    device_gb: float = 80.0,
) -> MemoryCalculator:
    """An interactive per-rank model-state calculator (see module docstring)."""
    return MemoryCalculator(num_params, world_size, zero_stage, recipe, device_gb)
