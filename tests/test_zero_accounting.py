"""Bytes held and bytes sent per rank equal the ZeRO formulas exactly, at N = 2 and N = 4."""

from __future__ import annotations

import pytest
import torch

import dtlab
from dtlab.memory import fsdp2_state_bytes, model_state_bytes, zero_comm_bytes_per_rank
from dtlab.parallel import MixedPrecision, shard_by_zero_stage
from dtlab.parallel.data.equivalence import TiedToyModel, lm_loss, rank_slice, toy_batches


def _held_and_sent(stage: int, recipe: str, collectives: str = "dtlab") -> dict:
    """Train one step (so Adam state exists), then measure step 2: held after backward, sent."""
    rank, world = dtlab.rank(), dtlab.world_size()
    mp = MixedPrecision(torch.bfloat16) if recipe == "mixed_adam" else None
    model = TiedToyModel(seed=0)
    units = [model.up, model.down, model.branch]
    setup = shard_by_zero_stage(
        model, stage, torch.optim.AdamW, mixed_precision=mp, units=units,
        collectives=collectives, lr=1e-2,
    )  # fmt: skip
    forward, opt, stats = setup.forward, setup.optimizer, setup.comm_stats
    held = None
    for step, (tokens, targets) in enumerate(toy_batches(2)):
        if step == 1:
            stats.reset()
        opt.zero_grad()
        lm_loss(
            forward(rank_slice(tokens, rank, world)), rank_slice(targets, rank, world)
        ).backward()
        if step == 1:
            report = setup.held_by_category()
            held = {k: report[k] for k in ("parameters", "gradients", "optimizer_state")}
            if stage == 0:
                # The formulas count trained parameters; the frozen layer is replicated anyway.
                frozen = sum(p.numel() * 4 for p in model.parameters() if not p.requires_grad)
                held["parameters"] -= frozen
        opt.step()
    # Counted on a fresh model: a ZeRO-3 model registers only this rank's shards.
    psi = sum(p.numel() for p in TiedToyModel(seed=0).parameters() if p.requires_grad)
    return {"held": held, "sent": stats.bytes_sent, "psi": psi, "counted": stats.counted}


CASES = [(0, "fp32_adam")] + [(s, r) for s in (1, 2, 3) for r in ("fp32_adam", "mixed_adam")]


def _all_cases():
    """Every stage on dtlab's rings: the bytes are counted from the messages really sent."""
    return {case: _held_and_sent(*case) for case in CASES}


@pytest.mark.parametrize("world", [2, 4])
def test_zero_stage_bytes_held_and_sent_per_rank_match_formulas(world, request):
    cluster = request.getfixturevalue(f"cluster{world}")
    per_rank = cluster.run(_all_cases)
    for (stage, recipe), measured in per_rank[0].items():
        assert measured["counted"], "accounting must use the counted path"
        psi = measured["psi"]
        if stage == 3:  # FSDP2's layout: fp32 shards are the masters (same 16Ψ/N in total)
            expected = fsdp2_state_bytes(psi, world, recipe).by_category
            assert sum(expected.values()) == model_state_bytes(psi, world, 3, recipe).total
        else:
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


def test_shard_by_zero_stage_says_which_stages_exist_and_where_mixed_precision_goes():
    with pytest.raises(ValueError, match=r"choose 0 \(DDP\), 1, 2 or 3"):
        shard_by_zero_stage(TiedToyModel(seed=0), 4, torch.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="choose stage 1, 2 or 3"):
        shard_by_zero_stage(
            TiedToyModel(seed=0),
            0,
            torch.optim.SGD,
            mixed_precision=MixedPrecision(torch.bfloat16),
            lr=0.1,
        )


def _torch_path_is_labelled_a_convention() -> dict:
    out = {}
    for collectives in ("torch", "dtlab"):
        measured = _held_and_sent(2, "fp32_adam", collectives)
        out[collectives] = (measured["counted"], measured["sent"])
    return out


def test_torch_collectives_report_ring_convention_and_dtlab_collectives_report_counts(cluster2):
    for r in cluster2.run(_torch_path_is_labelled_a_convention):
        assert r["torch"][0] is False and r["dtlab"][0] is True
        assert r["torch"][1] == r["dtlab"][1]  # the convention agrees with the count here
