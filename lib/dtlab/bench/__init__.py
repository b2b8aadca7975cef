"""Benchmarks, run with ``dtlab bench NAME [args]``: one module per benchmark.

A benchmark is a module here (``lib/dtlab/bench/allreduce.py``) whose docstring's first line
says what it measures and which exposes::

    def main(argv: list[str]) -> int:   # parse its own arguments, print results, exit status

Benchmarks measure dtlab's implementation side by side with PyTorch's production one in the
same run, interleaved step by step (:func:`run_interleaved`), and report ratios as medians over
repeats with their range (:func:`ratios_to`); wall-clock numbers live here, never in tests.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import pkgutil
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType


class UnknownBenchmark(LookupError):
    """``dtlab bench NAME`` with a NAME that is not a module of :mod:`dtlab.bench`."""


def available() -> list[str]:
    """Names of every benchmark module, sorted."""
    return sorted(
        info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")
    )


def load(name: str) -> ModuleType:
    """Import benchmark ``name``; unknown names raise :class:`UnknownBenchmark` listing the real ones.

    A hyphen in ``name`` reads as the module's underscore (``runtime-perf`` is ``runtime_perf``)."""
    name = name.replace("-", "_")
    names = available()
    if name not in names:
        choices = ", ".join(names) if names else "none yet"
        raise UnknownBenchmark(f"no benchmark named {name!r}; available: {choices}")
    module = importlib.import_module(f"{__name__}.{name}")
    if not callable(getattr(module, "main", None)):
        raise UnknownBenchmark(f"dtlab.bench.{name} has no main(argv) function")
    return module


def describe(name: str) -> str:
    """First line of the benchmark's docstring (read without importing it — no torch start-up)."""
    spec = importlib.util.find_spec(f"{__name__}.{name}")
    if spec is None or spec.origin is None:
        return ""
    import ast

    with open(spec.origin, encoding="utf-8") as source:
        doc = ast.get_docstring(ast.parse(source.read())) or ""
    return doc.strip().split("\n")[0]


def run(name: str, argv: list[str]) -> int:
    """Run benchmark ``name`` with its own command-line arguments; return its exit status."""
    return int(load(name).main(list(argv)) or 0)


# What every "ours vs production" benchmark shares: variants interleaved step by step in one run.
#
# Run one after another, two variants see different loads (a neighbour's job starts, the CPU
# throttles), and the drift decides their ratio. Interleaved — round r runs every variant's step r,
# the order rotated each round so none always goes first — they share the load of the moment.


@dataclass(frozen=True)
class Spread:
    """A median over repeats and the range it came from (``low``–``high``)."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """``names`` rotated left by ``round_index``: over ``len(names)`` rounds each name runs once
    in every position, so "goes first after the barrier" or "runs after the slowest" cancels."""
    k = round_index % len(names)
    return [*names[k:], *names[:k]]


def run_interleaved(
    steps: Mapping[str, Callable[[int], object]], rounds: int, warmup: int = 2
) -> dict[str, list[float]]:
    """On every rank: ``warmup + rounds`` rounds, each calling every variant's ``step(i)`` once
    (``i`` counts rounds from 0, warm-up included), in :func:`rotated` order.

    Each step starts after a barrier (and a device sync) and ends after a device sync, so every
    rank times the same step; measured steps are traced as ``bench_step`` spans (kind ``other``,
    labels ``variant`` and ``round``) to cut the run's trace by step. Returns this rank's seconds
    per measured round, per variant; :func:`slowest_rank` combines the ranks. Rank 0 reports the
    rounds to the driver's progress bar (:mod:`dtlab.progress`) between rounds.
    """
    import torch

    import dtlab
    import dtlab.progress
    from dtlab import trace

    cuda = dtlab.device().type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    # One bar on the driver, fed by rank 0 between rounds (outside every timed window).
    for i in dtlab.progress.track(range(warmup + rounds), desc="benchmark rounds"):
        for name in rotated(list(steps), i):
            dtlab.barrier()
            sync()
            measured = i >= warmup
            window = trace.span("bench_step", "other", variant=name, round=i - warmup)
            with window if measured else contextlib.nullcontext():
                start = time.perf_counter()
                steps[name](i)
                sync()
                elapsed = time.perf_counter() - start
            if measured:
                seconds[name].append(elapsed)
    return seconds


def slowest_rank(per_rank: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, list[float]]:
    """Each round's time is the slowest rank's: the step is not done until every rank is."""
    return {
        name: [max(times) for times in zip(*(rank[name] for rank in per_rank), strict=True)]
        for name in per_rank[0]
    }


def per_repeat(values: Sequence[float], repeats: int) -> list[list[float]]:
    """``values`` cut into ``repeats`` consecutive, equal runs of rounds."""
    per = len(values) // repeats
    return [list(values[r * per : (r + 1) * per]) for r in range(repeats)]


def ratios_to(
    seconds: Mapping[str, Sequence[float]], baseline: str, repeats: int
) -> dict[str, Spread]:
    """Each variant's step time ÷ the ``baseline``'s *in the same round* — steps taken seconds
    apart, under the same load — median per repeat, then the :class:`Spread` over repeats."""
    base = seconds[baseline]
    return {
        name: Spread.of(
            [
                statistics.median(run)
                for run in per_repeat([t / b for t, b in zip(s, base, strict=True)], repeats)
            ]
        )
        for name, s in seconds.items()
    }


def best_ratios_to(seconds: Mapping[str, Sequence[float]], baseline: str) -> dict[str, float]:
    """Fastest step ÷ the ``baseline``'s fastest: the steadier figure on a busy host, where the
    slow steps are someone else's load."""
    return {name: min(s) / min(seconds[baseline]) for name, s in seconds.items()}


def run_on_ranks(cluster, world_size: int, steps: int, repeats: int, fn: Callable, *args):
    """``cluster.run(fn, *args)``, or on a fresh ``Cluster(world_size)`` closed afterwards.

    One benchmark run holds every step of every variant, so a fresh cluster gets a long timeout.
    """
    if steps < 1 or repeats < 1:
        raise ValueError(f"need at least one step and one repeat, got {steps=} and {repeats=}")
    if cluster is not None:
        return cluster.run(fn, *args)
    from dtlab import Cluster

    with Cluster(world_size, device="auto", timeout=1200.0) as fresh:
        return fresh.run(fn, *args)
