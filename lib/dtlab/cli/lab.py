"""Open the labs in JupyterLab: ``dtlab lab`` (all of labs/) or ``dtlab lab 3`` (lab 03).

Options dtlab does not know go to JupyterLab unchanged; give them as ``--key=value`` so a value
is never mistaken for a lab number: ``dtlab lab 02 --no-browser --port=8899``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HELP = "start JupyterLab on labs/ or on one lab (`dtlab lab 03`)"


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
        lab = find_lab(labs_dir, args.number) if args.number else None
    except FileNotFoundError as err:
        print(f"error: {err}")
        return 2
    command = jupyter_command(labs_dir, lab, args.extra)
    print("$ " + " ".join(command))
    try:
        return subprocess.call(command, cwd=labs_dir)
    except KeyboardInterrupt:
        return 130


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("number", nargs="?", help="lab number, e.g. 3 or 03 (default: all labs)")
    parser.set_defaults(run=run, passthrough=True)
