"""Build the two notebooks of every lab from its single source (``dtlab workshop build``).

For each ``solutions/NN_name.py`` (percent format, see :mod:`dtlab.workshop.source`):

* ``solutions/NN_name.ipynb`` — the complete lab, every exercise solved (CI runs it with nbval);
* ``labs/NN_name.ipynb`` — the student edition: every block between ``# BEGIN SOLUTION`` and
  ``# END SOLUTION`` (markers included) becomes one line at the block's indentation::

      raise ExerciseNotWritten("ring_all_reduce")  # replace this line with your code

  and a function later cells use falls back to the library until it is written (the blocks,
  stubs and fallbacks: :mod:`dtlab.workshop.solution_blocks`, :mod:`dtlab.workshop.stubs`).
  Every exercise cell is checked against the authoring rules of
  :mod:`dtlab.workshop.exercises` first, so the student notebook runs top to bottom.

Output is deterministic — nbformat 4.5, cell ids ``<lab>-<cell index>`` (a section's markdown cell: its anchor, :func:`section_cell_id`), no outputs,
``execution_count`` null, the ``python3`` kernel, JSON written the way Jupyter writes it — so
``--check`` compares bytes and a stale notebook shows up in CI, not in a learner's hands.
Each notebook is written with :func:`dtlab.files.write_atomic`: a build interrupted half-way
leaves every notebook either old or new, never truncated.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dtlab.files import write_atomic
from dtlab.workshop.exercises import check_fallbacks, list_exercises
from dtlab.workshop.solution_blocks import student_source
from dtlab.workshop.source import Cell, LabSource, explicit_anchors, read_lab_source

BUILD_COMMAND = "dtlab workshop build"
LAB_SOURCE_GLOB = "[0-9][0-9]_*.py"
LAB_NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"

KERNEL_METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


_CELL_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def section_cell_id(markdown: str) -> str | None:
    """The cell id of a markdown cell that opens a section: its first explicit anchor
    (``<a id="slug">``), so a link ``NN_name.ipynb#cell-id=slug`` scrolls JupyterLab (4.0+) to
    that cell; ``None`` for a cell without one (or an anchor nbformat does not allow as an id)."""
    anchors = explicit_anchors(markdown)
    return anchors[0] if anchors and _CELL_ID.fullmatch(anchors[0]) else None


def _cell_json(lab: LabSource, index: int, cell: Cell, source: str) -> dict:
    lines = source.splitlines(keepends=True)
    section = section_cell_id(cell.source) if cell.cell_type == "markdown" else None
    data: dict = {
        "cell_type": cell.cell_type,
        "id": section or f"{lab.name}-{index:03d}",
        "metadata": dict(cell.metadata),
        "source": lines,
    }
    if cell.cell_type == "code":
        data["execution_count"] = None
        data["outputs"] = []
    return data


def render_notebook(lab: LabSource, edition: str) -> str:
    """The notebook JSON text of ``lab`` for ``edition`` ``"solution"`` or ``"student"``."""
    if edition not in ("solution", "student"):
        raise ValueError(f"edition {edition!r}: choose 'solution' or 'student'")
    cells = []
    for index, cell in enumerate(lab.cells):
        source = cell.source
        if cell.cell_type == "code":
            student = student_source(cell, lab.path, index)  # validates markers in both editions
            if edition == "student":
                source = student
        cells.append(_cell_json(lab, index, cell, source))
    notebook = {
        "cells": cells,
        "metadata": {
            **KERNEL_METADATA,
            "dtlab": {"lab": lab.name, "edition": edition, "source": f"solutions/{lab.name}.py"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(notebook, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def lab_sources(root: Path) -> list[Path]:
    """Every lab source under ``root/solutions``, in lab order."""
    return sorted((root / "solutions").glob(LAB_SOURCE_GLOB))


def planned_notebooks(root: Path) -> dict[Path, str]:
    """Output path → notebook text for every lab source (nothing is written)."""
    planned: dict[Path, str] = {}
    for path in lab_sources(root):
        lab = read_lab_source(path)
        list_exercises(lab)  # an exercise cell that breaks the authoring rule is a build error
        check_fallbacks(lab)  # a later cell that would stop Run All on a stub, too
        planned[root / "solutions" / f"{lab.name}.ipynb"] = render_notebook(lab, "solution")
        planned[root / "labs" / f"{lab.name}.ipynb"] = render_notebook(lab, "student")
    return planned


def build(root: Path) -> list[Path]:
    """Write every lab's two notebooks; return the paths whose bytes changed."""
    written = []
    for path, text in planned_notebooks(root).items():
        data = text.encode("utf-8")
        if not path.exists() or path.read_bytes() != data:
            write_atomic(path, data)
            written.append(path)
    return written


def stale_notebooks(root: Path) -> list[str]:
    """Problems ``--check`` reports: notebooks missing, out of date, or without a source."""
    planned = planned_notebooks(root)
    problems = []
    for path, text in planned.items():
        shown = path.relative_to(root)
        if not path.exists():
            problems.append(f"{shown} is missing")
        elif path.read_bytes() != text.encode("utf-8"):
            problems.append(f"{shown} differs from its source solutions/{path.stem}.py")
    for folder in ("solutions", "labs"):
        for path in sorted((root / folder).glob(LAB_NOTEBOOK_GLOB)):
            if path not in planned:
                problems.append(
                    f"{path.relative_to(root)} has no source solutions/{path.stem}.py; "
                    "write the source or delete the notebook"
                )
    return problems


def find_repo_root(start: Path | None = None) -> Path:
    """The dtlab checkout containing ``start`` (default: the working directory).

    Falls back to the checkout this package is installed from (editable install), so
    ``dtlab workshop build`` works from any directory of a development checkout.
    """
    candidates = [Path(start or Path.cwd()).resolve()]
    candidates += list(candidates[0].parents)
    candidates.append(Path(__file__).resolve().parents[3])
    for folder in candidates:
        if (folder / "pyproject.toml").is_file() and (folder / "lib" / "dtlab").is_dir():
            return folder
    raise FileNotFoundError(
        "not inside a dtlab checkout (no pyproject.toml next to lib/dtlab); "
        "cd into the repository, e.g. `cd dtlab`"
    )
