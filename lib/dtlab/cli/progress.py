"""Your mastery per topic: ``dtlab progress [--chart FILE.html]``.

Reads your progress file (every quiz cell, exercise and drill answer you gave) and prints one row
per topic of the bank: mastery (a recency-weighted score, see :mod:`dtlab.quiz.mastery`), items
mastered, items tried, attempts. ``--chart mastery.html`` also writes the plotly bar chart;
``--all`` counts every learner in the file instead of only you.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

HELP = "mastery per topic from your progress records (table, --chart FILE.html)"


def run_progress(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    """The ``dtlab progress`` command; returns the exit status."""
    from dtlab.files import write_atomic
    from dtlab.quiz.bank import BankError, cached_bank, load_bank
    from dtlab.quiz.mastery import mastery_by_topic, mastery_chart, mastery_table
    from dtlab.quiz.progress import default_progress_path, learner_id, read_progress

    stdout = sys.stdout if stdout is None else stdout
    path = args.progress or default_progress_path()
    try:
        bank = load_bank(args.bank) if args.bank else cached_bank()
    except BankError as error:
        print(
            f"warning: the quiz bank does not load, so topic sizes are unknown\n{error}",
            file=stdout,
        )
        bank = None
    learner = None if args.all else learner_id(args.learner)
    progress = read_progress(path, learner=learner)
    rows = mastery_by_topic(progress.records, bank)
    who = "all learners" if args.all else f"learner {learner}"
    print(f"Progress of {who} in {path} ({len(progress)} attempts)\n", file=stdout)
    print(mastery_table(rows), file=stdout)
    if progress.skipped_lines:
        print(f"\n(skipped unreadable lines {progress.skipped_lines})", file=stdout)
    if args.chart is not None:
        try:
            # Rendered first, then written whole: an interrupted write leaves the old chart.
            write_atomic(args.chart, mastery_chart(rows).to_html(include_plotlyjs=True))
        except OSError as error:
            print(f"error: cannot write the chart to {args.chart}: {error}", file=stdout)
            return 1
        print(f"\nwrote {args.chart}", file=stdout)
    return 0


def add_progress_file_option(parser: argparse.ArgumentParser) -> None:
    """``--progress FILE``: the attempts log to read or append to (``dtlab drill`` shares it)."""
    parser.add_argument(
        "--progress",
        type=Path,
        default=None,
        metavar="FILE",
        help="progress file (default ~/.dtlab/progress.jsonl)",
    )


def register(parser: argparse.ArgumentParser) -> None:
    add_progress_file_option(parser)
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--learner", default=None, help="a name used for a shared seat")
    who.add_argument("--all", action="store_true", help="every learner in the file together")
    parser.add_argument(
        "--chart", type=Path, default=None, help="also write a plotly chart (.html)"
    )
    parser.add_argument(
        "--bank", type=Path, default=None, metavar="DIR", help="quiz folder (default quizzes/)"
    )
    parser.set_defaults(run=run_progress)
