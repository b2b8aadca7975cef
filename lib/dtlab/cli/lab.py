"""Open the labs in JupyterLab: ``dtlab lab`` (all of labs/) or ``dtlab lab 3`` (lab 03).

Everything after the optional lab number goes to JupyterLab unchanged and in order, so its
options are written as JupyterLab takes them, with a space or an ``=``::

    dtlab lab 02 --no-browser --port 8899 --ip 0.0.0.0
    dtlab lab --no-browser --port=8899

Decision: a lab number is only the FIRST argument, and only when it is a bare number of one or
two digits (``3``, ``03``) or a lab's file-name prefix (``03_zero``). So ``8899`` after
``--port`` is always the port, never a lab; a first argument like ``7`` that names no lab is an
error listing the labs (JupyterLab would otherwise open an empty file called ``7``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HELP = "start JupyterLab on labs/ or on one lab (`dtlab lab 03 --port 8899`)"

LAB_NUMBER = re.compile(r"\d{1,2}(_[\w-]*)?")


def find_lab(labs_dir: Path, number: str) -> Path:
    """The student notebook of lab ``number`` (``"3"``, ``"03"`` or ``"03_zero"``)."""
    prefix = number.zfill(2) if number.isdigit() else number
    matches = sorted(labs_dir.glob(f"{prefix}*.ipynb"))
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(p.stem for p in sorted(labs_dir.glob("[0-9][0-9]_*.ipynb"))) or "none"
    if not matches:
        raise FileNotFoundError(f"no lab {number!r} in {labs_dir}; the labs are: {known}")
    raise FileNotFoundError(f"lab {number!r} is ambiguous ({', '.join(p.stem for p in matches)})")


def split_arguments(labs_dir: Path, arguments: list[str]) -> tuple[Path | None, list[str]]:
    """``[NN] [JupyterLab options...]`` → (the lab to open or None, JupyterLab's arguments).

    Only a leading ``NN`` is a lab (see the module docstring); the rest keeps its order, so
    ``--port 8899`` reaches JupyterLab as ``--port 8899``.
    """
    if arguments and LAB_NUMBER.fullmatch(arguments[0]):
        return find_lab(labs_dir, arguments[0]), list(arguments[1:])
    return None, list(arguments)


def jupyter_command(labs_dir: Path, lab: Path | None, extra: list[str]) -> list[str]:
    """The JupyterLab command line: rooted at ``labs_dir``, opening ``lab`` if given."""
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={labs_dir}"]
    if running_as_root() and "--allow-root" not in extra:
        # Containers on GPU boxes often run as root, and JupyterLab refuses root without this.
        command.append("--allow-root")
    if lab is not None:
        command.append(str(lab.relative_to(labs_dir)))
    return command + list(extra)


def running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def run(args: argparse.Namespace) -> int:
    from dtlab.workshop.build import find_repo_root

    try:
        labs_dir = find_repo_root() / "labs"
        lab, extra = split_arguments(labs_dir, args.extra)
    except FileNotFoundError as err:
        print(f"error: {err}")
        return 2
    command = jupyter_command(labs_dir, lab, extra)
    print("$ " + " ".join(command))
    try:
        return subprocess.call(command, cwd=labs_dir)
    except KeyboardInterrupt:
        return 130


def register(parser: argparse.ArgumentParser) -> None:
    # No positional here: argparse would fill it with the first bare word wherever it stands
    # (the 8899 of `--port 8899`). Every argument arrives in order as args.extra instead.
    parser.usage = "dtlab lab [NN] [JupyterLab options, e.g. --no-browser --port 8899]"
    parser.set_defaults(run=run, passthrough=True)
