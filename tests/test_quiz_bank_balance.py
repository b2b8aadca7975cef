"""The bank's key cannot be guessed from where the right option sits or how long it is (issue 28).

Before issue 28 the right option was the first in 111 of 115 ``choice`` items and the longest in
115 of 115 (a median 3.2 × the wrong ones). The display now shuffles options per learner
(:mod:`dtlab.quiz.shuffle`, tested in ``test_quiz_shuffle.py``), which hides position from a
learner but not length. These tests hold the *written* bank to:

* the right option is the longest — at least as long as every wrong option, by characters — in at
  most half the ``choice`` items (a learner who always picks the longest wins no more often than
  that);
* no written position holds the right option in more than 40 % of the items (a display with
  ``shuffle: false`` shows the written order, and a preview or an export might too);
* in every item the right option is at most 2.5 × the mean length of its wrong options (one very
  long right answer among short wrong ones is a giveaway even when the bank is balanced overall).

Each failure message lists the worst items by id, so the fix starts with them.
"""

from __future__ import annotations

from collections import Counter
from statistics import mean

import pytest

from dtlab.quiz import load_bank
from dtlab.quiz.schema import Choice, Item

LONGEST_AT_MOST = 0.5
ONE_POSITION_AT_MOST = 0.4
LENGTH_RATIO_AT_MOST = 2.5
SHOW = 15  # offenders listed in a failure message


def right_and_wrong(item: Item) -> tuple[Choice, list[Choice]]:
    right = next(c for c in item.choices if c.correct)
    return right, [c for c in item.choices if not c.correct]


def length_ratio(item: Item) -> float:
    """The right option's length over the mean length of the wrong ones, in characters."""
    right, wrong = right_and_wrong(item)
    return len(right.text) / mean(len(c.text) for c in wrong)


def right_is_longest(item: Item) -> bool:
    right, wrong = right_and_wrong(item)
    return len(right.text) >= max(len(c.text) for c in wrong)


def right_position(item: Item) -> int:
    return next(i for i, c in enumerate(item.choices) if c.correct)


def longest_problem(items: list[Item]) -> str | None:
    """Why the right option is the longest too often, or None."""
    longest = [i for i in items if right_is_longest(i)]
    if len(longest) <= LONGEST_AT_MOST * len(items):
        return None
    worst = sorted(longest, key=length_ratio, reverse=True)[:SHOW]
    return (
        f"the right option is the longest in {len(longest)} of {len(items)} choice items "
        f"(at most {LONGEST_AT_MOST:.0%} allowed); lengthen the wrong options (or shorten the "
        "right one) first in:\n"
        + "\n".join(f"  {i.id}: right is {length_ratio(i):.1f}× the wrong mean" for i in worst)
    )


def position_problem(items: list[Item]) -> str | None:
    """Why one written position holds the right option too often, or None."""
    counts = Counter(right_position(i) for i in items)
    position, count = counts.most_common(1)[0]
    if count <= ONE_POSITION_AT_MOST * len(items):
        return None
    at = [i.id for i in items if right_position(i) == position][:SHOW]
    spread = ", ".join(f"#{p + 1}: {n}" for p, n in sorted(counts.items()))
    return (
        f"the right option is written at position #{position + 1} in {count} of {len(items)} "
        f"choice items (at most {ONE_POSITION_AT_MOST:.0%} at one position; {spread}); move it "
        "elsewhere in, for example:\n" + "\n".join(f"  {item_id}" for item_id in at)
    )


def ratio_problem(items: list[Item]) -> str | None:
    """Which items' right option dwarfs their wrong ones, or None."""
    over = sorted(
        (i for i in items if length_ratio(i) > LENGTH_RATIO_AT_MOST), key=length_ratio, reverse=True
    )
    if not over:
        return None
    return (
        f"{len(over)} choice items have a right option over {LENGTH_RATIO_AT_MOST}× the mean "
        "length of their wrong ones (make the wrong options as specific):\n"
        + "\n".join(f"  {i.id}: {length_ratio(i):.1f}×" for i in over[:SHOW])
    )


@pytest.fixture(scope="module")
def choice_items() -> list[Item]:
    return [item for item in load_bank().values() if item.kind == "choice"]


def test_bank_right_option_is_the_longest_in_at_most_half_the_choice_items(choice_items):
    problem = longest_problem(choice_items)
    assert problem is None, problem


def test_bank_no_written_position_holds_the_right_option_in_over_40_percent(choice_items):
    problem = position_problem(choice_items)
    assert problem is None, problem


def test_bank_no_right_option_is_over_two_and_a_half_times_the_wrong_ones(choice_items):
    problem = ratio_problem(choice_items)
    assert problem is None, problem


# -- the checks themselves, on made-up items: each catches the bias it names ------------------


def made_up(item_id: str, texts: list[str], right: int) -> Item:
    choices = tuple(
        Choice(key, text, i == right, "why")
        for i, (key, text) in enumerate(zip("abcd", texts, strict=False))
    )
    return Item(
        item_id, "demo", "choice", "?", "!", "easy", ("t",), "lab:00#ranks", choices=choices
    )


def test_the_checks_catch_a_first_and_longest_key_and_name_the_worst_items():
    biased = [
        made_up(f"demo.q{n}", ["the right one, long and precise " * (1 + n % 3), "no", "nope"], 0)
        for n in range(10)
    ]
    longest = longest_problem(biased)
    assert longest.startswith("the right option is the longest in 10 of 10 choice items")
    assert "demo.q2: right is" in longest.splitlines()[1]  # the worst (longest right) first
    assert position_problem(biased).startswith("the right option is written at position #1 in 10")
    assert "demo.q0" in position_problem(biased)
    assert ratio_problem(biased).startswith("10 choice items have a right option over 2.5×")


def test_the_checks_pass_a_balanced_bank():
    texts = ["short option", "a middling option", "the longest option of all", "medium text"]
    balanced = [made_up(f"demo.q{n}", texts, n % 4) for n in range(8)]
    # right is longest only when it sits at position #3: 2 of 8 items; each position 2 of 8
    assert longest_problem(balanced) is None and position_problem(balanced) is None
    assert ratio_problem(balanced) is None
