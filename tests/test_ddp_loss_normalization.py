"""Loss normalisation across data-parallel ranks holding different numbers of tokens."""

from __future__ import annotations

import pytest
import torch

from dtlab.parallel.data.loss_normalization import (
    count_bytes_per_rank,
    single_process_gradient,
    token_weight_ratio,
    token_weights,
)

LENGTHS = (3, 9, 5)  # tokens per rank: deliberately unequal


def _tokens(total: int = sum(LENGTHS)):
    g = torch.Generator().manual_seed(7)
    return torch.randn(total, 4, generator=g, dtype=torch.float64), torch.randn(
        total, generator=g, dtype=torch.float64
    )


def _on_rank(how: str, lengths: tuple[int, ...]):
    import dtlab
    from dtlab.parallel.data.loss_normalization import ddp_gradient

    x, y = _tokens(sum(lengths))
    start = sum(lengths[: dtlab.rank()])
    mine = slice(start, start + lengths[dtlab.rank()])
    return ddp_gradient(x[mine], y[mine], how)


def test_global_token_count_gives_the_single_process_gradient_and_per_rank_means_do_not(cluster3):
    reference = single_process_gradient(*_tokens())
    fixed = cluster3.run(_on_rank, "global", LENGTHS)
    buggy = cluster3.run(_on_rank, "per_rank", LENGTHS)
    for result in fixed:
        assert result["divisor"] == sum(LENGTHS)
        torch.testing.assert_close(result["grad"], reference, rtol=1e-12, atol=1e-12)
    assert (buggy[0]["grad"] - reference).abs().max() > 1e-3  # misweighted, not rounding


def test_equal_lengths_make_per_rank_means_exact(cluster2):
    reference = single_process_gradient(*_tokens(8))
    for result in cluster2.run(_on_rank, "per_rank", (4, 4)):
        torch.testing.assert_close(result["grad"], reference, rtol=1e-12, atol=1e-12)


def test_the_count_all_reduce_moves_the_counted_bytes_of_one_int64(cluster3):
    """One element cannot split into 3 ring chunks, so ranks send unequal shares; summed over
    the ranks the element crossed 2(N − 1) links, i.e. 2(N − 1)/N · 8 bytes per rank on average."""
    counted = [r["count_bytes"] for r in cluster3.run(_on_rank, "global", LENGTHS)]
    assert sum(counted) == 3 * count_bytes_per_rank(3) == 32, counted
    for result in cluster3.run(_on_rank, "per_rank", LENGTHS):
        assert result["count_bytes"] == 0


def test_per_rank_means_weigh_a_short_ranks_token_by_the_length_ratio():
    assert token_weight_ratio((1000, 3000)) == pytest.approx(3.0)
    assert token_weights((1000, 3000), "per_rank") == pytest.approx([1 / 2000, 1 / 6000])
    assert token_weights((1000, 3000), "global") == pytest.approx([1 / 4000] * 2)
    with pytest.raises(ValueError, match="choose 'per_rank'"):
        token_weights((1, 2), "mean")
