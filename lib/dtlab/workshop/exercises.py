"""Find the graded exercises of a lab source, so tests can grade the solution and the stub.

An exercise is a code cell with a ``# BEGIN SOLUTION`` … ``# END SOLUTION`` block inside a
function, graded by a later cell that calls::

    dtlab.quiz.check_exercise("collectives.ring_all_reduce", ring_all_reduce, cluster)

For each such call this module returns an :class:`Exercise`: the id, the function's name, the
lab's setup code, and the exercise cell in both editions. ``tests/test_lab_exercises.py`` then
proves, for every lab, that the solution passes its grader and the student stub fails it.

Rules for lab authors (the build enforces the second one):

1. **The first code cell is the setup cell**: imports and plain settings only — no cluster, no
   heavy work — because it is executed before every exercise in the tests.
2. **An exercise cell contains only definitions and imports** (``import``, ``def``, ``class``,
   constant assignments, a docstring), so it can run alone right after the setup cell. Helpers
   an exercise needs live in the library, in the setup cell, or in the exercise cell itself.
3. The grading call names the exercise function directly (``check_exercise("id", fn, cluster)``)
   and comes after the exercise cell.
4. **A function that later cells use declares a fallback** on its marker
   (``# BEGIN SOLUTION fallback=package.module:function``, see :mod:`dtlab.workshop.stubs`), so
   the student notebook runs top to bottom before the learner writes it. A grading call is not
   a use: ``check_exercise`` reports an unwritten stub as "Not yet" and never raises. The build
   enforces this rule too (:func:`check_fallbacks`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from dtlab.workshop.solution_blocks import find_solution_blocks, student_source
from dtlab.workshop.source import Cell, LabSource, LabSourceError

_ALLOWED_STATEMENTS = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
)


@dataclass(frozen=True)
class Exercise:
    """One graded exercise of a lab, ready to execute: setup code, then one edition of the cell."""

    lab: str
    exercise_id: str
    function_name: str
    setup_code: str
    solution_code: str
    student_code: str
    cell_line: int  # where the exercise cell starts in the source, for error messages

    def __str__(self) -> str:
        return f"{self.lab}:{self.exercise_id}"


def _parse(cell: Cell, lab: LabSource) -> ast.Module:
    try:
        return ast.parse(cell.source)
    except SyntaxError as err:
        line = cell.line + (err.lineno or 1) - 1
        raise LabSourceError(f"{lab.path}:{line}: syntax error: {err.msg}") from None


def _is_constant_definition(node: ast.stmt) -> bool:
    value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
    if value is None:
        return False
    try:
        ast.literal_eval(value)
    except ValueError:
        return False
    return True


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def check_exercise_cell(cell: Cell, lab: LabSource) -> None:
    """Raise :class:`LabSourceError` unless the cell holds only definitions and imports."""
    for node in _parse(cell, lab).body:
        if isinstance(node, _ALLOWED_STATEMENTS) or _is_docstring(node):
            continue
        if _is_constant_definition(node):
            continue
        line = cell.line + node.lineno - 1
        raise LabSourceError(
            f"{lab.path}:{line}: an exercise cell may hold only imports and definitions "
            f"(found `{ast.unparse(node).splitlines()[0][:60]}`); move this statement to the "
            "next cell so the exercise can be graded on its own"
        )


def _grading_calls(cell: Cell, lab: LabSource) -> list[tuple[str, str, int]]:
    """``(exercise id, function name, source line)`` of each ``check_exercise`` call."""
    calls = []
    for node in ast.walk(_parse(cell, lab)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name != "check_exercise":
            continue
        line = cell.line + node.lineno - 1
        args = node.args
        if (
            len(args) < 2
            or not isinstance(args[0], ast.Constant)
            or not isinstance(args[0].value, str)
            or not isinstance(args[1], ast.Name)
        ):
            raise LabSourceError(
                f'{lab.path}:{line}: write the grading call as check_exercise("topic.name", '
                "function_name, cluster) — a literal id and the function's own name"
            )
        calls.append((args[0].value, args[1].id, line))
    return calls


def _defined_names(cell: Cell, lab: LabSource) -> set[str]:
    nodes = _parse(cell, lab).body
    return {n.name for n in nodes if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _uses(cell: Cell, lab: LabSource, names: set[str]) -> dict[str, int]:
    """``name → source line`` of each of ``names`` the cell reads, grading calls left out."""
    tree = _parse(cell, lab)
    graded = {
        id(node.args[1])
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and len(node.args) >= 2
        and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "check_exercise"
    }
    used: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in names and id(node) not in graded:
            used.setdefault(node.id, cell.line + node.lineno - 1)
    return used


def check_fallbacks(lab: LabSource) -> None:
    """Raise :class:`LabSourceError` when a later cell uses an exercise function that has no
    fallback: in the student notebook that cell would raise and stop Run All."""
    code_cells = [(i, c) for i, c in enumerate(lab.cells) if c.cell_type == "code"]
    for position, (index, cell) in enumerate(code_cells):
        blocks = find_solution_blocks(cell, lab.path, index)
        bare = {
            b.exercise_name for b in blocks if b.fallback is None and "." not in b.exercise_name
        }
        bare &= _defined_names(cell, lab)
        if not bare:
            continue
        for _, later in code_cells[position + 1 :]:
            for name, line in _uses(later, lab, bare).items():
                raise LabSourceError(
                    f"{lab.path}:{line}: this cell calls {name}(), which the student notebook "
                    f"leaves unwritten, so Run All would stop here; declare what stands in for it "
                    f"on its marker: '# BEGIN SOLUTION fallback=package.module:function'"
                )


def list_exercises(lab: LabSource) -> list[Exercise]:
    """Every graded exercise of ``lab``, in the order the grading calls appear."""
    code_cells = [(i, c) for i, c in enumerate(lab.cells) if c.cell_type == "code"]
    if not code_cells:
        return []
    setup_code = code_cells[0][1].source
    exercise_cells = [
        (i, c)
        for i, c in code_cells
        if find_solution_blocks(c, lab.path, i) and i != code_cells[0][0]
    ]
    exercises: list[Exercise] = []
    for position, cell in code_cells:
        for exercise_id, function_name, line in _grading_calls(cell, lab):
            defining = [
                (i, c)
                for i, c in exercise_cells
                if i < position and function_name in _defined_names(c, lab)
            ]
            if not defining:
                raise LabSourceError(
                    f"{lab.path}:{line}: {exercise_id!r} grades {function_name!r}, but no earlier "
                    f"cell defines {function_name}() with a '# BEGIN SOLUTION' block"
                )
            index, exercise_cell = defining[-1]
            check_exercise_cell(exercise_cell, lab)
            exercises.append(
                Exercise(
                    lab=lab.name,
                    exercise_id=exercise_id,
                    function_name=function_name,
                    setup_code=setup_code,
                    solution_code=exercise_cell.source,
                    student_code=student_source(exercise_cell, lab.path, index),
                    cell_line=exercise_cell.line,
                )
            )
    return exercises


def load_exercise_function(exercise: Exercise, edition: str):
    """Execute the setup cell and one edition of the exercise cell; return the function.

    The code runs in a fresh namespace named ``__dtlab_exercise__`` (not an importable module),
    so cloudpickle ships the function to the ranks by value, as it would from a notebook.
    """
    if edition not in ("solution", "student"):
        raise ValueError(f"edition {edition!r}: choose 'solution' or 'student'")
    code = exercise.solution_code if edition == "solution" else exercise.student_code
    namespace: dict = {"__name__": "__dtlab_exercise__"}
    exec(compile(exercise.setup_code, f"<{exercise.lab} setup cell>", "exec"), namespace)
    exec(compile(code, f"<{exercise.lab} {exercise.function_name} ({edition})>", "exec"), namespace)
    return namespace[exercise.function_name]
