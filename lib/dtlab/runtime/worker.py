"""The rank process: join the process group once, then run whatever the notebook sends.

One worker per rank, forked from a forkserver that has already imported torch (so a fork costs
milliseconds, and the notebook kernel itself never forks after CUDA init). The notebook and the
worker talk over a private ``multiprocessing`` pipe (a Unix socketpair: no network address).

Messages, notebook → worker: ``("run", call_id, payload, sys_path)`` and ``("stop",)``.
Worker → notebook: ``("ready", rank, pid)``, then per call ``("ok"|"error", call_id, data, spans)``.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import cloudpickle
import torch
import torch.distributed as dist

from dtlab import trace
from dtlab.runtime import context


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


def _run_one(spec: WorkerSpec, call_id: int, payload: bytes) -> tuple:
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
    except Exception:
        return (
            "error",
            call_id,
            (
                "RuntimeError",
                "could not unpickle the function on this rank",
                traceback.format_exc(),
                "unpickle",
            ),
            [],
        )
    trace.begin_call(spec.rank)
    try:
        result = _call_user_function(fn, args, kwargs)
    except BaseException as exc:  # report everything, including SystemExit from user code
        spans = trace.end_call()
        return (
            "error",
            call_id,
            (type(exc).__name__, str(exc), _user_traceback(exc), "raised"),
            spans,
        )
    spans = trace.end_call()
    try:
        data = cloudpickle.dumps(_to_cpu(result))
    except Exception as exc:
        return (
            "error",
            call_id,
            (type(exc).__name__, str(exc), traceback.format_exc(), "unpicklable"),
            spans,
        )
    return ("ok", call_id, data, spans)


def worker_main(spec: WorkerSpec, conn) -> None:
    """Entry point of a rank process (runs until told to stop or the parent goes away)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the notebook handles interrupts for everyone
    stack_file = open(spec.stack_dump_path, "a")  # noqa: SIM115 - must outlive this frame
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)
    threading.Thread(target=_watch_parent, args=(spec.parent_pid,), daemon=True).start()

    os.environ.update({k: str(v) for k, v in spec.env.items()})
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.world_size))
    _init_process_group(spec)
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
            conn.send(_run_one(spec, call_id, payload))
    finally:
        context._forget_groups()
        if dist.is_initialized():
            dist.destroy_process_group()
        conn.close()
