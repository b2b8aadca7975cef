"""The roofline: counted FLOPs and bytes equal the formulas, the bound follows the ridge point,
and the measured roofs come from real timed runs."""

from __future__ import annotations

import pytest
import torch

from dtlab.perf.fusion import rmsnorm_eager, rmsnorm_unfused_bytes
from dtlab.perf.op_census import count_ops, place_on_roofline
from dtlab.perf.roofline import Roofline, datasheet_for, gemm_sweep, intensity_and_bound, op_cost


def test_counted_matmul_flops_and_bytes_equal_2mkn_and_each_operand_once():
    a, b = torch.randn(24, 40), torch.randn(40, 56)
    counted = count_ops(lambda: a @ b)["mm"]
    flops, nbytes = op_cost("matmul", {"m": 24, "k": 40, "n": 56}, 4)
    assert counted.calls == 1 and counted.flops == flops == 2 * 24 * 40 * 56
    assert counted.nbytes == nbytes == (24 * 40 + 40 * 56 + 24 * 56) * 4


def test_counted_elementwise_bytes_equal_the_formula_and_views_move_nothing():
    x, y = torch.randn(1000), torch.randn(1000)
    ops = count_ops(lambda: x.view(10, 100).t() + y.view(10, 100).t())
    assert ops["add"].nbytes == op_cost("add", {"n": 1000}, 4)[1]
    assert ops["view"].nbytes == 0 and ops["t"].nbytes == 0


def test_eager_rmsnorm_moves_the_bytes_its_formula_predicts():
    x, w = torch.randn(64, 96), torch.randn(96)
    counted = sum(op.nbytes for op in count_ops(lambda: rmsnorm_eager(x, w)).values())
    assert counted == rmsnorm_unfused_bytes(64, 96, 4)


def test_a_training_steps_flops_equal_flop_counter_modes_total():
    from torch.utils.flop_counter import FlopCounterMode

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    x = torch.randn(16, 32)

    def step():
        model(x).sum().backward()

    with FlopCounterMode(display=False) as reference:
        step()
    counted = count_ops(step)
    assert sum(op.flops for op in counted.values()) == reference.get_total_flops() > 0


def test_the_bound_flips_at_the_ridge_point():
    roof = Roofline("test", peak_flops=100.0, bandwidth=10.0)
    assert roof.ridge == 10.0
    assert roof.bound(9.99) == "memory" and roof.bound(10.0) == "compute"
    assert roof.attainable(2.0) == 20.0 and roof.attainable(50.0) == 100.0
    assert roof.predicted_seconds(flops=100.0, nbytes=100.0) == 10.0  # bytes dominate


def test_a_decode_matmul_is_memory_bound_on_an_h100_and_a_square_one_is_not():
    h100 = datasheet_for("NVIDIA H100 80GB HBM3")
    peak, bw = h100.bf16_dense_flops, h100.hbm_bandwidth_bytes_per_s
    intensity, bound = intensity_and_bound("matmul", {"m": 1, "k": 8192, "n": 8192}, 2, peak, bw)
    assert bound == "memory" and intensity == pytest.approx(1.0, rel=1e-3)
    assert intensity_and_bound("matmul", {"m": 4096, "k": 4096, "n": 4096}, 2, peak, bw)[1] == (
        "compute"
    )


def test_the_gemm_sweep_reports_positive_measured_flops_per_size():
    points = gemm_sweep((16, 32), torch.device("cpu"))
    assert [n for n, _ in points] == [16, 32] and all(f > 0 for _, f in points)


def test_every_op_of_a_step_is_placed_with_its_count_and_time():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU())
    x = torch.randn(16, 32)
    placed = place_on_roofline(lambda: model(x).sum().backward(), Roofline("t", 1e11, 1e10), 2)
    by_name = {p.name: p for p in placed}
    assert by_name["addmm"].flops == 2 * 16 * 32 * 64 and by_name["gelu"].bound == "memory"
    assert all(p.seconds >= 0 and p.nbytes > 0 for p in placed)


def test_unknown_ops_name_the_ones_with_a_formula():
    with pytest.raises(ValueError, match="choose matmul"):
        op_cost("conv", {}, 4)


def test_no_datasheet_is_printed_for_a_pcie_or_nvl_card_of_the_same_name():
    assert datasheet_for("NVIDIA H100 80GB HBM3").name.startswith("H100 SXM")
    assert datasheet_for("NVIDIA H200").hbm_bandwidth_bytes_per_s == pytest.approx(4.8e12)
    assert datasheet_for("NVIDIA H100 PCIe") is None and datasheet_for("NVIDIA H100 NVL") is None
