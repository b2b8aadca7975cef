"""Running-real-jobs mechanisms on a GPU over NCCL (one GPU: a 1-rank cluster). Skipped without
CUDA; ``pytest -m gpu`` selects it. The CPU suite covers several ranks; this proves the same code
runs on CUDA tensors: the token count all-reduced on the device, Newton–Schulz on the GPU equal to
the CPU's to rounding, the document-masked ring on CUDA tensors, and a balanced save of CUDA
state that loads back bit for bit."""

from __future__ import annotations

import pytest
import torch

import dtlab

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _on_cuda(root: str) -> dict:
    from dtlab.checkpoint import load, replicated_state, save
    from dtlab.comm import Communicator
    from dtlab.optim.muon import muon_update
    from dtlab.parallel.context.documents import document_ids, document_ring_attention
    from dtlab.parallel.data.loss_normalization import ddp_gradient, single_process_gradient

    device = dtlab.device()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 4, generator=g, dtype=torch.float64), torch.randn(12, generator=g)
    grad = ddp_gradient(x.to(device), y.double().to(device), "global")
    m = torch.randn(32, 96, generator=g, dtype=torch.float32)
    docs = [4, 8, 4]
    q, k, v = (torch.randn(1, 2, 16, 8, generator=g).to(device) for _ in range(3))
    positions = torch.arange(16, device=device)
    out = document_ring_attention(
        q, k, v, positions, document_ids(docs).to(device), Communicator(collectives="dtlab")
    )
    model = torch.nn.Linear(8, 8).to(device)
    save(root, 1, replicated_state(model), writers="balanced")
    fresh = torch.nn.Linear(8, 8).to(device)
    load(root, replicated_state(fresh))
    return {
        "grad": (grad["grad"] - single_process_gradient(x, y.double())).abs().max().item(),
        "muon": (muon_update(m.to(device)).cpu() - muon_update(m)).abs().max().item(),
        "ring_on_cuda": out.is_cuda,
        "loaded": all(
            torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True)
        ),
    }


def test_running_jobs_mechanisms_run_on_cuda_tensors_over_nccl(tmp_path):
    with dtlab.Cluster(1, device="cuda", timeout=120) as cluster:
        result = cluster.run(_on_cuda, str(tmp_path))[0]
    assert result["grad"] < 1e-12
    assert result["muon"] < 1e-4  # TF32/kernel order may differ from the CPU's
    assert result["ring_on_cuda"] and result["loaded"]
