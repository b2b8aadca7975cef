"""Per-rank timelines: spans of compute, communication and idle time, with bytes and labels.

Inside a function run on the Cluster (or under torchrun)::

    with dtlab.trace.span("allreduce", kind="comm", nbytes=t.numel() * t.element_size()):
        dist.all_reduce(t)

    out = cluster.run(step)
    out.trace.total_seconds("comm"), out.trace.hidden_fraction(), out.trace.to_chrome("t.json")
    dtlab.viz.timeline(out.trace)

* :mod:`~dtlab.trace.recorder` — ``span``, ``cuda_span`` (device time from CUDA events),
  ``record``, ``labels`` (micro-batch, phase, group on every span inside a block), and the hooks
  the runtime calls around every run.
* :mod:`~dtlab.trace.clock` — ``calibrate_clock``: every rank's spans on rank 0's clock.
* :mod:`~dtlab.trace.analysis` — ``Trace``: per-kind time, bytes moved, idle gaps, overlap.
* :mod:`~dtlab.trace.chrome` — export for Perfetto / chrome://tracing.
"""

from dtlab.trace.analysis import Trace
from dtlab.trace.clock import calibrate_clock
from dtlab.trace.recorder import (
    KINDS,
    Span,
    begin_call,
    cuda_mark,
    cuda_span,
    current_labels,
    end_call,
    labels,
    now_ns,
    record,
    record_cuda,
    set_clock_offset,
    span,
)

__all__ = [
    "KINDS",
    "Span",
    "Trace",
    "span",
    "cuda_span",
    "cuda_mark",
    "record_cuda",
    "labels",
    "current_labels",
    "record",
    "now_ns",
    "begin_call",
    "end_call",
    "set_clock_offset",
    "calibrate_clock",
]
