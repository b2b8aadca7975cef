"""A replica as its own OS process, so that a failure can be a real ``SIGKILL``.

In torchft every data-parallel replica group is a separate job under its own launcher
(torchelastic's agent): when a replica's processes die, the launcher starts a replacement while
the other replicas keep training. Here each Cluster rank plays that launcher for one replica:
:func:`supervise_replica` ``fork``\\ s the replica process, waits for it, and — when it was
killed — waits ``down_s`` (the replacement booting) and forks a replacement that must rejoin.
The Cluster rank itself never dies (the Cluster would rightly end the whole run: that is a full
restart, the thing in-job recovery avoids); the *replica* dies for real and its memory — model,
optimizer, sockets — goes with it.

What moves between the processes: a stream of length-prefixed messages through a pipe to the
launcher. While it runs, the replica calls :func:`report` as it enters each phase of a step;
the message carries the phase and the spans finished since the last one, so the launcher's
timeline holds the replica's steps as they happen — and, if it is killed, knows in which phase
it died (recorded in ``deaths`` and drawn as a ``… (killed)`` span up to the death). The last
message is the result (or a traceback). Everything between replicas goes through the job's own
TCP store and gloo groups (:mod:`dtlab.faults.replicas`).

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
import pickle
import signal
import struct
import time
import traceback
from collections.abc import Callable

import torch

from dtlab.files import write_all
from dtlab.trace import begin_call, end_call, now_ns, record, span

_channel: tuple[int, int] | None = None  # in a replica process: (pipe to the launcher, rank)


class ReplicaFailed(RuntimeError):
    """A replica process ended other than by a finished run or an injected ``SIGKILL``."""


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # Linux only
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(1)


def _send(fd: int, message: dict, tensors: bool = False) -> None:
    if tensors:
        buf = io.BytesIO()
        torch.save(message, buf)
        data = b"T" + buf.getvalue()
    else:
        data = b"P" + pickle.dumps(message)
    write_all(fd, struct.pack("<Q", len(data)) + data)


def _messages(pipe):
    """The launcher's side: yield whole messages until EOF (a partial last one is dropped)."""
    while len(head := pipe.read(8)) == 8:
        size = struct.unpack("<Q", head)[0]
        if len(data := pipe.read(size)) < size:
            return  # killed while writing it
        body = data[1:]
        is_torch = data[:1] == b"T"
        yield torch.load(io.BytesIO(body), weights_only=False) if is_torch else pickle.loads(body)


def report(phase: str, **info) -> None:
    """In a replica process: "entering ``phase``" — sent to the launcher with the spans this
    process finished since its last report. A no-op outside a replica process."""
    if _channel is None:
        return
    fd, rank = _channel
    spans = end_call()
    begin_call(rank)
    _send(fd, {"phase": phase, "at_ns": now_ns(), "spans": spans, **info})


def _child(target: Callable[[], dict], rank: int, write_fd: int, parent: int) -> None:
    """In the forked process: run ``target``, send its result (or traceback), exit."""
    global _channel
    code = 0
    try:
        _die_with_parent(parent)
        torch.set_num_threads(1)
        begin_call(rank)  # this process's spans only (the fork copied the launcher's so far)
        _channel = (write_fd, rank)
        try:
            out = {"ok": target()}
        except BaseException:  # noqa: BLE001 - sent to the launcher, which raises it
            out, code = {"error": traceback.format_exc()}, 1
        out["spans"] = end_call()
        _send(write_fd, out, tensors=True)
    finally:
        os._exit(code)


def _record(spans: list[dict]) -> None:
    for s in spans:
        record(s["name"], s["kind"], s["start_ns"], s["end_ns"], s["nbytes"], **s["labels"])


def run_in_child(target: Callable[[], dict], rank: int) -> tuple[dict | None, int, dict | None]:
    """Fork, run ``target`` in the child, recording its spans as they arrive; return (its
    result or ``None``, its wait status, its last :func:`report` or ``None``)."""
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(target, rank, write_fd, parent)
    os.close(write_fd)
    out, last = None, None
    with os.fdopen(read_fd, "rb") as pipe:  # EOF once the child exits, however it exits
        for message in _messages(pipe):
            _record(message.pop("spans"))
            if "phase" in message:
                last = message
            else:
                out = message
    _, status = os.waitpid(pid, 0)
    return out, status, last


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
    incarnation's result with ``deaths`` (one entry per killed process: the step and phase it
    was in) added; the spans every child recorded, a killed one's too, join this rank's
    timeline. ``announce()`` runs as soon as a death is seen (it tells the job's quorum a
    replacement is coming).
    """
    deaths = []
    for incarnation in range(max_restarts + 1):
        started = time.perf_counter()
        out, status, last = run_in_child(make_target(incarnation), rank)
        if out is not None:
            if "error" in out:
                raise ReplicaFailed(
                    f"replica {rank} (process {incarnation}) raised:\n{out['error']}"
                )
            return {**out["ok"], "deaths": deaths}
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            raise ReplicaFailed(f"replica {rank}'s process ended with wait status {status}")
        announce()
        died_ns, last = now_ns(), last or {"phase": "start", "at_ns": now_ns()}
        at = {k: v for k, v in last.items() if k not in ("phase", "at_ns")}
        record(f"{last['phase']} (killed)", "idle", last["at_ns"], died_ns, replica=rank, **at)
        deaths.append(
            {
                "incarnation": incarnation,
                "signal": "SIGKILL",
                "phase": last["phase"],
                **at,
                "lived_s": time.perf_counter() - started,
            }
        )
        with span("down: replacement starting", kind="idle", replica=rank):
            time.sleep(down_s)
    raise ReplicaFailed(f"replica {rank} was killed {len(deaths)} times; giving up")
