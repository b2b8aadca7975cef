"""Options are shown shuffled per learner and attempt, reproducibly, and graded by identity (issue 28).

Before issue 28 every display showed options in written order under their written keys, and the
right option was written first in 111 of 115 choice items: "(a)" was the key. These tests hold
the notebook cell, the terminal drill and the practice API to :mod:`dtlab.quiz.shuffle`: the
same learner and attempt see the same order, other learners and attempts other orders, labels
are displayed positions, and what is graded and recorded is the option itself.
"""

from __future__ import annotations

import io
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from dtlab.quiz import attempt, item_as_text, load_bank, read_progress, shown_order
from dtlab.quiz.schema import AnswerError
from dtlab.quiz.shuffle import option_order, written_order
from dtlab.quiz.widgets import ask

BANK = """
topic: demo
items:
  - id: demo.pick
    kind: choice
    difficulty: easy
    source: [test]
    link: lab:00#ranks
    prompt: Which one?
    choices:
      - {key: a, text: the right option, correct: true, why: right}
      - {key: b, text: a wrong option, why: wrong}
      - {key: c, text: another wrong one, why: wrong}
      - {key: d, text: the third wrong one, why: wrong}
    explanation: a.
  - id: demo.many
    kind: multi
    difficulty: easy
    source: [test]
    link: lab:00#ranks
    prompt: Which ones?
    choices:
      - {key: a, text: right one, correct: true, why: right}
      - {key: b, text: wrong one, why: wrong}
      - {key: c, text: right two, correct: true, why: right}
      - {key: d, text: wrong two, why: wrong}
    explanation: a and c.
  - id: demo.scale
    kind: choice
    difficulty: easy
    source: [test]
    link: lab:00#ranks
    shuffle: false
    prompt: How often?
    choices:
      - {key: a, text: never, why: wrong}
      - {key: b, text: sometimes, why: wrong}
      - {key: c, text: always, correct: true, why: right}
      - {key: d, text: all of the above, why: wrong}
    explanation: always.
  - id: demo.order
    kind: ordering
    difficulty: easy
    source: [test]
    link: lab:00#ranks
    prompt: Order them.
    steps:
      - {key: two, text: second}
      - {key: one, text: first}
      - {key: three, text: third}
    answer: [one, two, three]
    explanation: one, two, three.
"""

LEARNERS = [f"learner-{n}" for n in range(20)]


@pytest.fixture
def bank(tmp_path: Path):
    folder = tmp_path / "quizzes"
    folder.mkdir()
    (folder / "demo.yaml").write_text(textwrap.dedent(BANK))
    return load_bank(folder)


def shown_position_of_right(item, learner: str, attempt: int = 0) -> int:
    return option_order(item, learner, attempt).keys.index(item.correct_keys[0])


# -- the order -------------------------------------------------------------------------------


def test_same_learner_item_and_attempt_always_show_the_same_order(bank):
    item = bank["demo.pick"]
    orders = {option_order(item, "ada", 3).keys for _ in range(5)}
    assert len(orders) == 1
    assert sorted(orders.pop()) == ["a", "b", "c", "d"]  # a permutation: nothing lost or added


def test_the_order_is_pinned_by_sha256_not_by_pythons_per_process_hash(bank):
    # Python salts hash() per process; these orders come from SHA-256 of (learner, item, attempt)
    # and are the same on every run and machine, so a learner's notebook is reproducible
    item = bank["demo.pick"]
    shown = ["".join(option_order(item, n, a).keys) for n in ("ada", "bob") for a in (0, 1)]
    assert shown == ["cdab", "cbad", "dcba", "cbad"]


def test_across_twenty_learners_the_right_option_moves(bank):
    item = bank["demo.pick"]
    positions = Counter(shown_position_of_right(item, learner) for learner in LEARNERS)
    assert len(positions) >= 3, positions  # written first, shown anywhere
    assert positions[0] < len(LEARNERS) / 2


def test_a_later_attempt_shows_another_order(bank):
    item = bank["demo.pick"]
    orders = {option_order(item, "ada", n).keys for n in range(6)}
    assert len(orders) >= 3


