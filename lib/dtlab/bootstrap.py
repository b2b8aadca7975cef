"""Set up dtlab from a fresh checkout and start the labs or the tests — standard library only.

From the repository root, before anything is installed::

    python3 lib/dtlab/bootstrap.py lab     # make .venv, install, start JupyterLab on labs/
    python3 lib/dtlab/bootstrap.py test    # make .venv, install, run the test suite (fast mode)

Steps, each printed as it runs, each skipped when already done (run it as often as you like):

1. Check Python >= 3.10.
2. Create ``.venv``. If the Python running this script can already import a supported torch
   (a CUDA build on a GPU box, a conda environment), the venv is made with
   ``--system-site-packages`` so it KEEPS that torch instead of downloading another.
3. Otherwise install torch explicitly first, pinned (``--torch`` changes the pin). The pin and
   the index matter: a bare ``pip install torch`` on Linux resolves to PyPI's default wheel,
   which is the CUDA build and drags in several GB of ``nvidia-*`` packages — on a laptop or a
   CI box without a GPU that is minutes of download for nothing. So on Linux with no NVIDIA
   driver (no ``nvidia-smi``) torch comes from PyTorch's CPU index; with a driver, from PyPI's
   default (CUDA) wheel; ``--torch-index URL`` picks any index (``--torch-index pypi`` for PyPI).
   When the CPU index cannot be reached (an offline mirror, a closed CI network), pip's own
   configured index is used, so a local wheel of the pinned torch is found there.
   macOS and Windows wheels on PyPI are already CPU-sized.
4. ``pip install -e .[dev]``: dtlab itself, editable, with JupyterLab, pytest and nbval.
5. Record a stamp (a hash of pyproject.toml and the torch choice) in ``.venv``; while it matches,
   steps 3–4 are skipped.

Then ``lab`` runs ``dtlab lab`` (JupyterLab on ``labs/``): an optional lab number right after
``lab``, then JupyterLab's own options, unchanged and in order, written as JupyterLab takes them
(``python3 lib/dtlab/bootstrap.py lab 03 --no-browser --port 8899``; ``--port=8899`` works too).
``test`` runs ``python -m pytest`` with
``DTLAB_MODE=fast`` unless you set it, and exits with pytest's exit status (pyproject's pytest
settings add the solution notebooks through ``--nbval-lax``). Given no arguments it runs the
suite as two pytest processes side by side — the browser tests beside everything else, the
browser's output kept in ``build/test-browser.log`` and printed when both end — and exits with
the first non-zero status (``DTLAB_TEST_SERIAL=1`` runs one process instead).

This file gathers the facts about the machine and runs the commands; what to do with the facts
(which torch, from which index, the stamp, every command line) is decided by the pure functions
of :mod:`dtlab.bootstrap_decisions`, which the tests drive case by case. That module is loaded
by its path when a bare ``python3`` runs this file, and imported normally as part of ``dtlab``.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder (lib/dtlab) heads sys.path, and dtlab's own `trace`
# package would shadow the standard library's. Drop it before importing anything else.
if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.dirname(os.path.realpath(__file__)):
    del sys.path[0]

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib.util  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
SHUTDOWN_GRACE_S = 30.0  # seconds a test run gets to tear down after Ctrl-C


def _load_by_path(name: str):
    """Import ``lib/dtlab/<name>.py`` from its file: run as a script, this file's folder is off
    ``sys.path`` (above) and the ``dtlab`` package cannot be imported yet (it imports torch)."""
    spec = importlib.util.spec_from_file_location(
        f"_dtlab_{name}", Path(__file__).with_name(f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look up the module while making a class
    spec.loader.exec_module(module)
    return module


# The decisions live in a sibling module, imported the ordinary way when this file is
# dtlab.bootstrap (tests, `dtlab doctor`), by its path when a bare python3 runs it as a script.
if __package__:
    from dtlab import bootstrap_decisions as decisions
else:
    decisions = _load_by_path("bootstrap_decisions")


def launcher_torch_version() -> str | None:
    """The torch version the launching Python can import (read from metadata, not imported)."""
    if importlib.util.find_spec("torch") is None:
        return None
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def launcher_is_a_venv() -> bool:
    """A venv's packages are invisible to a venv made from it, even with --system-site-packages."""
    return sys.prefix != sys.base_prefix


