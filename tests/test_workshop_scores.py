"""Instructor score export: learners' progress files → CSV per learner × topic and a leaderboard."""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path

import pytest

import dtlab.files
from dtlab.quiz.bank import Bank
from dtlab.quiz.progress import record_attempt
from dtlab.quiz.schema import Choice, Item
from dtlab.quiz.scores import (
    CSV_COLUMNS,
    FORMULA_TRIGGERS,
    aggregate_scores,
    format_leaderboard,
    register_scores,
    write_csv,
)

ALICE, BOB = "h-" + "a" * 16, "r-" + "b" * 16


def line(learner: str, item: str, score: float, ts: str = "2025-05-01T10:00:00.000+00:00") -> str:
    record = {
        "ts": ts,
        "learner": learner,
        "item": item,
        "topic": item.split(".")[0],
        "kind": "choice",
        "correct": score == 1.0,
        "score": score,
        "bank_version": "abc",
    }
    return json.dumps(record) + "\n"


def bank() -> Bank:
    items = [
        Item(
            id=i,
            topic=i.split(".")[0],
            kind="choice",
            prompt="?",
            explanation="!",
            difficulty="easy",
            source=("t",),
            link="dtlab.quiz.mastery:item_mastery",
            choices=(Choice("a", "x", True, "r"), Choice("b", "y", False, "w")),
        )
        for i in ("zero.a", "zero.b", "setup.a")
    ]
    return Bank(items, "test", (), {})


@pytest.fixture
def handed_in(tmp_path: Path) -> Path:
    folder = tmp_path / "handed_in"
    (folder / "room2").mkdir(parents=True)
    (folder / "alice_smith.jsonl").write_text(
        line(ALICE, "zero.a", 1.0) + line(ALICE, "zero.b", 1.0)
    )
    (folder / "room2" / "bob.jsonl").write_text(
        line(BOB, "zero.a", 0.0) + line(BOB, "setup.a", 1.0)
    )
    # The same file handed in twice must count once.
    (folder / "alice_copy.jsonl").write_text(line(ALICE, "zero.a", 1.0))
    return folder


def test_rows_per_learner_and_topic_and_a_leaderboard_by_items_mastered(handed_in):
    report = aggregate_scores(handed_in, bank())
    assert report.problems == [] and report.learners == 2 and report.files_read == 3
    rows = {(learner, row.topic): row for learner, row in report.rows}
    assert set(rows) == {(ALICE, "zero"), (ALICE, "setup"), (BOB, "zero"), (BOB, "setup")}
    assert rows[ALICE, "zero"].mastery == 1.0 and rows[ALICE, "zero"].attempts == 2
    assert rows[BOB, "zero"].mastery == 0.0 and rows[BOB, "setup"].mastery == 1.0
    assert [(r.rank, r.learner, r.items_mastered) for r in report.leaderboard] == [
        (1, ALICE[:10], 2),
        (2, BOB[:10], 1),
    ]


def test_csv_has_one_row_per_learner_and_topic(handed_in, tmp_path):
    path = write_csv(aggregate_scores(handed_in, bank()), tmp_path / "out" / "scores.csv")
    rows = list(csv.DictReader(path.open()))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == 4
    alice_zero = next(r for r in rows if r["learner"] == ALICE and r["topic"] == "zero")
    assert (alice_zero["mastery"], alice_zero["items_mastered"], alice_zero["items_total"]) == (
        "1.0000",
        "2",
        "2",
    )


