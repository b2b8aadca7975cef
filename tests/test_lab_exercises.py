"""Every graded exercise of every lab: the solution passes its grader, the student stub fails it.

The exercises are read from the lab sources (``solutions/NN_*.py``) by
:mod:`dtlab.workshop.exercises`; each runs on the shared warm cluster of the world size its
grader declares.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dtlab.quiz import check_exercise, known_exercises
from dtlab.workshop.build import lab_sources
from dtlab.workshop.exercises import list_exercises, load_exercise_function
from dtlab.workshop.source import read_lab_source

REPO = Path(__file__).resolve().parents[1]
EXERCISES = [e for path in lab_sources(REPO) for e in list_exercises(read_lab_source(path))]


def cluster_for(exercise_id: str, request: pytest.FixtureRequest):
    registered = known_exercises().get(exercise_id)
    assert registered is not None, f"{exercise_id!r} has no grader in lib/dtlab/quiz/graders/"
    world_size = registered.world_size
    assert world_size in (2, 3, 4), f"{exercise_id}: no shared cluster of world size {world_size}"
    return request.getfixturevalue(f"cluster{world_size}")


@pytest.mark.parametrize("exercise", EXERCISES, ids=str)
def test_lab_solution_passes_its_grader(exercise, request):
    fn = load_exercise_function(exercise, "solution")
    result = check_exercise(
        exercise.exercise_id, fn, cluster_for(exercise.exercise_id, request), record=False
    )
    assert result, (
        f"{exercise} (solutions/{exercise.lab}.py:{exercise.cell_line}): {result.message}"
    )


@pytest.mark.parametrize("exercise", EXERCISES, ids=str)
def test_lab_student_stub_fails_its_grader(exercise, request):
    fn = load_exercise_function(exercise, "student")
    result = check_exercise(
        exercise.exercise_id, fn, cluster_for(exercise.exercise_id, request), record=False
    )
    assert not result, f"{exercise}: the student stub passes its grader"
    assert "Not implemented yet" in result.message


def test_every_lab_exercise_has_a_distinct_id():
    ids = [e.exercise_id for e in EXERCISES]
    assert len(ids) == len(set(ids)), f"an exercise id is graded twice: {sorted(ids)}"
