"""The measuring side of ``dtlab bench collectives``: one sweep of sizes on one Cluster.

:func:`run_sweep` ships :func:`_measure_on_rank` to every rank. There each algorithm of
:data:`dtlab.collectives.ALGORITHMS` for the op, the ``torch.distributed`` collective
(:data:`BUILTIN`) and, on request, the call-agreement check alone (:data:`CHECK`) run on the same
buffers, interleaved iteration by iteration; one iteration's time is the slowest rank's (an
all-reduce of each rank's clock reading, ``MAX``). Back on the driver each (algorithm, size)
becomes a :class:`BenchRecord`: the median and fastest iteration, every iteration's time, and
the nccl-tests ``algbw``/``busbw`` (:mod:`dtlab.cost.bandwidth`). :mod:`dtlab.bench.collectives`
summarizes and prints them. The leading underscore keeps this module off ``dtlab bench``'s list:
it is a part of the ``collectives`` benchmark, not one of its own. The all-reduce may also time
``"ring_shm"`` (:data:`RING_SHM`): the same ring through shared memory
(``all_reduce(transport="shm")``, :mod:`dtlab.collectives.shm_transport`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from dtlab.cost.bandwidth import algbw, busbw

BUILTIN = "torch"
CHECK = "check"  # the agreement check alone: timed like a collective, reported as a cost
# the ring all-reduce through shared memory (all_reduce(transport="shm")); all_reduce only
RING_SHM = "ring_shm"
KIB, MIB = 1024, 1024 * 1024


@dataclass
class BenchRecord:
    """One (op, algorithm, world size, size) point: median seconds and nccl-tests bandwidths."""

    op: str
    algorithm: str  # one of ALGORITHMS[op], or "torch" for the built-in collective
    world_size: int
    backend: str
    nbytes: int
    seconds: float
    algbw_gbps: float
    busbw_gbps: float
    iterations: int
    best_seconds: float | None = None  # fastest iteration: steadier than the median on a busy host
    samples: list[float] | None = None  # every iteration's time, in order (paired across calls)


def default_sizes(fast: bool) -> list[int]:
    """1 KiB → 64 MiB in ×2 steps; in fast mode 1 KiB → 4 MiB in ×4 steps."""
    if fast:
        return [KIB * 4**k for k in range(7)]
    return [KIB * 2**k for k in range(17)]


def _calls_for(
    op: str, algorithms: Sequence[str], nbytes: int, n: int, dev, time_check: bool = False
) -> tuple[int, dict]:
    """Buffers of ``nbytes`` (fp32, a multiple of ``n`` elements) and a zero-argument call per
    algorithm plus the built-in, all reusing the same buffers."""
    import torch
    import torch.distributed as dist

    from dtlab import collectives

    elements = max(n, nbytes // 4 // n * n)
    x = torch.ones(elements, device=dev)
    shard = torch.ones(elements // n, device=dev)
    out = torch.empty(elements, device=dev)
    rs_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    builtins = {
        "all_reduce": lambda: dist.all_reduce(x),
        "broadcast": lambda: dist.broadcast(x, 0),
        "reduce": lambda: dist.reduce(x, 0),
        "reduce_scatter": lambda: rs_single(shard, x),
        "all_gather": lambda: ag_single(out, shard),
        "all_to_all": lambda: dist.all_to_all_single(out, x),
    }
    arguments = {
        "all_reduce": ((x,), {}),
        "broadcast": ((x,), {}),
        "reduce": ((x,), {}),
        "reduce_scatter": ((x,), {}),
        "all_gather": ((shard,), {"out": out}),
        "all_to_all": ((x,), {"out": out}),
    }
    args, kwargs = arguments[op]
    calls = {
        a: partial(collectives.ALGORITHMS[op][a], *args, **kwargs)
        for a in algorithms
        if a != RING_SHM
    }
    if RING_SHM in algorithms:
        calls[RING_SHM] = partial(collectives.all_reduce, x, algorithm="ring", transport="shm")
    calls[BUILTIN] = builtins[op]
    if time_check and op == "all_reduce" and ("ring" in algorithms or RING_SHM in algorithms):
        from dtlab.collectives.agreement import CallDescriptor, check_agreement
        from dtlab.collectives.p2p import peers_of

        ring_call = CallDescriptor("all_reduce", "ring", x.dtype, x.numel(), op="sum")
        calls[CHECK] = partial(check_agreement, peers_of(None), ring_call, dev)
    return elements, calls


def _measure_on_rank(
    op: str,
    algorithms: Sequence[str],
    sizes: Sequence[int],
    iters: int,
    warmup: int,
    time_check: bool = False,
) -> list[tuple[str, int, float, float]]:
    """Runs on every rank: median over iterations of the slowest rank's time, per algorithm/size."""
    import torch
    import torch.distributed as dist

    from dtlab.runtime.context import device

    n, dev = dist.get_world_size(), device()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    results = []
    for nbytes in sizes:
        elements, calls = _calls_for(op, algorithms, nbytes, n, dev, time_check)
        times: dict[str, list[float]] = {a: [] for a in calls}
        for i in range(warmup + iters):
            for name, call in calls.items():
                dist.barrier()
                sync()
                start = time.perf_counter()
                call()
                sync()
                slowest = torch.tensor(
                    [time.perf_counter() - start], dtype=torch.float64, device=dev
                )
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                if i >= warmup:
                    times[name].append(float(slowest.item()))
        for name, measured in times.items():
            results.append(
                (name, elements * 4, statistics.median(measured), min(measured), measured)
            )
    return results


