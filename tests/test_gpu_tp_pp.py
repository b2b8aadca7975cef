"""Tensor, pipeline and context parallelism on CUDA tensors over NCCL (one GPU: degree 1 on a 1-rank
cluster). Skipped without CUDA; ``pytest -m gpu`` selects it. One rank cannot test cross-rank
arithmetic (the CPU suite does, on gloo); it proves that the layers, the vocab-parallel loss, the
communication layer and the pipeline executor accept CUDA tensors on NCCL end to end."""

from __future__ import annotations

import pytest
import torch

import dtlab

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _tp_and_pp_on_cuda() -> dict:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.parallel import parallelize_gpt
    from dtlab.parallel.pipeline import one_f_one_b, pipeline_gpt

    device = dtlab.device()
    config = GPTConfig.tiny()
    x, y = (t.to(device) for t in SyntheticTokens(config, 1, 4)[0])
    out = {}
    for sp in (False, True):
        model = GPT(config, seed=0).to(device)
        tp = parallelize_gpt(model, Mesh(tp=1), sequence_parallel=sp)
        loss = tp.loss(model(x), y)
        loss.backward()
        tp.finish_gradients()
        reference = GPT(config, seed=0).to(device)
        out[f"tp_sp={sp}"] = abs(loss.item() - loss_fn(reference(x), y).item())
    model = GPT(config, seed=0).to(device)
    executor = pipeline_gpt(model, Mesh(pp=1), one_f_one_b(1, 2))
    out["pp_loss"] = float(executor.step(x, y))
    from dtlab.comm import Communicator
    from dtlab.parallel.context import parallelize_context, shard_batch

    for style in ("zigzag", "ulysses"):
        comm = Communicator(dim="cp")
        model = parallelize_context(GPT(config, seed=0).to(device), comm, style)
        tokens, targets, positions = shard_batch(x, y, comm, style)
        loss = loss_fn(model(tokens, positions=positions.to(device)), targets)
        loss.backward()
        reference = GPT(config, seed=0).to(device)
        out[f"cp_{style}"] = abs(loss.item() - loss_fn(reference(x), y).item())
    return out


@pytest.mark.timeout(300)
def test_tensor_pipeline_and_context_parallel_run_on_cuda_tensors_over_nccl():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_tp_and_pp_on_cuda)[0]
    assert r["tp_sp=False"] < 1e-4 and r["tp_sp=True"] < 1e-4
    assert r["pp_loss"] > 0
    assert r["cp_zigzag"] < 1e-4 and r["cp_ulysses"] < 1e-4
