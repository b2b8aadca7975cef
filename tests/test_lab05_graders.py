"""Lab 05's graders grade the skill: a 1F1B order written by hand, a bubble counted by hand.

The right answers pass (also in ``test_lab_exercises``); here each tempting wrong or borrowed
answer is turned away with a message that says what to change.
"""

from __future__ import annotations

from dtlab.parallel.pipeline import Action, interleaved_1f1b, one_f_one_b
from dtlab.quiz import check_exercise


def _grade(exercise_id: str, fn, cluster):
    return check_exercise(exercise_id, fn, cluster, record=False)


def hand_written_1f1b(n_ranks, n_micro):
    per_rank = []
    for r in range(n_ranks):
        warmup = min(n_ranks - 1 - r, n_micro)
        actions = [f"{r}F{i}" for i in range(warmup)]
        for i in range(n_micro - warmup):
            actions += [f"{r}F{i + warmup}", f"{r}B{i}"]
        actions += [f"{r}B{i}" for i in range(n_micro - warmup, n_micro)]
        per_rank.append(actions)
    return per_rank


def test_a_hand_written_1f1b_in_action_strings_passes_and_executes(cluster2):
    result = _grade("pipeline.one_f_one_b", hand_written_1f1b, cluster2)
    assert result, result.message
    assert "executed on 2 ranks" in result.message


def test_calling_the_library_generator_is_refused(cluster2):
    def borrowed(n_ranks, n_micro):
        return [list(actions) for actions in one_f_one_b(n_ranks, n_micro).actions]

    result = _grade("pipeline.one_f_one_b", borrowed, cluster2)
    assert not result
    assert "dtlab.parallel.pipeline.one_f_one_b" in result.message


def test_interleaved_with_one_chunk_is_the_same_order_and_is_refused(cluster2):
    def borrowed(n_ranks, n_micro):
        return interleaved_1f1b(n_ranks, n_micro, 1).actions

    result = _grade("pipeline.one_f_one_b", borrowed, cluster2)
    assert not result
    assert "interleaved_1f1b" in result.message


def test_gpipe_written_by_hand_is_refused_for_its_memory(cluster2):
    def gpipe_order(n_ranks, n_micro):
        return [
            [Action(r, "F", i) for i in range(n_micro)]
            + [Action(r, "B", i) for i in range(n_micro)]
            for r in range(n_ranks)
        ]

    result = _grade("pipeline.one_f_one_b", gpipe_order, cluster2)
    assert not result
    assert "GPipe's memory" in result.message


def test_a_missing_backward_is_caught_by_the_validator(cluster2):
    def forgetful(n_ranks, n_micro):
        return [actions[:-1] for actions in hand_written_1f1b(n_ranks, n_micro)]

    result = _grade("pipeline.one_f_one_b", forgetful, cluster2)
    assert not result
    assert "cannot run" in result.message


def test_no_warm_up_runs_but_idles_more_than_1f1b(cluster2):
    def eager(n_ranks, n_micro):  # F then B of each micro-batch: valid, but one at a time
        return [
            [a for i in range(n_micro) for a in (Action(r, "F", i), Action(r, "B", i))]
            for r in range(n_ranks)
        ]

    result = _grade("pipeline.one_f_one_b", eager, cluster2)
    assert not result
    assert "more than 1F1B's" in result.message


def test_the_bubble_formula_passes_and_borrowing_it_is_refused(cluster2):
    def mine(p, m, v=1):
        return (p - 1) / (v * m + p - 1)

    def borrowed(p, m, v=1):
        from dtlab.cost.bubble import interleaved_bubble_fraction_of_total

        return interleaved_bubble_fraction_of_total(p, m, v)

    assert _grade("pipeline.bubble_fraction", mine, cluster2)
    result = _grade("pipeline.bubble_fraction", borrowed, cluster2)
    assert not result
    assert "interleaved_bubble_fraction_of_total" in result.message


def test_the_wrong_convention_and_a_forgotten_v_get_their_hints(cluster2):
    def to_ideal(p, m, v=1):
        return (p - 1) / (v * m)

    def without_v(p, m, v=1):
        return (p - 1) / (m + p - 1)

    result = _grade("pipeline.bubble_fraction", to_ideal, cluster2)
    assert not result and "idle / ideal" in result.message
    result = _grade("pipeline.bubble_fraction", without_v, cluster2)
    assert not result and "v times shorter" in result.message
