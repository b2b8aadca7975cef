"""Build the two notebooks of every lab from its single source (``dtlab workshop build``).

For each ``solutions/NN_name.py`` (percent format, see :mod:`dtlab.workshop.source`):

* ``solutions/NN_name.ipynb`` — the complete lab, every exercise solved (CI runs it with nbval);
* ``labs/NN_name.ipynb`` — the student edition: every block between ``# BEGIN SOLUTION`` and
  ``# END SOLUTION`` (markers included) becomes one line at the block's indentation::

      raise NotImplementedError("Exercise: ring_all_reduce — replace this line with your code")

Output is deterministic — nbformat 4.5, cell ids ``<lab>-<cell index>``, no outputs,
``execution_count`` null, the ``python3`` kernel, JSON written the way Jupyter writes it — so
``--check`` compares bytes and a stale notebook shows up in CI, not in a learner's hands.
Each notebook is written with :func:`dtlab.files.write_atomic`: a build interrupted half-way
leaves every notebook either old or new, never truncated.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from dtlab.files import write_atomic
from dtlab.workshop.source import Cell, LabSource, LabSourceError, read_lab_source

BEGIN_MARKER = "# BEGIN SOLUTION"
END_MARKER = "# END SOLUTION"
BUILD_COMMAND = "dtlab workshop build"
LAB_SOURCE_GLOB = "[0-9][0-9]_*.py"
LAB_NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"

# Loose on purpose: "#BEGIN SOLUTION" or "# END SOLUTION (ring)" must never leak a solution.
_MARKER_LINE = re.compile(r"^#\s*(?P<which>BEGIN|END)\s+SOLUTION\b")
_ENCLOSING_DEF = re.compile(r"^(?P<indent>\s*)(?:async\s+)?(?:def|class)\s+(?P<name>\w+)")

KERNEL_METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


@dataclass(frozen=True)
class SolutionBlock:
    """One exercise body in a code cell: lines ``begin``..``end`` (0-based, markers included)."""

    begin: int
    end: int
    indent: str
    exercise_name: str


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _enclosing_name(lines: list[str], begin: int, indent: str, fallback: str) -> str:
    """Name of the nearest ``def``/``class`` above line ``begin`` that encloses it."""
    for line in reversed(lines[:begin]):
        found = _ENCLOSING_DEF.match(line)
        if found and len(found["indent"]) < len(indent):
            return found["name"]
    return fallback


def find_solution_blocks(cell: Cell, path: Path | str, cell_index: int) -> list[SolutionBlock]:
    """Locate the BEGIN/END SOLUTION blocks of a code cell; unbalanced markers name file:line."""
    lines = cell.source.split("\n")
    blocks: list[SolutionBlock] = []
    open_at: int | None = None
    for i, line in enumerate(lines):
        marker = _MARKER_LINE.match(line.strip())
        which = marker["which"] if marker else None
        where = f"{path}:{cell.line + i}"
        if which == "BEGIN":
            if open_at is not None:
                raise LabSourceError(
                    f"{where}: '{BEGIN_MARKER}' inside the block opened at line "
                    f"{cell.line + open_at}; close that block with '{END_MARKER}' first"
                )
            open_at = i
        elif which == "END":
            if open_at is None:
                raise LabSourceError(
                    f"{where}: '{END_MARKER}' without a '{BEGIN_MARKER}' above it in this cell"
                )
            indent = _indent_of(lines[open_at])
            name = _enclosing_name(lines, open_at, indent, fallback=f"cell {cell_index}")
            blocks.append(SolutionBlock(open_at, i, indent, name))
            open_at = None
    if open_at is not None:
        raise LabSourceError(
            f"{path}:{cell.line + open_at}: '{BEGIN_MARKER}' is never closed; add "
            f"'{END_MARKER}' in the same cell, at the end of the exercise body"
        )
    return blocks


def exercise_stub(name: str) -> str:
    """The line a student sees in place of a solution."""
    return f'raise NotImplementedError("Exercise: {name} — replace this line with your code")'


def student_source(cell: Cell, path: Path | str, cell_index: int) -> str:
    """The cell's source with every solution block replaced by :func:`exercise_stub`."""
    lines = cell.source.split("\n")
    for block in reversed(find_solution_blocks(cell, path, cell_index)):
        stub = block.indent + exercise_stub(block.exercise_name)
        lines[block.begin : block.end + 1] = [stub]
    return "\n".join(lines)


def _cell_json(lab: LabSource, index: int, cell: Cell, source: str) -> dict:
    lines = source.splitlines(keepends=True)
    data: dict = {
        "cell_type": cell.cell_type,
        "id": f"{lab.name}-{index:03d}",
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
    from dtlab.workshop.exercises import list_exercises

    planned: dict[Path, str] = {}
    for path in lab_sources(root):
        lab = read_lab_source(path)
        list_exercises(lab)  # an exercise cell that breaks the authoring rule is a build error
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
