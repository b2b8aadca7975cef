"""Interview drill in the terminal: ``dtlab drill [--topic T] [--n N] [--mock]``.

Questions come from the quiz bank, weighted toward the ones you missed before and the ones you
have never seen (see :mod:`dtlab.quiz.drill`); every answer is graded, explained and recorded in
your progress file, so the next drill knows what to bring back.

* ``dtlab drill`` — 10 questions from every topic; ``--topic zero`` for one topic.
* ``dtlab drill --mock`` — a mock interview: questions mixed across topics under a time limit
  (90 s per question; ``--time-limit SECONDS`` to change it), then a score by topic. An answer
  given after the deadline gets its feedback but scores 0.

While answering: ``skip`` (or ``s``) moves on, ``quit`` (or ``q``, end of input with Ctrl-D, or
Ctrl-C) stops and shows the score. Scoring is the same whichever way a question is left: every
question of the set is in the score's denominator; the one on screen when you skip or stop counts
as *skipped*, the ones never shown as *not reached*, all scoring 0. Choices are answered with the
letters shown beside the options (``b``, ``a c``), numbers with or without a unit (``1.12 TB``),
orderings with the step keys in order, and spoken answers by ticking the rubric points you made
(``1 3``, ``all``, ``none``).

Options are shuffled per learner and attempt (:mod:`dtlab.quiz.shuffle`) and lettered by their
displayed position; the attempt number is how many times your progress file has recorded you
answering that item, so an item that comes back in a later drill comes back reshuffled, and the
same history shows the same order. The letters you type are turned back into option keys before
grading, so grading and the record never depend on where an option was shown.

Questions and feedback are Markdown rendered for the terminal by ``rich`` (code, lists, links as
"text (target)"), wrapped to the terminal's width; the feedback never shows grader internals.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from dtlab.cli.drill_session import MAX_BAD_ANSWERS as MAX_BAD_ANSWERS
from dtlab.cli.drill_session import DrillSession
from dtlab.cli.drill_session import _rubric_ticks as _rubric_ticks
from dtlab.cli.progress import add_progress_file_option

HELP = "terminal interview drill (--topic T, --n N, --mock for a timed mixed set)"


def run_drill(
    args: argparse.Namespace,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """The ``dtlab drill`` command with injectable streams and clock; returns the exit status."""
    from dtlab.quiz.bank import BankError, cached_bank, load_bank
    from dtlab.quiz.drill import mock_set, select_items, time_limit_for
    from dtlab.quiz.progress import learner_id, read_progress

    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    try:
        bank = load_bank(args.bank) if args.bank else cached_bank()
    except BankError as error:
        print(f"error: {error}", file=stdout)
        return 2
    if args.topic is not None and args.topic not in bank.topics():
        print(
            f"error: no topic {args.topic!r}; choose one of: {', '.join(bank.topics())}",
            file=stdout,
        )
        return 2
    history = read_progress(args.progress, learner=learner_id(args.learner)).records
    pool = [item for item in bank.values() if args.topic in (None, item.topic)]
    try:
        if args.mock:
            items = mock_set(pool, args.n, history, seed=args.seed)
            limit = args.time_limit if args.time_limit is not None else time_limit_for(len(items))
        else:
            items = select_items(pool, args.n, history, seed=args.seed)
            limit = args.time_limit
    except ValueError as error:
        print(f"error: {error}", file=stdout)
        return 2
    title = "Mock interview" if args.mock else "Drill"
    timing = f", {limit / 60:.1f} minutes" if limit is not None else ""
    print(f"{title}: {len(items)} questions{timing}. 'skip' moves on, 'quit' stops.", file=stdout)
    session = DrillSession(
        items,
        bank,
        stdin=stdin,
        stdout=stdout,
        time_limit_s=limit,
        clock=clock,
        record=not args.no_record,
        learner=args.learner,
        progress_path=args.progress,
        history=history,
    )
    score = session.run()
    return 130 if score.interrupted else 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", help="only this topic (default: all topics)")
    parser.add_argument("--n", type=int, default=10, help="number of questions (default 10)")
    parser.add_argument(
        "--mock", action="store_true", help="timed mock interview mixed across topics"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds for the whole set (mock: 90/question)",
    )
    parser.add_argument("--seed", type=int, default=None, help="repeat a selection exactly")
    parser.add_argument("--learner", default=None, help="a name for a shared seat (stored hashed)")
    add_progress_file_option(parser)
    parser.add_argument("--no-record", action="store_true", help="do not record the answers")
    parser.add_argument(
        "--bank", type=Path, default=None, metavar="DIR", help="quiz folder (default quizzes/)"
    )
    parser.set_defaults(run=run_drill)
