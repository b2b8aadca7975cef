"""Instructor score export: ``dtlab workshop scores DIR`` over the learners' progress files.

Learners hand in their ``~/.dtlab/progress.jsonl`` (any file name; ``*.jsonl`` under ``DIR``,
searched recursively). This module reads them all and writes

* a **CSV**, one row per learner × topic: ``learner, topic, mastery, items_mastered,
  items_tried, items_total, attempts, last_attempt`` (mastery as in :mod:`dtlab.quiz.mastery`);
* a **leaderboard** by pseudonymous id — learners are identified only by the ``learner`` field of
  their records (a random id or a salted hash of a seat name, never a name), shortened for display.
  File names (which may be real names) never appear in either.

Merging never needs ids to agree across machines: records are grouped by their ``learner`` field
as written, and a record handed in twice is recognised by its full content. Since the salt is per
install (see :mod:`dtlab.quiz.progress`), one seat name typed on two machines is two learners.

The CSV is written atomically (:func:`dtlab.files.write_atomic`) and every cell that comes from a
learner's file (learner id, topic, timestamp) is neutralised against spreadsheet formula
injection: a cell starting with ``=``, ``+``, ``-``, ``@``, tab or carriage return gets a leading
``'`` (OWASP's advice), so opening the CSV in a spreadsheet never runs a learner's formula.

Robust by construction: a file that is not UTF-8, not JSON lines, or holds no progress record at
all (a notebook, a CSV, an empty file) is **reported and skipped**; a file with some bad lines (a
torn last line, a hand edit) keeps its good records and is reported as partial. The same record
handed in twice (two copies of one file) counts once. Nothing here raises on learner data.

It lives in :mod:`dtlab.quiz`, beside the progress records and mastery it reads, although the
command is ``dtlab workshop …``: :mod:`dtlab.workshop` (the lab sources and the notebooks built
from them) sits below the quiz, whose links point into those lab sources.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dtlab.files import write_atomic
from dtlab.quiz.mastery import TopicMastery, mastery_by_topic
from dtlab.quiz.progress import RECORD_FIELDS

CSV_COLUMNS = (
    "learner",
    "topic",
    "mastery",
    "items_mastered",
    "items_tried",
    "items_total",
    "attempts",
    "last_attempt",
)
# Columns whose text comes from learners' files; the others are numbers dtlab computed.
LEARNER_TEXT_COLUMNS = ("learner", "topic", "last_attempt")
FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(text: str) -> str:
    """``text`` with a leading ``'`` if a spreadsheet would read it as a formula (OWASP CSV injection).

    >>> spreadsheet_safe("=1+1"), spreadsheet_safe("zero")
    ("'=1+1", 'zero')
    """
    return "'" + text if text.startswith(FORMULA_TRIGGERS) else text


def display_id(learner: str) -> str:
    """A short pseudonym for the leaderboard: the id's kind and first 8 hex digits (``r-3fa2c1d0``).

    Ids come from learners' files, so anything unprintable (a terminal escape sequence that could
    clear or rewrite the instructor's screen) is shown as ``?``.
    """
    return "".join(c if c.isprintable() else "?" for c in learner[:10])


def _valid_record(record: object) -> bool:
    if not isinstance(record, dict) or any(f not in record for f in RECORD_FIELDS):
        return False
    return (
        isinstance(record["learner"], str)
        and isinstance(record["item"], str)
        and isinstance(record["topic"], str)
        and isinstance(record["correct"], bool)
        and isinstance(record["score"], int | float)
        and 0.0 <= float(record["score"]) <= 1.0
    )


def read_progress_file(path: Path) -> tuple[list[dict], str | None]:
    """The valid records of one file, and a problem to report (None when the file is clean)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return [], "not a text file (not UTF-8); skipped"
    except OSError as error:
        return [], f"cannot be read ({error.strerror or error}); skipped"
    records, bad = [], []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if _valid_record(record):
            records.append(record)
        else:
            bad.append(number)
    if not records:
        return [], (
            "empty; skipped"
            if not bad
            else f"holds no progress records ({len(bad)} unreadable line(s)); skipped"
        )
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
        return (
            records,
            f"partial: skipped {len(bad)} unreadable line(s) ({shown}); kept {len(records)}",
        )
    return records, None


@dataclass(frozen=True)
class LeaderboardRow:
    rank: int
    learner: str  # the display pseudonym
    items_mastered: int
    mastery: float  # mean topic mastery over the bank's topics (or the topics tried)
    attempts: int


