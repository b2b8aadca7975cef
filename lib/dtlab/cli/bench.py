"""Run a benchmark: ``dtlab bench NAME [args]``; ``dtlab bench`` lists them.

Benchmarks are the modules of :mod:`dtlab.bench`; each takes its own arguments
(``dtlab bench NAME --help``).
"""

from __future__ import annotations

import argparse

HELP = "run a benchmark (`dtlab bench` lists them)"


def run(args: argparse.Namespace) -> int:
    from dtlab import bench

    if args.name is None:
        names = bench.available()
        if not names:
            print("No benchmarks yet (add a module to lib/dtlab/bench/ exposing main(argv)).")
            return 0
        print("Benchmarks (dtlab bench NAME --help for options):")
        width = max(len(n) for n in names)
        for name in names:
            print(f"  {name:<{width}}  {bench.describe(name)}")
        return 0
    try:
        return bench.run(args.name, args.bench_args)
    except bench.UnknownBenchmark as err:
        print(f"error: {err}")
        return 2


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="benchmark to run")
    # REMAINDER hands everything after NAME (even --help) to the benchmark's own parser.
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="passed to the benchmark")
    parser.set_defaults(run=run)