def cpu_index_is_reachable(timeout_s: float = 3.0) -> bool:
    """Can this machine open a connection to PyTorch's CPU wheel index at all?"""
    import socket
    from urllib.parse import urlparse

    host = urlparse(decisions.CPU_TORCH_INDEX).hostname or ""
    try:
        with socket.create_connection((host, 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def step(message: str) -> None:
    print(f"==> {message}", flush=True)


def run_checked(command: list[str], root: Path) -> None:
    print("    $ " + " ".join(command), flush=True)
    subprocess.run(command, cwd=root, check=True)


def venv_can_import_torch(plan: decisions.Plan) -> bool:
    probe = [
        str(plan.venv_python),
        "-c",
        "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)",
    ]
    return subprocess.run(probe, cwd=plan.root).returncode == 0


def ensure_installed(plan: decisions.Plan) -> None:
    """Steps 2–5 of the module docstring."""
    if decisions.install_is_current(plan):
        step(f"{plan.venv.name} is up to date (stamp matches pyproject.toml); skipping install")
        return
    if plan.venv_python.exists():
        step(f"reusing {plan.venv}")
    else:
        how = (
            " with the system site-packages (keeping the installed torch)"
            * plan.reuse_launcher_torch
        )
        step(f"creating {plan.venv}{how}")
        run_checked(plan.create_venv_command(), plan.root)
    if plan.reuse_launcher_torch and venv_can_import_torch(plan):
        step("torch: using the torch this Python already has")
    else:
        where = plan.torch_index or "PyPI"
        step(
            f"installing {plan.torch_spec} from {where} (before dtlab, so pip never picks a CUDA build by accident)"
        )
        run_checked(plan.install_torch_command(), plan.root)
    step("installing dtlab (editable) with its dev extras: pip install -e .[dev]")
    run_checked(plan.install_dtlab_command(), plan.root)
    (plan.venv / decisions.STAMP_NAME).write_text(plan.stamp + "\n")
    step("install complete")


def main(argv: list[str] | None = None) -> int:
    problem = decisions.python_problem(sys.version_info)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    parser = argparse.ArgumentParser(
        prog="python3 lib/dtlab/bootstrap.py",
        description="Install dtlab into .venv, then start the labs or run the tests.",
        allow_abbrev=False,  # `--tor` is JupyterLab's or pytest's business, not our --torch
    )
    parser.add_argument(
        "action", choices=["lab", "test", "install"], help="what to do after installing"
    )
    parser.add_argument(
        "--torch",
        default=decisions.DEFAULT_TORCH,
        help=f"torch requirement (default {decisions.DEFAULT_TORCH})",
    )
    parser.add_argument("--torch-index", default=None, help="index URL for torch, or 'pypi'")
    args, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)

    launcher_torch = launcher_torch_version()
    system = platform.system()
    has_nvidia_driver = shutil.which("nvidia-smi") is not None
    probe_cpu_index = args.torch_index is None and system == "Linux" and not has_nvidia_driver
    plan = decisions.make_plan(
        REPO_ROOT,
        torch_spec=args.torch,
        torch_index=args.torch_index,
        launcher_torch=launcher_torch,
        launcher_in_venv=launcher_is_a_venv(),
        system=system,
        has_nvidia_driver=has_nvidia_driver,
        cpu_index_reachable=cpu_index_is_reachable() if probe_cpu_index else True,
    )
    step(f"Python {platform.python_version()} at {sys.executable}")
    if launcher_torch and not plan.reuse_launcher_torch:
        why = "it runs in a venv" if launcher_is_a_venv() else "dtlab supports torch 2.11-2.14"
        step(f"not reusing this Python's torch {launcher_torch} ({why})")
    try:
        ensure_installed(plan)
    except subprocess.CalledProcessError as err:
        print(
            f"bootstrap failed: `{' '.join(err.cmd)}` exited with {err.returncode}", file=sys.stderr
        )
        return err.returncode or 1
    if args.action == "install":
        return 0
    if args.action == "lab":
        command = decisions.lab_command(plan, extra)
        step("starting JupyterLab on labs/ (Ctrl-C to stop)")
        print("    $ " + " ".join(command), flush=True)
        try:
            return subprocess.call(command, cwd=plan.root)
        except KeyboardInterrupt:
            return 130
    env = decisions.test_environment(dict(os.environ))
    streams = decisions.test_streams(plan, extra, env)
    step(f"running the tests with DTLAB_MODE={env['DTLAB_MODE']}")
    if len(streams) == 1:
        print("    $ " + " ".join(streams[0]), flush=True)
        return subprocess.call(streams[0], cwd=plan.root, env=env)
    return run_side_by_side(streams, plan.root, env)


def run_side_by_side(streams: list[list[str]], root: Path, env: dict[str, str]) -> int:
    """Run the first command with its output on this terminal and the others beside it, each
    into ``build/test-<n>.log`` (the second: ``test-browser.log``), printed once all have ended;
    the combined exit status. On Ctrl-C every run has had the terminal's SIGINT too: each gets
    :data:`SHUTDOWN_GRACE_S` to tear its fixtures down (JupyterLab, Chromium) before it is
    killed."""
    logs = [root / "build" / ("test-browser.log" if i == 1 else f"test-{i}.log")
            for i in range(len(streams))]  # fmt: skip
    logs[0].parent.mkdir(parents=True, exist_ok=True)
    runs = []
    with contextlib.ExitStack() as files:
        for command, log in zip(streams[1:], logs[1:], strict=True):
            print(f"    $ {' '.join(command)}  > {log.relative_to(root)}", flush=True)
            out = files.enter_context(log.open("w"))
            runs.append(subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=out))
        print("    $ " + " ".join(streams[0]), flush=True)
        runs.insert(0, subprocess.Popen(streams[0], cwd=root, env=env))
        try:
            codes = [run.wait() for run in runs]
        except KeyboardInterrupt:
            for run in runs:
                try:
                    run.wait(timeout=SHUTDOWN_GRACE_S)
                except subprocess.TimeoutExpired:
                    run.kill()
            return 130
    for command, log, code in zip(streams[1:], logs[1:], codes[1:], strict=True):
        step(f"{' '.join(command[2:])} (exit {code}), from {log.relative_to(root)}:")
        print(log.read_text(), flush=True)
    return decisions.combined_exit_status(codes)


if __name__ == "__main__":
    sys.exit(main())
