"""Workshop tools for lab authors and instructors.

dtlab workshop build           write solutions/NN_*.ipynb and labs/NN_*.ipynb from solutions/NN_*.py
dtlab workshop build --check   write nothing; fail listing the notebooks that are out of date
dtlab workshop scores DIR      learners' progress files -> DIR/scores.csv and a leaderboard

Every file is written atomically (a temporary file, then a rename): Ctrl-C never leaves half of one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "instructor tools: build the lab notebooks (build [--check]); export scores (scores DIR)"


def run_build(args: argparse.Namespace) -> int:
    from dtlab.workshop.build import BUILD_COMMAND, build, find_repo_root, stale_notebooks
    from dtlab.workshop.source import LabSourceError

    root = args.root.resolve() if args.root else find_repo_root()
    if not (root / "solutions").is_dir():
        print(f"error: {root} has no solutions/ folder; pass the repository root with --root")
        return 2
    try:
        if args.check:
            problems = stale_notebooks(root)
            if problems:
                print("Stale lab notebooks:")
                for problem in problems:
                    print(f"  {problem}")
                print(f"Fix: run `{BUILD_COMMAND}` and commit the notebooks.")
                return 1
            print("Lab notebooks are up to date.")
            return 0
        written = build(root)
    except LabSourceError as err:
        print(f"error: {err}")
        return 1
    for path in written:
        print(f"wrote {path.relative_to(root)}")
    print(f"{len(written)} notebook(s) written; the others were already up to date.")
    return 0


def _register_build(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 listing notebooks that differ from their sources",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="repository root (default: the checkout around the working directory)",
    )
    parser.set_defaults(run=run_build)


# One (name, help, register) entry per action; register(parser) adds the action's arguments and
# parser.set_defaults(run=...).
def _register_scores(parser: argparse.ArgumentParser) -> None:
    from dtlab.quiz.scores import register_scores  # imported on use: keeps --help instant

    register_scores(parser)


ACTIONS = [
    (
        "build",
        "write solutions/NN_*.ipynb and labs/NN_*.ipynb from solutions/NN_*.py",
        _register_build,
    ),
    (
        "scores",
        "aggregate learners' progress files into a CSV and a pseudonymous leaderboard",
        _register_scores,
    ),
]


def register(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="workshop_action", metavar="ACTION")
    for name, help_text, register_action in ACTIONS:
        register_action(actions.add_parser(name, help=help_text, description=help_text))
    parser.set_defaults(run=lambda args: parser.print_help() or 2)
