"""Workshop tooling: one lab source builds the solution and the student notebook.

* :mod:`dtlab.workshop.source` — read a ``solutions/NN_name.py`` percent-format source;
* :mod:`dtlab.workshop.solution_blocks` — the ``# BEGIN/END SOLUTION`` blocks of a source and
  the stub that replaces each in the student edition;
* :mod:`dtlab.workshop.build` — write ``solutions/NN_name.ipynb`` and ``labs/NN_name.ipynb``
  (``dtlab workshop build [--check]``);
* :mod:`dtlab.workshop.exercises` — the graded exercises of a lab, for the tests that prove
  every solution passes its grader and every student stub fails it;
* :mod:`dtlab.workshop.stubs` — what an unwritten exercise does in the student notebook: raise
  :class:`ExerciseNotWritten` when graded, let later cells use the library's answer;
* :mod:`dtlab.workshop.references` — library answers reshaped to an exercise's return type.
"""

from dtlab.workshop.build import build, find_repo_root, render_notebook, stale_notebooks
from dtlab.workshop.exercises import Exercise, list_exercises, load_exercise_function
from dtlab.workshop.source import Cell, LabSource, LabSourceError, parse_lab_source, read_lab_source

__all__ = [
    "Cell",
    "Exercise",
    "LabSource",
    "LabSourceError",
    "build",
    "find_repo_root",
    "list_exercises",
    "load_exercise_function",
    "parse_lab_source",
    "read_lab_source",
    "render_notebook",
    "stale_notebooks",
]
