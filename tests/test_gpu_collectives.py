"""One-shot, two-shot and the switch's all-reduce, and the call-agreement check, on CUDA tensors over
NCCL: the same results and counted bytes as on gloo, and a mismatch still raises on every rank."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dtlab
from dtlab import collectives as C
from dtlab.cost.collectives import bytes_sent_per_rank
from dtlab.cost.nccl_protocols import in_network_bytes_per_gpu

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

LENGTH = 1200


def _every_schedule_on_cuda() -> dict:
    rank, n = dist.get_rank(), dist.get_world_size()
    x = (torch.arange(float(LENGTH), device="cuda") % 7) * (rank + 1)
    ring = C.all_reduce(x.clone(), algorithm="ring")
    seen = {"device": ring.device.type}
    for schedule in ("one_shot", "two_shot"):
        with C.counting() as moved:
            got = C.peer_all_reduce(x.clone(), algorithm=schedule)
        seen[schedule] = (torch.equal(got, ring), moved.bytes_sent)
    if n >= 3:
        with C.counting() as moved:
            got = C.switch_all_reduce(x.clone(), switch=n - 1)
        want = (torch.arange(float(LENGTH), device="cuda") % 7) * sum(range(1, n))
        seen["switch"] = (rank == n - 1 or torch.equal(got, want), moved.bytes_sent)
    try:
        C.all_reduce(torch.ones(10 + rank, device="cuda"))
        seen["mismatch"] = "no error" if n > 1 else "single rank"
    except C.CollectiveMismatch as error:
        seen["mismatch"] = str(error)
    return seen


def test_peer_memory_and_switch_all_reduce_on_nccl_match_the_ring_and_the_formulas():
    world = torch.cuda.device_count()
    with dtlab.Cluster(world, device="cuda") as cluster:
        per_rank = cluster.run(_every_schedule_on_cuda)
    for rank, seen in enumerate(per_rank):
        assert seen["device"] == "cuda"
        for schedule in ("one_shot", "two_shot"):
            equal, sent = seen[schedule]
            assert equal, f"rank {rank}: {schedule}"
            assert sent == bytes_sent_per_rank("all_reduce", schedule, LENGTH * 4, world)[rank]
        if world >= 3 and rank < world - 1:
            mine = C.chunk_sizes(LENGTH, world - 1)[rank]
            assert seen["switch"] == (True, (LENGTH + mine) * 4)
            if LENGTH % (world - 1) == 0:
                assert seen["switch"][1] == in_network_bytes_per_gpu(LENGTH * 4, world - 1)
        if world >= 2:
            assert "number of elements" in seen["mismatch"] and "rank 1: 11" in seen["mismatch"]
