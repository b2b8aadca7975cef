"""Why a graded exercise failed, said to the learner: :func:`explain_failure`.

:func:`dtlab.quiz.exercises.check_exercise` never raises; every error a grader or the learner's
code raises on the cluster comes here and becomes a message ("Not implemented yet: write the
body of ``merge``", "Your line 4 in rank_sum: … / Rank 1 raised …", a hang, a dead rank, a
mismatch against the reference, :class:`NotTheSkill`) with details for the expander. The
learner's own line is found in the remote traceback by :func:`learner_line`.
"""

from __future__ import annotations

import linecache
import re
import traceback
from collections.abc import Callable
from typing import Any


class NotTheSkill(AssertionError):
    """Raised by a grader when the result is right but was reached without the skill the exercise
    teaches: a built-in collective instead of messages, the wrong traffic, the library's answer."""


def _is(error: BaseException, class_name: str) -> bool:
    # By name, so this works before the runtime is imported and across module reloads.
    return any(c.__name__ == class_name for c in type(error).__mro__)


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def learner_line(trace: str, fn: Callable) -> str:
    """The deepest traceback line inside the learner's function, e.g.
    ``line 4 in rank_sum: t = dist.all_reduce(x)``; "" when the traceback never enters it."""
    code = getattr(fn, "__code__", None)
    if code is None or not trace:
        return ""
    lines = trace.splitlines()
    found = ""
    for i, line in enumerate(lines):
        frame = re.match(r'\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)', line)
        if frame and frame["file"] == code.co_filename:
            source = linecache.getline(code.co_filename, int(frame["line"])).strip()
            following = lines[i + 1] if i + 1 < len(lines) else ""
            if not source and following.startswith("    ") and following.strip()[:1] not in "^~":
                source = following.strip()
            found = f"line {frame['line']} in {frame['name']}" + (f": {source}" if source else "")
    return found


def _not_written(name: str, unwritten: str | None) -> str:
    if unwritten is None:
        return (
            f"Not implemented yet: write the body of `{name}` "
            "(replace the `raise NotImplementedError`)."
        )
    return (
        f"Not implemented yet: write the body of `{unwritten}` "
        "(replace the `raise ExerciseNotWritten` line)."
    )


def explain_failure(error: Exception, fn: Callable) -> tuple[str, dict[str, Any]]:
    """``(message, details)`` for a failed check: what went wrong in the learner's words (an
    unwritten body, a rank's error with the learner's own line first, a hang, a dead rank, a
    mismatch, the right result without the skill), and the traceback tail or ranks to show."""
    from dtlab.workshop.stubs import not_written_name

    name = getattr(fn, "__name__", "your function")
    if isinstance(error, NotImplementedError):
        trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        return _not_written(name, not_written_name(str(error))), {"traceback (tail)": _tail(trace)}
    if _is(error, "RankError"):
        rank = getattr(error, "rank", "?")
        remote = str(getattr(error, "remote_traceback", "") or error)
        remote_type = getattr(error, "exc_type", "")
        if remote_type in ("NotImplementedError", "ExerciseNotWritten") or re.search(
            r"^(\w+\.)*(NotImplementedError|ExerciseNotWritten)\b", remote, re.M
        ):
            unwritten = not_written_name(str(getattr(error, "remote_message", "")))
            ranks = getattr(error, "note", "") or f"rank {rank} raised it"
            return _not_written(name, unwritten), {
                "ranks": ranks.splitlines()[0],
                "traceback (tail)": _tail(remote),
            }
        if remote_type:
            what = f"{remote_type}: {getattr(error, 'remote_message', '')}"
        else:
            what = remote.strip().splitlines()[-1] if remote.strip() else str(error)
        yours = learner_line(remote, fn)
        first = f"Your {yours}\n" if yours else ""
        return f"{first}Rank {rank} raised {what}", {
            "rank": rank,
            "traceback (tail)": _tail(remote),
        }
    if _is(error, "ClusterTimeout"):
        return (
            f"`{name}` did not finish in time: a rank is probably waiting in a collective that "
            f"another rank never called (every rank must call the same collectives in the same order).\n{error}",
            {},
        )
    if _is(error, "RankDied"):
        return (
            f"A rank process died while running `{name}` (the pool restarts on the next run).\n{error}",
            {},
        )
    if isinstance(error, NotTheSkill):
        return f"The result is right, but not the way the exercise asks.\n{error}", {}
    if isinstance(error, AssertionError):
        return f"Your result does not match the reference.\n{error}", {}
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    yours = learner_line(trace, fn)
    first = f"Your {yours}\n" if yours else ""
    return f"{first}Checking `{name}` failed with {type(error).__name__}: {error}", {
        "traceback (tail)": _tail(trace)
    }
