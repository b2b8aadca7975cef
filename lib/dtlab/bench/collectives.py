"""Bandwidth of every from-scratch collective against the built-in one, 1 KiB → 64 MiB, same run.

::

    dtlab bench collectives --world-sizes 2 4 --ops all_reduce --out bench_collectives.json

For each world size a Cluster runs every algorithm of :data:`dtlab.collectives.ALGORITHMS` and the
``torch.distributed`` collective, interleaved iteration by iteration (so a noisy neighbour slows
them alike). One iteration's time is the slowest rank's; the reported time is the median over
iterations after warm-up. ``algbw``/``busbw`` follow nccl-tests (:mod:`dtlab.cost.bandwidth`).
α and β are fitted jointly to all our algorithms' times (:func:`dtlab.cost.fit.fit_alpha_beta_jointly`),
and the summary reports

* ``ring_vs_builtin``: our ring all-reduce's busbw ÷ the built-in all-reduce's, per size ≥ 16 MiB
  (ratio of the medians), and ``ring_vs_builtin_paired``: the same ratio iteration by iteration
  (the two ran back to back), as median, min and max — the range a noisy host allows;
* ``check``: what the call-agreement check (:mod:`dtlab.collectives.agreement`) costs — it is timed
  alone, interleaved with the rest, on the ring's own descriptor (a record with algorithm
  ``"check"``; its bandwidth columns are zero, it moves no payload), and ``check_share`` is its
  median over the ring's median time;
* ``crossover``: the size below which recursive doubling / the binary tree beat the ring —
  measured, and predicted from the fitted link.

Works on gloo (CPU) and NCCL (one rank per GPU). Wall-clock numbers live here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial

from dtlab.cost.bandwidth import algbw, busbw
from dtlab.cost.collectives import collective_time, crossover_bytes
from dtlab.cost.fit import fit_alpha_beta_jointly

BUILTIN = "torch"
CHECK = "check"  # the agreement check alone: timed like a collective, reported as a cost
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
    calls = {a: partial(collectives.ALGORITHMS[op][a], *args, **kwargs) for a in algorithms}
    calls[BUILTIN] = builtins[op]
    if time_check and op == "all_reduce" and "ring" in algorithms:
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


def summarize(records: Sequence[BenchRecord]) -> dict:
    """Fitted link per world size, ring-vs-built-in busbw ratios ≥ 16 MiB, and crossovers."""
    summary: dict = {}
    for n in sorted({r.world_size for r in records}):
        mine = [r for r in records if r.world_size == n]
        by = {(r.algorithm, r.nbytes): r for r in mine}
        entry: dict = {}
        ops = {r.op for r in mine}
        ours = [r for r in mine if r.algorithm not in (BUILTIN, CHECK)]
        if len(ours) >= 2:
            link = fit_alpha_beta_jointly(
                [(r.op, r.algorithm, n, r.nbytes, r.seconds) for r in ours], f"fitted, {n} ranks"
            )
            entry["fitted_alpha_us"] = link.alpha_s * 1e6
            entry["fitted_bandwidth_gbps"] = link.bandwidth_bytes_per_s / 1e9
            entry["link"] = link
        if "all_reduce" in ops:
            large = [
                size
                for size in sorted({r.nbytes for r in mine})
                if size >= 16 * MIB and ("ring", size) in by and (BUILTIN, size) in by
            ]
            # busbw ratio = time ratio (same op, size and N); median and fastest iteration
            entry["ring_vs_builtin"] = {
                size: by[(BUILTIN, size)].seconds / by[("ring", size)].seconds for size in large
            }
            entry["ring_vs_builtin_best"] = {
                size: by[(BUILTIN, size)].best_seconds / by[("ring", size)].best_seconds
                for size in large
                if by[(BUILTIN, size)].best_seconds and by[("ring", size)].best_seconds
            }
            entry["ring_vs_builtin_paired"] = {
                size: paired_ratio(by[(BUILTIN, size)], by[("ring", size)]) for size in large
            }
            entry["check_ms"] = {r.nbytes: r.seconds * 1e3 for r in mine if r.algorithm == CHECK}
            entry["check_share"] = {
                size: by[(CHECK, size)].seconds / by[("ring", size)].seconds
                for size in sorted({r.nbytes for r in mine})
                if (CHECK, size) in by and ("ring", size) in by
            }
            entry["crossover"] = {
                small: {
                    "measured_bytes": measured_crossover(mine, small, "ring"),
                    "predicted_bytes": crossover_bytes(
                        "all_reduce", small, "ring", n, entry["link"]
                    )
                    if "link" in entry
                    else None,
                }
                for small in ("recursive_doubling", "binary_tree")
                if any(r.algorithm == small for r in mine)
            }
        summary[n] = entry
    return summary


def paired_ratio(builtin: BenchRecord, ours: BenchRecord) -> dict[str, float] | None:
    """The built-in's time ÷ ours, iteration by iteration (they ran back to back in each
    iteration, so a noisy neighbour slows both): median, min and max over the iterations."""
    if not (builtin.samples and ours.samples):
        return None
    ratios = [b / o for b, o in zip(builtin.samples, ours.samples, strict=True)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def measured_crossover(records: Sequence[BenchRecord], small: str, large: str) -> float | None:
    """Geometric mean of the largest size where ``small`` still beats ``large`` and the next size
    measured (``None`` if ``small`` never wins; the top size if it always does)."""
    times = {(r.algorithm, r.nbytes): r.seconds for r in records}
    sizes = sorted(
        {r.nbytes for r in records if (small, r.nbytes) in times and (large, r.nbytes) in times}
    )
    wins = [s for s in sizes if times[(small, s)] < times[(large, s)]]
    if not wins:
        return None
    last = max(wins)
    after = [s for s in sizes if s > last]
    return float((last * after[0]) ** 0.5) if after else float(last)


def predicted_seconds(link, op: str, algorithm: str, nbytes: int, n: int) -> float:
    """The model's time for one point (the built-in is drawn as a ring)."""
    return collective_time(op, "ring" if algorithm == BUILTIN else algorithm, nbytes, n, link)


