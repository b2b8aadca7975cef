"""Quiz cells driven headlessly: set the real widgets' values, click Check and Retry, read feedback.

The layout and feedback rules (issue 21): every option is its own row — its control, then its
text as wrapping Markdown — identical for right and wrong options; a first miss gets a hint and a
link to the lab section, never the answer; the answer comes after a second miss or *Show answer*;
no grader internals; Enter in a number box checks it. The browser test checks the same in Chromium.
"""

from __future__ import annotations

import pytest
import torch

from dtlab.quiz import AnswerError, QuizCell, ask, read_progress
from dtlab.quiz.widgets import markdown_to_html


@pytest.fixture
def progress(tmp_path):
    return tmp_path / "progress.jsonl"


def cell(item_id: str, progress, **kwargs) -> QuizCell:
    return ask(item_id, learner="ada", progress_path=progress, **kwargs)


def right_and_wrong(item) -> tuple[str, str, str]:
    """The right option's key and two wrong ones' (keys are identity, whatever the display)."""
    wrong = [c.key for c in item.choices if not c.correct]
    return item.correct_keys[0], wrong[0], wrong[1]


def test_choice_cell_hints_first_then_answers_records_and_retries(progress):
    quiz = cell("setup.world_size", progress)
    right_key, wrong, other_wrong = right_and_wrong(quiz.item)
    right = quiz.item.choice(right_key)
    quiz.select(wrong)
    quiz.check_button.click()
    first = quiz.feedback.value
    assert "Not quite" in first and 'href="00_setup.ipynb#cell-id=ranks"' in first  # idea, linked
    assert right.text not in first and right.why not in first  # the answer is not given away
    assert not quiz.choice_buttons[wrong].disabled
    assert quiz.show_answer_button.layout.display is None
    quiz.check_button.click()  # the same answer again is not a second miss
    assert len(quiz.attempts) == 1
    quiz.select(other_wrong)
    quiz.check_button.click()  # second miss: now the answer and why
    assert right.why in quiz.feedback_markdown and "The answer is" in quiz.feedback.value
    assert f"**({quiz.option_order.label(right_key)})**" in quiz.feedback_markdown  # as shown
    assert quiz.choice_buttons[wrong].disabled and quiz.check_button.disabled
    assert quiz.retry_button.layout.display is None
    quiz.retry_button.click()
    assert quiz.feedback.value == "" and not quiz.choice_buttons[wrong].disabled
    assert all(b.value is None for b in quiz.choice_buttons.values())
    quiz.select(right_key)
    quiz.check_button.click()
    assert "Correct." in quiz.feedback.value
    records = read_progress(progress).records
    assert [(r["item"], r["correct"], r["chosen"]) for r in records] == [
        ("setup.world_size", False, [wrong]),
        ("setup.world_size", False, [other_wrong]),
        ("setup.world_size", True, [right_key]),
    ]
    assert [g.correct for g in quiz.attempts] == [False, False, True]


def test_show_answer_reveals_after_one_miss_without_an_attempt(progress):
    quiz = cell("setup.world_size", progress)
    right, wrong, _ = right_and_wrong(quiz.item)
    quiz.select(wrong)
    quiz.check_button.click()
    quiz.show_answer_button.click()
    assert quiz.item.choice(right).why in quiz.feedback_markdown and len(quiz.attempts) == 1
    assert quiz.check_button.disabled


def test_choice_options_are_rows_with_their_own_control_and_markdown_text(progress):
    quiz = cell("setup.world_size", progress)
    shapes = set()
    shown = quiz.option_order.keys
    for position, (row, key) in enumerate(zip(quiz.option_rows, shown, strict=True)):
        control, text = row.children
        assert control is quiz.choice_buttons[key]
        # the control, with a short label: its displayed position, never its written key
        assert control.options == ((f"({'abcd'[position]})", key),)
        assert "dtlab-text" in text._dom_classes and "`" not in text.value  # rendered Markdown
        shapes.add(
            (type(control), tuple(row._dom_classes), tuple(text._dom_classes), row.layout.width)
        )
    assert len(shapes) == 1  # right and wrong options are laid out identically
    first, second = shown[0], shown[2]
    quiz.select(first)
    quiz.select(second)  # radio semantics across the rows
    assert [k for k, b in quiz.choice_buttons.items() if b.value] == [second]
    assert "white-space: normal" in quiz.widget.children[0].value  # the scoped wrapping CSS


def test_check_without_an_answer_asks_for_one_and_records_nothing(progress):
    quiz = cell("setup.world_size", progress)
    quiz.check_button.click()
    assert "pick one of the options first" in quiz.feedback.value
    assert quiz.attempts == [] and not progress.exists()


def test_multi_cell_reads_its_checkboxes(progress):
    quiz = cell("setup.backends", progress)
    for key in quiz.item.correct_keys:
        quiz.checkboxes[key].value = True
    quiz.check_button.click()
    assert quiz.attempts[-1].correct


