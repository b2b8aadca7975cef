"""Straggler injection: make one rank slow and watch everyone wait for it.

Synchronous data parallelism takes one optimizer step per global batch, and the all-reduce in
that step cannot finish until *every* rank has contributed, so each step lasts as long as the
slowest rank's compute plus the communication: ``t_step = max_r(t_compute[r]) + t_comm``. One
slow GPU, a noisy neighbour or a thermally throttled node therefore slows the whole job — the
motivation for backup workers (Chen et al., "Revisiting Distributed Synchronous SGD", 2016) and
for asynchronous schemes (:mod:`dtlab.parallel.data.async_sgd`) that give up exact equivalence.

Use :func:`straggle` inside a training step; the delay shows as an ``other`` span named
``straggler_delay`` on the slow rank (injected work, not waiting), and the others' ``wait:`` spans grow by the same amount.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dtlab import trace
from dtlab.runtime.context import rank


@dataclass(frozen=True)
class Straggler:
    """Which rank is slow, and by how many seconds per step."""

    slow_rank: int
    delay_s: float

    def __post_init__(self) -> None:
        if self.delay_s < 0:
            raise ValueError(f"a straggler delay must be >= 0 seconds, got {self.delay_s}")


def straggle(straggler: Straggler | None) -> None:
    """Sleep ``delay_s`` on the slow rank only (a no-op elsewhere or when ``None``)."""
    if straggler is None or rank() != straggler.slow_rank or straggler.delay_s == 0:
        return
    # Its own kind ("other", brown), not "idle": the delay is injected work, not waiting.
    with trace.span("straggler_delay", kind="other", delay_s=straggler.delay_s):
        time.sleep(straggler.delay_s)
