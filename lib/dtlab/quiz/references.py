"""What loading a bank does not check: that every item's references resolve in the library.

:func:`dtlab.quiz.bank.load_bank` checks structure only and imports nothing, so it stays fast for
the CLI and the notebook cells. :func:`reference_problems` does the slow part — computes every
numeric key (:mod:`dtlab.quiz.keys`), imports every ``see`` library symbol and looks up every
``code`` item's exercise among the registered graders (:mod:`dtlab.quiz.exercises`, which imports
them all) — and the test suite runs it on the bank.
"""

from __future__ import annotations

from dtlab.quiz.bank import Bank
from dtlab.quiz.exercises import known_exercises
from dtlab.quiz.keys import KeyComputationError, compute_key
from dtlab.quiz.links import symbol_problem


def reference_problems(bank: Bank) -> list[str]:
    """Resolve what loading does not: numeric keys, ``see`` symbols, exercise ids. [] when all good."""
    problems = []
    exercises = None
    for item in bank.values():
        where = f"{item.file}: item {item.id!r}"
        if item.kind == "numeric":
            try:
                compute_key(item)
            except KeyComputationError as error:
                problems.append(f"{where}: {error}")
        if item.kind == "code":
            exercises = exercises if exercises is not None else known_exercises()
            if item.exercise not in exercises:
                problems.append(f"{where}: exercise {item.exercise!r} is not registered")
        if item.see:
            problem = symbol_problem(item.see)
            if problem:
                problems.append(f"{where}: {problem}")
    return problems
