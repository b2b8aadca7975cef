"""The supervisor: detect a failure, tear down, restart ranks, resume from the last checkpoint.

The loop every large-scale trainer runs around its job (torchrun's ``--max-restarts``, Slurm
requeue, TorchElastic), here around :meth:`dtlab.Cluster.run`:

1. run the job on every rank;
2. if the run ends in :class:`~dtlab.runtime.ClusterError` — a rank died (``RankDied``), hung
   (``ClusterTimeout``) or raised (``RankError``) — record when it was detected; the Cluster has
   already torn the ranks down and starts fresh ones on the next ``run``;
3. run again: the job itself loads the newest *complete* checkpoint. **Elastic**: with
   ``elastic_world_size`` the retry runs on a new, smaller Cluster and the checkpoint is
   resharded as it loads.

Each attempt's wall-clock span and the measured detection delay (from the fault's own log line to
the exception reaching the supervisor) go into :class:`Recovery`, which lab 10 draws as a timeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dtlab.faults.inject import fired_faults
from dtlab.faults.job import fault_log


@dataclass
class Attempt:
    """One run of the job: on how many ranks, from when to when (seconds), and how it ended."""

    index: int
    world_size: int
    start_s: float
    end_s: float
    outcome: str  # "finished" or the exception class name
    message: str = ""
    fault_s: float | None = None  # when the injected fault fired (same clock)

    @property
    def detection_s(self) -> float | None:
        """Seconds from the fault firing to the supervisor knowing (measured)."""
        return None if self.fault_s is None else self.end_s - self.fault_s


@dataclass
class Recovery:
    result: list
    attempts: list[Attempt] = field(default_factory=list)

    def describe(self) -> str:
        lines = []
        for a in self.attempts:
            detect = "" if a.detection_s is None else f", detected {a.detection_s:.2f} s after"
            lines.append(
                f"attempt {a.index} on {a.world_size} ranks: {a.start_s:6.2f}..{a.end_s:6.2f} s "
                f"{a.outcome}{detect}"
            )
        return "\n".join(lines)


def run_with_recovery(
    cluster,
    job: Callable,
    root: str | Path,
    *args,
    faults=(),
    max_restarts: int = 3,
    elastic_world_size: int | None = None,
    elastic_timeout_s: float = 120.0,
    **kwargs,
) -> Recovery:
    """Run ``job(root, *args, faults=..., attempt=k, **kwargs)`` until it finishes.

    A new Cluster made for an elastic restart (run timeout ``elastic_timeout_s``: its first run
    also starts the ranks' Python) is closed before returning.
    """
    from dtlab.runtime import Cluster, ClusterError

    t0 = time.time()
    attempts: list[Attempt] = []
    current, owned = cluster, False
    try:
        for k in range(max_restarts + 1):
            started = time.time() - t0
            seen = len(fired_faults(fault_log(root)))
            try:
                out = current.run(job, str(root), *args, faults=list(faults), attempt=k, **kwargs)
            except ClusterError as exc:
                ended = time.time() - t0
                fired = fired_faults(fault_log(root))[seen:]
                fault_s = fired[0]["time"] - t0 if fired else None
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                attempts.append(
                    Attempt(
                        k,
                        current.world_size,
                        started,
                        ended,
                        type(exc).__name__,
                        first_line,
                        fault_s,
                    )
                )
                if k == max_restarts:
                    raise
                if elastic_world_size is not None and elastic_world_size != current.world_size:
                    if owned:
                        current.close()
                    current = Cluster(
                        elastic_world_size, device=cluster.device_type, timeout=elastic_timeout_s
                    )
                    owned = True
                continue
            attempts.append(Attempt(k, current.world_size, started, time.time() - t0, "finished"))
            return Recovery(list(out), attempts)
    finally:
        if owned:
            current.close()
    raise AssertionError("unreachable")