def test_shuffle_false_keeps_the_written_order_for_everyone(bank):
    item = bank["demo.scale"]
    assert item.shuffle is False
    assert {option_order(item, learner, 1).keys for learner in LEARNERS} == {("a", "b", "c", "d")}


def test_ordering_steps_are_shuffled_but_never_shown_solved(bank):
    item = bank["demo.order"]
    orders = {option_order(item, learner).keys for learner in LEARNERS}
    assert tuple(item.answer) not in orders and len(orders) >= 3
    assert option_order(item, "ada").label("two") == "two"  # steps keep their word keys


def test_labels_are_displayed_positions_and_map_back_to_option_keys(bank):
    order = option_order(bank["demo.pick"], "ada", 0)
    assert order.labels() == ["a", "b", "c", "d"]
    for position, key in enumerate(order.keys):
        assert order.label(key) == "abcd"[position] and order.key_of("ABCD"[position]) == key
    with pytest.raises(AnswerError, match="'z' is not one of the options; choose from a, b, c, d"):
        order.key_of("z")
    many = option_order(bank["demo.many"], "ada", 0)
    typed = " ".join(many.label(k) for k in ("c", "a"))
    assert sorted(many.to_keys("multi", typed)) == ["a", "c"]
    assert written_order(bank["demo.pick"]).keys == ("a", "b", "c", "d")


# -- every display grades by identity --------------------------------------------------------


def learner_with_right_not_first(item, learners=LEARNERS) -> str:
    """A learner name whose first displayed option is a wrong one (names seed via their id)."""
    from dtlab.quiz.shuffle import shuffle_learner

    return next(
        name for name in learners if shown_position_of_right(item, shuffle_learner(name)) != 0
    )


def test_quiz_cell_shows_the_shuffled_order_and_grades_the_option_picked(bank, tmp_path):
    progress = tmp_path / "progress.jsonl"
    item = bank["demo.pick"]
    for name in LEARNERS[:6]:
        quiz = ask("demo.pick", bank, learner=name, progress_path=progress)
        order = option_order(item, quiz.shuffle_learner, 0)
        assert quiz.option_order == order
        rows = [row.children[0].options[0] for row in quiz.option_rows]
        assert rows == [(f"({label})", key) for label, key in zip("abcd", order.keys, strict=True)]
        quiz.select_label(order.label("a"))  # the row the right option is shown in
        quiz.check_button.click()
        assert quiz.attempts[-1].correct, name
    records = read_progress(progress).records
    assert all(r["chosen"] == ["a"] and r["correct"] for r in records)
    assert len({tuple(r["shown"]) for r in records}) > 1  # learners saw different orders


def test_quiz_cell_first_row_is_not_the_key_and_retry_reshuffles(bank, tmp_path):
    item = bank["demo.pick"]
    name = learner_with_right_not_first(item, [f"s{n}" for n in range(40)])
    quiz = ask("demo.pick", bank, learner=name, record=False)
    quiz.select_label("a")  # the first row shown: a wrong option for this learner
    quiz.check_button.click()
    assert not quiz.attempts[-1].correct
    orders = [quiz.option_order.keys]
    for _ in range(4):
        quiz.retry()
        orders.append(quiz.option_order.keys)
        assert quiz.option_order == option_order(item, quiz.shuffle_learner, quiz.round)
        assert [r.children[0].options[0][1] for r in quiz.option_rows] == list(orders[-1])
    assert len(set(orders)) > 1


def test_quiz_cell_multi_labels_follow_the_shuffle_and_feedback_names_them(bank):
    quiz = ask("demo.many", bank, learner="ada", record=False)
    labels = [quiz.checkboxes[k].description for k in quiz.option_order.keys]
    assert labels == ["(a)", "(b)", "(c)", "(d)"]
    for key in ("a", "c"):
        quiz.checkboxes[key].value = True
    quiz.check_button.click()
    assert quiz.attempts[-1].correct
    notes = [line for line in quiz.feedback_markdown.splitlines() if line.startswith("- ")]
    assert [n.split("**")[1] for n in notes] == ["(a)", "(b)", "(c)", "(d)"]  # shown order
    assert f"**({quiz.option_order.label('a')})** (you ticked it)" in quiz.feedback_markdown


