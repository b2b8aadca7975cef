"""FSDP × TP and PP × DP × TP composed by dtlab equal PyTorch's own compositions on the same mesh.

3-D: torch's recipe is DTensor TP, the model cut into stages, ``fully_shard`` over dp on each
stage and ``torch.distributed.pipelining``'s ``Schedule1F1B`` (the loss under
``loss_parallel``); ours is :func:`compose_gpt` with DDP over dp — the gradients agree.

PyTorch's 2-D recipe (torchtitan): ``parallelize_module`` with the lab GPT's DTensor TP plan
(:func:`dtlab.parallel.tensor.dtensor_parallelize_gpt`) over the mesh's ``tp`` dimension, then
``fully_shard`` on every block and the root over its ``dp`` dimension, loss under
``loss_parallel``. Ours: :func:`dtlab.parallel.compose.compose_gpt` with ``data_parallel="fsdp"``
on the same ``Mesh(dp=2, tp=2)`` (whose groups *are* the ``DeviceMesh``'s). Same fp64 model,
same global batch: the loss and every full gradient agree to rounding.
"""

from __future__ import annotations

import torch

import dtlab

TOLERANCE = 1e-10


def _ours_and_torchs(sequence_parallel: bool) -> dict:
    from torch.distributed.fsdp import fully_shard

    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.tensor import dtensor_loss_backward, dtensor_parallelize_gpt

    config = GPTConfig.tiny(seq_len=16, d_model=32, vocab_size=64, dropout=0.0)
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=4, seed=3)[0]
    mesh = Mesh(dp=2, tp=2)

    ours = compose_gpt(
        GPT(config, seed=0, dtype=torch.float64), mesh, data_parallel="fsdp",
        sequence_parallel=sequence_parallel,
    )  # fmt: skip
    our_loss = ours.train_step(tokens, targets)
    our_grads = ours.local_full_gradients()

    theirs = dtensor_parallelize_gpt(
        GPT(config, seed=0, dtype=torch.float64), mesh.device_mesh["tp"], sequence_parallel
    )
    for block in theirs.blocks:
        fully_shard(block, mesh=mesh.device_mesh["dp"])
    fully_shard(theirs, mesh=mesh.device_mesh["dp"])
    rows = slice(mesh.dp_rank * 2, mesh.dp_rank * 2 + 2)
    their_loss = dtensor_loss_backward(theirs(tokens[rows]), targets[rows]).detach()
    torch.distributed.all_reduce(their_loss, group=mesh.dp_group)
    their_grads = {n: p.grad.full_tensor() for n, p in theirs.named_parameters()}
    return {
        "loss": abs(our_loss - their_loss.item() / 2),
        "grads": max((our_grads[n] - g).abs().max().item() for n, g in their_grads.items()),
        "same_names": sorted(our_grads) == sorted(their_grads),
    }


def test_fsdp_by_tp_equals_torch_fully_shard_over_parallelize_module(cluster4):
    for sp in (False, True):
        for result in cluster4.run(_ours_and_torchs, sp):
            assert result["same_names"], sp
            assert result["loss"] < TOLERANCE and result["grads"] < TOLERANCE, (sp, result)


def test_bench_compose_runs_both_compositions_and_reports_a_ratio_to_torch(cluster4):
    from dtlab.bench import compose

    results = compose.run(cluster4, dp=2, tp=2, steps=1, repeats=1)
    assert [r.implementation for r in results] == list(compose.IMPLEMENTATIONS)
    baseline = results[-1]
    assert baseline.vs_torch.median == 1.0 and all(r.step_s > 0 for r in results)


def _ours_and_torchs_3d() -> dict:
    import torch.distributed.pipelining as pipelining
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import loss_parallel

    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, split_into_stages
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.pipeline import one_f_one_b
    from dtlab.parallel.tensor import dtensor_parallelize_gpt

    # Untied: torch's pipelining does not sum a tied embedding's two copies across stages (see
    # tests/test_pp_parity.py); ours does, so a tied model differs there by design.
    config = GPTConfig.tiny(
        seq_len=16, d_model=32, n_layers=4, vocab_size=64, dropout=0.0, tie_embeddings=False
    )
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=8, seed=3)[0]
    mesh = Mesh(pp=2, dp=2, tp=2)
    ours = compose_gpt(GPT(config, seed=0, dtype=torch.float64), mesh, schedule=one_f_one_b(2, 2))
    ours.train_step(tokens, targets)
    our_grads = ours.local_full_gradients()

    # torch's 3-D recipe: DTensor TP, cut into stages, FSDP2 over dp on each stage, 1F1B.
    model = dtensor_parallelize_gpt(
        GPT(config, seed=0, dtype=torch.float64), mesh.device_mesh["tp"]
    )
    stage_module = split_into_stages(model, 2)[mesh.pp_rank]
    for block in stage_module.blocks.values():
        fully_shard(block, mesh=mesh.device_mesh["dp"])
    fully_shard(stage_module, mesh=mesh.device_mesh["dp"])
    stage = pipelining.PipelineStage(
        stage_module, mesh.pp_rank, 2, torch.device("cpu"), group=mesh.pp_group
    )

    def loss(logits, y):
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    schedule = pipelining.Schedule1F1B(stage, n_microbatches=2, loss_fn=loss)
    rows = slice(mesh.dp_rank * 4, mesh.dp_rank * 4 + 4)
    with loss_parallel():
        if mesh.pp_rank == 0:
            schedule.step(tokens[rows])
        else:
            schedule.step(target=targets[rows], losses=[])
    theirs = {n: p.grad.full_tensor() for n, p in stage_module.named_parameters()}
    return {
        "grads": max((our_grads[n] - g).abs().max().item() for n, g in theirs.items()),
        "same_names": sorted(our_grads) == sorted(theirs),
    }


def test_pp_by_dp_by_tp_equals_torch_pipelining_over_fully_shard_over_parallelize_module():
    with dtlab.Cluster(8, timeout=300) as cluster:
        for result in cluster.run(_ours_and_torchs_3d):
            assert result["same_names"] and result["grads"] < TOLERANCE, result
