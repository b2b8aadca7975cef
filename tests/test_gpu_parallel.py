"""The data-parallel family on CUDA tensors over NCCL (one GPU: a 1-rank NCCL cluster).

Skipped without CUDA; ``pytest -m gpu`` selects this file on a GPU machine. One rank cannot test
cross-rank arithmetic (the CPU suite does that on gloo); it proves that every code path accepts
CUDA tensors on NCCL — NCCL rejects CPU tensors, which is how scalars left on the host show up —
and that CUDA-event comm spans and device memory reports come back.
"""

from __future__ import annotations

import pytest
import torch

import dtlab

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _every_wrapper_on_cuda() -> dict:
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.parallel import (
        BucketedDDP,
        FullyShardedDataParallel,
        MixedPrecision,
        NaiveDDP,
        OverlappedDDP,
        ZeroOptimizer,
        norms_in_fp32,
    )

    device = dtlab.device()
    config = GPTConfig.tiny()
    x, y = (t.to(device) for t in SyntheticTokens(config, 1, 4)[0])
    out = {}
    for name, wrap in (
        ("naive", NaiveDDP),
        ("overlapped", OverlappedDDP),
        ("bucketed", BucketedDDP),
    ):
        model = GPT(config, seed=0).to(device)
        ddp = wrap(model, find_unused_parameters=True)
        loss_fn(ddp(x), y).backward()
        out[name] = all(p.grad is not None and p.grad.is_cuda for p in model.parameters())
    model = GPT(config, seed=0).to(device)
    views = BucketedDDP(model, find_unused_parameters=True, gradient_as_bucket_view=True)
    loss_fn(views(x), y).backward()
    reference = GPT(config, seed=0).to(device)
    loss_fn(reference(x), y).backward()  # one rank: the average is the local gradient
    buffers = {b.buffer.untyped_storage().data_ptr() for b in views.buckets}
    out["bucket_views"] = all(
        p.grad.untyped_storage().data_ptr() in buffers and torch.allclose(p.grad, r.grad)
        for p, r in zip(model.parameters(), reference.parameters(), strict=True)
    )
    for stage in (1, 2):
        model = GPT(config, seed=0).to(device)
        opt = ZeroOptimizer(
            model.parameters(), torch.optim.AdamW, stage=stage,
            mixed_precision=MixedPrecision(torch.bfloat16), offload=stage == 2, lr=1e-3,
        )  # fmt: skip
        model.to(torch.bfloat16)
        loss_fn(model(x), y).backward()
        opt.clip_grad_norm_(1.0)
        opt.step()
        out[f"zero{stage}"] = opt.held_bytes()["by_device"]
    model = GPT(config, seed=0).to(device)
    norms = [m for b in model.blocks for m in (b.attn_norm, b.mlp_norm)]
    fsdp = FullyShardedDataParallel(
        model, units=list(model.blocks) + norms,
        mixed_precision=norms_in_fp32(MixedPrecision(torch.bfloat16)),
    )  # fmt: skip
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-3)
    loss_fn(fsdp(x), y).backward()
    out["fsdp_norm"] = fsdp.clip_grad_norm_(1.0).item()
    opt.step()
    out["fsdp_held"] = fsdp.held_bytes(opt)["by_device"]
    counted = BucketedDDP(GPT(config, seed=0).to(device), collectives="dtlab")
    loss_fn(counted(x), y).backward()
    out["counted"] = counted.comm_stats.counted
    return out


@pytest.mark.timeout(300)
def test_ddp_zero_fsdp_and_clipping_accept_cuda_tensors_on_nccl():
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_every_wrapper_on_cuda)[0]
    assert r["naive"] and r["overlapped"] and r["bucketed"]
    assert r["bucket_views"]  # gradients live in the CUDA buckets and equal one process's
    assert set(r["zero1"]) == {"cuda:0"}
    assert "cpu" in r["zero2"]  # offloaded optimizer state really lives on the host
    assert r["fsdp_norm"] > 0 and set(r["fsdp_held"]) == {"cuda:0"}
    assert r["counted"]


