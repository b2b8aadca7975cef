"""The planner's stated GEMM-efficiency curve held against this GPU's measured BF16 matmuls.

Skipped without CUDA; ``pytest -m gpu`` selects it. The curve in :mod:`dtlab.plan.constants`
is a stated assumption, not fitted; on a lent GPU this checks its *shape* (small GEMMs sustain a
smaller share of peak) and that it is the right order of magnitude at each size: measured and
stated efficiency within a factor 1.6 of each other, with the measurements printed for the
record. Throughput is timed with CUDA events after a warm-up, median of several repeats."""

from __future__ import annotations

import statistics

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PRESETS = {"A100": "a100_80gb", "H100": "h100_sxm", "H800": "h800_sxm", "H200": "h200_sxm"}


def _preset() -> str | None:
    name = torch.cuda.get_device_name()
    return next((preset for key, preset in PRESETS.items() if key in name), None)


def _measured_flops(n: int, repeats: int = 7, graphed: bool = True) -> float:
    """BF16 FLOP/s of an ``n³`` GEMM, median of ``repeats`` timings of 10 back-to-back products.

    ``graphed``: the 10 products are one captured CUDA graph, so the GPU never waits for the host
    to launch the next (what a training step's queued kernels see, and what the planner's curve
    models); eager launches measure the host's launch rate instead for small ``n`` (on a lent
    gVisor H200 a 512³ product ran at 0.8 % of peak eager, launch-bound)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)

    def ten() -> None:
        for _ in range(10):
            torch.matmul(a, b, out=c)

    for _ in range(3):
        ten()
    torch.cuda.synchronize()
    run = ten
    if graphed:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ten()  # warm-up on a side stream, as capture requires
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ten()
        run = graph.replay
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / 10)
    return 2 * n**3 / statistics.median(times)


def test_measured_gemm_efficiency_follows_the_stated_curve():
    from dtlab.cost import gpu
    from dtlab.plan.compute import gemm_efficiency

    preset = _preset()
    if preset is None:
        pytest.skip(f"no preset for {torch.cuda.get_device_name()}")
    peak = gpu(preset).bf16_dense_flops
    sizes = (512, 2048, 8192)
    measured = [_measured_flops(n) / peak for n in sizes]
    stated = [gemm_efficiency(preset, n, n, n) for n in sizes]
    print({n: (round(m, 3), round(s, 3)) for n, m, s in zip(sizes, measured, stated, strict=True)})
    record = {
        n: (
            round(_measured_flops(n) / peak, 3),
            round(_measured_flops(n, graphed=False) / peak, 3),
            round(gemm_efficiency(preset, n, n, n), 3),
        )
        for n in (256, 512, 1024, 4096)
    }
    print("graphed, eager, stated:", record)  # fmt: skip
    assert measured[0] < measured[-1]
    for m, s in zip(measured, stated, strict=True):
        assert s / 1.6 <= m <= s * 1.6
