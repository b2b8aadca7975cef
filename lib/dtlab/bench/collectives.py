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
* ``ring_shm_vs_builtin_paired`` and ``ring_shm_vs_ring_paired`` (with ``--algorithms ring
  ring_shm``): the same ring through shared memory (``all_reduce(transport="shm")``,
  :mod:`dtlab.collectives.shm_transport`) against the built-in and against the socket ring,
  iteration-paired, and ``check_share_ring_shm``, the check's share of its time;
* ``crossover``: the size below which recursive doubling / the binary tree beat the ring —
  measured, and predicted from the fitted link.

Works on gloo (CPU) and NCCL (one rank per GPU). Wall-clock numbers live here, never in tests.
The sweep itself — the calls timed on every rank and the :class:`BenchRecord` each point
becomes — is :mod:`dtlab.bench._collectives_sweep`; this module summarizes and prints.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict

from dtlab.bench._collectives_sweep import (
    BUILTIN,
    CHECK,
    KIB,
    MIB,
    RING_SHM,
    BenchRecord,
    default_sizes,
    run_sweep,
)
from dtlab.cost.collectives import collective_time, crossover_bytes
from dtlab.cost.fit import fit_alpha_beta_jointly

__all__ = [
    "BUILTIN",
    "CHECK",
    "KIB",
    "MIB",
    "RING_SHM",
    "BenchRecord",
    "default_sizes",
    "main",
    "measured_crossover",
    "paired_ratio",
    "predicted_seconds",
    "run_sweep",
    "summarize",
    "to_json",
]


def summarize(records: Sequence[BenchRecord]) -> dict:
    """Fitted link per world size, ring-vs-built-in busbw ratios ≥ 16 MiB, and crossovers."""
    summary: dict = {}
    for n in sorted({r.world_size for r in records}):
        mine = [r for r in records if r.world_size == n]
        by = {(r.algorithm, r.nbytes): r for r in mine}
        entry: dict = {}
        ops = {r.op for r in mine}
        ours = [r for r in mine if r.algorithm not in (BUILTIN, CHECK, RING_SHM)]
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
            shm = [s for s in sorted({r.nbytes for r in mine}) if (RING_SHM, s) in by]
            if shm:
                entry["ring_shm_vs_builtin_paired"] = {
                    size: paired_ratio(by[(BUILTIN, size)], by[(RING_SHM, size)])
                    for size in shm
                    if (BUILTIN, size) in by
                }
                entry["ring_shm_vs_ring_paired"] = {
                    size: paired_ratio(by[("ring", size)], by[(RING_SHM, size)])
                    for size in shm
                    if ("ring", size) in by
                }
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
            if shm:
                entry["check_share_ring_shm"] = {
                    size: by[(CHECK, size)].seconds / by[(RING_SHM, size)].seconds
                    for size in shm
                    if (CHECK, size) in by
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

        # The figure draws each curve against its α-β model, fitted to the socket algorithms:
        # the check moves no payload and ring_shm another link (shared memory), so both stay in
        # the table and the JSON only.
        drawn = [r for r in records if r.algorithm not in (CHECK, RING_SHM)]
        bandwidth_curve(drawn, summary).write_html(args.html, include_plotlyjs="cdn")
    print(f"\nwrote {args.out}")
    return 0
