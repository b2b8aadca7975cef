"""The solution blocks of a lab source, and the stub a student sees in their place.

Inside a code cell of ``solutions/NN_name.py``, an exercise body sits between two marker lines::

    def ring_all_reduce(x):
        # BEGIN SOLUTION
        ...the reference answer...
        # END SOLUTION

:func:`find_solution_blocks` locates them (unbalanced markers are an error naming file:line) and
:func:`student_source` replaces each block, markers included, by one :func:`exercise_stub` line
at the block's indentation, ``raise ExerciseNotWritten("ring_all_reduce")``, naming the function
or method to write (``VocabParallelCrossEntropy.forward`` inside a class), and imports
:class:`~dtlab.workshop.stubs.ExerciseNotWritten` at the top of the cell.

When later cells call the exercise's function, its marker names the library function that
computes the same thing, ``# BEGIN SOLUTION fallback=dtlab.parallel.context:merge``; the student
edition then decorates the function with :func:`~dtlab.workshop.stubs.until_written`, so Run All
goes on with the library's answer until the learner writes theirs. A fallback is allowed only on
a block directly inside a top-level function (the decorator wraps that function).

The build (:mod:`dtlab.workshop.build`) writes the student notebook from it;
:mod:`dtlab.workshop.exercises` uses it to run both editions of an exercise cell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dtlab.workshop.source import Cell, LabSourceError

BEGIN_MARKER = "# BEGIN SOLUTION"
END_MARKER = "# END SOLUTION"

# Loose on purpose: "#BEGIN SOLUTION" or "# END SOLUTION (ring)" must never leak a solution.
_MARKER_LINE = re.compile(r"^#\s*(?P<which>BEGIN|END)\s+SOLUTION\b(?P<rest>.*)$")
_FALLBACK = re.compile(r"^fallback=(?P<ref>[A-Za-z_][\w.]*:[A-Za-z_]\w*)$")
STUB_IMPORT = "from dtlab.workshop.stubs import ExerciseNotWritten"
FALLBACK_IMPORT = "from dtlab.workshop.stubs import ExerciseNotWritten, until_written"
_ENCLOSING_DEF = re.compile(r"^(?P<indent>\s*)(?:async\s+)?(?:def|class)\s+(?P<name>\w+)")


@dataclass(frozen=True)
class SolutionBlock:
    """One exercise body in a code cell: lines ``begin``..``end`` (0-based, markers included)."""

    begin: int
    end: int
    indent: str
    exercise_name: str  # qualified: "merge", "VocabParallelCrossEntropy.forward"
    fallback: str | None = None  # "package.module:function" later cells use until it is written
    def_line: int | None = None  # the enclosing top-level ``def`` (0-based), when a fallback is set


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _enclosing(lines: list[str], begin: int, indent: str) -> list[tuple[int, str]]:
    """``(line, name)`` of every ``def``/``class`` enclosing line ``begin``, innermost first."""
    found_all = []
    for number in range(begin - 1, -1, -1):
        found = _ENCLOSING_DEF.match(lines[number])
        if found and len(found["indent"]) < len(indent):
            found_all.append((number, found["name"]))
            indent = found["indent"]
    return found_all


def _parse_fallback(rest: str, where: str) -> str | None:
    """The ``fallback=`` reference after a BEGIN marker; other text there is a comment."""
    if "fallback" not in rest:
        return None
    found = _FALLBACK.match(rest.strip())
    if found is None:
        raise LabSourceError(
            f"{where}: cannot read {rest.strip()!r} after the marker; write nothing, or "
            f"'{BEGIN_MARKER} fallback=package.module:function'"
        )
    return found["ref"]


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
            fallback = _parse_fallback(marker["rest"], where)
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
            enclosing = _enclosing(lines, open_at, indent)
            name = ".".join(n for _, n in reversed(enclosing)) or f"cell {cell_index}"
            def_line = None
            if fallback is not None:
                if len(enclosing) != 1 or not lines[enclosing[0][0]].lstrip().startswith(
                    ("def ", "async def ")
                ):
                    raise LabSourceError(
                        f"{path}:{cell.line + open_at}: a fallback needs a block directly inside "
                        "a top-level function (it decorates that function); move it there or "
                        "drop 'fallback='"
                    )
                def_line = enclosing[0][0]
            blocks.append(SolutionBlock(open_at, i, indent, name, fallback, def_line))
            open_at = None
    if open_at is not None:
        raise LabSourceError(
            f"{path}:{cell.line + open_at}: '{BEGIN_MARKER}' is never closed; add "
            f"'{END_MARKER}' in the same cell, at the end of the exercise body"
        )
    return blocks


def exercise_stub(name: str) -> str:
    """The line a student sees in place of a solution."""
    return f'raise ExerciseNotWritten("{name}")  # replace this line with your code'


def _decorator_line(lines: list[str], def_line: int) -> int:
    """Where a new outermost decorator of the ``def`` at ``def_line`` goes: above its others."""
    while def_line > 0 and lines[def_line - 1].startswith("@"):
        def_line -= 1
    return def_line


def student_source(cell: Cell, path: Path | str, cell_index: int) -> str:
    """The cell's source with every solution block replaced by :func:`exercise_stub`, the stub's
    exception imported first, and each function with a fallback wrapped in ``until_written``."""
    blocks = find_solution_blocks(cell, path, cell_index)
    if not blocks:
        return cell.source
    lines = cell.source.split("\n")
    edits = [(b.begin, b.end + 1, [b.indent + exercise_stub(b.exercise_name)]) for b in blocks]
    for block in blocks:
        if block.fallback is not None:
            at = _decorator_line(lines, block.def_line)
            edits.append((at, at, [f'@until_written(fallback="{block.fallback}")']))
    for start, stop, new in sorted(edits, reverse=True):
        lines[start:stop] = new
    uses_fallback = any(b.fallback for b in blocks)
    return "\n".join([FALLBACK_IMPORT if uses_fallback else STUB_IMPORT, "", *lines])
