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
