"""The accelerator-runtime measurements on a real GPU: roofline, CUDA graphs, syncs, snapshot.

Selected with ``pytest -m gpu``; skipped without CUDA. What the CPU suite can only model, this
one measures on the device: a BF16 roofline beside the datasheet, a CUDA graph's replay against
eager, a host sync's wait for the queue, and the caching allocator's own snapshot beside the
simulated allocator fed the same allocation trace. No wall-clock thresholds: only orderings a
working GPU cannot fail (a graph replays the same outputs; a sync waits at least as long as the
kernel queued before it; reserved ≥ allocated).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.timeout(300),
]

DEVICE = torch.device("cuda", 0)


def test_the_measured_roofline_sits_below_the_datasheet_and_the_ridge_is_in_range():
    from dtlab.perf.roofline import datasheet_for, measure_roofline

    roof = measure_roofline(DEVICE, sizes=(1024, 4096), copy_bytes=1 << 30)
    assert roof.peak_flops > 1e12 and roof.bandwidth > 1e11
    sheet = datasheet_for(roof.device)
    if sheet is not None:  # an H100/H200/A100: measured never beats the datasheet
        assert roof.peak_flops < 1.05 * sheet.bf16_dense_flops
        assert roof.bandwidth < 1.05 * sheet.hbm_bandwidth_bytes_per_s


def test_a_steps_ops_are_placed_with_device_times():
    from dtlab.models import GPTConfig
    from dtlab.perf.op_census import place_on_roofline
    from dtlab.perf.roofline import Roofline
    from dtlab.perf.workloads import gpt_training_step

    config = GPTConfig(vocab_size=256, seq_len=128, d_model=128, n_layers=2, n_heads=4,
                       d_ff=512, dropout=0.0)  # fmt: skip
    step = gpt_training_step(config, 8, DEVICE)
    placed = place_on_roofline(step, Roofline("h", 1e15, 3e12), steps=3, device=DEVICE)
    timed = [p for p in placed if p.seconds > 0]
    assert any(p.flops > 0 for p in timed) and any(p.bound == "memory" for p in timed)


def test_a_cuda_graph_replays_the_tiny_model_with_the_same_outputs():
    from dtlab.perf.launch import TinyMLP, graph_report

    model = TinyMLP(16, 24).to(DEVICE)
    x = torch.randn(8, 16, device=DEVICE)
    graph = graph_report(model, x, peak_flops=1e14)
    assert graph["measured"] and graph["max_abs_diff"] < 1e-5
    assert graph["graph_s"] > 0 and graph["eager_s"] > 0


def test_a_sync_on_the_gpu_waits_for_the_queued_kernel():
    from dtlab.perf.syncs import SyncCounter

    a = torch.randn(4096, 4096, device=DEVICE)
    (a @ a).sum().item()  # warm-up: library handles and kernels chosen before the timed part
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    b = a @ a @ a
    end.record()
    with SyncCounter(DEVICE) as syncs:
        b.sum().item()
    (sync,) = syncs.found
    kernel_ms = start.elapsed_time(end)
    assert sync.call == "item" and sync.seconds * 1e3 >= 0.5 * kernel_ms


def test_the_snapshot_shows_reserved_at_least_allocated_and_the_simulation_runs_on_its_trace():
    from dtlab.perf.charts import segments_chart
    from dtlab.perf.memory import allocator_view
    from dtlab.viz.chart import chart_problems

    torch.cuda.empty_cache()
    view = allocator_view([1024, 768, 1280, 512, 1536, 896], 2048, 3, DEVICE)
    real = view["real"]
    assert real["reserved"] >= real["allocated"] and real["segments"]
    assert view["simulated"]["peak_reserved"] >= view["simulated"]["peak_allocated"]
    assert chart_problems(segments_chart(real["segments"], real["source"])) == []


def test_the_bench_prints_the_gpu_figures(capsys):
    from dtlab.bench import runtime_perf

    assert runtime_perf.main(["--fast"]) == 0
    out = capsys.readouterr().out
    assert "graph replay: eager" in out and "real allocator" in out


def test_a_compiled_step_on_the_gpu_runs_triton_kernels_and_dispatches_fewer_aten_ops():
    from dtlab.models import GPTConfig
    from dtlab.perf.fusion import compare_step_compiled, rmsnorm_eager, rmsnorm_fewer_passes
    from dtlab.perf.workloads import gpt_training_step, gpt_training_step_compiled

    x, w = torch.randn(64, 256, device=DEVICE), torch.randn(256, device=DEVICE)
    torch.testing.assert_close(rmsnorm_fewer_passes(x, w), rmsnorm_eager(x, w))
    config = GPTConfig(vocab_size=256, seq_len=32, d_model=64, n_layers=1, n_heads=2, d_ff=128,
                       dropout=0.0)  # fmt: skip
    result = compare_step_compiled(
        gpt_training_step(config, 2, DEVICE), gpt_training_step_compiled(config, 2, DEVICE), DEVICE
    )
    assert result.ok, result.error
    assert result.graphs == 2 and result.kernels >= 2
    assert 0 < result.compiled_aten_ops < result.eager_aten_ops
