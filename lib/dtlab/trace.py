"""Per-rank timelines: spans of compute, communication and idle time, with bytes and labels.

Inside a function run on the Cluster (or under torchrun)::

    with dtlab.trace.span("allreduce", kind="comm", nbytes=t.numel() * t.element_size()):
        dist.all_reduce(t)

Every span records start/end on ``time.perf_counter_ns`` (CLOCK_MONOTONIC on Linux: one clock
shared by every process of a machine), so spans from ranks on one host line up exactly. Across
hosts (torchrun) each rank's offset to rank 0 is estimated once after a barrier. The Cluster
collects each rank's spans after every ``run`` and returns them merged as a :class:`Trace`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

KINDS = ("compute", "comm", "idle", "memcpy", "optimizer", "other")


@dataclass
class Span:
    """One interval on one rank. Times are nanoseconds on the rank-0-aligned monotonic clock."""

    rank: int
    name: str
    kind: str
    start_ns: int
    end_ns: int
    nbytes: int = 0
    labels: dict = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def to_dict(self) -> dict:
        return asdict(self)


class _Recorder:
    """The spans this process records during one ``Cluster.run`` call."""

    def __init__(self) -> None:
        self.rank = 0
        self.clock_offset_ns = 0
        self.active = False
        self.spans: list[Span] = []


_recorder = _Recorder()


def now_ns() -> int:
    """The aligned clock: this process's monotonic time shifted onto rank 0's."""
    return time.perf_counter_ns() - _recorder.clock_offset_ns


@contextmanager
def span(name: str, kind: str = "compute", nbytes: int = 0, **labels) -> Iterator[None]:
    """Record the body as one span of ``kind`` on this rank (free when nobody is recording)."""
    if kind not in KINDS:
        raise ValueError(f"span kind {kind!r} is not one of {KINDS}")
    if not _recorder.active:
        yield
        return
    start = now_ns()
    try:
        yield
    finally:
        _recorder.spans.append(
            Span(_recorder.rank, name, kind, start, now_ns(), int(nbytes), dict(labels))
        )


def record(name: str, kind: str, start_ns: int, end_ns: int, nbytes: int = 0, **labels) -> None:
    """Add a span measured elsewhere (e.g. from CUDA events) on the aligned clock."""
    if _recorder.active:
        _recorder.spans.append(
            Span(_recorder.rank, name, kind, int(start_ns), int(end_ns), int(nbytes), labels)
        )


def begin_call(rank: int) -> None:
    """Runtime hook: start collecting spans for one call on this rank."""
    _recorder.rank = rank
    _recorder.spans = []
    _recorder.active = True


def end_call() -> list[dict]:
    """Runtime hook: stop collecting and hand back this call's spans as plain dicts."""
    _recorder.active = False
    spans, _recorder.spans = _recorder.spans, []
    return [s.to_dict() for s in spans]


def set_clock_offset(offset_ns: int) -> None:
    """Runtime hook: how far this rank's monotonic clock runs ahead of rank 0's."""
    _recorder.clock_offset_ns = int(offset_ns)


class Trace:
    """Spans from every rank of one run, on one aligned clock."""

    def __init__(self, spans: list[Span]):
        self.spans = sorted(spans, key=lambda s: (s.start_ns, s.rank))

    @classmethod
    def from_rank_spans(cls, per_rank: list[list[dict]]) -> Trace:
        return cls([Span(**d) for spans in per_rank for d in spans])

    def __len__(self) -> int:
        return len(self.spans)

    def __repr__(self) -> str:
        ranks = sorted({s.rank for s in self.spans})
        return f"Trace({len(self.spans)} spans on ranks {ranks})"
