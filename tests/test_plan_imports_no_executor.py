"""The planner is closed form: ``dtlab.plan`` imports no executor and starts no ranks (DESIGN).

Config and hardware in, numbers out. Comparing a plan against a real run belongs to the labs,
benchmarks (:mod:`dtlab.bench.planner_vs_cluster`) and tests. Two checks hold it:

* read with ``ast``, no module under ``lib/dtlab/plan`` imports an executor package or
  ``torch.distributed`` — at module level *or inside a function* (a deferred import still runs
  the executor the moment it is called);
* in a fresh interpreter, importing every ``dtlab.plan`` module adds no executor module to
  ``sys.modules``. ``import dtlab`` itself already loads ``dtlab.runtime`` (the package exports
  ``dtlab.rank()`` and friends from ``dtlab.runtime.context``), so for ``dtlab.runtime`` only
  what importing the planner adds beyond ``import dtlab`` is checked; ``dtlab.parallel``,
  ``dtlab.collectives`` and ``dtlab.comm`` must not be loaded at all.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from import_reader import imported_names, is_under

LIB = Path(__file__).resolve().parents[1] / "lib"
PLAN = LIB / "dtlab" / "plan"
EXECUTORS = ("dtlab.parallel", "dtlab.runtime", "dtlab.collectives", "dtlab.comm")
FORBIDDEN = (*EXECUTORS, "torch.distributed")


def test_the_reader_finds_imports_hidden_inside_functions():
    source = (
        "def f():\n    from dtlab.parallel.compose import compose_gpt\n"
        "def g():\n    from dtlab import runtime\n"
        "def h():\n    from ..comm import Communicator\n"
        "import torch.distributed as dist\n"
    )
    found = {n for n in imported_names(source, "dtlab.plan") if is_under(n, FORBIDDEN)}
    assert {"dtlab.parallel.compose", "dtlab.runtime", "dtlab.comm", "torch.distributed"} <= found


def test_no_plan_module_imports_an_executor_even_inside_a_function():
    offenders = {}
    for path in sorted(PLAN.rglob("*.py")):
        names = imported_names(path.read_text(encoding="utf-8"), "dtlab.plan")
        bad = sorted(n for n in names if is_under(n, FORBIDDEN))
        if bad:
            offenders[str(path.relative_to(LIB))] = bad
    assert not offenders, f"the planner imports an executor: {offenders}"


def test_importing_the_planner_loads_no_executor():
    script = (
        "import importlib, json, pkgutil, sys\n"
        "import dtlab\n"
        "before = set(sys.modules)\n"
        "import dtlab.plan\n"
        "for info in pkgutil.walk_packages(dtlab.plan.__path__, 'dtlab.plan.'):\n"
        "    importlib.import_module(info.name)\n"
        "print(json.dumps({'added': sorted(set(sys.modules) - before),"
        " 'all': sorted(sys.modules)}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(LIB), "PATH": "/usr/bin:/bin"},
    )
    modules = json.loads(out.stdout.splitlines()[-1])
    assert "dtlab.plan.worked" in modules["added"]  # every planner module was imported
    added = [m for m in modules["added"] if is_under(m, EXECUTORS)]
    assert not added, f"importing dtlab.plan loaded {added}"
    never = ("dtlab.parallel", "dtlab.collectives", "dtlab.comm")
    loaded = [m for m in modules["all"] if is_under(m, never)]
    assert not loaded, f"importing dtlab and dtlab.plan loaded {loaded}"
