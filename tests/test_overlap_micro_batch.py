"""Micro-batch size against GEMM efficiency: the step (m+p-1)·t(b) from a measured t(b)."""

from __future__ import annotations

import random

import pytest

from dtlab.parallel.pipeline.micro_batch import (
    GemmTime,
    best_micro_batch,
    gemm_times,
    pipeline_steps,
    step_with_linear_gemm,
)


def _times(seconds: dict[int, float]) -> list[GemmTime]:
    return [GemmTime(b, t, flops=1.0) for b, t in seconds.items()]


def test_step_times_are_the_1f1b_and_interleaved_formulas():
    rows = pipeline_steps(_times({1: 1.0, 2: 1.5, 3: 9.0, 4: 2.0}), global_batch=8, p=4, v=2)
    assert [r.micro_batch for r in rows] == [1, 2, 4]  # 3 does not divide 8
    one, two, four = rows
    assert (one.n_micro, one.one_f_one_b, one.interleaved) == (8, 11.0, 9.5)
    assert (two.n_micro, two.one_f_one_b, two.interleaved) == (4, 10.5, 8.25)
    assert (four.n_micro, four.one_f_one_b, four.interleaved) == (2, 10.0, 7.0)


def test_with_gemm_time_linear_in_b_the_smallest_micro_batch_always_wins():
    linear = _times({b: 0.3 * b for b in (1, 2, 4, 8, 16)})
    rows = pipeline_steps(linear, 16, p=8, v=2)
    assert best_micro_batch(rows) == best_micro_batch(rows, "interleaved") == 1
    for r in rows:
        assert r.one_f_one_b == pytest.approx(step_with_linear_gemm(r.micro_batch, 16, 8, 0.3))


def test_interleaving_never_moves_the_best_micro_batch_down():
    """Step (B/b + c)·t(b): a smaller bubble term c = (p-1)/v penalises large b less."""
    rng = random.Random(0)
    for _ in range(200):
        t, seconds = 0.0, {}
        for b in (1, 2, 4, 8, 16, 32):
            t += rng.uniform(0.01, 1.0) * b  # any increasing t(b)
            seconds[b] = t
        rows = pipeline_steps(_times(seconds), 32, p=rng.choice([2, 4, 8]), v=rng.choice([2, 4]))
        assert best_micro_batch(rows, "interleaved") >= best_micro_batch(rows)


def test_measured_gemm_times_are_positive_and_count_six_gemms():
    times = gemm_times([1, 2], seq_len=4, d_model=16, repeats=2)
    assert [t.micro_batch for t in times] == [1, 2]
    assert all(t.seconds > 0 for t in times)
    assert times[1].flops == 6 * 2 * 2 * 4 * 16 * 64


def test_errors_say_what_to_change():
    with pytest.raises(ValueError, match="divides the global batch 7"):
        pipeline_steps(_times({2: 1.0}), 7, 2)
    with pytest.raises(ValueError, match="choose 'one_f_one_b' or 'interleaved'"):
        best_micro_batch(pipeline_steps(_times({1: 1.0}), 2, 2), "gpipe")