def test_corrupt_partial_and_foreign_files_are_reported_and_skipped(handed_in):
    (handed_in / "binary.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    (handed_in / "notebook.jsonl").write_text('{"cells": [], "nbformat": 4}\n')
    (handed_in / "empty.jsonl").write_text("")
    (handed_in / "torn.jsonl").write_text(line(BOB, "zero.b", 1.0) + '{"ts": "2025-05-01T1')
    (handed_in / "wrong_types.jsonl").write_text(line(BOB, "zero.b", 1.0).replace("1.0", '"lots"'))
    (handed_in / "notes.txt").write_text("not a progress file, and not read")
    report = aggregate_scores(handed_in, bank())
    problems = "\n".join(report.problems)
    assert "binary.jsonl: not a text file" in problems
    assert "notebook.jsonl: holds no progress records (1 unreadable line(s)); skipped" in problems
    assert "empty.jsonl: empty; skipped" in problems
    assert "torn.jsonl: partial: skipped 1 unreadable line(s) (2); kept 1" in problems
    assert "wrong_types.jsonl: holds no progress records" in problems
    assert "notes.txt" not in problems and len(report.problems) == 5
    bob_zero = next(row for learner, row in report.rows if learner == BOB and row.topic == "zero")
    assert bob_zero.items_tried == 2  # the torn file's whole line was kept


def test_the_leaderboard_shows_no_file_names(handed_in):
    board = format_leaderboard(aggregate_scores(handed_in, bank()))
    assert "alice" not in board.lower() and "bob" not in board.lower()
    assert ALICE[:10] in board and ALICE not in board


def test_scores_command_writes_the_csv_and_never_crashes_on_bad_files(handed_in, capsys):
    (handed_in / "junk.jsonl").write_text("hello\n")
    parser = argparse.ArgumentParser()
    register_scores(parser)
    args = parser.parse_args(
        [str(handed_in), "--bank", str(Path(__file__).parents[1] / "quizzes" / "setup.yaml")]
    )
    assert args.run(args) == 0
    out = capsys.readouterr().out
    assert "junk.jsonl: holds no progress records" in out and "2 learner(s)" in out
    assert (handed_in / "scores.csv").exists()


def test_a_folder_without_progress_records_exits_1_with_a_message(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    register_scores(parser)
    args = parser.parse_args([str(tmp_path)])
    assert args.run(args) == 1
    assert "No progress records found" in capsys.readouterr().out


def malicious(learner: str, topic: str, ts: str) -> str:
    record = json.loads(line(BOB, "zero.a", 1.0))
    record.update(learner=learner, topic=topic, ts=ts)
    return json.dumps(record) + "\n"


def test_csv_neutralises_formulas_in_every_learner_field(tmp_path):
    folder = tmp_path / "handed_in"
    folder.mkdir()
    (folder / "evil.jsonl").write_text(
        malicious('=HYPERLINK("http://evil.example","click")', "+SUM(A1:A9)", "@NOW()")
        + malicious("-2+3", "\t=1+1", "\r=1+1")
        + malicious("r-plain", "zero", "2025-05-01T10:00:00.000+00:00")
    )
    path = write_csv(aggregate_scores(folder), tmp_path / "s.csv")
    rows = list(csv.reader(path.open(newline="")))
    assert len(rows) == 1 + 3
    for row in rows:
        for cell in row:
            assert not cell.startswith(FORMULA_TRIGGERS), row
    learners = {row[0] for row in rows[1:]}
    assert learners == {'\'=HYPERLINK("http://evil.example","click")', "'-2+3", "r-plain"}
    assert {row[1] for row in rows[1:]} == {"'+SUM(A1:A9)", "'\t=1+1", "zero"}
    assert {row[7] for row in rows[1:]} == {"'@NOW()", "'\r=1+1", "2025-05-01T10:00:00.000+00:00"}


def test_rewriting_the_csv_never_touches_the_old_file_in_place(handed_in, tmp_path, monkeypatch):
    path = tmp_path / "scores.csv"
    path.write_text("the old export\n")
    with path.open() as reader_of_the_old_file:
        write_csv(aggregate_scores(handed_in, bank()), path)
        assert reader_of_the_old_file.read() == "the old export\n"
    assert path.read_text().startswith(",".join(CSV_COLUMNS))

    def crash_half_way(fd, data):  # a kill or a full disk in the middle of the write
        os.write(fd, bytes(data[: len(data) // 2]))
        raise KeyboardInterrupt

    monkeypatch.setattr(dtlab.files, "write_all", crash_half_way)
    before = path.read_bytes()
    with pytest.raises(KeyboardInterrupt):
        write_csv(aggregate_scores(handed_in, bank()), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["handed_in", "scores.csv"]


def test_one_seat_name_on_two_installs_is_two_learners_and_copies_count_once(tmp_path, monkeypatch):
    folder = tmp_path / "handed_in"
    for machine in ("seat1", "seat2"):
        monkeypatch.setenv("HOME", str(tmp_path / machine))  # each install has its own salt
        record_attempt(item="zero.a", topic="zero", correct=True, score=1.0, bank_version="abc",
                       kind="choice", learner="Ada", path=folder / f"{machine}.jsonl")  # fmt: skip
    (folder / "seat1_again.jsonl").write_bytes((folder / "seat1.jsonl").read_bytes())
    report = aggregate_scores(folder, bank())
    assert report.problems == [] and report.files_read == 3
    assert report.learners == 2
    assert all(row.attempts == 1 for _, row in report.rows if row.topic == "zero")


def test_leaderboard_ids_cannot_carry_terminal_escape_codes():
    from dtlab.quiz.scores import display_id

    assert display_id("\x1b[2Jr-3fa2") == "?[2Jr-3fa2"
    assert display_id("r-3fa2c1d0ffff") == "r-3fa2c1d0"
