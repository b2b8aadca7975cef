"""Every quiz link lands on a real lab section, every ``see`` on a real library symbol; every quiz
cell names a real item. A library symbol in ``link`` is refused (issue 28)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtlab.quiz import load_bank
from dtlab.quiz.bank import Bank
from dtlab.quiz.links import (
    LinkResolver,
    link_problems,
    markdown_anchors,
    quiz_calls,
    quiz_cell_problems,
    slugify,
)
from dtlab.quiz.schema import Item

REPO = Path(__file__).resolve().parents[1]

LAB = """# %% [markdown]
# # Lab 03 — ZeRO & FSDP
#
# ## 2. The ZeRO stages, in bytes
# ### Exercise: shard it <a id="exercise-shard"></a>
#
# ```
# # not a heading: inside a code fence
# ```

# %%
# ## not markdown: a comment in a code cell
x = 1
"""


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("2. The ZeRO stages, in bytes", "2-the-zero-stages-in-bytes"),
        ("ZeRO & FSDP", "zero-fsdp"),
        ("  --Ring all-reduce--  ", "ring-all-reduce"),
        ("Lab 03 — ZeRO", "lab-03-zero"),
        ("`all_gather` vs. `all_reduce`", "all-gather-vs-all-reduce"),
        ("!!!", ""),
    ],
)
def test_slug_is_lowercase_with_dash_runs_and_no_edge_dashes(heading, slug):
    assert slugify(heading) == slug


def test_markdown_anchors_are_heading_slugs_and_explicit_ids_outside_code_fences():
    markdown = (
        '# Lab 03 — ZeRO & FSDP\n\n## 2. The ZeRO stages ##\n### Exercise: shard it <a id="shard"></a>\n'
        "```\n# not a heading\n```\nText with <a name='later'></a> an anchor.\n"
    )
    assert markdown_anchors(markdown) == [
        "lab-03-zero-fsdp",
        "2-the-zero-stages",
        "exercise-shard-it",
        "shard",
        "later",
    ]


def item(link: str, item_id: str = "zero.x", see: str = "") -> Item:
    return Item(
        see=see,
        id=item_id,
        topic="zero",
        kind="short",
        prompt="?",
        explanation="!",
        difficulty="easy",
        source=("t",),
        link=link,
        file="quizzes/zero.yaml",
        answer="a",
        rubric=("p", "q"),
    )


@pytest.fixture
def solutions(tmp_path: Path) -> Path:
    folder = tmp_path / "solutions"
    folder.mkdir()
    (folder / "03_zero.py").write_text(LAB)
    return folder


def test_lab_links_resolve_to_headings_and_explicit_anchors_only_in_markdown(solutions):
    resolver = LinkResolver(solutions)
    assert resolver.problem("lab:03#2-the-zero-stages-in-bytes") is None
    assert resolver.problem("lab:03#exercise-shard") is None
    assert "no section 'not-markdown-a-comment-in-a-code-cell'" in resolver.problem(
        "lab:03#not-markdown-a-comment-in-a-code-cell"
    )


def test_a_missing_lab_or_anchor_is_reported_with_file_item_id_and_suggestions(solutions):
    bank = Bank(
        [
            item("lab:07#experts", "zero.no_lab"),
            item("lab:03#zero-stages", "zero.no_anchor"),
            item("lab:3#zero", "zero.malformed"),
            item("lab:03#exercise-shard", "zero.see", see="dtlab.quiz.links:slugify"),
            item("lab:03#exercise-shard", "zero.bad_see", see="dtlab.quiz.links:no_such_thing"),
        ],
        "test",
        (),
        {},
    )
    problems = link_problems(bank, solutions)
    assert problems[0] == (
        "quizzes/zero.yaml: item 'zero.no_lab': link 'lab:07#experts': there is no lab 07 "
        "(no solutions/07_*.py)"
    )
    assert problems[1].startswith(
        "quizzes/zero.yaml: item 'zero.no_anchor': link 'lab:03#zero-stages': "
        "solutions/03_zero.py has no section 'zero-stages'"
    )
    assert "did you mean 2-the-zero-stages-in-bytes" in problems[1]
    assert (
        "item 'zero.malformed'" in problems[2] and "not of the form 'lab:NN#anchor'" in problems[2]
    )
    assert problems[3].startswith(
        "quizzes/zero.yaml: item 'zero.bad_see': see 'dtlab.quiz.links:no_such_thing' does not resolve"
    )
    assert len(problems) == 4


def test_a_library_symbol_in_link_is_refused_with_the_fix_to_move_it_to_see(solutions):
    """Issue 28: the hint links what ``link`` names, and a function is no lesson."""
    bank = Bank([item("dtlab.quiz.links:slugify", "zero.symbol")], "test", (), {})
    assert link_problems(bank, solutions) == [
        "quizzes/zero.yaml: item 'zero.symbol': link 'dtlab.quiz.links:slugify' is a library "
        "symbol; 'link' must name the lab section that teaches the idea ('lab:NN#anchor'): move "
        "the symbol to 'see: dtlab.quiz.links:slugify'"
    ]


def test_quiz_calls_are_found_with_their_ids_and_lines():
    source = 'ask("zero.a")\nx = 1\ndtlab.quiz.check_exercise("zero.ex", fn, cluster)\nask(name)\n'
    assert quiz_calls(source) == [("ask", "zero.a", 1), ("check_exercise", "zero.ex", 3)]


def test_a_quiz_cell_naming_no_bank_item_is_reported_with_file_and_line(solutions):
    (solutions / "04_tp.py").write_text(
        '# %%\nask("zero.x")\n\n# %%\nask("zero.y")\ncheck_exercise("nope", f, c)\n'
    )
    bank = Bank([item("lab:03#exercise-shard")], "test", (), {})
    assert quiz_cell_problems(bank, solutions, exercises=set()) == [
        "solutions/04_tp.py:5: ask('zero.y') names no item in the bank; did you mean zero.x?",
        "solutions/04_tp.py:6: check_exercise('nope', ...) names no registered exercise",
    ]


def test_every_link_in_the_bank_is_a_lab_section_and_every_see_a_library_symbol():
    problems = link_problems(load_bank(), REPO / "solutions")
    assert not problems, f"{len(problems)} broken quiz links:\n" + "\n".join(problems)


def test_every_quiz_cell_in_every_lab_pulls_an_item_that_exists():
    problems = quiz_cell_problems(load_bank(), REPO / "solutions")
    assert not problems, "quiz cells naming missing items:\n" + "\n".join(problems)
