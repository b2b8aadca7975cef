"""Composition on CUDA tensors over NCCL (one GPU: every degree 1 on a 1-rank cluster). Skipped
without CUDA; ``pytest -m gpu`` selects it. It proves that ``compose_gpt``'s step, its FSDP and
DDP paths, the global-norm clipping and the traffic accounting accept CUDA tensors on NCCL; the
cross-rank arithmetic is the CPU suite's (tests/test_compose.py, on gloo)."""

from __future__ import annotations

import pytest
import torch

import dtlab

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _compose_on_cuda() -> dict:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.parallel.compose import compose_gpt

    device = dtlab.device()
    config = GPTConfig.tiny()
    x, y = (t.to(device) for t in SyntheticTokens(config, 1, 4)[0])
    reference = GPT(config, seed=0).to(device)
    want = loss_fn(reference(x), y).item()
    out = {}
    for mode in ("ddp", "fsdp"):
        composed = compose_gpt(GPT(config, seed=0).to(device), Mesh(), data_parallel=mode)
        out[mode] = abs(composed.train_step(x, y) - want)
        out[f"{mode}_norm_on"] = composed.clip_grad_norm_(1.0).device.type
        out[f"{mode}_traffic"] = composed.traffic()
    return out


@pytest.mark.timeout(300)
def test_composed_step_runs_on_cuda_tensors_over_nccl():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_compose_on_cuda)[0]
    assert r["ddp"] < 1e-4 and r["fsdp"] < 1e-4
    assert r["ddp_norm_on"] == "cuda" and r["fsdp_norm_on"] == "cuda"
    assert r["ddp_traffic"] == {}  # one rank: no group of size > 1 moves a byte


def _stage_shards_on_cuda() -> dict:
    from dtlab.comm import Communicator
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, split_into_stages
    from dtlab.parallel.compose.stage_fsdp import StageShards

    device = dtlab.device()
    config = GPTConfig.tiny()
    x, y = (t.to(device) for t in SyntheticTokens(config, 1, 4)[0])
    reference = GPT(config, seed=0).to(device)
    loss_fn(reference(x), y).backward()
    want = {n: p.grad for n, p in reference.named_parameters()}
    stages = split_into_stages(GPT(config, seed=0).to(device), 2)
    shards = StageShards(dict(enumerate(stages)), Communicator(None, dim="dp"))
    shards.gather()  # once for the step; two micro-batches accumulate into the whole parameters
    for xm, ym in zip(x.chunk(2), y.chunk(2), strict=True):
        (loss_fn(stages[1](stages[0](xm)), ym) / 2).backward()
    shards.finish()
    grads = shards.full_gradients()
    return {
        "error": max((g - want[n]).abs().max().item() for n, g in grads.items()),
        "on": {s.device.type for s in shards.shards.values()},
        "freed": sum(p.numel() for s in stages for p in s.parameters()),
    }


@pytest.mark.timeout(300)
def test_stage_shards_gather_once_and_reduce_on_cuda_tensors_over_nccl():
    """FSDP over pipeline stages (both stages on one rank): whole parameters gathered once,
    two micro-batches accumulated, one reduction into CUDA shards, the whole tensors freed."""
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_stage_shards_on_cuda)[0]
    assert r["error"] < 1e-5 and r["on"] == {"cuda"} and r["freed"] == 0