def test_drill_reads_the_letters_shown_and_grades_the_option_behind_them(bank, tmp_path):
    from dtlab.cli.drill import DrillSession

    item = bank["demo.pick"]
    progress = tmp_path / "progress.jsonl"
    name = learner_with_right_not_first(item)
    session = DrillSession([item], bank, stdin=io.StringIO(), stdout=io.StringIO(), learner=name)
    order = session.order_for(item)
    assert order == option_order(item, session._shuffle_learner, 0)
    right_label = order.label("a")
    out = io.StringIO()
    session = DrillSession(
        [item, item],
        bank,
        stdin=io.StringIO(f"{right_label}\na\n"),
        stdout=out,
        learner=name,
        progress_path=progress,
    )
    score = session.run()
    first, second = score.results
    assert first.correct  # the letter shown beside the right option
    first_shown = item.choice(order.keys[0]).text
    assert f"(a) {first_shown}" in out.getvalue()  # options lettered by displayed position
    records = read_progress(progress).records
    assert [r["chosen"] for r in records] == [["a"], [session_key(bank, name, 1, "a")]]
    assert records[0]["shown"] == list(order.keys)
    assert records[1]["shown"] == list(option_order(item, session._shuffle_learner, 1).keys)
    assert second.correct == (records[1]["chosen"] == ["a"])


def session_key(bank, name: str, attempt_number: int, label: str) -> str:
    """The option key behind ``label`` on ``name``'s ``attempt_number``-th drill of demo.pick."""
    from dtlab.quiz.shuffle import shuffle_learner

    return option_order(bank["demo.pick"], shuffle_learner(name), attempt_number).key_of(label)


def test_drill_history_numbers_the_attempt_so_a_returning_item_is_reshuffled(bank):
    from dtlab.cli.drill import DrillSession

    item = bank["demo.pick"]
    past = [{"item": "demo.pick"}] * 2
    session = DrillSession([item], bank, stdin=io.StringIO(), stdout=io.StringIO(), history=past)
    assert session.order_for(item) == option_order(item, session._shuffle_learner, 2)


def test_practice_api_lists_the_shuffled_order_and_grades_typed_letters_by_identity(bank, tmp_path):
    item = bank["demo.pick"]
    name = learner_with_right_not_first(item)
    order = shown_order(item, name)
    text = item_as_text(item, order)
    listed = [line.strip() for line in text.splitlines() if line.startswith("  (")]
    by_key = {c.key: c.text for c in item.choices}
    assert listed == [f"({'abcd'[i]}) {by_key[k]}" for i, k in enumerate(order.keys)]
    progress = tmp_path / "progress.jsonl"
    right = attempt("demo.pick", order.label("a"), bank=bank, order=order, progress_path=progress)
    assert right.correct
    assert not attempt("demo.pick", "a", bank=bank, order=order, record=False).correct
    assert attempt("demo.pick", "a", bank=bank, record=False).correct  # no order: option keys
    assert read_progress(progress).records[0]["chosen"] == ["a"]


def test_progress_files_written_before_chosen_and_shown_still_read(tmp_path):
    from dtlab.quiz.drill import latest_scores

    path = tmp_path / "progress.jsonl"
    old = (
        '{"bank_version":"x","correct":true,"item":"demo.pick","kind":"choice",'
        '"learner":"r-1","score":1.0,"topic":"demo","ts":"2024-01-01T00:00:00.000+00:00"}\n'
    )
    new = old.replace('"correct":true', '"chosen":["b"],"correct":false,"shown":["b","a"]')
    path.write_text(old + new.replace("2024", "2025").replace('"score":1.0', '"score":0.0'))
    records = read_progress(path).records
    assert len(records) == 2 and "chosen" not in records[0] and records[1]["chosen"] == ["b"]
    assert latest_scores(records) == {"demo.pick": 0.0}
