"""Every chart a lab draws goes through the chart rules (title, axis units, legend, caption).

A static check of the lab sources: each cell that builds a Plotly figure calls
``dtlab.viz.describe`` (or a library chart function, which does). The browser test renders four
labs and checks the rules on the page; this one covers every lab cheaply.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SOLUTIONS = Path(__file__).resolve().parents[1] / "solutions"
LABS = sorted(p.stem for p in SOLUTIONS.glob("[0-9][0-9]_*.py"))


@pytest.mark.parametrize("lab", LABS)
def test_every_figure_a_lab_builds_is_described(lab: str):
    cells = (SOLUTIONS / f"{lab}.py").read_text().split("\n# %%")
    bare = [
        i
        for i, cell in enumerate(cells)
        if ("go.Figure(" in cell or "make_subplots(" in cell) and "describe(" not in cell
    ]
    assert not bare, f"{lab}: cells {bare} build a figure without dtlab.viz.describe(...)"


def run_cells(lab: str, *markers: str) -> dict:
    """Run a lab's first code cell (its imports) and then each cell holding a marker, in order;
    return the namespace. Only for cells that need no cluster."""
    cells = ("\n" + (SOLUTIONS / f"{lab}.py").read_text()).split("\n# %%")[1:]
    code = [c for c in cells if not c.lstrip().startswith("[markdown]")]
    namespace: dict = {"__name__": f"lab_{lab}"}
    chosen = [code[0]] + [next(c for c in code if marker in c) for marker in markers]
    for cell in chosen:
        exec(compile(cell, f"{lab}.py", "exec"), namespace)
    return namespace


def test_lab_04_cost_charts_leave_room_for_their_axis_titles_and_legends():
    from dtlab.viz import chart_problems

    cost = run_cells("04_tensor_parallel", "FABRICS = {", "compute vs TP communication")
    assert chart_problems(cost["fig"]) == []
    crossover = run_cells("04_tensor_parallel", "FABRICS = {", "L7, H7, T = 32")
    assert chart_problems(crossover["fig"]) == []


def test_lab_04_says_when_infiniband_overtakes_compute_as_its_numbers_do():
    lab = run_cells("04_tensor_parallel", "FABRICS = {")
    share = {t: comm["InfiniBand NDR"] / compute for t, compute, comm in lab["rows"]}
    first_over = min(t for t, s in share.items() if s > 1)
    prose = (SOLUTIONS / "04_tensor_parallel.py").read_text()
    assert f"({share[2]:.0%})" in prose and share[2] < 1  # at t = 2 a quarter, not "larger"
    assert f"overtakes it at `t` = {first_over}" in prose


# The timelines whose prose sends the learner to named spans pick those spans out, and the ones
# of ranks that never talk during the traced step align each rank to its own start.
PICKED_OUT = {
    "07_mixture_of_experts": [("moe_experts", "latest_start")],
    "09_activation_memory": [("recompute", "step"), ("offload", "step")],
}


@pytest.mark.parametrize("lab", sorted(PICKED_OUT))
def test_timelines_the_prose_points_into_highlight_those_spans(lab: str):
    calls = (SOLUTIONS / f"{lab}.py").read_text().split("dtlab.viz.timeline(")[1:]
    for name, align in PICKED_OUT[lab]:
        call = next((c.split("\n)")[0] for c in calls if f'"{name}"' in c.split("\n)")[0]), "")
        assert "highlight=" in call, f"{lab}: no timeline highlights {name!r}"
        if align:
            assert f'align="{align}"' in call, f"{lab}: the {name!r} timeline is not aligned"
