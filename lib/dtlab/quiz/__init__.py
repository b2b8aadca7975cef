"""Graded questions and exercises: the bank, grading, notebook quiz cells, progress records.

In a lab notebook::

    from dtlab.quiz import ask, check_exercise
    ask("setup.world_size")                               # an interactive quiz cell
    check_exercise("setup.rank_sum", rank_sum, cluster)   # runs your function on the ranks

Item authors: the schema is in :mod:`dtlab.quiz.bank` and ``quizzes/README.md``.
"""

from dtlab.quiz.bank import Bank, bank_version, cached_bank, load_bank
from dtlab.quiz.exercises import GradeResult, check_exercise, exercise, known_exercises
from dtlab.quiz.grading import grade
from dtlab.quiz.keys import KeyComputationError, compute_key
from dtlab.quiz.practice import attempt, get_item, item_as_text, items_for, shown_order, topics
from dtlab.quiz.progress import Progress, learner_id, read_progress, record_attempt
from dtlab.quiz.references import reference_problems
from dtlab.quiz.schema import AnswerError, BankError, Grade, Item
from dtlab.quiz.units import parse_number

__all__ = [
    "AnswerError",
    "Bank",
    "BankError",
    "Grade",
    "GradeResult",
    "Item",
    "KeyComputationError",
    "Progress",
    "QuizCell",
    "ask",
    "attempt",
    "bank_version",
    "cached_bank",
    "check_exercise",
    "compute_key",
    "exercise",
    "get_item",
    "grade",
    "item_as_text",
    "items_for",
    "known_exercises",
    "learner_id",
    "load_bank",
    "parse_number",
    "read_progress",
    "record_attempt",
    "reference_problems",
    "shown_order",
    "topics",
]


def __getattr__(name: str):
    # ipywidgets is only needed for notebook cells; the CLI and tests of grading stay light.
    if name in ("ask", "QuizCell"):
        from dtlab.quiz import widgets

        return getattr(widgets, name)
    raise AttributeError(f"module 'dtlab.quiz' has no attribute {name!r}")
