"""Graded coding exercises: a registry of graders and ``check_exercise``, which never raises.

A grader runs the learner's function on real ranks and compares it with the reference::

    @exercise("setup.rank_sum", title="All-reduce your rank", world_size=2)
    def grade(fn, cluster) -> GradeResult:
        results = cluster.run(fn)
        assert_all_ranks_close(results, expected_rank_sum(cluster.world_size), "the sum")
        return GradeResult(True, "every rank holds the sum")

Graders live in ``dtlab/quiz/graders/<topic>.py`` and are imported lazily the first time an
exercise is looked up. A lab cell calls ``check_exercise("setup.rank_sum", rank_sum, cluster)``:
the learner's stub raising ``NotImplementedError`` (the student notebook's
:class:`~dtlab.workshop.stubs.ExerciseNotWritten`, which names the function or method still to
write — not always the graded function: lab 04 grades ``vocab_parallel_cross_entropy`` and the
learner writes ``VocabParallelCrossEntropy.forward``), an error on a rank, a hang, a dead rank, a
mismatch (an ``AssertionError`` from the grader), a right result reached without the skill
(:class:`NotTheSkill`) — each becomes a failed :class:`GradeResult` with a message for the
learner, so a student notebook still runs top to bottom. The learner's own function is graded,
never the library stand-in :func:`~dtlab.workshop.stubs.until_written` puts around it.

Why a check failed is put in the learner's words by :mod:`dtlab.quiz.failures`. The
"Not yet"/"Passed" box renders its message as Markdown with the quiz feedback's
:func:`~dtlab.quiz.feedback.markdown_to_html` (`code` in backticks, one line per line); details
stay preformatted.
"""

from __future__ import annotations

import html
import importlib
import math
import pkgutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtlab.quiz.failures import NotTheSkill as NotTheSkill  # graders import it from here
from dtlab.quiz.failures import explain_failure


@dataclass
class GradeResult:
    """The outcome of one exercise check; falsy when failed, rendered as a coloured box."""

    passed: bool
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    exercise_id: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        mark = "PASSED" if self.passed else "FAILED"
        return f"[{mark}] {self.exercise_id}: {self.message}".rstrip()

    def _repr_html_(self) -> str:
        # No <table>: notebook front ends right-align table cells, which made tracebacks unreadable.
        colour, mark = ("#1a7f37", "✔ Passed") if self.passed else ("#cf222e", "✘ Not yet")
        rows = "".join(
            f"<div style='text-align:left'><b>{html.escape(str(k))}</b>"
            f"<pre style='text-align:left;white-space:pre-wrap;margin:2px 0 6px 0'>"
            f"{html.escape(str(v))}</pre></div>"
            for k, v in self.details.items()
        )
        details = f"<details><summary>details</summary>{rows}</details>" if rows else ""
        return (
            f"<div style='border-left:4px solid {colour};padding:4px 10px;text-align:left'>"
            f"<b style='color:{colour}'>{mark}</b> <code>{html.escape(self.exercise_id)}</code>"
            f"<div style='margin:4px 0'>{message_html(self.message)}</div>"
            f"{details}</div>"
        )


def message_html(message: str) -> str:
    """A grade message as HTML: Markdown (backticks become code), each line kept as a line."""
    from dtlab.quiz.feedback import markdown_to_html

    return markdown_to_html(message.rstrip().replace("\n", "  \n"))


@dataclass(frozen=True)
class Exercise:
    id: str
    topic: str
    title: str
    grade: Callable[[Callable, Any], GradeResult]
    world_size: int = 2


_registry: dict[str, Exercise] = {}
_grader_import_errors: dict[str, str] = {}
_graders_loaded = False


def exercise(
    exercise_id: str, *, topic: str | None = None, title: str | None = None, world_size: int = 2
) -> Callable:
    """Register ``grade(fn, cluster) -> GradeResult`` as the grader of ``exercise_id``."""

    def register(grade: Callable) -> Callable:
        existing = _registry.get(exercise_id)
        same = existing is not None and (
            existing.grade.__module__,
            existing.grade.__qualname__,
        ) == (
            grade.__module__,
            grade.__qualname__,
        )
        if existing is not None and not same:
            raise ValueError(
                f"exercise {exercise_id!r} is already graded by "
                f"{existing.grade.__module__}.{existing.grade.__qualname__}"
            )
        _registry[exercise_id] = Exercise(
            exercise_id, topic or exercise_id.split(".")[0], title or exercise_id, grade, world_size
        )
        return grade

    return register


