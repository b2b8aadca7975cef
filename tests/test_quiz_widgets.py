"""Quiz cells driven headlessly: set the real widgets' values, click Check and Retry, read feedback."""

from __future__ import annotations

import pytest

from dtlab.quiz import AnswerError, QuizCell, ask, read_progress
from dtlab.quiz.widgets import markdown_to_html


@pytest.fixture
def progress(tmp_path):
    return tmp_path / "progress.jsonl"


def cell(item_id: str, progress, **kwargs) -> QuizCell:
    return ask(item_id, learner="ada", progress_path=progress, **kwargs)


def test_choice_cell_checks_records_and_retries(progress):
    quiz = cell("setup.world_size", progress)
    quiz.radio.value = "a"
    quiz.check_button.click()
    assert "Not quite." in quiz.feedback.value
    assert "The world counts processes, not machines" in quiz.feedback.value  # why (a) is wrong
    assert quiz.radio.disabled and quiz.check_button.disabled
    assert quiz.retry_button.layout.display is None
    quiz.retry_button.click()
    assert quiz.feedback.value == "" and quiz.radio.value is None and not quiz.radio.disabled
    quiz.radio.value = "b"
    quiz.check_button.click()
    assert "Correct." in quiz.feedback.value
    records = read_progress(progress).records
    assert [(r["item"], r["correct"]) for r in records] == [
        ("setup.world_size", False),
        ("setup.world_size", True),
    ]
    assert [g.correct for g in quiz.attempts] == [False, True]


def test_check_without_an_answer_asks_for_one_and_records_nothing(progress):
    quiz = cell("setup.world_size", progress)
    quiz.check_button.click()
    assert "pick one of the options first" in quiz.feedback.value
    assert quiz.attempts == [] and not progress.exists()


def test_multi_cell_reads_its_checkboxes(progress):
    quiz = cell("setup.backends", progress)
    for key in ("a", "b", "e"):
        quiz.checkboxes[key].value = True
    quiz.check_button.click()
    assert quiz.attempts[-1].correct


def test_numeric_cell_accepts_typed_text_and_explains_a_bad_shape(progress):
    quiz = cell("setup.rank_sum_value", progress)
    quiz.number.value = "twenty-eight"
    quiz.check_button.click()
    assert "could not read" in quiz.feedback.value and quiz.attempts == []
    quiz.number.value = "28"
    quiz.check_button.click()
    assert quiz.attempts[-1].correct


def test_ordering_cell_reorders_with_its_up_down_buttons(progress):
    quiz = cell("setup.job_lifecycle", progress)
    assert quiz.order == ["collective", "launch", "destroy", "init"]
    up_button_of = {
        key: row.children[0] for key, row in zip(quiz.order, quiz.order_rows, strict=True)
    }
    up_button_of["launch"].click()  # launch, collective, destroy, init
    for _ in range(2):
        quiz.order_rows[quiz.order.index("init")].children[0].click()  # init moves to 2nd
    assert quiz.order == ["launch", "init", "collective", "destroy"]
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
    assert "Model answer" in quiz.feedback.value


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
    assert "check_exercise" in quiz.widget.children[1].value
    assert quiz.submit(rank_sum).correct


def test_cell_displays_as_its_widget(progress):
    bundle = cell("setup.world_size", progress)._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_prompt_markdown_escapes_html_and_renders_code():
    html = markdown_to_html("Use `dist.all_reduce` on <b>every</b> rank.\n\n- one\n- two")
    assert "<code>dist.all_reduce</code>" in html
    assert "&lt;b&gt;every&lt;/b&gt;" in html
    assert "<ul><li>one</li><li>two</li></ul>" in html