def run_sweep(
    cluster=None,
    world_size: int = 2,
    op: str = "all_reduce",
    algorithms: Sequence[str] | None = None,
    sizes: Sequence[int] | None = None,
    iters: int = 7,
    warmup: int = 2,
    time_check: bool = False,
) -> list[BenchRecord]:
    """Measure ``op`` by each of ``algorithms`` (default: all) and the built-in, on ``cluster``
    (or a fresh one of ``world_size`` ranks). Returns one :class:`BenchRecord` per point;
    ``time_check=True`` (an all-reduce sweep with the ring) adds the agreement check's records."""
    from dtlab import collectives
    from dtlab.config import fast_mode

    if op not in collectives.ALGORITHMS or op in ("gather", "scatter", "barrier"):
        raise ValueError(
            f"cannot benchmark {op!r}; choose all_reduce, broadcast, reduce, "
            "reduce_scatter, all_gather or all_to_all"
        )
    algorithms = list(algorithms or collectives.ALGORITHMS[op])
    unknown = [a for a in algorithms if a not in collectives.ALGORITHMS[op]]
    if unknown and (op != "all_reduce" or unknown != [RING_SHM]):
        raise ValueError(
            f"no {op} algorithm {unknown}; choose from {list(collectives.ALGORITHMS[op])}"
            + (f" or {RING_SHM!r} (the ring through shared memory)" if op == "all_reduce" else "")
        )
    sizes = list(sizes or default_sizes(fast_mode()))
    own = cluster is None
    if own:
        from dtlab import Cluster

        cluster = Cluster(world_size)
    try:
        raw = cluster.run(_measure_on_rank, op, algorithms, sizes, iters, warmup, time_check)[0]
        backend = cluster.run(lambda: __import__("torch").distributed.get_backend())[0]
        n = cluster.world_size
    finally:
        if own:
            cluster.close()
    return [
        BenchRecord(
            op,
            name,
            n,
            backend,
            nbytes,
            seconds,
            0.0 if name == CHECK else algbw(nbytes, seconds) / 1e9,
            0.0 if name == CHECK else busbw(op, nbytes, seconds, n) / 1e9,
            iters,
            best,
            samples,
        )
        for name, nbytes, seconds, best, samples in raw
    ]
