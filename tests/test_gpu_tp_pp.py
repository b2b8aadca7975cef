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


GPU_PIPELINES = [("zb_h1", 4), ("dualpipe_v", 2)]  # p = 1: (schedule, m)


def _split_backward_and_v_pipelines_on_cuda() -> None:
    """ZB-H1 (I and W) and DualPipeV (two stages in a V) on one CUDA rank, one traced step each."""
    from dtlab import trace
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.parallel.pipeline import SCHEDULES, pipeline_gpt

    device = dtlab.device()
    config = GPTConfig.tiny(n_layers=2)
    x, y = (t.to(device) for t in SyntheticTokens(config, 1, 4)[0])
    for name, m in GPU_PIPELINES:
        executor = pipeline_gpt(GPT(config, seed=0).to(device), Mesh(pp=1), SCHEDULES[name](1, m))
        with trace.labels(gpu_case=name):
            executor.step(x, y)


@pytest.mark.timeout(300)
def test_executed_bubble_reads_split_backward_and_v_pipelines_run_on_cuda():
    from dtlab.parallel.pipeline import SCHEDULES
    from dtlab.parallel.pipeline.executed_bubble import executed_bubble

    with dtlab.Cluster(1, device="cuda") as cluster:
        traced = cluster.run(_split_backward_and_v_pipelines_on_cuda).trace
    for name, m in GPU_PIPELINES:
        read = executed_bubble(traced.filter(gpu_case=name), [0], m)
        planned = SCHEDULES[name](1, m)
        assert read.schedule.actions == planned.actions, name  # one rank: no messages
        assert read.schedule.stage_ranks == planned.stage_ranks, name
        assert read.bubble_fraction_of_total == 0, name  # back to back: nothing to wait for


def _cp_shape_check_and_padded_loss_on_cuda() -> dict:
    import torch.nn.functional as F

    from dtlab.collectives import CollectiveMismatch
    from dtlab.comm import Communicator
    from dtlab.parallel.context import allgather_attention, ring_attention, ulysses_attention
    from dtlab.parallel.tensor import vocab_parallel_cross_entropy

    device = dtlab.device()
    comm = Communicator(dim="cp")
    q, k, v = (torch.randn(2, 2, 6, 8, device=device) for _ in range(3))
    positions = torch.arange(6, device=device)
    out = {}
    methods = {"ring": ring_attention, "ulysses": ulysses_attention}
    for name, attention in {**methods, "allgather": allgather_attention}.items():
        attention(q, k, v, positions, positions, comm)  # one position per token: runs
        try:  # 5 positions for 6 tokens: the shape check (an NCCL all-gather of CUDA int64) refuses
            attention(q, k, v, positions[:5], positions[:5], comm)
            out[name] = None
        except CollectiveMismatch as error:
            out[name] = str(error)

    g = torch.Generator(device).manual_seed(0)
    logits = torch.randn(4, 8, device=device, generator=g, requires_grad=True)
    targets = torch.randint(5, (4,), device=device, generator=g)
    loss = vocab_parallel_cross_entropy(logits, targets, Communicator(), vocab_size=5)
    loss.backward()
    reference = logits.detach()[:, :5].clone().requires_grad_()
    want = F.cross_entropy(reference, targets)
    want.backward()
    out["loss"] = abs(loss.item() - want.item())
    out["grad"] = (logits.grad[:, :5] - reference.grad).abs().max().item()
    out["padding_grad"] = logits.grad[:, 5:].abs().max().item()
    return out


@pytest.mark.timeout(300)
def test_cp_shape_check_and_padded_vocab_loss_run_on_cuda_tensors_over_nccl():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_cp_shape_check_and_padded_loss_on_cuda)[0]
    for name in ("ring", "ulysses", "allgather"):
        assert r[name] is not None and "5 query and 5 key positions for q's 6" in r[name]
    assert r["loss"] < 1e-5 and r["grad"] < 1e-6
    assert r["padding_grad"] == 0.0
