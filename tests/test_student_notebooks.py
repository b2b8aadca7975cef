"""A student notebook runs top to bottom with every exercise unwritten.

nbval runs every ``labs/NN_*.ipynb`` in the normal ``pytest`` run (pyproject's ``testpaths``);
these tests prove the mechanism underneath: a later cell that calls an unwritten exercise gets the
library's stand-in and one printed line, while the grader still grades the learner's own stub.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from dtlab.quiz import check_exercise, known_exercises
from dtlab.workshop import stubs
from dtlab.workshop.build import lab_sources
from dtlab.workshop.exercises import list_exercises, load_exercise_function
from dtlab.workshop.solution_blocks import find_solution_blocks
from dtlab.workshop.source import read_lab_source

REPO = Path(__file__).resolve().parents[1]
LABS = [read_lab_source(path) for path in lab_sources(REPO)]
EXERCISES = {e.exercise_id: e for lab in LABS for e in list_exercises(lab)}


def _fallbacks() -> dict[str, str]:
    """Function name → declared fallback, over every lab."""
    found = {}
    for lab in LABS:
        for index, cell in enumerate(lab.cells):
            if cell.cell_type == "code":
                for block in find_solution_blocks(cell, lab.path, index):
                    if block.fallback:
                        found[block.exercise_name] = block.fallback
    return found


FALLBACKS = _fallbacks()
WITH_FALLBACK = [e for e in EXERCISES.values() if e.function_name in FALLBACKS]


def _blocks(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    o = [torch.randn(2, 3, 4, generator=g) for _ in range(2)]
    lse = [torch.randn(2, 3, generator=g) for _ in range(2)]
    return o[0], lse[0], o[1], lse[1]


def test_pytest_runs_every_student_notebook():
    testpaths = re.search(r"^testpaths = \[(.*)\]$", (REPO / "pyproject.toml").read_text(), re.M)
    assert testpaths and '"labs"' in testpaths[1]
    assert len(list((REPO / "labs").glob("[0-9][0-9]_*.ipynb"))) == len(LABS)


def test_a_later_cell_gets_the_library_merge_and_one_line_per_cell(capsys, monkeypatch):
    from dtlab.parallel.context import merge as library_merge

    merge = load_exercise_function(EXERCISES["context_parallel.merge"], "student")
    cell = [7]
    monkeypatch.setattr(stubs, "_execution_count", lambda: cell[0])
    o, lse = merge(*_blocks())
    merge(*_blocks(1))
    want_o, want_lse = library_merge(*_blocks())
    assert torch.equal(o, want_o) and torch.equal(lse, want_lse)
    line = "your merge is not written yet — using dtlab.parallel.context.merge to continue\n"
    assert capsys.readouterr().out == line  # once in the cell, not once per call
    cell[0] = 8
    merge(*_blocks())
    assert capsys.readouterr().out == line  # and again in the next cell


def test_the_grader_still_grades_the_unwritten_stub(cluster2):
    merge = load_exercise_function(EXERCISES["context_parallel.merge"], "student")
    result = check_exercise("context_parallel.merge", merge, cluster2, record=False)
    assert not result
    assert result.message.startswith("Not implemented yet: write the body of `merge`")
    assert "ExerciseNotWritten" in result.details["traceback (tail)"]


def test_a_written_exercise_runs_the_learners_code_and_prints_nothing(capsys):
    @stubs.until_written(fallback="operator:neg")
    def double(x):
        return 2 * x

    assert double(3) == 6 and capsys.readouterr().out == ""
    assert stubs.learner_function(double)(4) == 8


def test_another_unwritten_exercise_the_learner_calls_is_not_hidden():
    def helper():
        raise stubs.ExerciseNotWritten("helper")

    @stubs.until_written(fallback="operator:neg")
    def double(x):
        return helper()

    with pytest.raises(stubs.ExerciseNotWritten, match="helper is not written yet"):
        double(3)


def test_a_fallback_that_does_not_import_names_the_reference():
    with pytest.raises(ImportError, match="'dtlab.no_such:thing' cannot be imported"):
        stubs.resolve_fallback("dtlab.no_such:thing")


def test_every_exercise_a_later_cell_uses_has_a_fallback_the_build_checked():
    assert set(FALLBACKS) == {"my_one_f_one_b", "merge", "memory_per_gpu", "choose_plan"}
    assert {e.function_name for e in WITH_FALLBACK} == set(FALLBACKS)


@pytest.mark.parametrize("exercise", WITH_FALLBACK, ids=str)
def test_every_fallback_computes_the_exercises_answer(exercise, request):
    """The grader finds the stand-in right (it may refuse it as the library's own answer)."""
    fallback = stubs.resolve_fallback(FALLBACKS[exercise.function_name])
    world_size = known_exercises()[exercise.exercise_id].world_size
    cluster = request.getfixturevalue(f"cluster{world_size}")
    result = check_exercise(exercise.exercise_id, fallback, cluster, record=False)
    assert result or result.message.startswith("The result is right"), result.message
