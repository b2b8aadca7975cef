"""Benchmarks, run with ``dtlab bench NAME [args]``: one module per benchmark.

A benchmark is a module here (``lib/dtlab/bench/allreduce.py``) whose docstring's first line
says what it measures and which exposes::

    def main(argv: list[str]) -> int:   # parse its own arguments, print results, exit status

Benchmarks measure dtlab's implementation side by side with PyTorch's production one in the
same run and report ratios; wall-clock numbers live here, never in tests.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from types import ModuleType


class UnknownBenchmark(LookupError):
    """``dtlab bench NAME`` with a NAME that is not a module of :mod:`dtlab.bench`."""


def available() -> list[str]:
    """Names of every benchmark module, sorted."""
    return sorted(
        info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")
    )


def load(name: str) -> ModuleType:
    """Import benchmark ``name``; unknown names raise :class:`UnknownBenchmark` listing the real ones."""
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
