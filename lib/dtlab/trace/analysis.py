"""A run's spans from every rank, on one clock, and the questions a learner asks of them.

How long did each rank compute, talk, wait? How many bytes went over the wire? How much of the
communication hid behind compute (the point of DDP's bucketed, overlapped all-reduce — Li et
al., "PyTorch Distributed", VLDB 2020)? Where did a rank sit idle waiting for the slowest one?

Spans on one rank may overlap (an async all-reduce in flight during backward, or a "forward"
span around "matmul" spans), so time is always measured on the *union* of intervals, never by
summing durations.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from dtlab.trace.chrome import chrome_trace_events
from dtlab.trace.recorder import Span

Interval = tuple[int, int]


def union_of(spans: Iterable[Span]) -> list[Interval]:
    """The spans' intervals merged into sorted, disjoint ``(start_ns, end_ns)`` pairs."""
    merged: list[list[int]] = []
    for start, end in sorted((s.start_ns, s.end_ns) for s in spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def length_of(intervals: list[Interval]) -> int:
    return sum(end - start for start, end in intervals)


def overlap_of(a: list[Interval], b: list[Interval]) -> int:
    """Nanoseconds covered by both of two disjoint, sorted interval lists (a two-pointer walk)."""
    i = j = covered = 0
    while i < len(a) and j < len(b):
        covered += max(0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return covered


def _as_set(value: str | int | Iterable | None) -> set | None:
    if value is None:
        return None
    if isinstance(value, (str, int)):
        return {value}
    return set(value)


class Trace:
    """Spans from every rank of one run, on one aligned clock.

    ``start_ns``/``end_ns`` bound the run (idle time is filled between them); ``origin_ns`` is
    the zero of every relative time this trace reports (``rows``, ``to_chrome``, the timeline
    figure). Both default to the first start and last end; a :meth:`window` keeps its parent's
    origin so its times still match the full picture.
    """

    def __init__(
        self,
        spans: list[Span],
        start_ns: int | None = None,
        end_ns: int | None = None,
        origin_ns: int | None = None,
    ):
        self.spans = sorted(spans, key=lambda s: (s.start_ns, s.rank, -s.end_ns))
        self.start_ns = (
            start_ns if start_ns is not None else min((s.start_ns for s in self.spans), default=0)
        )
        self.end_ns = (
            end_ns
            if end_ns is not None
            else max((s.end_ns for s in self.spans), default=self.start_ns)
        )
        self.origin_ns = origin_ns if origin_ns is not None else self.start_ns

    @classmethod
    def from_rank_spans(cls, per_rank: list[list[dict]]) -> Trace:
        """Merge what each rank's :func:`~dtlab.trace.end_call` returned into one trace."""
        return cls([Span(**d) for spans in per_rank for d in spans])

    def _like(self, spans: list[Span], start_ns=None, end_ns=None) -> Trace:
        start = self.start_ns if start_ns is None else start_ns
        end = self.end_ns if end_ns is None else end_ns
        return Trace(spans, start, end, self.origin_ns)

    def __len__(self) -> int:
        return len(self.spans)

    def __iter__(self) -> Iterator[Span]:
        return iter(self.spans)

    def __repr__(self) -> str:
        return (
            f"Trace({len(self.spans)} spans on ranks {self.ranks}, "
            f"{(self.end_ns - self.start_ns) / 1e6:.3f} ms)"
        )

    @property
    def ranks(self) -> list[int]:
        """The ranks that recorded at least one span, ascending."""
        return sorted({s.rank for s in self.spans})

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def by_rank(self) -> dict[int, list[Span]]:
        """Each rank's spans in start order."""
        out: dict[int, list[Span]] = {r: [] for r in self.ranks}
        for s in self.spans:
            out[s.rank].append(s)
        return out

    def filter(
        self,
        kind: str | Iterable[str] | None = None,
        name: str | Iterable[str] | None = None,
        rank: int | Iterable[int] | None = None,
        **labels,
    ) -> Trace:
        """The spans matching every given condition, e.g. ``filter(kind="comm", step=3)``.

        The result keeps this trace's bounds and origin (idle is still counted from the run's
        start); :meth:`cropped` draws the selection on its own.
        """
        kinds, names, ranks = _as_set(kind), _as_set(name), _as_set(rank)
        kept = [
            s
            for s in self.spans
            if (kinds is None or s.kind in kinds)
            and (names is None or s.name in names)
            and (ranks is None or s.rank in ranks)
            and all(k in s.labels and s.labels[k] == v for k, v in labels.items())
        ]
        return self._like(kept)

    def cropped(self) -> Trace:
        """The same spans bounded by their own first start and last end, which is also the new
        origin: ``trace.filter(step=2).cropped()`` is step 2 drawn from its own zero, with idle
        only where a rank waited inside that step."""
        return Trace(self.spans)

    def window(self, start_ms: float | None = None, end_ms: float | None = None) -> Trace:
        """The part between two times in ms after the origin (read them off the timeline's x
        axis); spans crossing an edge are clipped to it."""
        lo = self.start_ns if start_ms is None else self.origin_ns + round(start_ms * 1e6)
        hi = self.end_ns if end_ms is None else self.origin_ns + round(end_ms * 1e6)
        if hi < lo:
            raise ValueError(f"window ends ({end_ms} ms) before it starts ({start_ms} ms)")
        clipped = [
            Span(
                s.rank,
                s.name,
                s.kind,
                max(s.start_ns, lo),
                min(s.end_ns, hi),
                s.nbytes,
                dict(s.labels),
            )
            for s in self.spans
            if s.end_ns > lo and s.start_ns < hi
        ]
        return self._like(clipped, lo, hi)

    def total_seconds(
        self, kind: str | Iterable[str] | None = None, rank: int | None = None
    ) -> float:
        """Wall time covered by spans of ``kind`` (all kinds if None), summed over ranks.

        Per rank this is the union of the spans, so nested or concurrent spans count once.
        """
        chosen = self.filter(kind=kind, rank=rank).by_rank()
        return sum(length_of(union_of(spans)) for spans in chosen.values()) / 1e9

    def bytes_moved(self, rank: int | None = None, kind: str | Iterable[str] = "comm") -> int:
        """Sum of ``nbytes`` over the ``kind`` spans (communication by default) of ``rank`` or
        all ranks. Put ``nbytes`` on either an outer span or its inner steps, not both."""
        return sum(s.nbytes for s in self.filter(kind=kind, rank=rank).spans)

    def idle_gaps(self, min_gap_ns: int = 0) -> list[Span]:
        """Each rank's uncovered time between the run's start and end, as ``kind="idle"`` spans.

        A rank that finishes its work early and then waits in a collective for the slowest
        rank shows up here (if the wait itself is untraced) as a gap: "idle". Gaps shorter than
        ``min_gap_ns`` (Python overhead between two spans) are skipped.
        """
        gaps = []
        for rank, spans in self.by_rank().items():
            cursor = self.start_ns
            for start, end in [*union_of(spans), (self.end_ns, self.end_ns)]:
                gap = start - cursor
                if gap > 0 and gap >= min_gap_ns:
                    gaps.append(Span(rank, "idle", "idle", cursor, start))
                cursor = max(cursor, end)
        return gaps

    def with_idle(self, min_gap_ns: int = 0) -> Trace:
        """This trace plus its :meth:`idle_gaps`."""
        return self._like(self.spans + self.idle_gaps(min_gap_ns))

    def hidden_fraction(
        self,
        comm_kind: str | Iterable[str] = "comm",
        compute_kind: str | Iterable[str] = "compute",
        rank: int | None = None,
    ) -> float:
        """Fraction of communication time that ran while the same rank was computing.

        ``sum_r |comm_r ∩ compute_r| / sum_r |comm_r|`` over unions of intervals: 1.0 means the
        all-reduces are fully hidden behind backward (ideal overlapped DDP), 0.0 means every
        byte was waited for (naive DDP). A trace with no communication returns 0.0.
        """
        comm_kinds, compute_kinds = _as_set(comm_kind), _as_set(compute_kind)
        hidden = total = 0
        for spans in self.filter(rank=rank).by_rank().values():
            comm = union_of(s for s in spans if s.kind in comm_kinds)
            compute = union_of(s for s in spans if s.kind in compute_kinds)
            hidden += overlap_of(comm, compute)
            total += length_of(comm)
        return hidden / total if total else 0.0

    def rows(self) -> list[dict]:
        """One flat dict per span (times in ms after the origin); ``pandas.DataFrame(rows)``
        works. Labels become columns; one whose name is taken gets a ``label_`` prefix."""
        out = []
        for s in self.spans:
            row = {
                "rank": s.rank,
                "name": s.name,
                "kind": s.kind,
                "start_ms": (s.start_ns - self.origin_ns) / 1e6,
                "end_ms": (s.end_ns - self.origin_ns) / 1e6,
                "duration_ms": (s.end_ns - s.start_ns) / 1e6,
                "nbytes": s.nbytes,
            }
            for key, value in s.labels.items():
                row[f"label_{key}" if key in row else key] = value
            out.append(row)
        return out

    def to_chrome(self, path: str | Path | None = None) -> dict:
        """Chrome/Perfetto trace-event JSON (see :mod:`dtlab.trace.chrome`); also written to
        ``path`` if given — open it at https://ui.perfetto.dev or chrome://tracing."""
        doc = chrome_trace_events(self.by_rank(), self.origin_ns)
        if path is not None:
            Path(path).write_text(json.dumps(doc))
        return doc
