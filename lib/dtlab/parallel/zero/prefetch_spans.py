"""An FSDP run's parameter all-gathers, read off the trace on either collectives path.

:func:`~dtlab.parallel.zero.prefetch.measure_fsdp_prefetch` measures what a rank's *main thread*
spent getting a unit's parameters. What the trace holds for one unit gather depends on how it ran:

* **prefetched** (``async_op=True``) — on ``collectives="torch"``, the ``comm`` span
  ``unit[k].all_gather`` (labelled ``async_op``) from launch to completion; on
  ``collectives="dtlab"`` (gloo) the ring runs on the background stream
  (:mod:`dtlab.comm.background`): the same ``comm`` span, from the worker's start, plus the ring's
  steps, all labelled ``stream="background"``. On both, the caller's ``idle`` span
  ``wait:unit[k].all_gather`` is the exposed part;
* **blocking** (on demand: depth 0, or the first unit) — on ``collectives="torch"`` the ``comm``
  span ``unit[k].all_gather`` with no ``async_op`` label, all of it exposed; on
  ``collectives="dtlab"`` there is no span with the unit's name: the ring runs on the calling
  thread and draws its steps (``comm`` spans ``all_gather.ring``, ``comm_step`` 0 … N−2) and its
  agreement check (``other``: ``all_gather check (control)``), none labelled
  ``stream="background"``. All of them are exposed: the main thread did nothing else meanwhile.

The run must hold no other all-gather on the main thread in the spans passed (the measurement
labels each implementation's steps and filters on them).
"""

from __future__ import annotations

from collections.abc import Iterable

from dtlab.trace.analysis import overlap_of, union_of
from dtlab.trace.recorder import Span

_SUFFIX = ".all_gather"


def _unit_gather(span: Span) -> bool:
    return span.kind == "comm" and span.name.startswith("unit[") and span.name.endswith(_SUFFIX)


def _blocking_ring_part(span: Span) -> bool:
    """A step or agreement check of a counted all-gather run on the calling thread."""
    return (
        span.kind in ("comm", "other")
        and span.name.startswith("all_gather")
        and span.labels.get("stream") != "background"
    )


def exposed_gather_ns(spans: Iterable[Span]) -> int:
    """Nanoseconds the main thread spent getting parameters: every ``wait:unit[k].all_gather``,
    every blocking ``unit[k].all_gather`` (torch's path) and every blocking ring step and
    agreement check of an all-gather (the counted path). Summed over the spans given."""
    total = 0
    for s in spans:
        waited = s.kind == "idle" and s.name.startswith("wait:unit[") and s.name.endswith(_SUFFIX)
        blocking = _unit_gather(s) and "async_op" not in s.labels
        if waited or blocking or _blocking_ring_part(s):
            total += s.end_ns - s.start_ns
    return total


def gathers_in(spans: Iterable[Span]) -> int:
    """How many unit all-gathers the spans hold: each ``unit[k].all_gather`` ``comm`` span (torch's
    path, and the counted path's prefetches), plus each blocking counted ring (its step 0)."""
    count = 0
    for s in spans:
        ring_start = s.kind == "comm" and _blocking_ring_part(s) and s.labels.get("comm_step") == 0
        count += _unit_gather(s) or ring_start
    return count


def gathers_overlapped_compute(spans: list[Span]) -> bool:
    """Whether part of an asynchronous unit all-gather ran while the same rank computed: the
    ``async_op`` ``unit[k].all_gather`` spans of each rank intersect its ``compute`` spans.

    Read from the spans' intervals (ordering), never from a duration. ``False`` where no gather
    was asynchronous (depth 0) or every one ran outside compute."""
    ranks = {s.rank for s in spans}
    for rank in ranks:
        mine = [s for s in spans if s.rank == rank]
        gathers = union_of(s for s in mine if _unit_gather(s) and "async_op" in s.labels)
        compute = union_of(s for s in mine if s.kind == "compute")
        if overlap_of(gathers, compute) == 0:
            return False
    return bool(ranks)
