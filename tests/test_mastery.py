"""Mastery per topic: recency-weighted item scores, untried items count 0; table, chart, CLI."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

import dtlab.files
from dtlab.cli import main
from dtlab.quiz.bank import Bank
from dtlab.quiz.mastery import item_mastery, mastery_by_topic, mastery_chart, mastery_table
from dtlab.quiz.progress import record_attempt
from dtlab.quiz.schema import Choice, Item


def choice_item(item_id: str) -> Item:
    return Item(
        id=item_id,
        topic=item_id.split(".")[0],
        kind="choice",
        prompt="?",
        explanation="!",
        difficulty="easy",
        source=("test",),
        link="dtlab.quiz.mastery:item_mastery",
        choices=(Choice("a", "x", True, "right"), Choice("b", "y", False, "wrong")),
    )


@pytest.fixture
def bank() -> Bank:
    ids = ["zero.a", "zero.b", "zero.c", "zero.d", "pipeline.a"]
    return Bank([choice_item(i) for i in ids], "test", (), {})


def rec(item: str, score: float, ts: str) -> dict:
    return {
        "item": item,
        "topic": item.split(".")[0],
        "score": score,
        "ts": ts,
        "correct": score == 1,
    }


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([], 0.0),
        ([1.0], 1.0),
        ([0.0, 0.0, 1.0], 1 / 1.75),
        ([0.0, 0.0, 1.0, 1.0], 0.8),
        ([1.0, 0.0], 1 / 3),
    ],
)
def test_latest_attempt_weighs_as_much_as_all_earlier_ones(scores, expected):
    assert math.isclose(item_mastery(scores), expected)


def test_untried_items_of_a_topic_count_as_zero(bank):
    rows = {r.topic: r for r in mastery_by_topic([rec("zero.a", 1.0, "2025-01-01")], bank)}
    assert rows["zero"].mastery == 0.25
    assert (rows["zero"].items_total, rows["zero"].items_tried, rows["zero"].items_mastered) == (
        4,
        1,
        1,
    )
    assert rows["pipeline"].mastery == 0.0 and rows["pipeline"].attempts == 0


def test_attempts_are_ordered_by_timestamp_not_by_file_order(bank):
    records = [rec("zero.a", 0.0, "2025-01-02T00:00"), rec("zero.a", 1.0, "2025-01-01T00:00")]
    (row,) = [r for r in mastery_by_topic(records, bank) if r.topic == "zero"]
    assert math.isclose(row.mastery, (1 / 3) / 4)  # right, then missed: the miss counts most
    assert row.last_attempt == "2025-01-02T00:00" and row.items_mastered == 0


def test_topics_outside_the_bank_are_listed_after_it_over_the_items_tried(bank):
    records = [rec("capstone.plan", 1.0, "2025-01-01"), rec("zero.a", 1.0, "2025-01-01")]
    rows = mastery_by_topic(records, bank)
    assert [r.topic for r in rows] == ["zero", "pipeline", "capstone"]
    assert rows[-1].mastery == 1.0 and rows[-1].items_total == 1
    assert [r.topic for r in mastery_by_topic(records)] == ["capstone", "zero"]


def test_table_and_chart_show_one_entry_per_topic(bank):
    rows = mastery_by_topic(
        [rec("zero.a", 1.0, "2025-01-01"), rec("zero.b", 1.0, "2025-01-01")], bank
    )
    table = mastery_table(rows)
    assert "zero" in table and "50%" in table and "pipeline" in table
    figure = mastery_chart(rows)
    assert list(figure.data[0].x) == ["zero", "pipeline"]
    assert list(figure.data[0].y) == [50.0, 0.0]
    assert "no attempts recorded yet" in mastery_table([])


def test_progress_command_prints_my_table_and_writes_the_chart(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    progress = tmp_path / "progress.jsonl"
    bank_dir = Path(__file__).resolve().parents[1] / "quizzes" / "setup.yaml"
    record_attempt(
        item="setup.world_size",
        topic="setup",
        correct=True,
        score=1.0,
        bank_version=None,
        kind="choice",
        path=progress,
    )
    record_attempt(
        item="setup.world_size",
        topic="setup",
        correct=False,
        score=0.0,
        bank_version=None,
        kind="choice",
        learner="someone else",
        path=progress,
    )
    chart = tmp_path / "mastery.html"
    assert (
        main(
            [
                "progress",
                "--progress",
                str(progress),
                "--bank",
                str(bank_dir),
                "--chart",
                str(chart),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "(1 attempts)" in out and "setup" in out and "1/" in out
    assert chart.read_text().count("<html") == 1
    assert main(["progress", "--progress", str(progress), "--bank", str(bank_dir), "--all"]) == 0
    assert "(2 attempts)" in capsys.readouterr().out


def test_a_chart_write_that_fails_half_way_leaves_the_old_chart_whole(
    tmp_path: Path, monkeypatch, capsys
):
    chart = tmp_path / "mastery.html"
    chart.write_text("<html>the old chart</html>")
    progress = tmp_path / "progress.jsonl"
    args = ["progress", "--progress", str(progress), "--all", "--chart", str(chart)]

    def disk_full_half_way(fd, data):
        os.write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dtlab.files, "write_all", disk_full_half_way)
    assert main(args) == 1
    assert "cannot write the chart" in capsys.readouterr().out
    assert chart.read_text() == "<html>the old chart</html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mastery.html"]
    monkeypatch.undo()
    with chart.open() as reader_of_the_old_chart:
        assert main(args) == 0
        assert reader_of_the_old_chart.read() == "<html>the old chart</html>"
    assert chart.read_text().count("<html") == 1
