"""What an unwritten exercise does in a student notebook: raise when graded, stand in elsewhere.

The build (:mod:`dtlab.workshop.solution_blocks`) replaces every solution block with::

    raise ExerciseNotWritten("merge")  # replace this line with your code

:class:`ExerciseNotWritten` is a ``NotImplementedError``, so ``check_exercise`` reports
"Not yet: write the body of `merge`" and never raises. A later cell that *uses* the learner's
function (``o, lse = merge(...)`` to fold ring-attention blocks) would stop Run All half-way,
though; so an exercise whose function later cells call declares the library function that
computes the same thing, on its ``BEGIN SOLUTION`` marker::

    # BEGIN SOLUTION fallback=dtlab.parallel.context:merge

and the student edition wraps the function with :func:`until_written`: while its body still
raises :class:`ExerciseNotWritten`, a call returns the library's answer and prints one line,
``your merge is not written yet — using dtlab.parallel.context.merge to continue``. The student
notebook names the library function, never contains its code. ``check_exercise`` grades the
learner's own function (:func:`learner_function`), so the stand-in never passes a grader.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable
from typing import Any

_NOT_WRITTEN = re.compile(r"^(?P<name>[\w.]+) is not written yet\b")


class ExerciseNotWritten(NotImplementedError):
    """Raised by the stub line of an exercise the learner has not written; ``name`` is the
    function or method to write (``VocabParallelCrossEntropy.forward``)."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(
            f"{name} is not written yet: replace the `raise ExerciseNotWritten` line with your code"
        )

    def __reduce__(self):  # pickles by name, so it crosses from a rank to the notebook
        return (type(self), (self.name,))


def not_written_name(message: str) -> str | None:
    """The exercise named by an :class:`ExerciseNotWritten` message (e.g. a rank's), else None."""
    found = _NOT_WRITTEN.match(message.strip())
    return found["name"] if found else None


def resolve_fallback(reference: str) -> Callable:
    """Import ``"package.module:function"``; an error names the reference to fix in the source."""
    module_name, _, attribute = reference.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ImportError(
            f"fallback {reference!r} cannot be imported ({error}); write an existing "
            "'package.module:function' on the BEGIN SOLUTION marker"
        ) from None


def _execution_count() -> int | None:
    """The running notebook cell's number, so the stand-in line prints once per cell."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return getattr(shell, "execution_count", None) if shell is not None else None


def until_written(fallback: str) -> Callable[[Callable], Callable]:
    """Decorate an exercise so that, while unwritten, calls use ``fallback`` and say so once per
    cell; a written function (or any other error it raises) passes through untouched."""

    def wrap(fn: Callable) -> Callable:
        printed_in: list = [object()]  # the cell that last printed the line (none yet)

        @functools.wraps(fn)
        def exercise(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except ExerciseNotWritten as error:
                if error.name != fn.__name__:
                    raise  # another exercise, called from the learner's code, is unwritten
            cell = _execution_count()
            if printed_in[0] != cell:
                printed_in[0] = cell
                shown = fallback.replace(":", ".")
                print(f"your {fn.__name__} is not written yet — using {shown} to continue")
            return resolve_fallback(fallback)(*args, **kwargs)

        exercise.__dtlab_learner_function__ = fn
        return exercise

    return wrap


def learner_function(fn: Callable) -> Callable:
    """The learner's own function behind :func:`until_written` (``fn`` itself otherwise)."""
    return getattr(fn, "__dtlab_learner_function__", fn)
