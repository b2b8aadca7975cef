"""The MoE benchmark runs at tiny sizes and reports both ratios and counted bytes (no timings
asserted: the lead runs the real figures on a quiet machine)."""

from __future__ import annotations

import pytest
import torch

from dtlab.bench import moe
from dtlab.models.moe_experts import grouped_mm_available


def test_moe_bench_reports_both_ratios_and_the_counted_exchange_bytes(cluster2):
    result = moe.run(cluster2, tokens=64, dim=16, experts=4, steps=2, repeats=2)
    assert result.world_size == 2
    assert result.a2a_dtlab_vs_torch.median > 0
    # the goal's ratio: the checked exchange over all_to_all_single ÷ bare all_to_all_single
    assert len(result.checked_per_repeat) == len(result.counted_per_repeat) == 2
    spread = result.checked_vs_plain
    assert spread.low == min(result.checked_per_repeat) > 0
    assert spread.high == max(result.checked_per_repeat) and result.checked_best_ratio > 0
    assert set(result.step_s) >= {"a2a_dtlab", "a2a_torch", "a2a_torch_plain", "a2a_generic"}
    assert "experts_loop" in result.step_s
    assert result.a2a_dtlab_vs_torch_plain.median > 0 and result.a2a_generic_vs_torch_plain.low > 0
    if grouped_mm_available(torch.float32):
        assert result.grouped_vs_loop is not None and result.grouped_best_ratio > 0
        assert result.grouped_refusal is None
    # counts + dispatch + combine, counted from the messages == the formula from the routed counts
    assert result.dtlab_bytes_per_exchange == result.formula_bytes_per_exchange
    assert all(b > 2 * 8 for b in result.dtlab_bytes_per_exchange)  # rows moved, not just counts
    # the deduplicated dispatch: counted per link class == the formula from the routed choices
    for counted, want in zip(result.dedup_bytes, result.link_bytes, strict=True):
        assert counted["inter_rows"] == want.dedup_inter_rows <= want.plain_inter
        assert counted["intra_rows"] == want.dedup_intra_rows
    assert result.dedup_vs_plain.median > 0 and result.dedup_vs_torch.median > 0


def test_moe_bench_dedups_inside_pretended_nodes_on_four_ranks(cluster4):
    result = moe.run(cluster4, tokens=32, dim=8, experts=8, steps=1, repeats=1, ranks_per_node=2)
    for counted, want in zip(result.dedup_bytes, result.link_bytes, strict=True):
        assert counted["inter_rows"] == want.dedup_inter_rows < want.plain_inter
        assert counted["intra_rows"] == want.dedup_intra_rows


def test_moe_bench_on_unaligned_rows_times_the_loop_only_and_says_why(cluster2):
    result = moe.run(cluster2, tokens=64, dim=30, experts=4, steps=1, repeats=1)
    assert "experts_grouped" not in result.step_s and result.grouped_vs_loop is None
    assert "experts_loop" in result.step_s
    want = "d_model=30" if grouped_mm_available(torch.float32) else "no torch._grouped_mm"
    assert want in result.grouped_refusal
    assert moe._ratio(None, None, result.grouped_refusal).endswith(f"{result.grouped_refusal})")


def test_moe_bench_refuses_experts_that_do_not_split_over_the_ranks():
    with pytest.raises(ValueError, match="multiple of --world-size"):
        moe.run(None, world_size=2, experts=3)