def to_json(records: Sequence[BenchRecord], summary: dict) -> dict:
    def clean(entry: dict) -> dict:
        return {k: v for k, v in entry.items() if k != "link"}

    return {
        "records": [asdict(r) for r in records],
        "summary": {str(n): clean(e) for n, e in summary.items()},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="dtlab bench collectives", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--ops", nargs="+", default=["all_reduce"])
    parser.add_argument("--algorithms", nargs="*", default=None, help="default: all of each op")
    parser.add_argument("--min-bytes", type=int, default=KIB)
    parser.add_argument("--max-bytes", type=int, default=64 * MIB)
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default="bench_collectives.json", help="JSON results")
    parser.add_argument("--html", default=None, help="also write the bandwidth figure here")
    args = parser.parse_args(argv)
    sizes, size = [], args.min_bytes
    while size <= args.max_bytes:
        sizes.append(size)
        size *= 2
    records: list[BenchRecord] = []
    from dtlab import Cluster

    for n in args.world_sizes:
        with Cluster(n) as cluster:
            for op in args.ops:
                records += run_sweep(
                    cluster,
                    op=op,
                    algorithms=args.algorithms,
                    sizes=sizes,
                    iters=args.iters,
                    warmup=args.warmup,
                    time_check=True,
                )
    summary = summarize(records)
    with open(args.out, "w") as f:
        json.dump(to_json(records, summary), f, indent=1)
    print(f"{'n':>2} {'op':<15}{'algorithm':<20}{'bytes':>10}{'ms':>10}{'busbw GB/s':>12}")
    for r in records:
        if r.algorithm == CHECK:
            print(
                f"{r.world_size:>2} {r.op:<15}{'agreement check':<20}{r.nbytes:>10}"
                f"{r.seconds * 1e3:>10.3f}{'(no payload)':>12}"
            )
            continue
        print(
            f"{r.world_size:>2} {r.op:<15}{r.algorithm:<20}{r.nbytes:>10}"
            f"{r.seconds * 1e3:>10.3f}{r.busbw_gbps:>12.3f}"
        )
    for n, entry in summary.items():
        clean = {k: v for k, v in entry.items() if k != "link"}
        print(f"\n{n} ranks: {json.dumps(clean, indent=1, default=str)}")
    if args.html:
        from dtlab.viz.bandwidth import bandwidth_curve

        bandwidth_curve(records, summary).write_html(args.html, include_plotlyjs="cdn")
    print(f"\nwrote {args.out}")
    return 0
