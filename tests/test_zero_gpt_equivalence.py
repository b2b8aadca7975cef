"""On the lab GPT (tied embeddings, blocks as FSDP units): bucketed DDP, ZeRO-2 and ZeRO-3 train
exactly like one process. SGD with momentum, not Adam: Adam is invariant to the gradient's scale,
so it would not notice a missing 1/N."""

from __future__ import annotations

import torch

import dtlab
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
from dtlab.parallel import BucketedDDP, FullyShardedDataParallel, ZeroOptimizer
from dtlab.parallel.data.equivalence import (
    FP32_STEP_TOLERANCE,
    max_abs_difference,
    parameters_by_name,
)
from dtlab.parallel.zero.full_state import gather_full_parameters


def _gpt_equivalence() -> dict:
    rank, world = dtlab.rank(), dtlab.world_size()
    config = GPTConfig.tiny(seq_len=8, d_model=32, n_layers=2)
    batches = list(SyntheticTokens(config, n_batches=2, batch_size=4, seed=0))

    def train(model, forward, opt):
        for tokens, targets in batches:
            opt.zero_grad()
            x, y = (
                shard_for_rank((tokens, targets), rank, world)
                if forward is not None
                else (tokens, targets)
            )
            loss_fn((forward or model)(x), y).backward()
            opt.step()

    reference = GPT(config, seed=0)
    train(reference, None, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9))
    ref = parameters_by_name(reference)

    ddp_model = GPT(config, seed=0)
    ddp = BucketedDDP(ddp_model, bucket_cap_mb=0.02, first_bucket_mb=0.005)
    train(ddp_model, ddp, torch.optim.SGD(ddp_model.parameters(), lr=0.1, momentum=0.9))

    z2_model = GPT(config, seed=0)
    z2 = ZeroOptimizer(
        z2_model.parameters(), torch.optim.SGD, stage=2, bucket_cap_mb=0.02, lr=0.1, momentum=0.9
    )
    train(z2_model, z2_model, z2)

    z3_model = GPT(config, seed=0)
    fsdp = FullyShardedDataParallel(z3_model)  # default units: the blocks (an nn.ModuleList)
    train(z3_model, fsdp, fsdp.build_optimizer(torch.optim.SGD, lr=0.1, momentum=0.9))
    return {
        "ddp_bucketed": max_abs_difference(parameters_by_name(ddp_model), ref),
        "zero2": max_abs_difference(parameters_by_name(z2_model), ref),
        "zero3": max_abs_difference(gather_full_parameters(fsdp), ref),
        "units": len(fsdp.units),
        "buckets": len(ddp.buckets),
    }


def test_ddp_zero2_zero3_match_single_process_on_tiny_gpt(cluster2):
    for r in cluster2.run(_gpt_equivalence):
        assert r.pop("units") == 1 + 2  # root + one per block
        assert r.pop("buckets") > 2
        for name, diff in r.items():
            assert diff < FP32_STEP_TOLERANCE, (name, r)