def test_numeric_cell_checks_on_enter_and_explains_a_bad_shape(progress):
    quiz = cell("setup.rank_sum_value", progress)
    assert quiz.number.continuous_update is False  # the value arrives on Enter
    quiz.number.value = "twenty-eight"  # what pressing Enter does: the value changes
    assert "could not read" in quiz.feedback.value and quiz.attempts == []
    quiz.number.value = "27"
    assert len(quiz.attempts) == 1 and not quiz.attempts[-1].correct
    assert "28" not in quiz.feedback.value  # a hint, not the key
    quiz.number.value = "28"
    assert quiz.attempts[-1].correct


def test_feedback_never_shows_grader_internals(progress):
    quiz = cell("setup.rank_sum_value", progress, record=False)
    for answer in ("27", "26"):
        quiz.number.value = answer
        text = quiz.feedback.value
        assert "key is" not in text and "Computed by" not in text and "`" not in text
    assert "28" in quiz.feedback.value  # after the second miss, the answer


def test_ordering_cell_reorders_with_its_up_down_buttons(progress):
    quiz = cell("setup.job_lifecycle", progress)
    answer = list(quiz.item.answer)
    assert quiz.order == list(quiz.option_order.keys) != answer  # shuffled, never solved
    for target, key in enumerate(answer):  # bubble each step up into place with its ▲ button
        while quiz.order.index(key) > target:
            quiz.order_rows[quiz.order.index(key)].children[0].click()
    assert quiz.order == answer
    quiz.check_button.click()
    assert quiz.attempts[-1].correct


def test_short_cell_reveals_the_rubric_then_scores_ticks(progress):
    quiz = cell("setup.process_groups", progress)
    assert quiz.rubric_panel.layout.display == "none" and quiz.check_button.layout.display == "none"
    quiz.answer_text.value = "A group is a subset of ranks..."
    quiz.reveal_button.click()
    assert quiz.rubric_panel.layout.display is None
    quiz.rubric_boxes[0].value = True
    quiz.rubric_boxes[2].value = True
    quiz.check_button.click()
    assert quiz.attempts[-1].score == pytest.approx(0.5)
    assert "model answer" in quiz.feedback.value
    # rubric points wrap beside their checkbox instead of being cut in the checkbox's label
    assert all(len(box.description) <= 4 for box in quiz.rubric_boxes)


def test_short_answer_enter_reveals_the_rubric(progress):
    quiz = cell("setup.process_groups", progress)
    quiz.answer_text.value = "my answer"  # Enter
    assert quiz.rubric_panel.layout.display is None


def test_submit_grades_directly_and_raises_for_a_bad_shape(progress):
    quiz = cell("setup.job_lifecycle", progress, record=False)
    with pytest.raises(AnswerError, match="exactly once"):
        quiz.submit(["launch"])
    assert "exactly once" in quiz.feedback.value
    assert quiz.submit(["launch", "init", "collective", "destroy"]).correct
    assert not progress.exists()


def test_code_cell_runs_the_submitted_function_on_the_cluster(progress, cluster2):
    import torch
    import torch.distributed as dist

    def rank_sum():
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t)
        return t

    quiz = cell("setup.rank_sum", progress, cluster=cluster2)
    assert "check_exercise" in quiz.widget.children[2].value
    assert quiz.submit(rank_sum).correct


def test_cell_displays_as_its_widget(progress):
    bundle = cell("setup.world_size", progress)._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_prompt_markdown_escapes_html_and_renders_code_math_and_lab_links():
    html = markdown_to_html(
        "Use `dist.all_reduce` on <b>every</b> rank, $a_i * b_i$, see lab:00#ranks.\n\n- one\n- two"
    )
    assert "<code>dist.all_reduce</code>" in html
    assert "&lt;b&gt;every&lt;/b&gt;" in html
    assert "<ul>\n<li>one</li>\n<li>two</li>\n</ul>" in html
    assert "$a_i * b_i$" in html  # math left intact for MathJax
    assert 'href="00_setup.ipynb#cell-id=ranks"' in html and "Start a cluster" in html
    assert "lab:00" not in html


def test_a_failing_exercise_names_the_learners_line_first_left_aligned(cluster2):
    from dtlab.quiz import check_exercise

    def rank_sum():
        ones = torch.ones(2)
        return ones @ torch.ones(3)  # the learner's bug

    result = check_exercise("setup.rank_sum", rank_sum, cluster2, record=False)
    assert not result.passed
    first = result.message.splitlines()[0]
    assert first.startswith("Your line") and "ones @ torch.ones(3)" in first and "rank_sum" in first
    shown = result._repr_html_()
    assert "<table" not in shown and "text-align:left" in shown  # tables right-align cells