def _load_graders() -> None:
    global _graders_loaded
    if _graders_loaded:
        return
    from dtlab.quiz import graders

    for module in pkgutil.iter_modules(graders.__path__):
        name = f"{graders.__name__}.{module.name}"
        try:
            importlib.import_module(name)
        except Exception as error:  # one broken grader file must not hide the others
            _grader_import_errors[name] = f"{type(error).__name__}: {error}"
    _graders_loaded = True


def known_exercises() -> dict[str, Exercise]:
    """Every registered exercise, after importing all grader modules."""
    _load_graders()
    return dict(_registry)


def _values_close(got: Any, want: Any, rtol: float, atol: float) -> bool:
    try:
        import torch

        got_t, want_t = (
            torch.as_tensor(got, dtype=torch.float64),
            torch.as_tensor(want, dtype=torch.float64),
        )
        return got_t.shape == want_t.shape and bool(
            torch.allclose(got_t, want_t, rtol=rtol, atol=atol)
        )
    except (TypeError, ValueError, RuntimeError):
        return isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=rtol, abs_tol=atol)


def assert_all_ranks_close(
    results: list, expected: Any, what: str, rtol: float = 0.0, atol: float = 0.0
) -> None:
    """Raise ``AssertionError`` naming every rank whose result differs from ``expected``.

    ``expected`` is one value for all ranks, or a list with one value per rank.
    """
    per_rank = expected if isinstance(expected, list) else [expected] * len(results)
    wrong = [
        f"rank {r} returned {got!r}, expected {want!r}"
        for r, (got, want) in enumerate(zip(results, per_rank, strict=True))
        if not _values_close(got, want, rtol, atol)
    ]
    if wrong:
        raise AssertionError(
            f"{what} differs on {len(wrong)} of {len(results)} ranks:\n" + "\n".join(wrong)
        )


def _run_grader(entry: Exercise, fn: Callable, cluster: Any) -> GradeResult:
    owned = None
    try:
        if getattr(cluster, "closed", False) and hasattr(cluster, "reopen"):
            cluster.reopen()  # closed by an earlier cell (e.g. the lab's last one, after Run All)
        if cluster is None:
            import dtlab

            cluster = owned = dtlab.Cluster(entry.world_size)
        outcome = entry.grade(fn, cluster)
        if isinstance(outcome, GradeResult):
            return outcome
        return GradeResult(
            bool(outcome), "matches the reference" if outcome else "does not match the reference"
        )
    except Exception as error:
        message, details = explain_failure(error, fn)
        return GradeResult(False, message, details)
    finally:
        if owned is not None:
            owned.close()


def check_exercise(
    exercise_id: str,
    fn: Callable,
    cluster: Any = None,
    *,
    learner: str | None = None,
    progress_path: str | Path | None = None,
    record: bool = True,
) -> GradeResult:
    """Grade ``fn`` for ``exercise_id`` on ``cluster`` (a temporary one if None); never raises."""
    _load_graders()
    entry = _registry.get(exercise_id)
    if entry is None:
        broken = "".join(f"\n  {name}: {err}" for name, err in _grader_import_errors.items())
        known = ", ".join(sorted(_registry)) or "none"
        message = f"No exercise named {exercise_id!r}. Known exercises: {known}."
        if broken:
            message += f"\nSome grader modules failed to import:{broken}"
        return GradeResult(False, message, exercise_id=exercise_id)
    if not callable(fn):
        result = GradeResult(
            False, f"Pass your function itself, not {type(fn).__name__} (no parentheses)."
        )
    else:
        from dtlab.workshop.stubs import learner_function

        result = _run_grader(entry, learner_function(fn), cluster)
    result.exercise_id = exercise_id
    if record:
        try:
            from dtlab.quiz.bank import bank_version
            from dtlab.quiz.progress import record_attempt

            record_attempt(
                item=exercise_id,
                topic=entry.topic,
                kind="exercise",
                correct=result.passed,
                score=1.0 if result.passed else 0.0,
                bank_version=bank_version(),
                learner=learner,
                path=progress_path,
            )
        except (OSError, ValueError) as error:
            warnings.warn(f"could not record progress: {error}", stacklevel=2)
    return result
