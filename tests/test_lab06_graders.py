"""Lab 06's graders: the library's own answers (under any name), inexact merges, merges that
give nan on fully masked blocks and wrong layouts fail; right answers written by hand pass."""

from __future__ import annotations

import math

import torch

from dtlab.parallel.context import merge as library_merge
from dtlab.parallel.context import shard_positions as library_layout
from dtlab.quiz import check_exercise
from dtlab.quiz.graders.context_parallel import causal_work_ratio_key, score_memory_ratio_key


def hand_merge(o_a, lse_a, o_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return (
        torch.exp(lse_a - safe).unsqueeze(-1) * o_a + torch.exp(lse_b - safe).unsqueeze(-1) * o_b,
        lse,
    )


def test_a_hand_written_merge_passes(cluster2):
    assert check_exercise("context_parallel.merge", hand_merge, cluster2, record=False)


def test_the_library_merge_under_another_name_is_refused(cluster2):
    def wrapped(*args):
        return library_merge(*args)

    result = check_exercise("context_parallel.merge", wrapped, cluster2, record=False)
    assert not result and "dtlab.parallel.context.merge" in result.message


def test_averaging_the_blocks_is_not_exact(cluster2):
    def average(o_a, lse_a, o_b, lse_b):
        return (o_a + o_b) / 2, torch.logaddexp(lse_a, lse_b)

    result = check_exercise("context_parallel.merge", average, cluster2, record=False)
    assert not result and "differs from full attention" in result.message


def test_a_merge_that_gives_nan_on_fully_masked_blocks_fails(cluster2):
    def unguarded(o_a, lse_a, o_b, lse_b):
        lse = torch.logaddexp(lse_a, lse_b)
        return (
            torch.exp(lse_a - lse).unsqueeze(-1) * o_a + torch.exp(lse_b - lse).unsqueeze(-1) * o_b,
            lse,
        )

    result = check_exercise("context_parallel.merge", unguarded, cluster2, record=False)
    assert not result and "nan" in result.message


def hand_zigzag(seq_len, cp, rank):
    chunk = seq_len // (2 * cp)
    tail = (2 * cp - 1 - rank) * chunk
    return torch.cat(
        [torch.arange(rank * chunk, (rank + 1) * chunk), torch.arange(tail, tail + chunk)]
    )


def test_a_hand_written_zigzag_layout_passes(cluster2):
    assert check_exercise("context_parallel.zigzag_positions", hand_zigzag, cluster2, record=False)


def test_the_library_layout_is_refused(cluster2):
    def wrapped(seq_len, cp, rank):
        return library_layout(seq_len, cp, rank, "zigzag")

    result = check_exercise("context_parallel.zigzag_positions", wrapped, cluster2, record=False)
    assert not result and "shard_positions" in result.message


def test_the_contiguous_layout_is_not_zigzag(cluster2):
    def contiguous(seq_len, cp, rank):
        size = seq_len // cp
        return torch.arange(rank * size, (rank + 1) * size)

    result = check_exercise("context_parallel.zigzag_positions", contiguous, cluster2, record=False)
    assert not result and "chunks" in result.message


def test_a_layout_of_floats_is_refused(cluster2):
    def floats(seq_len, cp, rank):
        return hand_zigzag(seq_len, cp, rank).float()

    result = check_exercise("context_parallel.zigzag_positions", floats, cluster2, record=False)
    assert not result and "LongTensor" in result.message


def test_contiguous_causal_work_ratio_is_two_n_minus_one_for_long_sequences():
    assert math.isclose(causal_work_ratio_key(4, 32768), 7, rel_tol=1e-3)
    assert causal_work_ratio_key(4, 32768, "zigzag") == 1


def test_activation_growth_is_between_linear_and_quadratic():
    assert 4 < score_memory_ratio_key(8192, 4096, 32, 4) < 16
