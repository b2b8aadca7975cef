"""FSDP with pipeline stages trains like one process, gathering each stage once per step.

Each rank builds the same fp64 ``GPT(config, seed=0)``, composes it with pipeline stages and
FSDP (or HSDP) over dp, and runs training steps on the same global batch. Loss, every gradient
(each pipeline rank its own stages', gathered whole over dp and tp) and, after an SGD step on
the shards, the next step's loss equal single-process autograd's. The dp traffic is counted from
real messages and equals :func:`~dtlab.parallel.compose.stage_fsdp.stage_fsdp_bytes` — one
all-gather and one reduce-scatter per stage per step, the same for 2 and 4 micro-batches.
"""

from __future__ import annotations

import pytest
import torch

TOLERANCE = 1e-10


def _fsdp_pp_on_rank(
    degrees: dict, n_micro: int, data_parallel: str = "fsdp", schedule: str = "1f1b", **extra
) -> dict:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.pipeline import interleaved_1f1b, one_f_one_b, zbv

    config = GPTConfig.tiny(seq_len=16, d_model=32, n_layers=4, vocab_size=64, dropout=0.0)
    batches = SyntheticTokens(config, n_batches=2, batch_size=8, seed=3)
    reference = GPT(config, seed=0, dtype=torch.float64)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    ref_losses, ref_grads = [], {}
    for step, (tokens, targets) in enumerate(batches):
        ref_opt.zero_grad()
        loss = loss_fn(reference(tokens), targets)
        loss.backward()
        ref_losses.append(loss.item())
        if step == 0:  # the second step is checked by its loss
            ref_grads = {n: p.grad.clone() for n, p in reference.named_parameters()}
        ref_opt.step()

    mesh = Mesh(**degrees)
    composed = compose_gpt(
        GPT(config, seed=0, dtype=torch.float64),
        mesh,
        data_parallel=data_parallel,
        schedule={"1f1b": one_f_one_b, "interleaved": interleaved_1f1b, "zbv": zbv}[schedule](
            mesh.pp_size, n_micro
        ),
        collectives="dtlab",
        **extra,
    )
    opt = torch.optim.SGD(composed.parameters(), lr=0.5)
    losses, traffic = [], None
    for step, (tokens, targets) in enumerate(batches):
        opt.zero_grad()
        composed.reset_traffic()
        losses.append(composed.train_step(tokens, targets))
        if step == 0:
            traffic = composed.traffic().get("dp", {})
            grads = composed.local_full_gradients()
        opt.step()
    if config.tie_embeddings and "lm_head.weight" in grads:  # the last stage's copy of the tie
        grads["embed.weight"] = grads.pop("lm_head.weight")
    return {
        "loss": max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
        "grad_error": max((g - ref_grads[n]).abs().max().item() for n, g in grads.items()),
        "names": sorted(grads),
        "all_names": sorted(ref_grads),
        "traffic": traffic,
        "formula": composed.stage_shards.bytes_formula(n_micro),
        "per_micro_batch": composed.stage_shards.bytes_formula(n_micro, per_micro_batch=True),
        "reduced": {n: p.reduced_over for n, p in composed.placements.items()},
        "whole_held": sum(
            p.numel() for m in composed.pipeline.stages.values() for p in m.parameters()
        ),  # fmt: skip
    }


def _check(results) -> None:
    covered = set()
    for result in results:
        assert result["loss"] < TOLERANCE, result["loss"]
        assert result["grad_error"] < TOLERANCE, result["grad_error"]
        covered |= set(result["names"])
    assert covered == set(results[0]["all_names"])


@pytest.mark.parametrize("n_micro", [2, 4])
def test_fsdp_over_pipeline_stages_trains_like_one_process_for_two_steps(cluster4, n_micro):
    _check(cluster4.run(_fsdp_pp_on_rank, {"pp": 2, "dp": 2}, n_micro))


@pytest.mark.parametrize("n_micro", [2, 4])
def test_each_stage_is_gathered_and_reduced_once_per_step_whatever_the_micro_batches(
    cluster4, n_micro
):
    for result in cluster4.run(_fsdp_pp_on_rank, {"pp": 2, "dp": 2}, n_micro):
        traffic, formula = result["traffic"], result["formula"]
        assert traffic == formula, (traffic, formula)  # counted bytes == the formula
        assert formula["all_gather"] > 0
        # gathering around every micro-batch would send 2m gathers and m reductions
        assert result["per_micro_batch"]["all_gather"] == 2 * n_micro * formula["all_gather"]
        assert result["whole_held"] == 0  # between steps only the shards are held


