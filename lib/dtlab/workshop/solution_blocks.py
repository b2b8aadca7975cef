"""The solution blocks of a lab source, and the stub a student sees in their place.

Inside a code cell of ``solutions/NN_name.py``, an exercise body sits between two marker lines::

    def ring_all_reduce(x):
        # BEGIN SOLUTION
        ...the reference answer...
        # END SOLUTION

:func:`find_solution_blocks` locates them (unbalanced markers are an error naming file:line) and
:func:`student_source` replaces each block, markers included, by one :func:`exercise_stub` line
at the block's indentation. The build (:mod:`dtlab.workshop.build`) writes the student notebook
from it; :mod:`dtlab.workshop.exercises` uses it to run both editions of an exercise cell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dtlab.workshop.source import Cell, LabSourceError

BEGIN_MARKER = "# BEGIN SOLUTION"
END_MARKER = "# END SOLUTION"

# Loose on purpose: "#BEGIN SOLUTION" or "# END SOLUTION (ring)" must never leak a solution.
_MARKER_LINE = re.compile(r"^#\s*(?P<which>BEGIN|END)\s+SOLUTION\b")
_ENCLOSING_DEF = re.compile(r"^(?P<indent>\s*)(?:async\s+)?(?:def|class)\s+(?P<name>\w+)")


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
