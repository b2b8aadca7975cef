"""The recorder: what each rank writes down while a function runs on the Cluster.

Spans are timed on ``time.perf_counter_ns`` (CLOCK_MONOTONIC on Linux: one clock shared by
every process of a machine) minus this rank's offset to rank 0 (see :mod:`dtlab.trace.clock`),
so spans from all ranks land on one aligned clock. On a GPU, :func:`cuda_span` times the
*device* work with CUDA events instead of the host. The runtime brackets every call with
:func:`begin_call` / :func:`end_call` and ships the spans back as plain dicts.
"""

from __future__ import annotations

import threading
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
        # CUDA spans wait here as event pairs until end_call() converts them (see cuda_span).
        self.pending_cuda: list[tuple] = []
        self.cuda_anchors: dict[int, tuple] = {}


_recorder = _Recorder()
# A background stream (dtlab.comm.background) records its collectives' spans from its own thread
# while the main thread records compute; appends and the swap at end_call() take this lock, so a
# span is never lost between reading the list and replacing it.
_spans_lock = threading.Lock()


def _append(span_: Span) -> None:
    with _spans_lock:
        _recorder.spans.append(span_)


# Labels every span recorded now carries (trace.labels): micro-batch, phase, group. Per thread:
# simulated ranks are threads of one process, and one thread's block must not label another's.
_context = threading.local()


def _context_labels() -> dict:
    return getattr(_context, "labels", {})


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"span kind {kind!r} is not one of {KINDS}")


def now_ns() -> int:
    """The aligned clock: this process's monotonic time shifted onto rank 0's."""
    return time.perf_counter_ns() - _recorder.clock_offset_ns


@contextmanager
def labels(**values) -> Iterator[None]:
    """Label every span recorded inside the block, e.g. ``with trace.labels(micro_batch=3,
    phase="F"):`` around one pipeline action; inner blocks add to (and override) outer ones."""
    previous = _context_labels()
    _context.labels = {**previous, **values}
    try:
        yield
    finally:
        _context.labels = previous


def current_labels() -> dict:
    """The labels :func:`labels` has in force right now."""
    return dict(_context_labels())


@contextmanager
def span(name: str, kind: str = "compute", nbytes: int = 0, **labels) -> Iterator[None]:
    """Record the body as one span of ``kind`` on this rank (free when nobody is recording)."""
    _check_kind(kind)
    if not _recorder.active:
        yield
        return
    start = now_ns()
    try:
        yield
    finally:
        _append(
            Span(
                _recorder.rank,
                name,
                kind,
                start,
                now_ns(),
                int(nbytes),
                {**_context_labels(), **labels},
            )  # fmt: skip
        )


def record(name: str, kind: str, start_ns: int, end_ns: int, nbytes: int = 0, **labels) -> None:
    """Add a span measured elsewhere (e.g. from CUDA events) on the aligned clock."""
    _check_kind(kind)
    if _recorder.active:
        _append(
            Span(
                _recorder.rank,
                name,
                kind,
                int(start_ns),
                int(end_ns),
                int(nbytes),
                {**_context_labels(), **labels},
            )  # fmt: skip
        )


def _wants_cuda_timing(stream) -> bool:
    """Time with CUDA events when given a stream, or when this rank computes on a GPU: its
    process group runs NCCL (the rule of :func:`dtlab.runtime.context.device`). The trace sits
    below the runtime (the Cluster collects its spans), so it reads ``torch.distributed`` itself
    rather than importing the runtime."""
    if stream is not None:
        return True
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl"


