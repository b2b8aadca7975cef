"""Check that this machine can run the labs: ``dtlab doctor [--json] [--no-gloo] [--network]``.

Reports Python and torch versions, CUDA (GPU count, NCCL version), a gloo self-test — a real
2-rank Cluster on the CPU that all-reduces and checks the sum, with its cold-start time — the
notebook packages (jupyterlab, ipywidgets, plotly, nbval) and the lab mode. Every problem comes
with what to do about it. Exit status 1 when something essential fails.

Lab 00 calls :func:`environment_report` and prints :func:`format_report` of it.
``--network`` runs the network-debugging checklist instead (:mod:`dtlab.cli.doctor_network`):
interfaces, loopback vs real, RDMA devices, GPUDirect, GPU topology, NCCL switches — a check
that cannot run on this machine reports ``n/a`` and why.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict
from importlib import metadata

from dtlab.cli.doctor_checks import Check

HELP = "check Python, torch, CUDA/NCCL, a 2-rank gloo run and the notebook packages"

MIN_PYTHON = (3, 10)
SUPPORTED_TORCH = ((2, 11), (2, 14))  # inclusive minor range, as pyproject's torch>=2.11,<2.15
NOTEBOOK_PACKAGES = {
    # package: (essential?, why it matters)
    "plotly": (True, "every figure in the labs"),
    "ipywidgets": (True, "the graded quiz cells"),
    "jupyterlab": (False, "`dtlab lab` (the notebook interface)"),
    "nbval": (False, "running the lab notebooks as tests"),
}


def _version_tuple(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def check_python() -> Check:
    version = platform.python_version()
    ok = sys.version_info[:2] >= MIN_PYTHON
    return Check(
        "python",
        ok,
        f"{version} ({sys.executable})",
        ""
        if ok
        else f"dtlab needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]}; install a newer Python",
    )


def check_torch() -> list[Check]:
    """torch version, then CUDA (with GPU count and NCCL) — CUDA is never essential."""
    try:
        import torch
    except ImportError as err:
        return [
            Check(
                "torch",
                False,
                f"not importable ({err})",
                "run `python3 lib/dtlab/bootstrap.py lab` from the repository root",
            )
        ]
    low, high = SUPPORTED_TORCH
    version = torch.__version__
    supported = low <= _version_tuple(version) <= high
    checks = [
        Check(
            "torch",
            supported,
            version,
            ""
            if supported
            else f"dtlab is tested on torch {low[0]}.{low[1]}–{high[0]}.{high[1]}; "
            "install one of those (`pip install torch==2.13.0`)",
            essential=False,
        )
    ]
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
        try:
            version = torch.cuda.nccl.version()  # a tuple (2, 21, 5); an int on old builds
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except (AttributeError, RuntimeError):
            nccl = "unavailable"
        checks.append(
            Check(
                "cuda",
                True,
                f"{count} GPU(s): {', '.join(names)}; CUDA {torch.version.cuda}; NCCL {nccl}",
                essential=False,
            )
        )
        if nccl == "unavailable":
            checks.append(
                Check(
                    "nccl",
                    False,
                    "torch has no NCCL",
                    "install a CUDA build of torch with NCCL to run ranks on GPUs",
                    essential=False,
                )
            )
    else:
        built = "CPU-only build" if torch.version.cuda is None else "no GPU visible"
        checks.append(
            Check(
                "cuda",
                True,
                f"not available ({built}); labs run gloo ranks on CPU",
                essential=False,
            )
        )
    return checks


def check_gloo(world_size: int = 2) -> Check:
    """Start a real ``world_size``-rank Cluster on CPU, all-reduce ones, check the sum."""
    try:
        import dtlab
    except ImportError as err:
        return Check(
            "gloo self-test",
            False,
            f"cannot import dtlab ({err})",
            "install dtlab: `pip install -e .[dev]` from the repository root",
        )

    def rank_plus_one():
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(dtlab.rank() + 1)])
        dist.all_reduce(t)
        return float(t.item())

    expected = float(world_size * (world_size + 1) // 2)
    start = time.perf_counter()
    try:
        with dtlab.Cluster(world_size, device="cpu", timeout=60.0) as cluster:
            cold_start = time.perf_counter() - start
            sums = cluster.run(rank_plus_one)
    except Exception as err:  # any failure here is the finding; report it, never crash
        return Check(
            "gloo self-test",
            False,
            f"{type(err).__name__}: {err}",
            "see the traceback with `python -c 'import dtlab; dtlab.Cluster(2).run(print)'`; "
            "a firewall or a full /tmp are the usual causes",
        )
    ok = all(s == expected for s in sums)
    detail = f"{world_size} ranks, all_reduce sums {sums} (expected {expected}); cold start {cold_start:.1f} s"
    return Check(
        "gloo self-test",
        ok,
        detail,
        "" if ok else "gloo returned a wrong sum; report this with `dtlab doctor --json` output",
    )


def check_packages() -> list[Check]:
    checks = []
    for package, (essential, purpose) in NOTEBOOK_PACKAGES.items():
        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:
            checks.append(
                Check(
                    package,
                    False,
                    f"not installed (needed for {purpose})",
                    f"pip install {package}  (or `pip install -e .[dev]`)",
                    essential,
                )
            )
            continue
        checks.append(Check(package, True, version, essential=essential))
    return checks


def check_lab_mode() -> Check:
    from dtlab.config import lab_mode

    try:
        mode = lab_mode()
    except ValueError as err:
        return Check("lab mode", False, str(err), "unset DTLAB_MODE or set it to fast/full")
    meaning = "seconds-small sizes (CPU, CI)" if mode == "fast" else "real sizes on GPUs"
    return Check(
        "lab mode", True, f"{mode}: {meaning}; override with DTLAB_MODE=fast|full", essential=False
    )


def environment_report(gloo: bool = True) -> list[Check]:
    """Every check, in report order. ``gloo=False`` skips the 2-rank self-test (a few seconds)."""
    checks = [check_python(), *check_torch()]
    if gloo:
        checks.append(check_gloo())
    checks += check_packages()
    checks.append(check_lab_mode())
    return checks


def report_ok(checks: list[Check]) -> bool:
    """True when no essential check failed."""
    return all(c.ok or not c.essential for c in checks)


def format_report(checks: list[Check]) -> str:
    """The report as aligned text lines: ``ok``/``WARN``/``FAIL``, name, detail, then the fix."""
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        status = (
            "n/a " if not c.checked else "ok  " if c.ok else ("FAIL" if c.essential else "WARN")
        )
        lines.append(f"{status}  {c.name:<{width}}  {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"      {'':<{width}}  fix: {c.fix}")
    problems = [c for c in checks if not c.ok]
    if not problems:
        lines.append("Everything dtlab needs is here.")
    elif report_ok(checks):
        lines.append(f"{len(problems)} warning(s); the labs will run.")
    else:
        lines.append("Something essential is missing: fix the FAIL lines above.")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.network:
        from dtlab.cli.doctor_network import network_report

        checks = network_report()
    else:
        checks = environment_report(gloo=not args.no_gloo)
    if args.json:
        print(
            json.dumps({"ok": report_ok(checks), "checks": [asdict(c) for c in checks]}, indent=2)
        )
    else:
        print(format_report(checks))
    return 0 if report_ok(checks) else 1


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable report")
    parser.add_argument("--no-gloo", action="store_true", help="skip the 2-rank gloo self-test")
    parser.add_argument(
        "--network",
        action="store_true",
        help="run the network-debugging checklist (interfaces, RDMA, GPUDirect, GPU topology)",
    )
    parser.set_defaults(run=run)
