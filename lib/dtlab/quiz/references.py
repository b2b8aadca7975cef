"""What loading a bank does not check: that every item's references resolve in the library.

:func:`dtlab.quiz.bank.load_bank` checks structure only and imports nothing, so it stays fast for
the CLI and the notebook cells. :func:`reference_problems` does the slow part — computes every
numeric key (:mod:`dtlab.quiz.keys`), imports every library-symbol ``link`` and looks up every
``code`` item's exercise among the registered graders (:mod:`dtlab.quiz.exercises`, which imports
them all) — and the test suite runs it on the bank.
"""

from __future__ import annotations

import importlib

from dtlab.quiz.bank import Bank
from dtlab.quiz.exercises import known_exercises
from dtlab.quiz.keys import KeyComputationError, compute_key


def reference_problems(bank: Bank) -> list[str]:
    """Resolve what loading does not: numeric keys, symbol links, exercise ids. [] when all good."""
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
        if item.link.startswith("dtlab"):
            module_name, _, attribute = item.link.partition(":")
            try:
                target = importlib.import_module(module_name)
                for part in filter(None, attribute.split(".")):
                    target = getattr(target, part)
            except (ImportError, AttributeError) as error:
                problems.append(f"{where}: link {item.link!r} does not resolve ({error})")
    return problems
