"""The planner as a widget: a job (model, GPUs, batch, sequence, fabric) → its layouts ranked.

Pick a model preset (the capstone's 7B/70B/405B and the 671B mixture of experts, or lab 14's
jobs), change the GPU count, the tokens per step or the sequence length, and read, for the
fastest layouts that pass every check of :func:`dtlab.plan.plan_problems` and for the first one
in the expert's order (:func:`dtlab.plan.first_plan_that_fits`):

* memory per GPU by category (:func:`dtlab.plan.memory_by_category.memory_per_gpu`), as stacked
  bars against the GPU's usable memory;
* bytes each GPU sends per step along dp, tp, pp, cp and ep, the bubble, the step time and MFU
  (:func:`dtlab.plan.step_time.step_time`, on a rail-optimised fabric or one NIC per node);
* how many layouts each reason rules out, with one real example of it in the planner's words.

The ranked layouts are an HTML table; the title says the GPUs as edited.

Every number is the planner's model, not a measurement (lab 11 checks the model's terms against
the cluster). Headless: ``p = PlannerWidget(); p.gpus.value = 4096; p.rows`` (the layouts shown)
and ``p.figure``.
"""

from __future__ import annotations

import dataclasses
import html
import re
from collections import Counter

import ipywidgets as w
import plotly.graph_objects as go
from IPython.display import HTML, display

from dtlab.cost import gpu
from dtlab.plan import plan_problems
from dtlab.plan.job import JOBS, Requirements
from dtlab.plan.large_jobs import CAPSTONE_JOBS
from dtlab.plan.memory_by_category import memory_per_gpu
from dtlab.plan.search import candidate_plans, first_plan_that_fits
from dtlab.plan.step_time import step_time
from dtlab.viz.chart import describe
from dtlab.viz.theme import DTLAB_TEMPLATE

GB = 1e9
_FABRICS = {"one NIC per GPU": None, "one NIC per node": 1}  # label -> NICs per node for step_time
_BARS = (
    ("parameters", "parameters"),
    ("gradients", "gradients"),
    ("optimizer", "optimizer state"),
    ("activations", "activations"),
    ("zero3_gathered", "ZeRO-3 gathered layers"),
)


def _presets() -> dict[str, Requirements]:
    jobs = {job.name: job for job in CAPSTONE_JOBS}
    jobs.update({job.name: job for job in JOBS if job.name not in jobs})
    return jobs


def rank_layouts(
    job: Requirements,
    limit: int = 5,
    nics_per_node: int | None = None,
    examples: dict[str, str] | None = None,
):
    """``(rows, rejected)``: the ``limit`` fastest plans that pass every check plus the first
    that fits (each row ``(label, plan, memory, step)``), and how many candidates each first
    reason ruled out (reasons with their numbers replaced by ``N``, so one reason counts once).
    ``examples``, when given, receives each reason's first real problem, numbers included."""
    rejected: Counter[str] = Counter()
    timed = []
    for plan in candidate_plans(job):
        problems = plan_problems(job, plan)
        if problems:
            reason = _reason(problems[0])
            rejected[reason] += 1
            if examples is not None:
                examples.setdefault(reason, problems[0])
            continue
        timed.append((plan, step_time(job, plan, nics_per_node=nics_per_node)))
    timed.sort(key=lambda pair: pair[1].step_s)
    rows = [(f"#{i + 1}", plan, memory_per_gpu(job, plan), t) for i, (plan, t) in enumerate(timed)]
    rows = rows[:limit]
    try:
        first = first_plan_that_fits(job)
    except ValueError:
        return rows, rejected
    if all(plan != first for _, plan, _, _ in rows):
        t = step_time(job, first, nics_per_node=nics_per_node)
        rows.append(("first fit", first, memory_per_gpu(job, first), t))
    else:
        rows = [
            (f"{label} (first fit)" if plan == first else label, plan, m, t)
            for label, plan, m, t in rows
        ]
    return rows, rejected


def _reason(problem: str) -> str:
    """A problem with its numbers replaced by ``N``, so layouts failing for one reason count
    together (``"needs N GB per GPU on its worst pipeline stage (…) but the memory policy …"``)."""
    text = re.sub(r"\d[\d.,]*\d|\d", "N", problem)
    return text if len(text) <= 100 else text[:97].rsplit(" ", 1)[0] + " …"


def memory_figure(job: Requirements, rows) -> go.Figure:
    """Memory per GPU by category for each ranked layout, with the usable memory as a line."""
    labels = [f"{label}: {plan.describe()}" for label, plan, _, _ in rows]
    fig = go.Figure()
    for key, name in _BARS:
        values = [memory.by_category[key] / GB for _, _, memory, _ in rows]
        if any(values):
            fig.add_trace(go.Bar(name=name, y=labels, x=values, orientation="h"))
    usable = gpu(job.gpu).hbm_bytes * job.usable_memory_fraction / GB
    fig.add_vline(x=usable, line_dash="dash", annotation_text=f"usable {usable:.0f} GB")
    fig.update_layout(
        template=DTLAB_TEMPLATE,
        barmode="stack",
        height=160 + 45 * len(rows),
        yaxis={"autorange": "reversed"},
    )
    return describe(
        fig,
        title=f"{job_title(job)}: memory per GPU of the ranked layouts (planner)",
        x="memory per GPU (GB)",
        y="layout (rank: plan)",
        caption="Each bar must end left of the dashed line; activations usually decide.",
    )


