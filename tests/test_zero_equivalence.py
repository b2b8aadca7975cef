"""ZeRO-1/2 train exactly like one process and like torch's ZeroRedundancyOptimizer.

SGD with momentum and weight decay: unlike Adam it is sensitive to the gradient's scale, so a
missing 1/N average would show.
"""

from __future__ import annotations

import torch

import dtlab
from dtlab.parallel import ZeroOptimizer
from dtlab.parallel.data.equivalence import (
    FP32_STEP_TOLERANCE,
    TiedToyModel,
    lm_loss,
    max_abs_difference,
    parameters_by_name,
    rank_slice,
    toy_batches,
    train_single_process,
)

STEPS = 3


def _param_groups(model):
    """Two groups with different hyperparameters, handed over as dicts (tied weight once)."""
    decay = [model.up.weight, model.down.weight, model.embed.weight]
    no_decay = [model.up.bias, model.down.bias, model.branch.weight, model.branch.bias]
    return [
        {"params": decay, "weight_decay": 0.1},
        {"params": no_decay + [model.frozen.weight], "weight_decay": 0.0, "lr": 0.05},
    ]


def _train_zero_variants() -> dict:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dtlab.rank(), dtlab.world_size()
    batches = toy_batches(STEPS)
    reference = TiedToyModel(seed=0)
    ref = train_single_process(
        reference, torch.optim.SGD(_param_groups(reference), lr=0.1, momentum=0.9), batches
    )
    out = {}
    for name in ("zero1", "zero2", "zero1_generator", "torch_zero"):
        model = TiedToyModel(seed=0)
        if name == "torch_zero":
            ddp = DistributedDataParallel(model)
            opt = ZeroRedundancyOptimizer(
                model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=0.1
            )
            forward = ddp
        elif name == "zero1_generator":
            opt = ZeroOptimizer(
                model.parameters(), torch.optim.SGD, stage=1, bucket_cap_mb=0.0004,
                lr=0.1, momentum=0.9, weight_decay=0.1,
            )  # fmt: skip
            forward = model
        else:
            stage = int(name[-1])
            opt = ZeroOptimizer(
                _param_groups(model),
                torch.optim.SGD,
                stage=stage,
                bucket_cap_mb=0.0004,
                lr=0.1,
                momentum=0.9,
            )
            forward = model
        for tokens, targets in batches:
            opt.zero_grad()
            lm_loss(
                forward(rank_slice(tokens, rank, world)), rank_slice(targets, rank, world)
            ).backward()
            opt.step()
        out[name] = parameters_by_name(model)
        out[f"{name}.tied"] = model.head.weight is model.embed.weight
    single_group_ref = TiedToyModel(seed=0)
    ref_generator = train_single_process(
        single_group_ref,
        torch.optim.SGD(single_group_ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1),
        batches,
    )
    return {
        "zero1": max_abs_difference(out["zero1"], ref),
        "zero2": max_abs_difference(out["zero2"], ref),
        "zero1_generator": max_abs_difference(out["zero1_generator"], ref_generator),
        "zero1_vs_torch_zero": max_abs_difference(out["zero1_generator"], out["torch_zero"]),
        "torch_zero": max_abs_difference(out["torch_zero"], ref_generator),
        "tied": all(v for k, v in out.items() if k.endswith(".tied")),
    }


def test_zero1_and_zero2_match_single_process_and_zero_redundancy_optimizer(cluster4):
    for r in cluster4.run(_train_zero_variants):
        assert r.pop("tied")
        for name, diff in r.items():
            assert diff < FP32_STEP_TOLERANCE, (name, r)
