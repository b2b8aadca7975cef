"""The terminal session of ``dtlab drill``: ask each question, read and grade the answer, score.

:class:`DrillSession` is the part of the drill a learner talks to — it shows a question as
Markdown, reads typed answers (letters, numbers with units, step keys, rubric ticks) with a
polite retry, grades and records each through :func:`dtlab.quiz.practice.attempt`, and keeps
the score under an optional time limit. It stands alone because it is independent of the
command line: :mod:`dtlab.cli.drill` parses the options, picks the questions and hands them here,
and tests drive a session with their own streams and clock. It has no ``register``, so it is not
a subcommand of its own.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from dtlab.quiz.drill import MockScore

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
