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
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from dtlab.cli.progress import add_progress_file_option

if TYPE_CHECKING:
    from dtlab.quiz.drill import MockScore

HELP = "terminal interview drill (--topic T, --n N, --mock for a timed mixed set)"
MAX_BAD_ANSWERS = 3


class _EndOfInput(Exception):
    """The learner closed the input (Ctrl-D) or typed quit."""


class DrillSession:
    """Asks ``items`` one by one on ``stdin``/``stdout``; ``clock`` is injectable for tests.

    ``width`` is the wrap width (default: the terminal's, 80 when output is not a terminal).
    ``history`` is the learner's progress records: its attempts at an item number the shuffle.
    """

    def __init__(
        self,
        items: list,
        bank,
        *,
        stdin: TextIO,
        stdout: TextIO,
        time_limit_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        record: bool = True,
        learner: str | None = None,
        progress_path: Path | None = None,
        width: int | None = None,
        history: list[dict] | tuple = (),
    ):
        from rich.console import Console

        from dtlab.quiz.drill import MockScore

        self.items, self.bank = items, bank
        self.stdin, self.stdout = stdin, stdout
        self.time_limit_s, self.clock = time_limit_s, clock
        self.record, self.learner, self.progress_path = record, learner, progress_path
        self.score = MockScore()
        self.past_attempts = Counter(r.get("item") for r in history)
        is_terminal = hasattr(stdout, "isatty") and stdout.isatty()
        self.console = Console(
            file=stdout,
            width=width or (shutil.get_terminal_size().columns if is_terminal else 80),
            force_terminal=is_terminal,
            no_color=not is_terminal,
            highlight=False,
            emoji=False,
            soft_wrap=False,
        )

    def say(self, text: str = "") -> None:
        """Print plain text, wrapped to the width (never read as markup)."""
        self.console.print(text, markup=False)
        self.stdout.flush()

    def show(self, markdown: str) -> None:
        """Print Markdown rendered for the terminal, wrapped to its width."""
        from rich.markdown import Markdown

        from dtlab.quiz.feedback import terminal_links

        self.console.print(Markdown(terminal_links(markdown), hyperlinks=False))
        self.stdout.flush()

    def read(self, prompt: str = "> ") -> str:
        self.stdout.write(prompt)
        self.stdout.flush()
        line = self.stdin.readline()
        if not line:
            self.say()
            raise _EndOfInput("end of input")
        text = line.strip()
        if text.lower() in ("q", "quit", "exit"):
            raise _EndOfInput("quit")
        return text

    def run(self) -> MockScore:
        """Ask every item (until the end, a quit, end of input or the deadline); the score."""
        from dtlab.quiz.drill import Answered
        from dtlab.quiz.feedback import answer_markdown

        deadline = None if self.time_limit_s is None else self.clock() + self.time_limit_s
        stopped = None
        for number, item in enumerate(self.items, start=1):
            if deadline is not None and self.clock() >= deadline:
                stopped = "Time is up."
                break
            self.say(
                f"\n── Question {number}/{len(self.items)} · {item.topic}{self._time_left(deadline)}"
            )
            try:
                asked = self.ask(item)
            except (_EndOfInput, KeyboardInterrupt) as reason:
                # the question on screen counts as skipped, however the drill was left
                self.score.add(Answered(item, 0.0, False, "skipped"))
                self.score.interrupted = isinstance(reason, KeyboardInterrupt)
                stopped = {
                    "quit": "Stopped at your request.",
                    "end of input": "End of input.",
                }.get(str(reason), "Interrupted.")
                break
            if asked is None:
                self.score.add(Answered(item, 0.0, False, "skipped"))
                continue
            response, result, order = asked
            late = deadline is not None and self.clock() > deadline
            self.show(answer_markdown(item, response, result, order))
            if late:
                self.say("(Answered after the time limit: it counts 0 in the mock score.)")
            self.score.add(
                Answered(
                    item,
                    0.0 if late else result.score,
                    result.correct and not late,
                    "late" if late else "answered",
                )
            )
        for item in self.items[len(self.score.results) :]:
            self.score.add(Answered(item, 0.0, False, "unanswered"))
        if stopped:
            self.say(f"\n{stopped}")
        self.say("\n" + self.score.report())
        return self.score

    def _time_left(self, deadline: float | None) -> str:
        if deadline is None:
            return ""
        left = max(0, int(deadline - self.clock()))
        return f" · {left // 60}:{left % 60:02d} left"

    def order_for(self, item):
        """How ``item``'s options are shown to this learner now (:mod:`dtlab.quiz.shuffle`)."""
        from dtlab.quiz.shuffle import option_order, shuffle_learner

        if not hasattr(self, "_shuffle_learner"):
            self._shuffle_learner = shuffle_learner(self.learner)
        return option_order(item, self._shuffle_learner, self.past_attempts[item.id])

    def ask(self, item):
        """Show ``item``, read answers until one has a gradable shape.

        Returns ``(response in option keys, Grade, the order shown)``, or None if skipped.
        """
        from dtlab.quiz.drill import item_as_markdown
        from dtlab.quiz.practice import attempt
        from dtlab.quiz.schema import AnswerError

        order = self.order_for(item)
        self.show(item_as_markdown(item, order))
        if item.kind == "short":
            if self.read().lower() in ("s", "skip"):
                return None
            rubric = "\n".join(f"{i}. {point}" for i, point in enumerate(item.rubric, start=1))
            self.show(
                "Which points did your answer make?\n\n"
                + rubric
                + "\n\nType their numbers (e.g. `1 3`), `all` or `none`."
            )
        for _ in range(MAX_BAD_ANSWERS):
            text = self.read()
            if text.lower() in ("s", "skip"):
                return None
            try:
                response = _rubric_ticks(text, len(item.rubric)) if item.kind == "short" else text
                labels = _as_response(item, response)
                result = attempt(
                    item.id,
                    labels,
                    bank=self.bank,
                    learner=self.learner,
                    progress_path=self.progress_path,
                    record=self.record,
                    order=order,  # turns the letters typed into option keys, records the order
                )
                if self.record:
                    self.past_attempts[item.id] += 1
                return order.to_keys(item.kind, labels), result, order
            except AnswerError as error:
                self.say(f"That answer does not fit the question: {error}. Try again, or 'skip'.")
        self.say("Skipping this one.")
        return None


def _as_response(item, text):
    """The typed answer as a list of labels for multi and ordering items (text otherwise)."""
    if item.kind in ("multi", "ordering") and isinstance(text, str):
        return text.replace(",", " ").split()
    return text


def _rubric_ticks(text: str, n_points: int) -> list[int]:
    """'1 3' / '1,3' / 'all' / 'none' → 0-based indices of the ticked rubric points."""
    from dtlab.quiz.schema import AnswerError

    lowered = text.lower()
    if lowered == "all":
        return list(range(n_points))
    if lowered in ("none", "0", "-", ""):
        return []
    parts = lowered.replace(",", " ").split()
    if not all(p.isdigit() and 1 <= int(p) <= n_points for p in parts):
        raise AnswerError(f"type point numbers between 1 and {n_points}, 'all' or 'none'")
    return sorted({int(p) - 1 for p in parts})


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
