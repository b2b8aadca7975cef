"""Fusion and launch overhead: the fewer-passes RMSNorm equals eager and its counted bytes equal
its formula; a failed compile is reported, not raised; a compiled training step dispatches fewer
ATen ops than eager; a tiny model's ops grow with its depth."""

from __future__ import annotations

import pytest
import torch

from dtlab.perf import fusion
from dtlab.perf.launch import (
    TinyMLP,
    dispatch_floor,
    launch_bound_share,
    ops_per_call,
    step_time_by_width,
    time_per_op,
)


def test_the_fewer_passes_rmsnorm_equals_eager():
    x, w = torch.randn(37, 64), torch.randn(64)
    torch.testing.assert_close(fusion.rmsnorm_fewer_passes(x, w), fusion.rmsnorm_eager(x, w))


def test_counted_rmsnorm_bytes_equal_each_forms_formula():
    from dtlab.perf.op_census import count_ops

    rows, cols = 24, 40
    x, w = torch.randn(rows, cols), torch.randn(cols)

    def counted(fn):
        return sum(op.nbytes for op in count_ops(lambda: fn(x, w)).values())

    assert counted(fusion.rmsnorm_eager) == fusion.rmsnorm_unfused_bytes(rows, cols, 4)
    assert counted(fusion.rmsnorm_fewer_passes) == fusion.rmsnorm_fewer_passes_bytes(rows, cols, 4)
    assert (
        fusion.rmsnorm_fused_bytes(rows, cols, 4)
        < fusion.rmsnorm_fewer_passes_bytes(rows, cols, 4)
        < fusion.rmsnorm_unfused_bytes(rows, cols, 4)
    )


def test_fusion_predicts_a_third_of_the_bytes_for_wide_rows():
    unfused = fusion.rmsnorm_unfused_bytes(4096, 4096, 2)
    fused = fusion.rmsnorm_fused_bytes(4096, 4096, 2)
    assert 3.4 < unfused / fused < 3.6  # 7n against 2n


def test_a_compiler_failure_is_returned_as_an_error_not_raised(monkeypatch):
    def broken(fn, *args, **kwargs):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(torch, "compile", broken)
    result = fusion.compile_and_measure(fusion.rmsnorm_eager, torch.randn(4, 8), torch.randn(8))
    assert not result.ok and "C++ compiler" in result.error


@pytest.mark.skipif(fusion.c_compiler() is None, reason="Inductor on a CPU needs a C++ compiler")
def test_compiled_rmsnorm_is_one_generated_kernel_and_still_correct():
    x, w = torch.randn(8, 32), torch.randn(32)
    result = fusion.compile_and_measure(fusion.rmsnorm_eager, x, w, calls=4)
    assert result.ok, result.error
    assert result.kernels == 1 and result.cold_start_s > result.warm_call_s > 0


def test_a_compiler_failure_on_a_whole_step_is_returned_as_an_error(monkeypatch):
    from torch._inductor import utils as inductor_utils

    def broken(call):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(inductor_utils, "run_and_get_code", broken)
    step = lambda: torch.ones(3).add(1)  # noqa: E731
    result = fusion.compare_step_compiled(step, step, torch.device("cpu"), repeats=1)
    assert not result.ok and "C++ compiler" in result.error and result.eager_aten_ops >= 1


@pytest.mark.slow
@pytest.mark.skipif(fusion.c_compiler() is None, reason="Inductor on a CPU needs a C++ compiler")
def test_a_compiled_training_step_dispatches_fewer_aten_ops_and_learns_the_same():
    from dtlab.models import GPTConfig
    from dtlab.perf.workloads import gpt_training_step, gpt_training_step_compiled

    config = GPTConfig(
        vocab_size=64, seq_len=8, d_model=16, n_layers=1, n_heads=2, d_ff=32, dropout=0.0
    )
    eager, compiled = gpt_training_step(config, 2), gpt_training_step_compiled(config, 2)
    losses = [(eager().item(), compiled().item()) for _ in range(3)]
    for a, b in losses:
        assert abs(a - b) < 1e-3 * max(1.0, abs(a))
    result = fusion.compare_step_compiled(
        gpt_training_step(config, 2), gpt_training_step_compiled(config, 2), torch.device("cpu"), 2
    )
    assert result.ok, result.error
    assert result.graphs == 2 and result.kernels >= 2  # forward and backward graphs
    assert 0 < result.compiled_aten_ops < result.eager_aten_ops
    assert result.cold_start_s > 0 and result.compiled_s > 0


def test_a_tiny_models_ops_grow_with_depth_not_width():
    def ops(width, depth):
        model, x = TinyMLP(width, depth), torch.randn(4, width)
        return ops_per_call(lambda: model(x).sum().backward())

    per_layer = ops(8, 6) - ops(8, 5)
    assert per_layer > 0 and ops(8, 10) - ops(8, 5) == 5 * per_layer
    assert ops(64, 6) == ops(8, 6)


def test_the_op_sweep_and_width_sweep_report_measured_times():
    points = time_per_op((1, 1024), calls=20)
    assert dispatch_floor(points) == points[0][1] > 0
    rows = step_time_by_width((4, 8), depth=3, calls=2)
    assert rows[0]["ops"] == rows[1]["ops"] and all(r["seconds"] > 0 for r in rows)
    assert 0 < launch_bound_share(rows[0], rows[0]["per_op_s"]) <= 1.0


def test_on_a_cpu_the_graph_report_is_an_estimate_from_a_measured_forward():
    from dtlab.perf.launch import graph_report

    report = graph_report(TinyMLP(16, 4), torch.randn(8, 16), peak_flops=1e11)
    assert report["measured"] is False and "graph_s" not in report
    assert report["arithmetic_s"] == pytest.approx(2 * 8 * 16 * 16 * 4 / 1e11)
    assert report["estimate_s"] == pytest.approx(report["eager_s"] - report["arithmetic_s"])


def test_eager_rmsnorm_with_kept_buffers_moves_the_same_bytes_and_gives_the_same_result():
    from dtlab.perf.op_census import count_ops

    x, w = torch.randn(48, 80), torch.randn(80)
    work: dict = {}
    torch.testing.assert_close(
        fusion.rmsnorm_eager_reusing(x, w, work=work), fusion.rmsnorm_eager(x, w)
    )
    kept = sum(
        op.nbytes
        for op in count_ops(lambda: fusion.rmsnorm_eager_reusing(x, w, work=work)).values()
    )
    assert kept == fusion.rmsnorm_unfused_bytes(48, 80, 4)
