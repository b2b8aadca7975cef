"""FP8's speed-up against width on the roofline: cast bytes against saved GEMM time
(dtlab.precision.cast_overhead)."""

import pytest

from dtlab.cost.hardware import gpu
from dtlab.precision.cast_overhead import (
    KEPT_IN_BF16,
    block_speedup,
    break_even_hidden,
    cast_bytes,
    gemm_seconds,
    linear_times,
    model_speedup,
)


def test_cast_bytes_are_amax_read_cast_read_and_two_fp8_copies_per_tensor():
    assert cast_bytes(8, 4, 2) == (2 + 2 + 2) * (8 * 2 + 4 * 2 + 8 * 4)
    assert cast_bytes(8, 4, 2, copies=1, amax_pass=False) == 3 * (8 * 2 + 4 * 2 + 8 * 4)


def test_a_compute_bound_fp8_gemm_takes_half_the_bf16_time():
    h100 = gpu("h100_sxm")
    assert gemm_seconds(8192, 8192, 8192, "fp8", h100) == pytest.approx(
        gemm_seconds(8192, 8192, 8192, "bf16", h100) / 2, rel=1e-3
    )


def test_the_speedup_grows_with_width_and_stays_below_the_two_x_of_the_tensor_cores():
    widths = [256, 512, 1024, 2048, 4096, 8192, 16384]
    speedups = [block_speedup(h, 8192) for h in widths]
    assert speedups == sorted(speedups)
    assert speedups[0] < 1 < speedups[-1] < 2


def test_the_cast_costs_less_than_the_gemm_time_it_saves_only_past_break_even():
    h = break_even_hidden(8192)
    assert block_speedup(h, 8192) > 1 >= block_speedup(h // 2, 8192)
    t = linear_times(8192, 4 * h, h)
    assert t["bf16"] - t["fp8_gemm"] > t["cast"]


def test_layers_kept_in_bf16_pull_the_model_speedup_below_the_blocks():
    layer = block_speedup(4096, 8192)
    model = model_speedup(4096, 32, 4096, 128256, 8192)
    assert 1 < model < layer
    assert {"embedding", "lm_head", "norms", "router"} <= set(KEPT_IN_BF16)


def test_a_gpu_without_fp8_tensor_cores_is_refused():
    with pytest.raises(ValueError, match="no FP8 tensor cores"):
        gemm_seconds(64, 64, 64, "fp8", gpu("a100_80gb"))