@dataclass
class ScoreReport:
    """Everything ``workshop scores`` found: rows per learner × topic, the board, the problems."""

    rows: list[tuple[str, TopicMastery]] = field(default_factory=list)
    leaderboard: list[LeaderboardRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    files_read: int = 0
    learners: int = 0


def aggregate_scores(directory: str | Path, bank=None) -> ScoreReport:
    """Read every ``*.jsonl`` under ``directory`` into a :class:`ScoreReport` (never raises on data)."""
    directory = Path(directory)
    report = ScoreReport()
    if not directory.is_dir():
        report.problems.append(f"{directory}: not a folder")
        return report
    seen: set[str] = set()
    by_learner: dict[str, list[dict]] = {}
    for path in sorted(directory.rglob("*.jsonl")):
        records, problem = read_progress_file(path)
        where = path.relative_to(directory).as_posix()
        if problem:
            report.problems.append(f"{where}: {problem}")
        if not records:
            continue
        report.files_read += 1
        for record in records:
            fingerprint = json.dumps(record, sort_keys=True)
            if fingerprint not in seen:  # the same file handed in twice counts once
                seen.add(fingerprint)
                by_learner.setdefault(record["learner"], []).append(record)
    board = []
    for learner in sorted(by_learner):
        topics = mastery_by_topic(by_learner[learner], bank)
        report.rows += [(learner, t) for t in topics]
        board.append(
            (
                sum(t.items_mastered for t in topics),
                sum(t.mastery for t in topics) / len(topics),
                sum(t.attempts for t in topics),
                learner,
            )
        )
    board.sort(key=lambda entry: (-entry[0], -entry[1], entry[3]))
    report.leaderboard = [
        LeaderboardRow(rank, display_id(learner), mastered, mastery, attempts)
        for rank, (mastered, mastery, attempts, learner) in enumerate(board, start=1)
    ]
    report.learners = len(by_learner)
    return report


def write_csv(report: ScoreReport, path: str | Path) -> Path:
    """Write the learner × topic rows (full pseudonymous ids) to ``path``, atomically, UTF-8."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for learner, row in report.rows:
        values = asdict(row)
        values["learner"] = learner
        values["mastery"] = f"{row.mastery:.4f}"
        for column in LEARNER_TEXT_COLUMNS:
            values[column] = spreadsheet_safe(str(values[column]))
        writer.writerow([values[c] for c in CSV_COLUMNS])
    return write_atomic(path, buffer.getvalue())


def format_leaderboard(report: ScoreReport, top: int = 10) -> str:
    """The leaderboard as text: rank, pseudonym, items mastered, mean mastery, attempts."""
    lines = [f"{'#':>3}  {'learner':<10}  {'mastered':>8}  {'mastery':>7}  {'attempts':>8}"]
    for row in report.leaderboard[:top]:
        lines.append(
            f"{row.rank:>3}  {row.learner:<10}  {row.items_mastered:>8}  "
            f"{row.mastery:>7.0%}  {row.attempts:>8}"
        )
    return "\n".join(lines)


def run_scores(args: argparse.Namespace) -> int:
    from dtlab.quiz.bank import BankError, cached_bank, load_bank

    try:
        bank = load_bank(args.bank) if args.bank else cached_bank()
    except BankError:
        print("warning: the quiz bank does not load; mastery counts only the items tried")
        bank = None
    report = aggregate_scores(args.directory, bank)
    for problem in report.problems:
        print(f"skipped or partial: {problem}")
    if not report.learners:
        print(f"No progress records found under {args.directory} (expected *.jsonl files).")
        return 1
    out = args.out or Path(args.directory) / "scores.csv"
    write_csv(report, out)
    print(f"Read {report.files_read} file(s), {report.learners} learner(s); wrote {out}\n")
    print(format_leaderboard(report, args.top))
    return 0


def register_scores(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``dtlab workshop scores`` (wired in :mod:`dtlab.cli.workshop`)."""
    parser.add_argument("directory", type=Path, help="folder of learners' progress .jsonl files")
    parser.add_argument(
        "--out", type=Path, default=None, help="CSV to write (default DIRECTORY/scores.csv)"
    )
    parser.add_argument("--top", type=int, default=10, help="leaderboard length (default 10)")
    parser.add_argument("--bank", type=Path, default=None, help="quiz folder (default quizzes/)")
    parser.set_defaults(run=run_scores)
