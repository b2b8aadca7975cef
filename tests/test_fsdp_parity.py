"""Our ZeRO-3 trains exactly like one process and like PyTorch's FSDP2 ``fully_shard``."""

from __future__ import annotations

import torch

import dtlab
from dtlab.parallel import FullyShardedDataParallel
from dtlab.parallel.data.equivalence import (
    FP32_STEP_TOLERANCE,
    TiedToyModel,
    lm_loss,
    max_abs_difference,
    rank_slice,
    toy_batches,
    train_single_process,
)

STEPS = 3


def _train(model, forward, opt, batches):
    rank, world = dtlab.rank(), dtlab.world_size()
    for tokens, targets in batches:
        opt.zero_grad()
        lm_loss(
            forward(rank_slice(tokens, rank, world)), rank_slice(targets, rank, world)
        ).backward()
        opt.step()


def _zero3_and_fsdp2_on_the_toy_model() -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    batches = toy_batches(STEPS)
    reference = TiedToyModel(seed=0)
    ref = train_single_process(
        reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9), batches
    )

    ours = TiedToyModel(seed=0)
    fsdp = FullyShardedDataParallel(ours, units=[ours.up, ours.down, ours.branch])
    _train(ours, fsdp, fsdp.build_optimizer(torch.optim.SGD, lr=0.1, momentum=0.9), batches)
    from dtlab.parallel.zero.full_state import gather_full_parameters

    ours_full = gather_full_parameters(fsdp)

    theirs = TiedToyModel(seed=0)
    mesh = init_device_mesh("cpu", (dtlab.world_size(),))
    for unit in (theirs.up, theirs.down, theirs.branch, theirs):
        fully_shard(unit, mesh=mesh)
    _train(theirs, theirs, torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9), batches)
    theirs_full = {n: p.full_tensor().detach().clone() for n, p in theirs.named_parameters()}
    return {
        "zero3_vs_single": max_abs_difference(ours_full, ref),
        "fsdp2_vs_single": max_abs_difference(theirs_full, ref),
        "zero3_vs_fsdp2": max_abs_difference(ours_full, theirs_full),
        "params_freed_after_step": fsdp.held_parameter_bytes()
        == sum(u.shard.numel() * 4 for u in fsdp.units),
    }


def test_zero3_matches_single_process_and_fsdp2_fully_shard(cluster2):
    for r in cluster2.run(_zero3_and_fsdp2_on_the_toy_model):
        assert r.pop("params_freed_after_step")
        for name, diff in r.items():
            assert diff < FP32_STEP_TOLERANCE, (name, r)
