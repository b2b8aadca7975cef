"""Bytes held and bytes sent per rank equal the ZeRO formulas exactly, at N = 2 and N = 4."""

from __future__ import annotations

import pytest
import torch

import dtlab
from dtlab.memory import measure_model_state, model_state_bytes, zero_comm_bytes_per_rank
from dtlab.parallel import BucketedDDP, FullyShardedDataParallel, MixedPrecision, ZeroOptimizer
from dtlab.parallel.equivalence import TiedToyModel, lm_loss, rank_slice, toy_batches


def _held_and_sent(stage: int, recipe: str) -> dict:
    """Train one step (so Adam state exists), then measure step 2: held after backward, sent."""
    rank, world = dtlab.rank(), dtlab.world_size()
    mp = MixedPrecision() if recipe == "mixed_adam" else None
    model = TiedToyModel(seed=0)
    if stage == 0:
        forward = BucketedDDP(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        stats = forward.comm_stats
    elif stage in (1, 2):
        if mp is not None:
            model.to(mp.param_dtype)
        forward = model
        opt = ZeroOptimizer(
            model.parameters(), torch.optim.AdamW, stage=stage, mixed_precision=mp, lr=1e-2
        )
        stats = opt.comm_stats
    else:
        forward = FullyShardedDataParallel(
            model, units=[model.up, model.down, model.branch], mixed_precision=mp
        )
        opt = forward.build_optimizer(torch.optim.AdamW, lr=1e-2)
        stats = forward.comm_stats
    held = None
    for step, (tokens, targets) in enumerate(toy_batches(2)):
        if step == 1:
            stats.reset()
        opt.zero_grad()
        lm_loss(
            forward(rank_slice(tokens, rank, world)), rank_slice(targets, rank, world)
        ).backward()
        if step == 1:
            if stage == 0:
                report = measure_model_state(model, opt).by_category
                held = {k: report[k] for k in ("parameters", "gradients", "optimizer_state")}
                # The formulas count trained parameters; the frozen layer is replicated anyway.
                frozen = sum(p.numel() * 4 for p in model.parameters() if not p.requires_grad)
                held["parameters"] -= frozen
            else:
                h = opt.held_bytes()
                held = {
                    "parameters": h["params"],
                    "gradients": h["grads"],
                    "optimizer_state": h["optimizer_state"],
                }
        opt.step()
    psi = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"held": held, "sent": stats.bytes_sent, "psi": psi}


CASES = [(0, "fp32_adam")] + [(s, r) for s in (1, 2, 3) for r in ("fp32_adam", "mixed_adam")]


def _all_cases():
    return {case: _held_and_sent(*case) for case in CASES}


@pytest.mark.parametrize("world", [2, 4])
def test_zero_stage_bytes_held_and_sent_per_rank_match_formulas(world, request):
    cluster = request.getfixturevalue(f"cluster{world}")
    per_rank = cluster.run(_all_cases)
    for (stage, recipe), measured in per_rank[0].items():
        psi = measured["psi"]
        expected = model_state_bytes(psi, world, stage, recipe).by_category
        assert measured["held"] == expected, (stage, recipe, world)
        bytes_per_elem = 2 if recipe == "mixed_adam" else 4
        assert measured["sent"] == zero_comm_bytes_per_rank(psi, world, stage, bytes_per_elem)
    for r in per_rank[1:]:  # every rank holds and sends the same
        assert r == per_rank[0]
    # The headline ratios: ZeRO-1/2 move what DDP moves; ZeRO-3 moves 1.5x.
    ddp = per_rank[0][(0, "fp32_adam")]["sent"]
    assert per_rank[0][(1, "fp32_adam")]["sent"] == per_rank[0][(2, "fp32_adam")]["sent"] == ddp
    assert per_rank[0][(3, "fp32_adam")]["sent"] == 1.5 * ddp
