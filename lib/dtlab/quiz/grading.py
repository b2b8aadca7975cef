"""Grade one response to one item: ``grade(item, response) -> Grade(correct, score, feedback)``.

What a response looks like, per kind:

* ``choice``   — the chosen key, ``"b"`` (case-insensitive).
* ``multi``    — the selected keys, ``["a", "c"]`` (or ``"a, c"``); may be empty.
* ``numeric``  — a number, or text read by :func:`dtlab.quiz.units.parse_number` (``"1.5 TB"``).
* ``ordering`` — every step key once, in the learner's order: ``["c", "a", "b"]`` (or ``"c a b"``).
* ``short``    — the rubric points the learner ticked, as 0-based indices ``[0, 2]`` or a list of
  booleans, one per point.
* ``code``     — the learner's function; it runs on ``cluster`` (a fresh one when None).

A response of the wrong *shape* (text for a number, an unknown key, an ordering that is not a
permutation) raises :class:`AnswerError` with what is expected — it is never graded as wrong.
Feedback is plain text: the verdict, why each chosen (or missed) option is right or wrong, and
the item's explanation. It is the full report for item authors and tests (it names the key and
how the library computed it); learners never see it: quiz cells and the drill show
:mod:`dtlab.quiz.feedback`'s hint-then-answer Markdown instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from dtlab.quiz.keys import compute_key
from dtlab.quiz.schema import AnswerError, Grade, Item
from dtlab.quiz.units import parse_number, slip_hint


def _as_keys(response: object, what: str) -> list[str]:
    if isinstance(response, str):
        return [k for k in re.split(r"[\s,]+", response.strip()) if k]
    if isinstance(response, Iterable) and not isinstance(response, (bytes, dict)):
        keys = list(response)
        if all(isinstance(k, str) for k in keys):
            return keys
    raise AnswerError(f"expected {what}, got {response!r}")


def _canonical_key(item: Item, given: str) -> str:
    keys = [c.key for c in item.choices]
    if given in keys:
        return given
    folded = [k for k in keys if k.lower() == given.lower()]
    if len(folded) == 1:
        return folded[0]
    raise AnswerError(f"{given!r} is not one of the choices; choose from {', '.join(keys)}")


def _verdict(correct: bool, score: float) -> str:
    if correct:
        return "Correct."
    return f"Partly right ({score:.0%})." if score > 0 else "Not quite."


def _grade_choice(item: Item, response: object) -> Grade:
    if not isinstance(response, str):
        raise AnswerError(f"expected one choice key such as 'a', got {response!r}")
    chosen = item.choice(_canonical_key(item, response.strip()))
    lines = [_verdict(chosen.correct, float(chosen.correct)), f"({chosen.key}) {chosen.why}"]
    if not chosen.correct:
        right = item.choice(item.correct_keys[0])
        lines.append(f"The answer is ({right.key}) {right.text}")
        lines.append(right.why)
    lines.append(item.explanation)
    return Grade(chosen.correct, float(chosen.correct), "\n".join(lines))


def _grade_multi(item: Item, response: object) -> Grade:
    selected = {_canonical_key(item, k) for k in _as_keys(response, "a list of choice keys")}
    judged_right, notes = 0, []
    for choice in item.choices:
        picked = choice.key in selected
        if picked == choice.correct:
            judged_right += 1
            if picked:
                notes.append(f"✓ ({choice.key}) is right: {choice.why}")
        elif picked:
            notes.append(f"✗ ({choice.key}) should not be selected: {choice.why}")
        else:
            notes.append(f"✗ ({choice.key}) should also be selected: {choice.why}")
    score = judged_right / len(item.choices)
    correct = judged_right == len(item.choices)
    return Grade(correct, score, "\n".join([_verdict(correct, score), *notes, item.explanation]))


def _grade_numeric(item: Item, response: object) -> Grade:
    value = parse_number(response, item.unit)
    key = compute_key(item)
    correct = item.tolerance.accepts(value, key)
    unit = f" {item.unit}" if item.unit else ""
    lines = [_verdict(correct, float(correct))]
    if correct:
        lines.append(f"The answer is {key:.6g}{unit}; you said {value:.6g}{unit}.")
    else:
        lines.append(
            f"You said {value:.6g}{unit}; the answer is {key:.6g}{unit} "
            f"(accepted: {item.tolerance.describe()})."
        )
        hint = slip_hint(value, key)
        if hint:
            lines.append(hint)
    lines.append(item.explanation)
    return Grade(correct, float(correct), "\n".join(lines))


def _grade_ordering(item: Item, response: object) -> Grade:
    order = _as_keys(response, "a list of step keys")
    keys = [s.key for s in item.steps]
    missing = [k for k in keys if k not in order]
    repeated = sorted({k for k in order if order.count(k) > 1})
    unknown = [k for k in order if k not in keys]
    if missing or repeated or unknown:
        details = "; ".join(
            f"{label}: {', '.join(values)}"
            for label, values in (
                ("missing", missing),
                ("repeated", repeated),
                ("unknown", unknown),
            )
            if values
        )
        raise AnswerError(
            f"an ordering must use each of the steps {', '.join(keys)} exactly once ({details})"
        )
    position = {k: i for i, k in enumerate(item.answer)}
    pairs = [(a, b) for i, a in enumerate(order) for b in order[i + 1 :]]
    in_order = sum(position[a] < position[b] for a, b in pairs)
    score = in_order / len(pairs)
    correct = list(order) == list(item.answer)
    text = {s.key: s.text for s in item.steps}
    lines = [_verdict(correct, score)]
    if not correct:
        first_wrong = next(
            i for i, (got, want) in enumerate(zip(order, item.answer, strict=True)) if got != want
        )
        lines.append(f"Step {first_wrong + 1} should be: {text[item.answer[first_wrong]]}")
        lines.append("The correct order:")
        lines.extend(f"  {i + 1}. {text[k]}" for i, k in enumerate(item.answer))
    lines.append(item.explanation)
    return Grade(correct, score, "\n".join(lines))


def _grade_short(item: Item, response: object) -> Grade:
    points = item.rubric
    if isinstance(response, Iterable) and not isinstance(response, (str, bytes, dict)):
        ticks = list(response)
    else:
        raise AnswerError(
            f"expected the ticked rubric points as indices 0..{len(points) - 1}, got {response!r}"
        )
    if ticks and all(isinstance(t, bool) for t in ticks):
        if len(ticks) != len(points):
            raise AnswerError(
                f"expected {len(points)} true/false ticks (one per rubric point), got {len(ticks)}"
            )
        ticked = {i for i, t in enumerate(ticks) if t}
    elif all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < len(points) for t in ticks
    ):
        ticked = set(ticks)
    else:
        raise AnswerError(
            f"ticked rubric points must be indices 0..{len(points) - 1}, got {ticks!r}"
        )
    score = len(ticked) / len(points)
    correct = len(ticked) == len(points)
    lines = [_verdict(correct, score), f"Model answer: {item.answer}"]
    missed = [p for i, p in enumerate(points) if i not in ticked]
    if missed:
        lines.append("Points to add next time:")
        lines.extend(f"  - {p}" for p in missed)
    lines.append(item.explanation)
    return Grade(correct, score, "\n".join(lines))


def _grade_code(item: Item, response: object, cluster: object = None) -> Grade:
    if not callable(response):
        raise AnswerError(
            f"a code item is answered with your function, got {type(response).__name__}"
        )
    from dtlab.quiz.exercises import check_exercise

    result = check_exercise(item.exercise, response, cluster, record=False)
    return Grade(result.passed, float(result.passed), f"{result.message}\n{item.explanation}")


_GRADERS: dict[str, Callable[[Item, object], Grade]] = {
    "choice": _grade_choice,
    "multi": _grade_multi,
    "numeric": _grade_numeric,
    "ordering": _grade_ordering,
    "short": _grade_short,
}


def grade(item: Item, response: object, *, cluster: object = None) -> Grade:
    """Grade ``response`` to ``item`` (see the module docstring for each kind's response shape)."""
    if item.kind == "code":
        return _grade_code(item, response, cluster)
    return _GRADERS[item.kind](item, response)
