"""Failure injection: make one rank die, hang, raise or slow down at a chosen step.

Faults are data (:class:`Fault`), passed to the rank function, which calls :func:`maybe_fail` at
its injection points — at the start of a step (``phase="step"``) or in the middle of a save,
after the rank file is written but before its done flag (``phase="save"``). What each kind does,
and how the :class:`~dtlab.Cluster` notices (nothing in the runtime is special-cased):

* ``kill`` — ``SIGKILL`` to its own process, like the out-of-memory killer or a lost node: the
  Cluster sees the process exit and raises :class:`~dtlab.runtime.RankDied`.
* ``hang`` — sleeps forever, like a wedged driver: peers block in their next collective and the
  Cluster's timeout raises :class:`~dtlab.runtime.ClusterTimeout`.
* ``raise`` — raises :class:`InjectedFault`, like a software bug: :class:`~dtlab.runtime.RankError`.
* ``slow`` — sleeps ``seconds`` once, like a straggler: nothing fails, everyone waits.

Before acting, the rank appends one line (time, rank, step, kind) to ``log_path`` so the
supervisor can measure how long detection took.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

KINDS = ("kill", "hang", "raise", "slow")
PHASES = ("step", "save")


class InjectedFault(RuntimeError):
    """The exception a ``raise`` fault throws."""


@dataclass(frozen=True)
class Fault:
    """``kind`` on ``rank`` when it reaches ``step`` (in ``phase``) during attempt ``attempt``."""

    kind: str
    rank: int
    step: int
    phase: str = "step"
    seconds: float = 1.0
    attempt: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind {self.kind!r} is not one of {KINDS}")
        if self.phase not in PHASES:
            raise ValueError(f"fault phase {self.phase!r} is not one of {PHASES}")
        if self.rank < 0 or self.step < 0:
            raise ValueError(f"fault rank {self.rank} and step {self.step} must be >= 0")


def maybe_fail(
    faults,
    rank: int,
    step: int,
    attempt: int,
    phase: str = "step",
    log_path: str | Path | None = None,
) -> None:
    """Fire every fault in ``faults`` that targets this rank, step, phase and attempt."""
    for f in faults or ():
        if (f.rank, f.step, f.phase, f.attempt) != (rank, step, phase, attempt):
            continue
        if log_path is not None:
            line = json.dumps({**asdict(f), "time": time.time(), "pid": os.getpid()})
            with open(log_path, "a") as out:
                out.write(line + "\n")
                out.flush()
                os.fsync(out.fileno())
        if f.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif f.kind == "hang":
            while True:
                time.sleep(3600)
        elif f.kind == "raise":
            raise InjectedFault(f"injected failure on rank {rank} at step {step} ({phase})")
        else:
            time.sleep(f.seconds)


def fired_faults(log_path: str | Path) -> list[dict]:
    """Every fault that fired, in order, as logged by :func:`maybe_fail`."""
    path = Path(log_path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
