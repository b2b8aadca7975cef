"""check_exercise on real ranks: the solution passes; stubs, wrong answers and crashes fail politely."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dtlab.quiz import (
    GradeResult,
    check_exercise,
    exercise,
    grade,
    known_exercises,
    load_bank,
    read_progress,
)
from dtlab.quiz.graders.setup import expected_rank_sum


def rank_sum():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def rank_sum_stub():
    raise NotImplementedError("Exercise: all-reduce your rank")


def rank_sum_without_all_reduce():
    return torch.tensor(float(dist.get_rank()))


def rank_sum_that_crashes():
    raise ValueError("shapes do not match")


def rank_sum_from_the_closed_form():
    """The right number on every rank, and not one byte moved."""
    n = dist.get_world_size()
    return torch.tensor([n * (n - 1) / 2])


def rank_sum_by_all_gather():
    mine = torch.tensor([float(dist.get_rank())])
    everyone = [torch.empty(1) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return torch.cat(everyone).sum()


def rank_sum_on_dtlab_rings():
    from dtlab import collectives

    return collectives.all_reduce(torch.tensor([float(dist.get_rank())]))


def test_expected_rank_sum_is_the_closed_form():
    assert [expected_rank_sum(n) for n in (1, 2, 3, 4, 8)] == [0, 1, 3, 6, 28]


def test_solution_passes_and_is_recorded(cluster2, tmp_path):
    path = tmp_path / "progress.jsonl"
    result = check_exercise("setup.rank_sum", rank_sum, cluster2, learner="ada", progress_path=path)
    assert result, result.message
    assert "All 2 ranks hold 1" in result.message
    assert "Passed" in result._repr_html_()
    (record,) = read_progress(path).records
    assert (record["item"], record["kind"], record["correct"]) == (
        "setup.rank_sum",
        "exercise",
        True,
    )


def test_solution_passes_on_three_ranks(cluster3):
    assert check_exercise("setup.rank_sum", rank_sum, cluster3, record=False)


def test_stub_fails_with_not_implemented_message(cluster2):
    result = check_exercise("setup.rank_sum", rank_sum_stub, cluster2, record=False)
    assert not result
    assert result.message.startswith("Not implemented yet: write the body of `rank_sum_stub`")


def test_wrong_function_fails_and_says_what_differed(cluster2):
    result = check_exercise("setup.rank_sum", rank_sum_without_all_reduce, cluster2, record=False)
    assert not result
    assert "differs on 1 of 2 ranks" in result.message
    assert "rank 0 returned 0.0, expected 1" in result.message
    assert "FAILED" in repr(result)


def test_the_right_number_without_an_all_reduce_fails(cluster2):
    closed_form = check_exercise(
        "setup.rank_sum", rank_sum_from_the_closed_form, cluster2, record=False
    )
    assert not closed_form
    assert closed_form.message.startswith("The result is right, but not the way the exercise asks")
    assert "returned 1 without an all-reduce (it sent nothing)" in closed_form.message
    gathered = check_exercise("setup.rank_sum", rank_sum_by_all_gather, cluster2, record=False)
    assert not gathered and "(it called ['all_gather'])" in gathered.message


def test_an_all_reduce_on_dtlab_rings_counts(cluster2):
    assert check_exercise("setup.rank_sum", rank_sum_on_dtlab_rings, cluster2, record=False)


def test_error_on_a_rank_names_the_rank_and_shows_its_traceback(cluster2):
    result = check_exercise("setup.rank_sum", rank_sum_that_crashes, cluster2, record=False)
    assert not result
    assert "raised ValueError: shapes do not match" in result.message
    assert "rank_sum_that_crashes" in result.details["traceback (tail)"]


def test_unknown_exercise_and_non_callables_fail_without_raising(cluster2):
    unknown = check_exercise("setup.no_such_thing", rank_sum, cluster2, record=False)
    assert not unknown and "No exercise named 'setup.no_such_thing'" in unknown.message
    assert "setup.rank_sum" in unknown.message
    called = check_exercise("setup.rank_sum", torch.tensor(1.0), cluster2, record=False)
    assert not called and "not Tensor (no parentheses)" in called.message


def test_grader_errors_are_caught_too(cluster2):
    @exercise("demo.grader_bug", topic="demo")
    def buggy_grader(fn, cluster) -> GradeResult:
        return {}["missing"]

    result = check_exercise("demo.grader_bug", rank_sum, cluster2, record=False)
    assert not result and "KeyError" in result.message
    assert "demo.grader_bug" in known_exercises()


def test_code_item_is_graded_through_its_exercise(cluster2):
    item = load_bank()["setup.rank_sum"]
    assert grade(item, rank_sum, cluster=cluster2).correct
    assert not grade(item, rank_sum_stub, cluster=cluster2).correct


def test_hangs_and_dead_ranks_become_messages_for_the_learner():
    from dtlab.quiz.failures import explain_failure
    from dtlab.runtime.errors import ClusterTimeout, RankDied, RankError

    hang, _ = explain_failure(
        ClusterTimeout("rank 1 still in all_reduce", {1: "all_reduce"}), rank_sum
    )
    assert "did not finish in time" in hang and "rank 1 still in all_reduce" in hang
    died, _ = explain_failure(RankDied("rank 0 exited with SIGKILL", 0, -9), rank_sum)
    assert "A rank process died while running `rank_sum`" in died
    stub, details = explain_failure(
        RankError(
            1, "NotImplementedError", "Exercise", "Traceback ...\nNotImplementedError: Exercise"
        ),
        rank_sum_stub,
    )
    assert stub.startswith("Not implemented yet") and details["ranks"] == "rank 1 raised it"


def test_an_unwritten_method_is_named_and_its_details_show_every_rank_and_the_trace():
    """Lab 04 grades vocab_parallel_cross_entropy; the learner writes the class's forward."""
    from dtlab.quiz.failures import explain_failure
    from dtlab.runtime.errors import RankError
    from dtlab.workshop.stubs import ExerciseNotWritten

    unwritten = ExerciseNotWritten("VocabParallelCrossEntropy.forward")
    trace = (
        'Traceback (most recent call last):\n  File "<cell>", line 6, in forward\n'
        f"ExerciseNotWritten: {unwritten}"
    )
    message, details = explain_failure(
        RankError(
            0,
            "ExerciseNotWritten",
            str(unwritten),
            trace,
            "ranks [0, 1] all raised; showing rank 0.",
        ),
        vocab_parallel_cross_entropy,
    )
    assert message.startswith(
        "Not implemented yet: write the body of `VocabParallelCrossEntropy.forward`"
    )
    assert "vocab_parallel_cross_entropy" not in message
    assert details["ranks"] == "ranks [0, 1] all raised; showing rank 0."
    assert "line 6, in forward" in details["traceback (tail)"]


def vocab_parallel_cross_entropy(logits):
    return logits


def test_the_not_yet_box_renders_markdown_line_by_line():
    shown = GradeResult(
        False, "Not implemented yet: write the body of `merge`.\nthen rerun", {"ranks": "rank 0"}
    )._repr_html_()
    assert "<code>merge</code>" in shown and "`" not in shown
    assert "<br />\nthen rerun" in shown  # one line per line, as the grader wrote it
