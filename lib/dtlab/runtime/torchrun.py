"""Run the same user function under ``torchrun`` (and Slurm's ``srun torchrun``) or a Cluster.

A training script written for the labs ends with::

    if __name__ == "__main__":
        results = dtlab.launch(train, steps=100, world_size=4)

* Started with ``python train.py``, ``launch`` opens a local :class:`Cluster` of ``world_size``
  ranks and runs ``train`` on each.
* Started with ``torchrun --nnodes=2 --nproc-per-node=8 train.py``, each process *is* a rank:
  ``launch`` joins the process group from torchrun's environment (``env://``: RANK, WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT, LOCAL_RANK), runs ``train`` once, and all-gathers every rank's result,
  so both paths return the same list in rank order.

When every rank runs on this one machine (``LOCAL_WORLD_SIZE == WORLD_SIZE``, e.g.
``torchrun --standalone``), gloo listens on the loopback interface only, as in a Cluster; across
nodes it must listen where the other nodes can reach it, so ``GLOO_SOCKET_IFNAME`` is left to you.
"""

from __future__ import annotations

import atexit
import os
import time
from contextlib import suppress
from datetime import timedelta

import torch
import torch.distributed as dist

from dtlab import trace
from dtlab.runtime.devices import loopback_interface

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def running_under_torchrun() -> bool:
    """True when this process was started by torchrun (or another env:// launcher)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(v in os.environ for v in _TORCHRUN_VARS)


def init_from_env(backend: str | None = None, timeout_s: float = 600.0) -> str:
    """Join the process group described by torchrun's environment; return the backend used.

    ``backend=None`` picks NCCL when this process has a GPU of its own (LOCAL_RANK < GPU count),
    otherwise gloo. Calling it twice is harmless.
    """
    if dist.is_initialized():
        return dist.get_backend()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend is None:
        has_gpu = torch.cuda.is_available() and local_rank < torch.cuda.device_count()
        backend = "nccl" if has_gpu else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    _listen_on_loopback_if_single_node()
    dist.init_process_group(
        backend=backend, init_method="env://", timeout=timedelta(seconds=timeout_s)
    )
    # A process that exits with a live gloo/NCCL group can abort in C++ ("terminate called
    # without an active exception"); the group we created is ours to tear down.
    atexit.register(_leave_process_group)
    calibrate = getattr(trace, "calibrate_clock", None)
    if calibrate is not None:
        calibrate()
    return backend


def _listen_on_loopback_if_single_node() -> None:
    """Single node: gloo listens on loopback only (a ``GLOO_SOCKET_IFNAME`` you set wins)."""
    single_node = os.environ.get("LOCAL_WORLD_SIZE", "") == os.environ.get("WORLD_SIZE", "-")
    interface = loopback_interface()
    if single_node and interface and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = interface


def _leave_process_group() -> None:
    """Leave together: the barrier keeps a rank from closing its sockets while a peer still
    talks on them (which aborts the peer); a peer that already died makes it raise, not hang."""
    if not dist.is_initialized():
        return
    with suppress(Exception):  # a dead peer makes the barrier raise: tear down anyway
        dist.barrier()
    dist.destroy_process_group()


def set_training_timeout(timeout_s: float, group: dist.ProcessGroup | None = None) -> bool:
    """Once every rank is ready, shorten ``group``'s collective timeout to ``timeout_s``.

    Start-up (imports, loading a checkpoint, compiling) can keep the slowest rank away from the
    first collective for minutes, so the group is joined with a long timeout; after that, a short
    one detects a hang in seconds (:mod:`dtlab.faults.timeouts`). Every rank of ``group`` passes
    one barrier under the long timeout, then the timeout is changed with torch's
    ``distributed_c10d._set_pg_timeout`` (what torchtitan does; private — in torch since 2.3,
    checked in 2.13). Without it the long timeout stays, a warning says so, and this returns
    ``False`` (held by ``tests/test_faults_timeouts.py``, which removes the setter).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive seconds, got {timeout_s!r}")
    dist.barrier(group=group)
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None:
        import warnings

        warnings.warn(
            "this torch has no distributed_c10d._set_pg_timeout: the process group keeps its "
            "start-up timeout for training",
            stacklevel=2,
        )
        return False
    setter(timedelta(seconds=timeout_s), group)
    return True


def launch(
    fn,
    *args,
    world_size: int | None = None,
    device: str = "auto",
    timeout: float = 600.0,
    start_timeout: float | None = None,
    **kwargs,
):
    """Run ``fn(*args, **kwargs)`` on every rank and return the results in rank order.

    Under torchrun the world size comes from the launcher and ``world_size`` is ignored.
    ``timeout``: seconds a collective may wait (under torchrun) or a run may take (a Cluster).
    ``start_timeout``: seconds the ranks get to start and meet at their first collective; when
    given under torchrun the group is joined with it and shortened to ``timeout`` after one
    barrier (:func:`set_training_timeout`) — a long first-collective timeout and a short training
    one. Without it, one ``timeout`` serves both, as before.
    """
    if running_under_torchrun():
        from dtlab.runtime.cluster import RunResult

        init_from_env(timeout_s=start_timeout if start_timeout is not None else timeout)
        if start_timeout is not None:
            set_training_timeout(timeout)
        rank = dist.get_rank()
        started = time.perf_counter()
        trace.begin_call(rank)
        try:
            value = fn(*args, **kwargs)
        finally:
            spans = trace.end_call()
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (value, spans))
        return RunResult(
            [v for v, _ in gathered],
            trace.Trace.from_rank_spans([s for _, s in gathered]),
            time.perf_counter() - started,
        )

    from dtlab.runtime.cluster import Cluster

    if world_size is None:
        raise ValueError("launch() outside torchrun needs world_size=N (how many local ranks)")
    starting = {} if start_timeout is None else {"start_timeout": start_timeout}
    with Cluster(world_size, device=device, timeout=timeout, **starting) as cluster:
        return cluster.run(fn, *args, **kwargs)