def job_title(job: Requirements) -> str:
    """``70B on 4,096 H100 SXM``: the preset's model with the GPUs as they are now (a preset's
    own name keeps the GPU count it was written with)."""
    model = job.name.split(" on ", 1)[0]
    return f"{model} on {job.n_gpus:,} {gpu(job.gpu).name}"


_COLUMNS = ("rank", "layout", "memory / GPU", "step", "MFU", "bubble", "exposed comm")


def rows_html(rows) -> str:
    """The ranked layouts as an HTML table (cells never wrap inside a word)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in _COLUMNS)
    body = []
    for label, plan, memory, t in rows:
        exposed = t.exposed_communication_s
        cells = (
            label,
            plan.describe(),
            f"{memory.total / GB:.1f} GB",
            f"{t.step_s:.2f} s",
            f"{t.mfu:.1%}",
            f"{t.bubble:.1%}",
            f"{exposed:.2f} s",
        )
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    style = (
        "<style>.dtlab-plans td,.dtlab-plans th{white-space:nowrap;padding:2px 8px;"
        "text-align:left}</style>"
    )
    return f'{style}<table class="dtlab-plans"><tr>{head}</tr>{"".join(body)}</table>'


def describe_row(label: str, plan, memory, t) -> str:
    """One line per layout: step, MFU, bubble, and the GB each GPU sends per dimension."""
    return (
        f"{label:>16} {plan.describe():<44} {memory.total / GB:5.1f} GB  step {t.step_s:6.2f} s  "
        f"MFU {t.mfu:5.1%}  bubble {t.bubble:5.1%}  exposed comm "
        f"{t.exposed_communication_s:5.2f} s"
    )


class PlannerWidget:
    """Widgets for a job; ``rows``, ``rejected`` and ``figure`` hold the last result."""

    def __init__(self, job: str | None = None, limit: int = 5):
        presets = _presets()
        self._presets, self.limit = presets, limit
        self.model = w.Dropdown(options=list(presets), value=job or next(iter(presets)))
        self.gpus = w.IntText(description="GPUs", value=presets[self.model.value].n_gpus)
        self.batch = w.IntText(description="tokens/step")
        self.seq = w.IntText(description="sequence")
        # string values: a Dropdown whose value is None shows as blank
        self.fabric = w.Dropdown(
            options=list(_FABRICS), value="one NIC per GPU", description="fabric"
        )
        self.output = w.Output()
        self._load_preset()
        self.model.observe(lambda _: self._load_preset(), "value")
        for control in (self.gpus, self.batch, self.seq, self.fabric):
            control.observe(lambda _: self.update(), "value")
        self.widget = w.VBox(
            [
                w.HBox([self.model, self.fabric]),
                w.HBox([self.gpus, self.batch, self.seq]),
                self.output,
            ]
        )
        self.update()

    def _load_preset(self) -> None:
        job = self._presets[self.model.value]
        self._loading = True
        self.gpus.value, self.batch.value, self.seq.value = (
            job.n_gpus,
            job.global_batch_tokens,
            job.seq_len,
        )
        self._loading = False
        self.update()

    @property
    def job(self) -> Requirements:
        """The preset with this widget's GPUs, tokens per step and sequence length."""
        return dataclasses.replace(
            self._presets[self.model.value],
            n_gpus=max(1, self.gpus.value),
            global_batch_tokens=max(1, self.batch.value),
            seq_len=max(1, self.seq.value),
        )

    def update(self) -> None:
        if getattr(self, "_loading", False):
            return
        job = self.job
        self.examples: dict[str, str] = {}
        self.rows, self.rejected = rank_layouts(
            job, self.limit, _FABRICS[self.fabric.value], self.examples
        )
        self.figure = memory_figure(job, self.rows) if self.rows else None
        self.table_html = rows_html(self.rows) if self.rows else ""
        self.reasons = [
            f"ruled out ×{count}, e.g.: {self.examples[reason]}"
            for reason, count in self.rejected.most_common(4)
        ]
        self.output.clear_output(wait=True)
        with self.output:
            lines = [
                f"<b>{html.escape(job_title(job))}</b>: {len(self.rows)} layouts shown, "
                f"{sum(self.rejected.values())} ruled out",
                self.table_html,
                *(f"<div>{html.escape(reason)}</div>" for reason in self.reasons),
            ]
            display(HTML("".join(lines)))
            if self.figure is not None:
                self.figure.show()

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def planner_widget(job: str | None = None, limit: int = 5) -> PlannerWidget:
    """The planner for ``job`` (a preset's name; default the first capstone job)."""
    return PlannerWidget(job, limit)
