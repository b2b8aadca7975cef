"""What the bootstrap will do, decided from facts about this machine — standard library only.

Every function here is pure: the facts (the launching Python's torch, the OS, an NVIDIA driver,
whether PyTorch's CPU index answers) are passed in, so the tests can decide every case without
creating a venv. :mod:`dtlab.bootstrap` gathers the facts and runs the commands (its docstring
lists the steps and why torch is pinned and where it comes from).

This module must stay importable by a bare ``python3`` before anything is installed: the
bootstrap, run as a script, loads it by its path (the ``dtlab`` package itself imports torch).
Import nothing outside the standard library, and nothing from ``dtlab``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

MIN_PYTHON = (3, 10)
DEFAULT_TORCH = "torch==2.13.0"
SUPPORTED_TORCH = ((2, 11), (2, 14))  # inclusive minor range, as pyproject's torch>=2.11,<2.15
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
STAMP_NAME = ".dtlab-bootstrap-stamp"


@dataclass(frozen=True)
class Plan:
    """What the bootstrap will do, decided before anything runs (so it can be unit-tested)."""

    root: Path
    venv: Path
    reuse_launcher_torch: bool  # venv with --system-site-packages, keep the launcher's torch
    torch_spec: str
    torch_index: str | None  # None: pip's default index (PyPI)
    stamp: str

    @property
    def venv_python(self) -> Path:
        return venv_executable(self.venv, "python")

    def create_venv_command(self) -> list[str]:
        command = [sys.executable, "-m", "venv"]
        if self.reuse_launcher_torch:
            command.append("--system-site-packages")
        return command + [str(self.venv)]

    def install_torch_command(self) -> list[str]:
        command = [str(self.venv_python), "-m", "pip", "install", self.torch_spec]
        if self.torch_index:
            command += ["--index-url", self.torch_index]
        return command

    def install_dtlab_command(self) -> list[str]:
        return [str(self.venv_python), "-m", "pip", "install", "-e", ".[dev]"]


def venv_executable(venv: Path, name: str) -> Path:
    """``.venv/bin/NAME`` (``.venv\\Scripts\\NAME.exe`` on Windows)."""
    if os.name == "nt":
        return venv / "Scripts" / f"{name}.exe"
    return venv / "bin" / name


def python_problem(version: tuple[int, ...]) -> str | None:
    """A message when this Python is too old for dtlab, else None."""
    if tuple(version[:2]) >= MIN_PYTHON:
        return None
    found = ".".join(str(v) for v in version[:3])
    return (
        f"dtlab needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]}, but this is Python {found}. "
        "Run the bootstrap with a newer one, e.g. `python3.11 lib/dtlab/bootstrap.py lab`."
    )


def torch_version_supported(version: str) -> bool:
    """True for a torch version inside :data:`SUPPORTED_TORCH` (local tags like +cu124 ignored)."""
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    low, high = SUPPORTED_TORCH
    return low <= (major, minor) <= high


def choose_torch_index(
    system: str, has_nvidia_driver: bool, override: str | None, cpu_index_reachable: bool = True
) -> str | None:
    """Where torch comes from: the CPU index on driverless Linux, PyPI otherwise (see docstring).

    A machine that cannot reach PyTorch's CPU index (an offline mirror, a closed CI network)
    uses pip's own configured index and wheel folders instead of failing.
    """
    if override is not None:
        return None if override.lower() in ("", "pypi", "default") else override
    if system == "Linux" and not has_nvidia_driver and cpu_index_reachable:
        return CPU_TORCH_INDEX
    return None


def compute_stamp(
    pyproject: bytes, reuse_launcher_torch: bool, torch_spec: str, index: str | None
) -> str:
    """Changes whenever the install would change: pyproject.toml or the torch choice."""
    digest = hashlib.sha256(pyproject)
    digest.update(f"\n{reuse_launcher_torch}\n{torch_spec}\n{index}".encode())
    return digest.hexdigest()


def make_plan(
    root: Path,
    torch_spec: str = DEFAULT_TORCH,
    torch_index: str | None = None,
    launcher_torch: str | None = None,
    launcher_in_venv: bool = False,
    system: str = "Linux",
    has_nvidia_driver: bool = False,
    cpu_index_reachable: bool = True,
) -> Plan:
    """Decide every step from the facts about this machine (all passed in: no side effects)."""
    reuse = (
        launcher_torch is not None
        and torch_version_supported(launcher_torch)
        and not launcher_in_venv
    )
    index = choose_torch_index(system, has_nvidia_driver, torch_index, cpu_index_reachable)
    stamp = compute_stamp((root / "pyproject.toml").read_bytes(), reuse, torch_spec, index)
    return Plan(root, root / ".venv", reuse, torch_spec, index, stamp)


def install_is_current(plan: Plan) -> bool:
    """True when .venv exists and was installed from this same pyproject and torch choice."""
    stamp = plan.venv / STAMP_NAME
    return plan.venv_python.exists() and stamp.is_file() and stamp.read_text().strip() == plan.stamp


def lab_command(plan: Plan, extra: list[str]) -> list[str]:
    """``dtlab lab``, spelled through the venv's python (with --system-site-packages the venv may
    have no console scripts of its own): it starts JupyterLab on labs/ and owns the details."""
    return [str(plan.venv_python), "-m", "dtlab.cli", "lab", *extra]


def test_command(plan: Plan, extra: list[str]) -> list[str]:
    return [str(plan.venv_python), "-m", "pytest", *extra]


def test_streams(plan: Plan, extra: list[str], environ: dict[str, str]) -> list[list[str]]:
    """The pytest runs ``test`` starts side by side. With no arguments (the whole suite, as CI
    runs it): two streams — the browser tests (JupyterLab and Chromium spend much of their time
    waiting on rendering) beside everything else — so the two cores stay busy; together they
    select exactly what one plain ``pytest`` would. With arguments, or ``DTLAB_TEST_SERIAL=1``:
    one plain ``pytest`` run with those arguments. Only the first stream writes pytest's cache
    (``--lf`` after a side-by-side run knows that stream's failures, not the browser's)."""
    if extra or environ.get("DTLAB_TEST_SERIAL", "") not in ("", "0"):
        return [test_command(plan, extra)]
    browser = ["-m", "browser", "-p", "no:cacheprovider"]  # one writer of pytest's cache
    return [test_command(plan, ["-m", "not browser"]), test_command(plan, browser)]


def combined_exit_status(codes: list[int]) -> int:
    """One status for side-by-side pytest runs: the first that is not 0 (pytest's "no tests
    ran", 5, fails like any failure), else 0."""
    return next((code for code in codes if code != 0), 0)


def test_environment(environ: dict[str, str]) -> dict[str, str]:
    """The test run's environment: fast mode unless DTLAB_MODE is already set."""
    return {**environ, "DTLAB_MODE": environ.get("DTLAB_MODE") or "fast"}
