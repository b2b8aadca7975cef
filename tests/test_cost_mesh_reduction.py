"""Which ranks reduce which gradients in an N-D mesh, and the over-counted global norm."""

from __future__ import annotations

import math

import pytest

from dtlab.cost.mesh_reduction import (
    gradient_reduction_ranks,
    gradient_reduction_size,
    naive_norm_inflation,
    norm_reduction_size,
)
from dtlab.mesh import Layout


def test_dense_gradients_reduce_over_dp_and_cp_at_fixed_tp_and_pp():
    layout = Layout(dp=2, tp=2, pp=2)  # ranks row-major over (pp, dp, cp, tp)
    assert gradient_reduction_ranks(layout, "dense", 0) == [0, 2]
    assert gradient_reduction_ranks(layout, "dense", 5) == [5, 7]
    assert gradient_reduction_ranks(layout, "dense", 0) == layout.group_of("dp", 0)
    assert gradient_reduction_size("dense", dp=4, tp=2, cp=2) == 8


def test_sequence_parallel_layernorm_also_reduces_over_tp():
    layout = Layout(dp=2, tp=2)
    assert gradient_reduction_ranks(layout, "tp_replicated", 0) == [0, 2]
    assert gradient_reduction_ranks(layout, "tp_replicated_sp", 0) == [0, 1, 2, 3]


def test_expert_gradients_reduce_over_the_expert_data_parallel_group():
    layout = Layout(dp=8, ep=4)
    assert gradient_reduction_ranks(layout, "expert", 1) == layout.group_of("edp", 1) == [1, 5]
    assert gradient_reduction_size("expert", dp=8, ep=4) == 2
    assert gradient_reduction_size("dense", dp=8, ep=4) == 8


def test_norm_counts_each_piece_once():
    assert norm_reduction_size(tp=8, pp=4) == 32
    assert naive_norm_inflation(1.0, 0.0, 8) == pytest.approx(math.sqrt(8))
    assert naive_norm_inflation(1.0, 3.0, 8) == pytest.approx(math.sqrt(11 / 4))
    assert naive_norm_inflation(0.0, 5.0, 8) == 1.0
    with pytest.raises(ValueError, match="unknown parameter kind"):
        gradient_reduction_ranks(Layout(dp=2), "bias", 0)
