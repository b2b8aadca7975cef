"""The library's own buffers sit on the data's device on a real NCCL rank (one GPU, world of 1).

Skipped without CUDA; ``pytest -m gpu`` selects it. ``tests/test_device_placement.py`` checks the
same buffers on the CPU with ``meta`` data; this runs each path where a CPU buffer would fail for
real. World size 1 skips the messages of a ring, so every case is one that still reaches NCCL at
one rank (torch's all-gather and all-reduce run even alone; the CP shape check is an all-gather)
or fails before any message (dedup's routing masks, the refusals of a receive from any source).
"""

from __future__ import annotations

import pytest
import torch

import dtlab

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _refusal(call) -> str | None:
    try:
        call()
    except ValueError as error:
        return str(error)
    return None


def _placements_on_rank() -> dict:
    from dtlab.comm import Communicator
    from dtlab.models.attention import math_attention
    from dtlab.optim.muon import muon_update, sharded_muon_updates
    from dtlab.parallel.context import ring_attention, shard_sequence
    from dtlab.parallel.data.async_sgd import run_async_sgd
    from dtlab.parallel.expert.dedup import dedup_dispatch
    from dtlab.parallel.zero.grad_clip import clip_sharded_grad_norm_

    device = dtlab.device()
    torch.manual_seed(0)
    out = {}
    # dedup: its routing masks index a token range that must sit on x's device
    x = torch.randn(6, 4, device=device)
    experts = torch.tensor([[0, 1], [1, -1], [0, -1], [1, 0], [-1, -1], [0, 1]], device=device)
    dedup_comm = Communicator(None, collectives="dtlab", dim="ep")
    result = dedup_dispatch(x, experts, dedup_comm, n_experts=2, ranks_per_node=1)
    out["dedup"] = (result.rows.device.type, len(result.rows), int((experts >= 0).sum()))
    # Muon, replicated: the momentum is all-gathered (NCCL runs it at one rank too)
    comm = Communicator(None, collectives="torch", dim="dp")
    momentum = torch.randn(16, device=device)
    (mine,) = sharded_muon_updates([momentum], [(4, 4)], comm, "replicated")
    out["muon_gap"] = (mine - muon_update(momentum.view(4, 4)).reshape(-1)).abs().max().item()
    # ZeRO clipping on a rank that holds no gradient: the norm is all-reduced from the device
    norm = clip_sharded_grad_norm_([None], 1.0, comm)
    out["clip"] = (norm.device.type, float(norm))
    # CP: shard_sequence's positions go straight into ring attention (its shape check gathers)
    q = torch.randn(1, 2, 8, 4, device=device)
    local, positions = shard_sequence(q, 1, 0, "zigzag", dim=2)
    ring = ring_attention(local, local, local, positions, positions, comm)
    everything = torch.arange(8, device=device)
    out["positions"] = positions.device.type
    out["ring_gap"] = (ring - math_attention(q, q, q, everything, everything)).abs().max().item()
    cpu = torch.arange(8)
    out["cpu_positions"] = _refusal(lambda: ring_attention(q, q, q, cpu, cpu, comm))
    # a receive from any rank: NCCL cannot, and says so
    model = torch.nn.Linear(2, 1).to(device)
    out["async_sgd"] = _refusal(lambda: run_async_sgd(model, lambda m, s: m.weight.sum(), 1, 0.1))
    out["recv_any"] = _refusal(lambda: comm.recv(torch.empty(1, device=device)))
    return out


@pytest.mark.timeout(300)
def test_library_buffers_sit_on_the_cuda_device_over_nccl():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_placements_on_rank)[0]
    device, rows, kept = r["dedup"]
    assert device == "cuda" and rows == kept == 8, r  # one row per kept (token, expert)
    assert r["muon_gap"] < 1e-6, r  # the same Newton–Schulz on the gathered copy
    assert r["clip"] == ("cuda", 0.0), r
    assert r["positions"] == "cuda" and r["ring_gap"] < 1e-5, r
    assert "positions_q on q's device (cuda:0), got cpu" in r["cpu_positions"], r
    assert "NCCL cannot do: run it on gloo" in r["async_sgd"], r
    assert "Pass source=<group rank>, or run on gloo" in r["recv_any"], r
