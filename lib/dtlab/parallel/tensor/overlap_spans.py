"""Reading a tensor-parallel overlap run off its trace (:mod:`.overlap`), on either path.

Times per step and layer from the ``comm``, ``idle`` and ``compute`` spans of named collectives;
on ``collectives="dtlab"`` a blocking collective, which draws only its ring's steps and agreement
check, is first read as the span torch's path draws for it (:func:`_with_blocking_named`).
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from dtlab import trace
from dtlab.trace.analysis import length_of, overlap_of, union_of


def _per_step(tr: trace.Trace, steps: list[int], per: int, *, kind: str, names, **labels):
    """Median over ``steps`` of the mean over ranks of the summed duration, divided by ``per``."""
    ranks = max(len(tr.ranks), 1)
    values = []
    for step in steps:
        spans = tr.filter(kind=kind, name=names, step=step, **labels).spans
        values.append(sum(s.end_ns - s.start_ns for s in spans) / 1e6 / ranks / per)
    return statistics.median(values) if values else 0.0


def _exposed_per_step(tr: trace.Trace, steps: list[int], per: int, *, names, **labels):
    """Like :func:`_per_step` for the time of the ``names`` comm spans that no compute span of
    the same rank covers: the launch and the wait, where the rank did nothing else."""
    values = []
    for step in steps:
        chosen = tr.filter(step=step, **labels)
        total = 0
        for rank in chosen.ranks:
            comm = union_of(chosen.filter(kind="comm", name=names, rank=rank).spans)
            compute = union_of(chosen.filter(kind="compute", rank=rank).spans)
            total += length_of(comm) - overlap_of(comm, compute)
        values.append(total / 1e6 / max(len(tr.ranks), 1) / per)
    return statistics.median(values) if values else 0.0


def _names(prefix: str | tuple, tr: trace.Trace, kind: str) -> set[str]:
    return {s.name for s in tr.filter(kind=kind).spans if s.name.startswith(prefix)}


def _check_collectives(cluster, collectives: str) -> None:
    if collectives not in ("torch", "dtlab"):
        raise ValueError(f"collectives={collectives!r}: pass 'torch' or 'dtlab'")
    if collectives == "dtlab" and getattr(cluster, "backend", "gloo") != "gloo":
        raise ValueError(
            "collectives='dtlab' on NCCL runs an asynchronous collective inside its launch "
            "(OverlapRefused: no background stream there), so there is no wait to read; measure "
            "overlap with collectives='torch' on a GPU, or with either path on gloo"
        )


_COUNTED_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def _with_blocking_named(tr: trace.Trace, collectives: str) -> trace.Trace:
    """On the counted path, each ring step and agreement check run on the calling thread
    (``stream`` not ``"background"``) renamed ``tp.<op>`` of kind ``comm``: what torch's path
    draws for the same blocking collective. torch's trace is returned as it is."""
    if collectives != "dtlab":
        return tr
    spans = []
    for s in tr.spans:
        op = next((o for o in _COUNTED_OPS if s.name.startswith(o)), None)
        blocking = s.labels.get("stream") != "background" and s.kind in ("comm", "other")
        spans.append(replace(s, name=f"tp.{op}", kind="comm") if op and blocking else s)
    return trace.Trace(spans, tr.start_ns, tr.end_ns, tr.origin_ns)
