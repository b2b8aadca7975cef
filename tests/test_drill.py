"""The interview drill: weighted, seeded selection; mock sets across topics; the terminal session."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import pytest

from dtlab.cli import build_parser, main
from dtlab.cli.drill import _rubric_ticks, run_drill
from dtlab.quiz import load_bank, shown_order
from dtlab.quiz.drill import (
    Answered,
    MockScore,
    item_weight,
    latest_scores,
    mock_set,
    select_items,
)

BANK_FILES = {
    "alpha.yaml": """
topic: alpha
items:
  - id: alpha.pick
    kind: choice
    difficulty: easy
    source: [test]
    link: lab:00#ranks
    prompt: Pick b.
    choices:
      - {key: a, text: wrong one, why: wrong}
      - {key: b, text: right one, correct: true, why: right}
    explanation: b is right.
  - id: alpha.number
    kind: numeric
    difficulty: medium
    source: [test]
    link: lab:00#ranks
    prompt: Four ranks all-reduce their rank. What does each hold?
    key: {call: "dtlab.quiz.graders.setup:expected_rank_sum", kwargs: {world_size: 4}}
    unit: ""
    tolerance: {abs: 0}
    explanation: 0 + 1 + 2 + 3.
  - id: alpha.talk
    kind: short
    difficulty: hard
    source: [test]
    link: lab:00#ranks
    prompt: Explain it.
    answer: An explanation.
    rubric: [first point, second point, third point]
    explanation: Three points.
  - id: alpha.code
    kind: code
    difficulty: easy
    source: [test]
    link: lab:00#ranks
    prompt: Write it.
    exercise: setup.rank_sum
    explanation: One all-reduce.
""",
    "beta.yaml": """
topic: beta
items:
  - id: beta.many
    kind: multi
    difficulty: easy
    source: [test]
    link: lab:00#ranks
    prompt: Pick a and c.
    choices:
      - {key: a, text: one, correct: true, why: right}
      - {key: b, text: two, why: wrong}
      - {key: c, text: three, correct: true, why: right}
    explanation: a and c.
  - id: beta.order
    kind: ordering
    difficulty: medium
    source: [test]
    link: lab:00#ranks
    prompt: Order them.
    steps:
      - {key: two, text: second}
      - {key: one, text: first}
      - {key: three, text: third}
    answer: [one, two, three]
    explanation: One, two, three.
