"""Impossible composed layouts are refused before any process starts, saying what to choose."""

from __future__ import annotations

import pytest

from dtlab.mesh import Layout
from dtlab.models import GPTConfig
from dtlab.parallel.compose.checks import check_composed_layout, composed_layout_problems

CONFIG = GPTConfig.tiny(seq_len=16, d_model=32, n_heads=4, n_layers=4)


def test_a_product_that_is_not_the_world_size_names_the_dp_that_fills_it():
    (problem,) = composed_layout_problems(CONFIG, Layout(dp=2, tp=2), 8)
    assert "dp=4 fills 8 ranks" in problem


def test_tp_larger_than_a_node_is_refused_with_the_degrees_that_fit():
    problems = composed_layout_problems(CONFIG, Layout(tp=4, dp=2), 8, ranks_per_node=2)
    assert any(
        "TP 4 spans nodes" in p and "a node of 2 ranks" in p and "[1, 2]" in p for p in problems
    )


def test_cp_that_does_not_divide_the_sequence_is_refused():
    problems = composed_layout_problems(CONFIG, Layout(cp=3), 3, cp_style="ring")
    assert any("seq_len=16" in p for p in problems)


def test_ep_that_does_not_divide_the_experts_is_refused():
    problems = composed_layout_problems(CONFIG, Layout(dp=4, ep=4), 4, n_experts=6)
    assert any("6" in p and "ep" in p for p in problems)


def test_every_problem_is_listed_at_once():
    with pytest.raises(ValueError) as info:
        check_composed_layout(CONFIG, Layout(tp=8, pp=2), 8, ranks_per_node=4, data_parallel="fsdp")
    message = str(info.value)
    assert message.count("\n- ") >= 3  # world size, heads, node (fsdp with pp is composed now)


def test_a_valid_layout_has_no_problems():
    assert composed_layout_problems(CONFIG, Layout(pp=2, dp=2, tp=2), 8, ranks_per_node=4) == []


def test_sequence_parallel_that_cannot_cut_the_sequence_is_refused_up_front():
    odd = GPTConfig.tiny(seq_len=30, n_layers=4)
    problems = composed_layout_problems(odd, Layout(tp=4), 4, sequence_parallel=True)
    assert any("cuts seq_len=30 into tp=4 chunks" in p for p in problems)
    assert composed_layout_problems(odd, Layout(tp=4), 4, cp_style="ring") == []


def test_the_all_gather_style_is_checked_as_the_contiguous_ring():
    problems = composed_layout_problems(CONFIG, Layout(cp=3), 3, cp_style="allgather")
    assert any("cp=3 does not divide seq_len=16" in p for p in problems)
