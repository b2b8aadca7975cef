"""Grading every kind: right and wrong answers, partial credit, and clear errors for bad shapes."""

from __future__ import annotations

import pytest

from dtlab.quiz import AnswerError, grade, load_bank, parse_number
from dtlab.quiz.schema import Item, NumericKey, Tolerance
from dtlab.quiz.units import slip_hint


@pytest.fixture(scope="module")
def bank():
    return load_bank()


def test_choice_feedback_explains_the_chosen_wrong_option_and_the_right_one(bank):
    item = bank["setup.world_size"]
    right = item.correct_keys[0]
    wrong = next(c.key for c in item.choices if not c.correct)
    result = grade(item, wrong)
    assert not result and result.score == 0.0
    assert item.choice(wrong).why in result.feedback
    assert item.choice(right).why in result.feedback
    assert grade(item, right.upper()).correct  # keys are case-insensitive


def test_choice_rejects_unknown_keys_and_lists(bank):
    with pytest.raises(AnswerError, match="'z' is not one of the choices; choose from a, b, c, d"):
        grade(bank["setup.world_size"], "z")
    with pytest.raises(AnswerError, match="expected one choice key"):
        grade(bank["setup.world_size"], ["b"])


def test_multi_scores_the_fraction_of_options_judged_right(bank):
    item = bank["setup.backends"]
    assert grade(item, ["a", "b", "e"]).correct
    partial = grade(item, "a b c")  # a, b right; c wrongly picked; e missed; d rightly left out
    assert not partial.correct
    assert partial.score == pytest.approx(3 / 5)
    assert "(c) should not be selected" in partial.feedback
    assert "(e) should also be selected" in partial.feedback
    assert grade(item, []).score == pytest.approx(2 / 5)


def test_numeric_accepts_plain_numbers_and_text(bank):
    item = bank["setup.rank_sum_value"]
    assert grade(item, 28).correct
    assert grade(item, "28").correct
    assert grade(item, " 2.8e1 ").correct
    assert not grade(item, 27).correct


def test_numeric_rejects_text_that_is_not_a_number_or_has_a_unit_when_none_is_asked(bank):
    item = bank["setup.rank_sum_value"]
    with pytest.raises(AnswerError, match="could not read 'twenty-eight' as a number"):
        grade(item, "twenty-eight")
    with pytest.raises(AnswerError, match="plain number without a unit"):
        grade(item, "28 GB")
    with pytest.raises(AnswerError, match="expected a number, got list"):
        grade(item, [28])
    with pytest.raises(AnswerError, match="expected a number, got bool"):
        grade(item, True)


def test_number_parsing_converts_si_and_iec_prefixes_to_the_items_unit():
    assert parse_number("1.12 TB", "GB") == pytest.approx(1120)
    assert parse_number("1.12e12 B", "GB") == pytest.approx(1120)
    assert parse_number("1 GiB", "GB") == pytest.approx(1.073741824)
    assert parse_number("1,120", "GB") == 1120
    assert parse_number("250 ms", "s") == pytest.approx(0.25)
    assert parse_number("25%", "%") == 25
    assert parse_number("3.5", "GB") == 3.5
    with pytest.raises(AnswerError, match="is in s, but the question asks for GB"):
        parse_number("3 s", "GB")
    with pytest.raises(AnswerError, match="unit 'furlongs' not understood"):
        parse_number("3 furlongs", "GB")
    with pytest.raises(AnswerError, match="use '.' for decimals"):
        parse_number("1,5", "GB")


def test_numeric_tolerance_and_gib_slip_hint():
    item = Item(
        id="demo.bytes",
        topic="demo",
        kind="numeric",
        prompt="How many GB?",
        explanation="because",
        difficulty="easy",
        source=("seed:x",),
        link="lab:00",
        key=NumericKey(
            "dtlab.quiz.graders.setup:expected_rank_sum", kwargs={"world_size": 1001}, scale=2e-3
        ),
        unit="GB",
        tolerance=Tolerance(rel=0.01),
    )
    assert grade(item, "1000 GB").correct  # key is 1001 * 1000 / 2 * 2e-3 = 1001
    assert grade(item, "1.01 TB").correct
    wrong = grade(item, 1001 / 1.024**3)
    assert not wrong.correct
    assert "GiB" in wrong.feedback
    assert item.key.describe().endswith("expected_rank_sum(world_size=1001) × 0.002")  # authors
    assert "expected_rank_sum" not in wrong.feedback  # never shown to a learner


def test_slip_hint_names_bits_versus_bytes():
    assert "bits vs bytes" in slip_hint(64.0, 8.0)
    assert slip_hint(10.0, 7.0) == ""


def test_ordering_gives_partial_credit_by_pairs_in_order(bank):
    item = bank["setup.job_lifecycle"]
    assert grade(item, ["launch", "init", "collective", "destroy"]).correct
    swapped = grade(item, "launch collective init destroy")
    assert swapped.score == pytest.approx(5 / 6)
    assert "Step 2 should be" in swapped.feedback
    assert grade(item, ["destroy", "collective", "init", "launch"]).score == 0.0


def test_ordering_that_is_not_a_permutation_is_an_answer_error(bank):
    item = bank["setup.job_lifecycle"]
    with pytest.raises(AnswerError, match="missing: destroy; repeated: init"):
        grade(item, ["launch", "init", "init", "collective"])
    with pytest.raises(AnswerError, match="unknown: teardown"):
        grade(item, ["launch", "init", "collective", "destroy", "teardown"])


def test_short_answer_score_is_the_fraction_of_rubric_points_ticked(bank):
    item = bank["setup.process_groups"]
    n = len(item.rubric)
    assert grade(item, list(range(n))).correct
    half = grade(item, [0, 1])
    assert half.score == pytest.approx(2 / n) and not half.correct
    assert item.rubric[-1] in half.feedback  # missed points are listed
    assert grade(item, [True] + [False] * (n - 1)).score == pytest.approx(1 / n)
    with pytest.raises(AnswerError, match="indices 0..3"):
        grade(item, [7])
    with pytest.raises(AnswerError, match="ticked rubric points"):
        grade(item, "all of them")


def test_code_item_needs_a_function(bank):
    with pytest.raises(AnswerError, match="answered with your function"):
        grade(bank["setup.rank_sum"], "print(1)")


def test_grade_text_keeps_grader_internals_out():
    from dtlab.quiz import load_bank

    item = load_bank()["composition.zero3_micro_batches"]
    for response in ("839", "210"):
        text = grade(item, response).feedback
        assert "key" not in text.lower() and "Computed by" not in text and "dtlab." not in text
