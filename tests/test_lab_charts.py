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
