"""The runtime on a GPU: a 1-rank NCCL Cluster, CUDA-event spans and the CUDA allocator's reports.

Selected with ``pytest -m gpu``; skipped (never passed) without CUDA. One rank on one GPU proves
the NCCL path end to end — the process group, a collective on a CUDA tensor, device-timed spans,
tensors coming back to the host, unfinished NCCL work drained before the reply — while the CPU
suite checks cross-rank arithmetic on gloo.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dtlab

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.timeout(300),
]


@pytest.fixture(scope="module")
def gpu_cluster():
    with dtlab.Cluster(1, device="cuda", timeout=120) as cluster:
        yield cluster


def _all_reduce_on_the_gpu() -> dict:
    t = torch.full((8,), 3.0, device=dtlab.device())
    dist.all_reduce(t)
    return {"backend": dist.get_backend(), "device": str(t.device), "value": t}


def test_one_rank_nccl_cluster_runs_a_function_and_an_all_reduce(gpu_cluster):
    assert gpu_cluster.backend == "nccl" and gpu_cluster.device_type == "cuda"
    out = gpu_cluster.run(_all_reduce_on_the_gpu)[0]
    assert out["backend"] == "nccl" and out["device"] == "cuda:0"
    assert out["value"].device.type == "cpu"  # results travel back to the caller's host
    assert torch.equal(out["value"], torch.full((8,), 3.0))


def _device_timed_spans() -> None:
    from dtlab import trace

    a = torch.randn(2048, 2048, device=dtlab.device())
    with trace.cuda_span("matmul", kind="compute"):
        for _ in range(8):
            a = a @ a
            a = a / a.norm()
    big = torch.ones(16 * 2**20 // 4, device=dtlab.device())
    with trace.cuda_span("all_reduce", kind="comm", nbytes=big.numel() * 4, bucket=0):
        dist.all_reduce(big)


def test_cuda_spans_record_device_durations(gpu_cluster):
    run = gpu_cluster.run(_device_timed_spans)
    spans = {s.name: s for s in run.trace.spans}
    assert {"matmul", "all_reduce"} <= set(spans)
    assert spans["matmul"].end_ns > spans["matmul"].start_ns  # eight 2048² matmuls take time
    assert spans["all_reduce"].end_ns >= spans["all_reduce"].start_ns
    assert spans["all_reduce"].kind == "comm" and spans["all_reduce"].nbytes == 16 * 2**20
    assert spans["all_reduce"].labels["bucket"] == 0
    # Device time is placed after its host anchor: the matmuls end before the all-reduce starts.
    assert spans["matmul"].end_ns <= spans["all_reduce"].start_ns


def _memory_on_the_gpu() -> dict:
    from dtlab.memory import cuda_memory_report, peak_bytes_of

    device = dtlab.device()
    model = torch.nn.Linear(1024, 1024).to(device)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(64, 1024, device=device)).sum().backward()
    opt.step()
    torch.cuda.reset_peak_memory_stats(device)
    report = cuda_memory_report(model, opt)
    work = peak_bytes_of(lambda: torch.empty(2**20, device=device).fill_(1.0), device)
    return {
        "by_category": report.by_category,
        "total": report.total,
        "peak": report.peak,
        "reserved": report.reserved,
        "allocated": torch.cuda.memory_allocated(device),
        "work": (work.peak_bytes, work.end_bytes, work.source),
    }


def test_cuda_memory_report_and_peak_work_on_the_gpu(gpu_cluster):
    m = gpu_cluster.run(_memory_on_the_gpu)[0]
    params = (1024 * 1024 + 1024) * 4
    assert m["by_category"]["parameters"] == params
    assert m["by_category"]["gradients"] == params
    assert m["by_category"]["optimizer_state"] == 2 * params  # Adam's two moments
    assert m["peak"] >= m["total"] > 0 and m["reserved"] >= m["total"]
    peak, end, source = m["work"]
    assert source == "cuda allocator"
    assert peak >= 4 * 2**20 and end == 0  # the 4 MiB tensor was freed when the lambda returned


def _leave_an_all_reduce_unwaited():
    t = torch.full((1 << 22,), 2.0, device=dtlab.device())
    dist.all_reduce(t, async_op=True)  # NCCL: the worker polls the handle before replying
    return t


def test_unwaited_nccl_work_is_finished_before_the_reply(gpu_cluster):
    pids = gpu_cluster.pids
    out = gpu_cluster.run(_leave_an_all_reduce_unwaited)[0]
    assert torch.all(out == 2.0)
    assert gpu_cluster.run(lambda: dtlab.rank()) == [0]
    assert gpu_cluster.pids == pids  # nothing was left unfinished: no restart


def test_a_rank_stuck_inside_fsdp_on_cuda_is_reported_at_the_learners_line():
    """On NCCL a collective returns before it finishes, so a stuck rank is found by the timeout
    and its stack dump: the report must still name the learner's ``model(x)`` line."""
    import inspect
    import threading

    from dtlab.parallel import FullyShardedDataParallel

    def forward_that_never_returns():
        waits = torch.nn.Identity()
        waits.forward = threading.Event().wait  # standard library only: no frame of the learner's
        embed = torch.nn.Embedding(4000, 1).to(dtlab.device())
        model = FullyShardedDataParallel(torch.nn.Sequential(waits, embed))
        model(torch.tensor([3600]))  # the wait's timeout, in seconds

    lines, first = inspect.getsourcelines(forward_that_never_returns)
    line = first + next(i for i, text in enumerate(lines) if "model(torch.tensor" in text)
    cluster = dtlab.Cluster(1, device="cuda", timeout=10)
    with cluster, pytest.raises(dtlab.ClusterTimeout) as info:
        cluster.run(forward_that_never_returns)
    text = info.value.pending[0]
    assert "inside dtlab.parallel.FullyShardedDataParallel.forward" in text
    assert f"forward_that_never_returns ({__file__}:{line})" in text, text
