"""Library answers in the shape an exercise returns, for the student notebook's stand-ins.

An exercise whose later cells use its result names a library function on its marker
(``# BEGIN SOLUTION fallback=...``, see :mod:`dtlab.workshop.stubs`). Most library functions
already have the exercise's signature; the ones here adapt a library answer that returns a
richer object.
"""

from __future__ import annotations

from dtlab.parallel.pipeline import Action, one_f_one_b


def one_f_one_b_actions(n_ranks: int, n_micro: int) -> list[list[Action]]:
    """Lab 05's ``my_one_f_one_b``: each rank's 1F1B order (PipeDream-Flush, Narayanan et al.
    2021), as lists of :class:`Action`, taken from :func:`dtlab.parallel.pipeline.one_f_one_b`."""
    return [list(actions) for actions in one_f_one_b(n_ranks, n_micro).actions]
