"""Timing a matmul on a CUDA GPU the way a training step runs it, for the GPU suite's GEMM tests
(``tests/test_gpu_plan_gemm_curve.py``, ``tests/test_gpu_plan_layer_gemms.py``)."""

from __future__ import annotations

import statistics

import torch


def seconds_per_matmul(
    a: torch.Tensor, b: torch.Tensor, repeats: int = 7, graphed: bool = True
) -> float:
    """Median seconds of one ``a @ b``, over ``repeats`` timings of 10 back-to-back products
    (CUDA events, after a warm-up).

    ``graphed``: the 10 products are one captured CUDA graph, so the GPU never waits for the host
    to launch the next (what a training step's queued kernels see, and what the planner's curve
    models); eager launches measure the host's launch rate instead for small GEMMs (on a lent
    gVisor H200 a 512³ product ran at 0.8 % of peak eager, launch-bound)."""
    out = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)

    def ten() -> None:
        for _ in range(10):
            torch.matmul(a, b, out=out)

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
    return statistics.median(times)
