"""The rank process: join the process group once, then run whatever the notebook sends.

One worker per rank, forked from a forkserver that has already imported torch (so a fork costs
milliseconds, and the notebook kernel itself never forks after CUDA init). The notebook and the
worker talk over a private ``multiprocessing`` pipe (a Unix socketpair: no network address).

Messages, notebook → worker: ``("run", call_id, payload, sys_path)`` and ``("stop",)``.
Worker → notebook: ``("ready", rank, pid)``, then per call any number of ``("progress", call_id,
(done, total, desc))`` from rank 0 (:mod:`dtlab.progress`), then ``("ok"|"error", call_id, data,
spans, counts)``. When the function returns with communication still unfinished (an ``isend`` never
waited for), ``("draining", call_id, report)`` comes first: the rank waits for that work before it
replies, and the Cluster decides from every rank's counts whether it can ever finish.

A second pipe serves a helper thread that answers ``("status", n)`` with
:func:`dtlab.runtime.inflight.snapshot` at any time, even while the main thread is blocked in C++
inside a collective (which releases the GIL): that is how the Cluster tells a rank blocked on a
peer from one still computing.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from dtlab import progress, trace
from dtlab.runtime import context, inflight, last_words
from dtlab.runtime import payload as wire


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a rank needs to start; sent once when the process is created."""

    rank: int
    world_size: int
    backend: str
    init_method: str
    parent_pid: int
    stack_dump_path: str
    collective_timeout_s: float
    env: dict
    stderr_path: str | None = None  # where fd 2 goes (dtlab.runtime.last_words); None: unchanged


def _watch_parent(parent_pid: int) -> None:
    """Exit if the notebook kernel dies, even while the main thread is stuck in a collective."""
    while True:
        time.sleep(0.5)
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os._exit(3)
        except PermissionError:
            pass


def _answer_status(diag) -> None:
    """Helper thread: report what the main thread is doing, whenever the Cluster asks."""
    while True:
        try:
            _, number = diag.recv()
        except (EOFError, OSError):
            return
        try:
            status = inflight.snapshot()
        except Exception:  # an answer the Cluster cannot use: it falls back to a stack dump
            status = {}
        try:
            diag.send((number, status))
        except (EOFError, OSError):
            return


def _to_cpu(value):
    """Results travel back through a pipe: move tensors off the GPU, recursively."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value.detach()
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, dict) and type(value) is dict:
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _call_user_function(fn, args, kwargs):
    # Named entry point: the hang diagnosis finds the user's frames above this one.
    return fn(*args, **kwargs)


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the user's function down, without this module's two frames."""
    tb = exc.__traceback__
    for _ in range(2):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _init_process_group(spec: WorkerSpec) -> None:
    if spec.backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(
        backend=spec.backend,
        init_method=spec.init_method,
        rank=spec.rank,
        world_size=spec.world_size,
        timeout=timedelta(seconds=spec.collective_timeout_s),
    )
    calibrate = getattr(trace, "calibrate_clock", None)
    if calibrate is not None:
        calibrate()


def _run_one(spec: WorkerSpec, call_id: int, payload: bytes, conn) -> tuple:
    try:
        fn, args, kwargs = wire.loads(payload)
    except Exception:
        error = ("RuntimeError", "could not unpickle the function on this rank")
        return ("error", call_id, (*error, traceback.format_exc(), "unpickle"), [], {})
    trace.begin_call(spec.rank)
    inflight.begin_run()
    progress.bind_sender(lambda message: conn.send(("progress", call_id, message)), spec.rank == 0)
    try:
        result = _call_user_function(fn, args, kwargs)
        outcome = None
    except BaseException as exc:  # report everything, including SystemExit from user code
        outcome = (type(exc).__name__, str(exc), _user_traceback(exc), "raised")
    finally:
        progress.bind_sender(None, spec.rank == 0)
        spans = trace.end_call()
        # Work left in flight would be matched by the next run's messages: finish it first.
        unfinished = inflight.unfinished()
        if unfinished:
            conn.send(("draining", call_id, inflight.report(unfinished)))
            inflight.drain(unfinished)
        counts = inflight.end_run()
    if outcome is not None:
        return ("error", call_id, outcome, spans, counts)
    try:
        data = wire.dumps(_to_cpu(result))
    except Exception as exc:
        outcome = (type(exc).__name__, str(exc), traceback.format_exc(), "unpicklable")
        return ("error", call_id, outcome, spans, counts)
    return ("ok", call_id, data, spans, counts)


def _leave_process_group() -> None:
    """Leave together, quietly. The barrier keeps a rank from closing its sockets while a peer
    still talks on them; gloo may still abort in C++ while tearing down ("terminate called
    without an active exception"), after every result was delivered: that is no crash of the
    user's work, so this rank's stderr goes to /dev/null for the teardown."""
    context._forget_groups()
    inflight.forget_groups()
    if not dist.is_initialized():
        return
    with suppress(Exception):  # a peer that died makes the barrier raise: leave anyway
        dist.barrier()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    dist.destroy_process_group()


def worker_main(spec: WorkerSpec, conn, diag) -> None:
    """Entry point of a rank process (runs until told to stop or the parent goes away)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the notebook handles interrupts for everyone
    if spec.stderr_path is not None:
        last_words.capture_stderr(spec.stderr_path)  # first: a death from here on leaves a reason
    stack_file = open(spec.stack_dump_path, "a")  # noqa: SIM115 - must outlive this frame
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)
    threading.Thread(target=_watch_parent, args=(spec.parent_pid,), daemon=True).start()

    os.environ.update({k: str(v) for k, v in spec.env.items()})
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.world_size))
    _init_process_group(spec)
    inflight.install()
    threading.Thread(target=_answer_status, args=(diag,), daemon=True).start()
    conn.send(("ready", spec.rank, os.getpid()))

    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "stop":
                break
            _, call_id, payload, sys_path = message
            if sys_path is not None:
                sys.path[:] = sys_path
            conn.send(_run_one(spec, call_id, payload, conn))
        _leave_process_group()
    finally:
        conn.close()