@pytest.mark.parametrize("schedule", ["interleaved", "zbv"])
def test_two_stages_per_rank_each_gathered_once_train_like_one_process(cluster4, schedule):
    """Interleaved 1F1B (stages 0, 2 | 1, 3) and ZB-V (stages 0, 3 | 1, 2: the tied embedding
    and head on one rank, weight gradients in separate W actions)."""
    results = cluster4.run(_fsdp_pp_on_rank, {"pp": 2, "dp": 2}, 4, "fsdp", schedule)
    _check(results)
    for result in results:
        assert result["traffic"] == result["formula"]


def test_every_stage_parameter_is_sharded_over_dp_and_averaged_there(cluster4):
    result = cluster4.run(_fsdp_pp_on_rank, {"pp": 2, "dp": 2}, 2)[0]
    assert result["reduced"]["blocks.0.attn.q_proj.weight"] == ("dp",)
    assert result["reduced"]["embed.weight"] == ("dp", "pp")  # the tie: summed over its stages


@pytest.fixture(scope="module")
def cluster8():
    import dtlab

    with dtlab.Cluster(8, timeout=300) as cluster:
        yield cluster


def test_fsdp_over_pipeline_and_tensor_stages_trains_like_one_process(cluster8):
    _check(cluster8.run(_fsdp_pp_on_rank, {"pp": 2, "dp": 2, "tp": 2}, 2))


def test_hsdp_over_pipeline_stages_trains_like_one_process(cluster8):
    """dp = 4 split into shard blocks of 2, the shards' gradients averaged across the blocks."""
    _check(cluster8.run(_fsdp_pp_on_rank, {"pp": 2, "dp": 4}, 2, "hsdp", hsdp_shard=2))


def _torch_fsdp2_pipelining_on_rank(n_micro: int = 2) -> dict:
    """torch's own recipe on the same ranks: ``fully_shard`` (FSDP2, ``reshard_after_forward=
    False`` as torchtitan sets it under pipelining) on each ``PipelineStage``'s module, run by
    ``Schedule1F1B``; then dtlab's ``compose_gpt`` with the same layout. Both stages' gradients,
    gathered whole, are compared with each other."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, split_into_stages
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.pipeline import one_f_one_b

    config = GPTConfig.tiny(
        seq_len=16, d_model=32, n_layers=4, vocab_size=64, dropout=0.0, tie_embeddings=False
    )
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=8, seed=3)[0]
    mesh = Mesh(pp=2, dp=2)
    rows = tokens.shape[0] // mesh.dp_size
    mine = slice(mesh.dp_rank * rows, (mesh.dp_rank + 1) * rows)

    device_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    stage_module = split_into_stages(GPT(config, seed=0, dtype=torch.float64), 2)[mesh.pp_rank]
    fully_shard(stage_module, mesh=device_mesh["dp"], reshard_after_forward=False)
    stage = PipelineStage(
        stage_module, mesh.pp_rank, 2, torch.device("cpu"), group=device_mesh.get_group("pp")
    )
    schedule = Schedule1F1B(stage, n_micro, loss_fn=loss_fn)
    if mesh.pp_rank == 0:
        schedule.step(tokens[mine])
    else:
        schedule.step(target=targets[mine])
    theirs = {n: p.grad.full_tensor() for n, p in stage_module.named_parameters()}
    dist.barrier()

    composed = compose_gpt(
        GPT(config, seed=0, dtype=torch.float64),
        mesh,
        data_parallel="fsdp",
        schedule=one_f_one_b(2, n_micro),
    )
    composed.train_step(tokens, targets)
    ours = composed.local_full_gradients()
    assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
    return {
        "error": max((ours[n] - theirs[n]).abs().max().item() for n in ours),
        "smallest": min(g.abs().max().item() for g in theirs.values()),  # every stage learns
    }


def test_fsdp_over_pipeline_stages_matches_torchs_fully_shard_with_pipelining(cluster4):
    for result in cluster4.run(_torch_fsdp2_pipelining_on_rank):
        assert result["error"] < TOLERANCE and result["smallest"] > 0, result
