"""Cluster call overhead beside launching torch ranks per call, interleaved in one run.

Run: ``dtlab bench runtime [--world-size 4] [--repeats 5] [--warm-calls 20] [--json PATH]``.

Every repeat times, in alternating order so both see the same load:

* **baseline: torch per call** — what running one function on N ranks costs without a warm
  pool: ``torch.multiprocessing.spawn`` of N processes that each import torch, join a gloo
  process group (``FileStore``), run a no-op and leave.
* **dtlab warm run** — ``cluster.run(no-op)`` on a started Cluster: pickling the function, a
  pipe round trip to every rank, collecting each rank's (empty) trace; the median of
  ``--warm-calls`` calls. Also with one 4-byte ``all_reduce`` inside, for scale.
* **dtlab cold start** — ``Cluster(N)`` until every rank has joined the process group (the first
  also pays for the forkserver importing torch, and is reported apart).

Reported: medians over repeats with their range, and the baseline ÷ warm-run ratio of each repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from dtlab.bench import Spread, rotated
from dtlab.runtime import Cluster
from dtlab.runtime.devices import loopback_interface


def _noop() -> None:
    return None


def _tiny_allreduce() -> None:
    dist.all_reduce(torch.ones(1))


def _baseline_rank(rank: int, world_size: int, store_path: str) -> None:
    """One rank of the baseline: join a gloo group, run the no-op, leave together."""
    interface = loopback_interface()
    if interface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    dist.init_process_group(
        "gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size
    )
    _noop()
    dist.barrier()
    dist.destroy_process_group()


def spawn_once(world_size: int) -> float:
    """Seconds for one baseline call: spawn ``world_size`` fresh torch processes, no-op, join."""
    import torch.multiprocessing as tmp

    workdir = tempfile.mkdtemp(prefix="dtlab-bench-spawn-")
    try:
        started = time.perf_counter()
        tmp.spawn(
            _baseline_rank, args=(world_size, os.path.join(workdir, "store")), nprocs=world_size
        )
        return time.perf_counter() - started
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _warm_calls(cluster: Cluster, fn, calls: int) -> float:
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        cluster.run(fn)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def measure(world_size: int = 4, repeats: int = 5, warm_calls: int = 20) -> dict:
    """Baseline and dtlab timings (seconds), interleaved repeat by repeat, as :class:`Spread`\\ s."""
    if repeats < 1 or warm_calls < 1:
        raise ValueError("repeats and warm_calls must be at least 1")
    baseline, warm, warm_allreduce, cold = [], [], [], []
    for repeat in range(repeats):
        for name in rotated(["baseline", "dtlab"], repeat):
            if name == "baseline":
                baseline.append(spawn_once(world_size))
                continue
            started = time.perf_counter()
            cluster = Cluster(world_size, device="cpu")
            cold.append(time.perf_counter() - started)
            try:
                _warm_calls(cluster, _noop, 2)  # first calls ship sys.path and warm the pipes
                warm.append(_warm_calls(cluster, _noop, warm_calls))
                warm_allreduce.append(_warm_calls(cluster, _tiny_allreduce, warm_calls))
            finally:
                cluster.close()
    return {
        "world_size": world_size,
        "repeats": repeats,
        "warm_calls": warm_calls,
        "baseline_spawn_per_call_s": Spread.of(baseline),
        "warm_run_s": Spread.of(warm),
        "warm_allreduce_run_s": Spread.of(warm_allreduce),
        "first_cold_start_s": cold[0],
        "cold_start_s": Spread.of(cold[1:] or cold),
        "baseline_over_warm_run": Spread.of([b / w for b, w in zip(baseline, warm, strict=True)]),
    }


def _row(label: str, spread: Spread, scale: float, unit: str, digits: int = 2) -> str:
    low, median, high = (v * scale for v in (spread.low, spread.median, spread.high))
    return f"{label:<48}{median:10.{digits}f} {unit}  ({low:.{digits}f}-{high:.{digits}f})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dtlab bench runtime", description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warm-calls", type=int, default=20)
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    result = measure(args.world_size, args.repeats, args.warm_calls)
    print(f"ranks: {result['world_size']} (gloo, CPU); medians over {args.repeats} repeats (range)")
    print(
        _row(
            "baseline: torch.multiprocessing.spawn per call",
            result["baseline_spawn_per_call_s"],
            1,
            "s",
        )
    )
    print(_row("dtlab warm cluster.run of a no-op", result["warm_run_s"], 1e3, "ms"))
    print(
        _row(
            "dtlab warm cluster.run of a 4-byte all_reduce",
            result["warm_allreduce_run_s"],
            1e3,
            "ms",
        )
    )
    print(_row("dtlab cold start, Cluster(N)", result["cold_start_s"], 1, "s"))
    print(
        f"{'  (first cold start, forkserver imports torch)':<48}{result['first_cold_start_s']:10.2f} s"
    )
    print(_row("baseline / warm run", result["baseline_over_warm_run"], 1, "x", digits=0))
    if args.json:
        serialisable = {k: asdict(v) if isinstance(v, Spread) else v for k, v in result.items()}
        with open(args.json, "w") as out:
            json.dump(serialisable, out, indent=2)
    return 0
