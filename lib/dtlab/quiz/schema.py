"""The shapes of a quiz item, its grade, and the errors a learner or an author can meet.

The field-by-field contract for item authors lives in :mod:`dtlab.quiz.bank` (and
``quizzes/README.md``); this module only holds the frozen dataclasses the loader builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KINDS = ("choice", "multi", "numeric", "ordering", "short", "code")

# Ordered from first contact to interview deep-dive; the index is the sort key.
DIFFICULTIES = ("easy", "medium", "hard")


class BankError(ValueError):
    """The question bank is malformed. ``problems`` lists every problem found, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        count = len(self.problems)
        header = (
            "the quiz bank has 1 problem" if count == 1 else f"the quiz bank has {count} problems"
        )
        super().__init__(header + ":\n  " + "\n  ".join(self.problems))


class AnswerError(ValueError):
    """A response of the wrong *shape* for the item (not a wrong answer): say what is expected."""


@dataclass(frozen=True)
class Choice:
    """One option of a ``choice`` or ``multi`` item, with why it is right or wrong."""

    key: str
    text: str
    correct: bool
    why: str


@dataclass(frozen=True)
class Step:
    """One step of an ``ordering`` item."""

    key: str
    text: str


@dataclass(frozen=True)
class Tolerance:
    """A numeric response passes when within ``rel`` (relative) OR ``abs`` (absolute) of the key."""

    rel: float = 1e-9
    abs: float = 0.0

    def accepts(self, response: float, key: float) -> bool:
        gap = abs(response - key)
        return gap <= self.abs or gap <= self.rel * abs(key)

    def describe(self) -> str:
        parts = []
        if self.rel > 1e-9:
            parts.append(f"±{self.rel:.3g} relative")
        if self.abs > 0:
            parts.append(f"±{self.abs:g} absolute")
        return " or ".join(parts) if parts else "exact"


@dataclass(frozen=True)
class NumericKey:
    """How a numeric item's answer is computed: ``scale * pick(call(*args, **kwargs))``.

    ``call`` is ``"dtlab.module.path:function"``. Any argument written as a mapping with a
    ``call`` entry is itself computed first (e.g. a config dataclass built from its kwargs).
    ``pick`` selects a field of the result (attribute or mapping key; dots for nesting).
    """

    call: str
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    scale: float = 1.0
    pick: str | None = None

    def describe(self) -> str:
        arguments = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        text = f"{self.call.replace(':', '.')}({', '.join(arguments)})"
        if self.pick:
            text += f".{self.pick}"
        if self.scale != 1.0:
            text += f" × {self.scale:g}"
        return text


@dataclass(frozen=True)
class Item:
    """One question. Kind-specific fields are empty/None for the other kinds."""

    id: str
    topic: str
    kind: str
    prompt: str
    explanation: str
    difficulty: str
    source: tuple[str, ...]
    link: str
    file: str = ""
    # a library symbol (``dtlab.module:attr``) that computes or implements the idea: the hint's
    # second pointer after the lab section in ``link``
    see: str = ""
    # choice / multi: False keeps the authored option order ("All of the above", a scale)
    shuffle: bool = True
    # choice / multi
    choices: tuple[Choice, ...] = ()
    # numeric
    key: NumericKey | None = None
    unit: str = ""
    tolerance: Tolerance = Tolerance()
    # ordering: ``steps`` in display order, ``answer`` the keys in the correct order
    steps: tuple[Step, ...] = ()
    # ordering (tuple of step keys) or short (the model answer text)
    answer: Any = None
    # short
    rubric: tuple[str, ...] = ()
    # code
    exercise: str | None = None

    @property
    def difficulty_rank(self) -> int:
        """0 for easy, 1 for medium, 2 for hard: sort by this."""
        return DIFFICULTIES.index(self.difficulty)

    def choice(self, key: str) -> Choice:
        for c in self.choices:
            if c.key == key:
                return c
        raise KeyError(key)

    @property
    def correct_keys(self) -> tuple[str, ...]:
        """The keys of the correct choices (choice/multi items)."""
        return tuple(c.key for c in self.choices if c.correct)


@dataclass(frozen=True)
class Grade:
    """The outcome of one attempt: pass/fail, a score in [0, 1], and what to tell the learner."""

    correct: bool
    score: float
    feedback: str

    def __bool__(self) -> bool:
        return self.correct
