"""The whole lab GPT, context-parallel, computes the loss and gradients of one process.

Every rank builds the same ``GPT(config, seed=0)`` in fp64, swaps its attention cores with
:func:`parallelize_context`, and runs its own tokens at their global positions; the mean of the
ranks' losses and the CP-averaged parameter gradients must equal the single-process loss and
gradients on the whole sequence, for ring (contiguous), zig-zag ring, Ulysses and all-gather K/V.
"""

from __future__ import annotations

import pytest
import torch

TOLERANCE = 1e-10


def _step_on_rank(style: str, collectives: str, kv_heads: int = 2, dp: int = 1) -> dict:
    from dtlab.comm import Communicator
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.parallel.context import average_gradients, parallelize_context, shard_batch

    config = GPTConfig.tiny(seq_len=16, d_model=32, n_kv_heads=kv_heads)
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=2, seed=3)[0]
    reference = GPT(config, seed=0, dtype=torch.float64)
    ref_loss = loss_fn(reference(tokens), targets)
    ref_loss.backward()

    if dp == 1:
        comm = Communicator(None, collectives=collectives, dim="cp")
    else:  # a dp × cp mesh: each CP group rings only among itself
        from dtlab.mesh import Mesh

        mesh = Mesh(dp=dp, cp=torch.distributed.get_world_size() // dp)
        comm = Communicator.along(mesh, "cp", collectives)
    model = parallelize_context(GPT(config, seed=0, dtype=torch.float64), comm, style)
    local_tokens, local_targets, positions = shard_batch(tokens, targets, comm, style)
    loss = loss_fn(model(local_tokens, positions=positions), local_targets)
    loss.backward()
    average_gradients(model, comm)
    mean_loss = loss.detach().clone()
    comm.all_reduce(mean_loss)
    ref_grads = dict(reference.named_parameters())
    grad_error = max(
        (p.grad - ref_grads[n].grad).abs().max().item() for n, p in model.named_parameters()
    )
    return {"loss": abs(mean_loss.item() / comm.world_size - ref_loss.item()), "grads": grad_error}


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_gpt_loss_and_every_gradient_equal_one_process(world, request):
    cluster = request.getfixturevalue(f"cluster{world}")
    styles = [("ring", "dtlab"), ("zigzag", "torch"), ("allgather", "dtlab")]
    if world == 2:  # 2 KV heads: Ulysses fits cp=2, not cp=4
        styles.append(("ulysses", "dtlab"))
    for style, via in styles:
        for result in cluster.run(_step_on_rank, style, via):
            assert result["loss"] < TOLERANCE and result["grads"] < TOLERANCE, (style, result)


def test_ulysses_gpt_with_four_kv_heads_on_four_ranks_equals_one_process(cluster4):
    for result in cluster4.run(_step_on_rank, "ulysses", "dtlab", 4):
        assert result["loss"] < TOLERANCE and result["grads"] < TOLERANCE, result


def test_zigzag_ring_over_the_cp_groups_of_a_dp_by_cp_mesh_equals_one_process(cluster4):
    for via in ("dtlab", "torch"):
        for result in cluster4.run(_step_on_rank, "zigzag", via, 2, 2):
            assert result["loss"] < TOLERANCE and result["grads"] < TOLERANCE, (via, result)
