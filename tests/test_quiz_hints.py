"""A hint sends the learner to the lab section that teaches the idea, and names the library symbol
as a second pointer when the item has a ``see`` (issue 28); it never gives the answer."""

from __future__ import annotations

import dataclasses

import pytest

from dtlab.quiz.feedback import answer_markdown, hint_markdown, markdown_to_html
from dtlab.quiz.grading import grade
from dtlab.quiz.schema import Choice, Item

RIGHT = Choice("a", "Sixteen processes, one per GPU", True, "One process per GPU on 2 nodes.")
WRONG = Choice("b", "Two processes, one per node", False, "The world counts processes.")


@pytest.fixture
def item() -> Item:
    return Item(
        id="setup.demo",
        topic="setup",
        kind="choice",
        prompt="How many processes?",
        explanation="World size = nodes × processes per node.",
        difficulty="easy",
        source=("t",),
        link="lab:00#ranks",
        choices=(RIGHT, WRONG),
    )


def first_miss(item: Item) -> str:
    return hint_markdown(item, "b", grade(item, "b"))


def test_hint_links_the_lab_section_and_names_no_function_without_see(item):
    hint = first_miss(item)
    assert (
        "Revisit [Lab 00 · 2. Start a cluster](00_setup.ipynb#cell-id=ranks) and try again." in hint
    )
    assert "in the library" not in hint and "dtlab." not in hint


def test_hint_adds_the_see_symbol_after_the_lab_section(item):
    hint = first_miss(dataclasses.replace(item, see="dtlab.runtime.context:device"))
    assert (
        "Revisit [Lab 00 · 2. Start a cluster](00_setup.ipynb#cell-id=ranks) and try again "
        "(in the library: `dtlab.runtime.context.device`)." in hint
    )
    assert hint.index("Lab 00") < hint.index("dtlab.runtime")  # the lesson first
    assert "<code>dtlab.runtime.context.device</code>" in markdown_to_html(hint)


def test_a_hint_with_see_still_never_gives_the_answer(item):
    hint = first_miss(dataclasses.replace(item, see="dtlab.runtime.context:device"))
    for secret in (RIGHT.text, RIGHT.why, "(a)", "The answer"):
        assert secret not in hint


def test_the_answer_ends_with_the_lab_section_and_the_see_symbol(item):
    with_see = dataclasses.replace(item, see="dtlab.runtime.context:device")
    text = answer_markdown(with_see, "b", grade(with_see, "b"))
    assert text.endswith(
        "More in [Lab 00 · 2. Start a cluster](00_setup.ipynb#cell-id=ranks) "
        "(in the library: `dtlab.runtime.context.device`)."
    )
    assert answer_markdown(item, "b", grade(item, "b")).endswith("(00_setup.ipynb#cell-id=ranks).")