@contextmanager
def cuda_span(
    name: str, kind: str = "compute", nbytes: int = 0, stream=None, **labels
) -> Iterator[None]:
    """Time the GPU work enqueued in the body with CUDA events; an ordinary :func:`span` on CPU.

    Kernels and NCCL calls return before the GPU runs them, so host timestamps around them
    measure only the launch. Here two ``torch.cuda.Event(enable_timing=True)`` are recorded on
    ``stream`` (default: the current stream) around the body, without synchronising. The first
    CUDA span of a call sets an *anchor*: after ``torch.cuda.synchronize()`` the device is idle,
    so an event recorded right then runs at (almost exactly) the host time read beside it.
    At :func:`end_call` the device is synchronised once and every span is placed at
    ``anchor_host_ns + anchor_event.elapsed_time(event)``: device times on the aligned clock.
    The price is two synchronisations per call (first span, end of call), none per span.
    """
    _check_kind(kind)
    if not _recorder.active or not _wants_cuda_timing(stream):
        with span(name, kind, nbytes, **labels):
            yield
        return
    start = cuda_mark(stream)
    try:
        yield
    finally:
        record_cuda(name, kind, start, cuda_mark(stream), nbytes, **labels)


def cuda_mark(stream=None):
    """A timing event recorded now on ``stream`` (default: the current one), or ``None`` when
    nobody is recording or the device is not a GPU. Two marks make a span: :func:`record_cuda`.

    For work whose start and end are not one ``with`` block apart — an async collective launched
    in a hook and waited for at the end of backward.
    """
    if not _recorder.active or not _wants_cuda_timing(stream):
        return None
    import torch

    stream = stream if stream is not None else torch.cuda.current_stream()
    device_index = stream.device.index
    if device_index not in _recorder.cuda_anchors:
        torch.cuda.synchronize(device_index)
        anchor = torch.cuda.Event(enable_timing=True)
        anchor.record(stream)
        _recorder.cuda_anchors[device_index] = (anchor, now_ns())
    event = torch.cuda.Event(enable_timing=True)
    event.record(stream)
    return device_index, event


def record_cuda(name: str, kind: str, start, end, nbytes: int = 0, **labels) -> None:
    """A span between two :func:`cuda_mark` events, placed on the aligned clock at ``end_call``."""
    _check_kind(kind)
    if start is None or end is None:
        return
    (device_index, start_event), (_, end_event) = start, end
    _recorder.pending_cuda.append(
        (
            device_index,
            start_event,
            end_event,
            name,
            kind,
            int(nbytes),
            {**_context_labels(), **labels},
        )  # fmt: skip
    )


def _flush_cuda_spans() -> None:
    pending, _recorder.pending_cuda = _recorder.pending_cuda, []
    anchors, _recorder.cuda_anchors = _recorder.cuda_anchors, {}
    if not pending:
        return
    import torch

    try:
        for device_index in anchors:
            torch.cuda.synchronize(device_index)
        for device_index, start, end, name, kind, nbytes, labels in pending:
            anchor, anchor_ns = anchors[device_index]
            start_ns = anchor_ns + round(anchor.elapsed_time(start) * 1e6)  # ms -> ns
            end_ns = anchor_ns + round(anchor.elapsed_time(end) * 1e6)
            _append(Span(_recorder.rank, name, kind, start_ns, end_ns, nbytes, labels))
    except RuntimeError:
        # A failed kernel leaves the device unusable; the user's own error says why, so the
        # device spans of this call are dropped rather than hiding that error behind this one.
        return


def begin_call(rank: int) -> None:
    """Runtime hook: start collecting spans for one call on this rank."""
    _recorder.rank = rank
    _recorder.spans = []
    _recorder.pending_cuda = []
    _recorder.cuda_anchors = {}  # re-anchor every call so GPU/host clock drift cannot add up
    _recorder.active = True


def end_call() -> list[dict]:
    """Runtime hook: stop collecting and hand back this call's spans as plain dicts."""
    _flush_cuda_spans()
    _recorder.active = False
    with _spans_lock:
        spans, _recorder.spans = _recorder.spans, []
    return [s.to_dict() for s in spans]


def set_clock_offset(offset_ns: int) -> None:
    """Runtime hook: how far this rank's monotonic clock runs ahead of rank 0's."""
    _recorder.clock_offset_ns = int(offset_ns)
