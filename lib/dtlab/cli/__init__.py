"""The ``dtlab`` command: one subcommand per module of this package.

``dtlab doctor`` checks the machine, ``dtlab lab`` opens the labs, ``dtlab workshop build``
builds the notebooks, ``dtlab bench NAME`` runs a benchmark. A new subcommand is a new module
here (e.g. ``drill.py``) exposing::

    HELP = "one line for `dtlab --help`"

    def register(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(...)
        parser.set_defaults(run=run)          # run(args) -> int, the exit status

A subcommand that hands unknown options to another program (``dtlab lab --no-browser``) also
sets ``passthrough=True``; the options it does not know arrive as ``args.extra``.

It is found by name, in alphabetical order; nothing else needs editing. Keep module-level
imports light (argparse, pathlib): heavy ones (torch, jupyter) go inside ``run`` so that
``dtlab --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys


def subcommand_modules() -> dict[str, object]:
    """Subcommand name → module, for every public module of this package."""
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "register"):
            found[info.name.replace("_", "-")] = module
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dtlab",
        description="dtlab: a hands-on lab for distributed deep-learning training.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in subcommand_modules().items():
        help_text = getattr(module, "HELP", None) or (module.__doc__ or "").strip().split("\n")[0]
        sub = subparsers.add_parser(
            name,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``dtlab`` console script; returns the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    run = getattr(args, "run", None)
    if run is None:
        parser.print_help()
        return 2
    return int(run(args) or 0)
