"""A replica as its own OS process, so that a failure can be a real ``SIGKILL``.

In torchft every data-parallel replica group is a separate job under its own launcher
(torchelastic's agent): when a replica's processes die, the launcher starts a replacement while
the other replicas keep training. Here each Cluster rank plays that launcher for one replica:
:func:`supervise_replica` ``fork``\\ s the replica process, waits for it, and — when it was
killed — waits ``down_s`` (the replacement booting) and forks a replacement that must rejoin.
The Cluster rank itself never dies (the Cluster would rightly end the whole run: that is a full
restart, the thing in-job recovery avoids); the *replica* dies for real and its memory — model,
optimizer, sockets — goes with it.

What moves between the processes: the replica's result (a ``torch.save`` of a dict, with the
spans it recorded) through a pipe to its launcher. Everything between replicas goes through the
job's own TCP store and gloo groups (:mod:`dtlab.faults.replicas`).

``os.fork`` rather than ``multiprocessing``: Cluster ranks are daemonic processes, which
``multiprocessing`` forbids to have children; a forked child also starts in milliseconds with
torch already imported (as a DataLoader worker does). The child asks the kernel to kill it if its
launcher dies (``PR_SET_PDEATHSIG``), so a torn-down Cluster leaves no orphans.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import signal
import time
import traceback
from collections.abc import Callable

import torch

from dtlab.files import write_all
from dtlab.trace import begin_call, end_call, record, span


class ReplicaFailed(RuntimeError):
    """A replica process ended other than by a finished run or an injected ``SIGKILL``."""


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # Linux only
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(1)


def _child(target: Callable[[], dict], rank: int, write_fd: int, parent: int) -> None:
    """In the forked process: run ``target``, send its result (or traceback), exit."""
    code = 0
    try:
        _die_with_parent(parent)
        torch.set_num_threads(1)
        begin_call(rank)  # this process's spans only (the fork copied the launcher's so far)
        try:
            out = {"ok": target()}
        except BaseException:  # noqa: BLE001 - sent to the launcher, which raises it
            out, code = {"error": traceback.format_exc()}, 1
        out["spans"] = end_call()
        buf = io.BytesIO()
        torch.save(out, buf)
        write_all(write_fd, buf.getvalue())
    finally:
        os._exit(code)


def run_in_child(target: Callable[[], dict], rank: int) -> tuple[dict | None, int]:
    """Fork, run ``target`` in the child; return (its result or ``None``, its wait status)."""
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(target, rank, write_fd, parent)
    os.close(write_fd)
    chunks = []
    with os.fdopen(read_fd, "rb") as pipe:  # EOF once the child exits, however it exits
        while chunk := pipe.read(1 << 20):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    data = b"".join(chunks)
    out = torch.load(io.BytesIO(data), weights_only=False) if data else None
    return out, status


def supervise_replica(
    make_target: Callable[[int], Callable[[], dict]],
    rank: int,
    down_s: float,
    max_restarts: int,
    announce: Callable[[], None] = lambda: None,
) -> dict:
    """Run replica ``rank`` as a child process; replace it whenever it is killed.

    ``make_target(incarnation)`` is what the child runs: incarnation 0 is the original replica,
    1, 2, ... are replacements (which start from nothing and must rejoin). Returns the last
    incarnation's result with ``deaths`` (one entry per killed process) added; the spans every
    finished child recorded join this rank's timeline. ``announce()`` runs as soon as a death is
    seen (it tells the job's quorum a replacement is coming).
    """
    deaths = []
    for incarnation in range(max_restarts + 1):
        started = time.perf_counter()
        out, status = run_in_child(make_target(incarnation), rank)
        if out is not None:
            for s in out["spans"]:
                record(s["name"], s["kind"], s["start_ns"], s["end_ns"], s["nbytes"], **s["labels"])
            if "error" in out:
                raise ReplicaFailed(
                    f"replica {rank} (process {incarnation}) raised:\n{out['error']}"
                )
            return {**out["ok"], "deaths": deaths}
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            raise ReplicaFailed(f"replica {rank}'s process ended with wait status {status}")
        announce()
        deaths.append(
            {
                "incarnation": incarnation,
                "signal": "SIGKILL",
                "lived_s": time.perf_counter() - started,
            }
        )
        with span("down: replacement starting", kind="idle", replica=rank):
            time.sleep(down_s)
    raise ReplicaFailed(f"replica {rank} was killed {len(deaths)} times; giving up")