""",
}

RIGHT_ANSWERS = {
    "alpha.pick": ["b"],
    "alpha.number": ["6"],
    "alpha.talk": ["I would say...", "all"],
    "beta.many": ["a c"],
    "beta.order": ["one two three"],
}


def typed_right_answer(item, learner: str | None = None, attempt: int = 0) -> list[str]:
    """The lines a learner types to answer ``item`` right, in the letters the drill shows."""
    if item.kind in ("choice", "multi"):
        order = shown_order(item, learner, attempt)
        return [" ".join(sorted(order.label(k) for k in item.correct_keys))]
    return RIGHT_ANSWERS[item.id]


@pytest.fixture
def bank_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))  # the learner id file lands here, not in ~
    folder = tmp_path / "quizzes"
    folder.mkdir()
    for name, text in BANK_FILES.items():
        (folder / name).write_text(text)
    return folder


def record(item: str, score: float, ts: str) -> dict:
    return {
        "item": item,
        "topic": item.split(".")[0],
        "score": score,
        "ts": ts,
        "correct": score == 1,
    }


def test_item_weight_favours_missed_then_new_then_solved():
    assert item_weight(0.0) == 4.0
    assert item_weight(None) == 2.0
    assert item_weight(0.5) == 2.5
    assert item_weight(1.0) == 1.0


def test_latest_score_is_the_most_recent_attempt_whatever_the_file_order():
    records = [record("a.x", 1.0, "2025-01-02"), record("a.x", 0.0, "2025-01-01")]
    assert latest_scores(records) == {"a.x": 1.0}


def test_same_seed_and_history_give_the_same_selection(bank_dir):
    bank = load_bank(bank_dir)
    first = select_items(bank.values(), 3, seed=7)
    assert [i.id for i in first] == [i.id for i in select_items(bank.values(), 3, seed=7)]
    assert len({i.id for i in first}) == 3


def test_a_missed_item_comes_back_four_times_as_often_as_a_solved_one(bank_dir):
    items = [i for i in load_bank(bank_dir).values() if i.id in ("alpha.pick", "alpha.number")]
    history = [record("alpha.pick", 0.0, "2025-01-01"), record("alpha.number", 1.0, "2025-01-01")]
    picks = Counter(select_items(items, 1, history, seed=s)[0].id for s in range(2000))
    assert 0.76 < picks["alpha.pick"] / 2000 < 0.84  # weights 4 : 1 → 80%


def test_code_exercises_are_left_to_the_labs(bank_dir):
    bank = load_bank(bank_dir)
    chosen = select_items(bank.values(), 10, seed=0)
    assert "alpha.code" not in {i.id for i in chosen} and len(chosen) == 5
    with pytest.raises(ValueError, match="only code exercises"):
        select_items([bank["alpha.code"]], 1, seed=0)


def test_mock_set_spreads_questions_evenly_over_topics(bank_dir):
    bank = load_bank(bank_dir)
    for n in (1, 2, 3, 4):
        chosen = mock_set(bank.values(), n, seed=n)
        counts = Counter(i.topic for i in chosen)
        assert len(chosen) == n and len({i.id for i in chosen}) == n
        assert max(counts.values()) - min(counts.get(t, 0) for t in ("alpha", "beta")) <= 1


def test_mock_score_totals_points_per_topic_weakest_first(bank_dir):
    bank = load_bank(bank_dir)
    score = MockScore()
    score.add(Answered(bank["alpha.pick"], 1.0, True, "answered"))
    score.add(Answered(bank["alpha.number"], 0.0, False, "late"))
    score.add(Answered(bank["beta.many"], 0.0, False, "skipped"))
    by_topic = {t.topic: t for t in score.by_topic()}
    assert (by_topic["alpha"].asked, by_topic["alpha"].correct, by_topic["alpha"].percent) == (
        2,
        1,
        50.0,
    )
    assert [t.topic for t in score.by_topic()] == ["beta", "alpha"]
    assert "Review next: alpha.number, beta.many" in score.report()


def test_rubric_ticks_are_read_as_one_based_point_numbers():
    assert _rubric_ticks("1 3", 3) == [0, 2]
    assert _rubric_ticks("3,1", 3) == [0, 2]
    assert _rubric_ticks("all", 3) == [0, 1, 2]
    assert _rubric_ticks("none", 3) == []


def drill_args(bank_dir: Path, *extra: str) -> list[str]:
    return [
        "drill",
        "--bank",
        str(bank_dir),
        "--progress",
        str(bank_dir / "progress.jsonl"),
        *extra,
    ]


def test_drill_grades_right_answers_records_them_and_prints_the_score(
    bank_dir, monkeypatch, capsys
):
    items = select_items(load_bank(bank_dir).values(), 5, seed=3)
    answers = [line for item in items for line in typed_right_answer(item)]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(answers) + "\n"))
    assert main(drill_args(bank_dir, "--n", "5", "--seed", "3")) == 0
    out = capsys.readouterr().out
    assert "Score: 5.0 / 5 (100%)" in out and "Review next" not in out
    lines = (bank_dir / "progress.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["item"] for line in lines) == sorted(i.id for i in items)


def test_bad_input_gets_a_polite_retry_and_end_of_input_stops_the_drill(
    bank_dir, monkeypatch, capsys
):
    monkeypatch.setattr("sys.stdin", io.StringIO("zz\n"))
    assert main(drill_args(bank_dir, "--topic", "beta", "--n", "2", "--seed", "1")) == 0
    out = capsys.readouterr().out
    assert "does not fit the question" in out and "Try again, or 'skip'" in out
    assert "End of input." in out and "Score: 0.0 / 2" in out


def test_quit_and_skip_are_commands_not_answers(bank_dir, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("skip\nquit\n"))
    assert main(drill_args(bank_dir, "--n", "3", "--seed", "2", "--no-record")) == 0
    out = capsys.readouterr().out
    assert "Stopped at your request." in out and "Score: 0.0 / 3" in out
    assert not (bank_dir / "progress.jsonl").exists()


def test_mock_answers_after_the_deadline_score_zero_and_the_rest_go_unanswered(bank_dir, capsys):
    args = build_parser().parse_args(
        drill_args(bank_dir, "--mock", "--n", "4", "--seed", "5", "--time-limit", "150")
    )
    items = mock_set(load_bank(bank_dir).values(), 4, seed=5)
    answers = "\n".join(line for item in items for line in typed_right_answer(item)) + "\n"
    ticks = iter(range(0, 10_000, 30))  # each look at the clock is 30 s later: q1 in time, q2 late
    out = io.StringIO()
    assert run_drill(args, io.StringIO(answers), out, clock=lambda: next(ticks)) == 0
    text = out.getvalue()
    assert "Mock interview: 4 questions, 2.5 minutes" in text
    assert "counts 0 in the mock score" in text and "Time is up." in text
    assert "Score: 1.0 / 4" in text


def test_unknown_topic_lists_the_topics(bank_dir, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(drill_args(bank_dir, "--topic", "gamma")) == 2
    assert "no topic 'gamma'; choose one of: alpha, beta" in capsys.readouterr().out


# -- issue 21: Markdown rendered for the terminal, wrapped; skip / Ctrl-D / Ctrl-C scored alike --


class _Interrupting(io.StringIO):
    """stdin whose next read is Ctrl-C."""

    def readline(self, *args):
        raise KeyboardInterrupt


def _session(bank_dir: Path, stdin, width: int = 80):
    from dtlab.cli.drill import DrillSession

    bank = load_bank(bank_dir)
    items = [bank["alpha.pick"], bank["alpha.number"], bank["beta.many"]]
    out = io.StringIO()
    session = DrillSession(items, bank, stdin=stdin, stdout=out, record=False, width=width)
    return session, out


def test_skip_end_of_input_and_ctrl_c_score_the_question_on_screen_the_same(bank_dir):
    outcomes = {}
    for how, stdin in {
        "skip then quit": io.StringIO("skip\nquit\n"),
        "end of input": io.StringIO(""),
        "ctrl-c": _Interrupting(),
    }.items():
        session, out = _session(bank_dir, stdin)
        score = session.run()
        statuses = [r.status for r in score.results]
        outcomes[how] = (statuses[0], statuses.count("skipped") + statuses.count("unanswered"))
        assert "Score: 0.0 / 3" in out.getvalue(), how
        assert score.interrupted == (how == "ctrl-c")
    assert set(outcomes.values()) == {("skipped", 3)}


def test_ctrl_c_exits_130_with_the_whole_set_in_the_score(bank_dir, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", _Interrupting())
    assert main(drill_args(bank_dir, "--n", "3", "--seed", "2", "--no-record")) == 130
    out = capsys.readouterr().out
    assert "Interrupted." in out and "Score: 0.0 / 3" in out and "Skipped 1, not reached 2" in out


def test_questions_and_feedback_render_as_wrapped_markdown_without_internals(bank_dir):
    long_text = "a very long option " * 12
    (bank_dir / "alpha.yaml").write_text(
        BANK_FILES["alpha.yaml"]
        .replace("Pick b.", "Pick `b` with **care**.")
        .replace("text: wrong one", f"text: {long_text.strip()}")
    )
    session, out = _session(bank_dir, io.StringIO("b\n27\n"), width=60)
    session.run()
    text = out.getvalue()
    assert "Pick b with care." in text and "`" not in text and "**" not in text
    assert all(len(line.rstrip()) <= 60 for line in text.splitlines()), "a line ran past the width"
    assert "key is" not in text and "Computed by" not in text
    assert "The answer is 6" in text  # the numeric answer, without how the library computed it