def _comm_spans_use_cuda_events() -> list[tuple[str, float]]:
    from dtlab.comm import Communicator

    comm = Communicator(dim="dp")
    big = torch.ones(64 * 2**20 // 4, device=dtlab.device())
    pending = comm.all_reduce(big, name="async_all_reduce", async_op=True)
    pending.wait()
    comm.all_reduce(big, name="sync_all_reduce")
    return []


@pytest.mark.timeout(300)
def test_data_parallel_comm_spans_are_timed_on_the_device():
    with dtlab.Cluster(1, device="cuda") as cluster:
        run = cluster.run(_comm_spans_use_cuda_events)
    names = {s.name for s in run.trace.filter(kind="comm").spans}
    assert {"async_all_reduce", "sync_all_reduce"} <= names
    assert all(s.end_ns >= s.start_ns for s in run.trace.spans)


def _full_size_lab_configs_build() -> dict:
    from dtlab.models import GPT, GPTConfig

    sizes = {}
    for name in ("small",):
        model = GPT(getattr(GPTConfig, name)(), seed=0).to(dtlab.device())
        sizes[name] = model.num_params()
    return sizes


@pytest.mark.timeout(300)
def test_full_size_lab_configs_build_on_the_gpu():
    with dtlab.Cluster(1, device="cuda") as cluster:
        sizes = cluster.run(_full_size_lab_configs_build)[0]
    assert sizes["small"] > 1_000_000


def _self_checkpointing_blocks_under_fsdp_on_cuda() -> dict:
    from torch.utils.checkpoint import checkpoint

    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.parallel import FullyShardedDataParallel

    device = dtlab.device()
    config = GPTConfig.tiny(dropout=0.0)
    x, y = (t.to(device) for t in SyntheticTokens(config, 1, 4)[0])

    def checkpoint_own_body(block) -> None:
        body = block.forward

        def forward(*args, **kwargs):
            return checkpoint(body, *args, use_reentrant=False, **kwargs)

        block.forward = forward

    def model_with_self_checkpointing_blocks():
        model = GPT(config, seed=0).to(device)
        for block in model.blocks:
            checkpoint_own_body(block)
        return model

    reference = model_with_self_checkpointing_blocks()
    loss_fn(reference(x), y).backward()
    model = model_with_self_checkpointing_blocks()
    fsdp = FullyShardedDataParallel(model, units=list(model.blocks))
    with fsdp.no_sync():  # two half-weighted micro-batches: one reduce-scatter at the end
        (loss_fn(fsdp(x), y) / 2).backward()
    unsynced = fsdp.unsynced_gradient_bytes()
    (loss_fn(fsdp(x), y) / 2).backward()
    grads = fsdp.full_gradients()
    return {
        "gap": max(
            (grads[n].float().cpu() - p.grad.float().cpu()).abs().max().item()
            for n, p in reference.named_parameters()
        ),
        "unsynced_bytes": unsynced,
        "after_sync": fsdp.unsynced_gradient_bytes(),
        "params": sum(u.seg.padded_numel for u in fsdp.units),
        "shards_on_cuda": all(u.shard.is_cuda for u in fsdp.units),
    }


@pytest.mark.timeout(300)
def test_fsdp_gathers_for_a_block_that_checkpoints_its_own_body_on_nccl():
    """The recompute inside the block's forward reads gathered parameters (a 1-rank shard is
    1-D too, so the old code failed here with 'mat2 must be a matrix'); no_sync keeps one full
    fp32 gradient on the device until the synchronising backward."""
    with dtlab.Cluster(1, device="cuda") as cluster:
        r = cluster.run(_self_checkpointing_blocks_under_fsdp_on_cuda)[0]
    assert r["gap"] < 1e-4, r
    assert r["unsynced_bytes"] == 4 * r["params"] and r["after_sync"] == 0, r
    assert r["shards_on_cuda"]
