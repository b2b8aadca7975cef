"""Cluster start-up and call overhead: cold start of N ranks and a warm trivial run, as medians.

Run: ``dtlab bench runtime [--world-size 4] [--repeats 5] [--warm-calls 50] [--json PATH]``.

* **cold start** — ``Cluster(N)`` until every rank has joined the process group (the first
  repeat also pays for the forkserver importing torch; it is reported separately).
* **warm run** — ``cluster.run(lambda: None)`` on a started cluster: pickling the function,
  the pipe round trip to every rank, and collecting each rank's (empty) trace.
* **warm all-reduce** — the same with one 4-byte ``all_reduce`` inside, for scale.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

from dtlab.runtime import Cluster


def _noop() -> None:
    return None


def _tiny_allreduce() -> None:
    dist.all_reduce(torch.ones(1))


def measure(world_size: int = 4, repeats: int = 5, warm_calls: int = 50) -> dict:
    """Medians (seconds) of cold start and warm call latency, measured in this process."""
    cold: list[float] = []
    first_start = None
    warm: list[float] = []
    warm_allreduce: list[float] = []
    for repeat in range(repeats):
        started = time.perf_counter()
        cluster = Cluster(world_size, device="cpu")
        elapsed = time.perf_counter() - started
        if repeat == 0:
            first_start = elapsed
        else:
            cold.append(elapsed)
        if repeat == 0:
            for _ in range(warm_calls):
                t0 = time.perf_counter()
                cluster.run(_noop)
                warm.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                cluster.run(_tiny_allreduce)
                warm_allreduce.append(time.perf_counter() - t0)
        cluster.close()
    return {
        "world_size": world_size,
        "first_cold_start_s": first_start,
        "cold_start_median_s": statistics.median(cold) if cold else first_start,
        "warm_run_median_s": statistics.median(warm),
        "warm_allreduce_run_median_s": statistics.median(warm_allreduce),
        "repeats": repeats,
        "warm_calls": warm_calls,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dtlab bench runtime", description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warm-calls", type=int, default=50)
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    result = measure(args.world_size, args.repeats, args.warm_calls)
    print(f"ranks: {result['world_size']} (gloo, CPU)")
    print(f"cold start, first (forkserver imports torch): {result['first_cold_start_s']:.2f} s")
    print(f"cold start, median of later starts:            {result['cold_start_median_s']:.2f} s")
    print(
        f"warm run of a no-op, median:                   {result['warm_run_median_s'] * 1e3:.2f} ms"
    )
    print(
        f"warm run of a 4-byte all_reduce, median:       "
        f"{result['warm_allreduce_run_median_s'] * 1e3:.2f} ms"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return 0
