"""Our tensor/sequence parallel GPT gives PyTorch's production TP's loss and gradients.

PyTorch's side is DTensor: ``parallelize_module`` with ``ColwiseParallel``, ``RowwiseParallel``,
``SequenceParallel``, ``PrepareModuleInput``/``PrepareModuleOutput`` and ``loss_parallel``
(:func:`dtlab.parallel.tensor.dtensor_parallelize_gpt`), all of which run on CPU gloo with this
torch. Same model (tied embedding and head), same batch, fp64: the loss and every parameter's
full gradient agree to :data:`TOLERANCE` (only the order of sums differs), and so do the
activation bytes each rank saves in one block — DTensor keeps the same tensors we do.
"""

from __future__ import annotations

import pytest
import torch

from dtlab.models import GPT, GPTConfig, SyntheticTokens

TOLERANCE = 1e-12
CONFIG = GPTConfig.tiny(seq_len=16, d_model=32)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _ours_and_dtensor_on_rank(sequence_parallel: bool) -> dict:
    from dtlab.memory import ActivationMeter
    from dtlab.mesh import Mesh
    from dtlab.parallel.tensor import (
        dtensor_loss_backward,
        dtensor_parallelize_gpt,
        parallelize_gpt,
    )

    mesh = Mesh(tp=torch.distributed.get_world_size())
    tokens, targets = SyntheticTokens(CONFIG, n_batches=1, batch_size=2, seed=5)[0]

    tp = parallelize_gpt(GPT(CONFIG, seed=0, dtype=torch.float64), mesh, sequence_parallel)
    ours_loss = tp.loss(tp.model(tokens), targets)
    ours_loss.backward()
    tp.finish_gradients()
    ours = tp.full_gradients()

    theirs_model = dtensor_parallelize_gpt(
        GPT(CONFIG, seed=0, dtype=torch.float64), mesh.device_mesh["tp"], sequence_parallel
    )
    theirs_loss = dtensor_loss_backward(theirs_model(tokens), targets)
    theirs = {n: _full(p.grad) for n, p in theirs_model.named_parameters()}

    local_seq = CONFIG.seq_len // (mesh.tp_size if sequence_parallel else 1)
    saved = {}
    for name, model in (("ours", tp.model), ("dtensor", theirs_model)):
        x = torch.randn(2, local_seq, CONFIG.d_model, dtype=torch.float64, requires_grad=True)
        with ActivationMeter(model) as meter:
            model.blocks[0](x, torch.arange(CONFIG.seq_len))
        saved[name] = meter.total_bytes
    return {
        "names": sorted(ours) == sorted(theirs),
        "loss": abs(ours_loss.item() - theirs_loss.item()),
        "grads": max((ours[n] - theirs[n]).abs().max().item() for n in ours),
        "saved": saved,
    }


@pytest.mark.parametrize("world", [2, 4])
def test_loss_and_gradients_match_dtensor_tensor_and_sequence_parallel(world, request):
    cluster = request.getfixturevalue(f"cluster{world}")
    for sp in (False, True):
        for r in cluster.run(_ours_and_dtensor_on_rank, sp):
            assert r["names"], r
            assert r["loss"] < TOLERANCE, (sp, r)
            assert r["grads"] < TOLERANCE, (sp, r)
            assert r["saved"]["ours"] == r["saved"]["dtensor"], (sp, r)


def _foreach_step_on_rank(grouped: bool) -> str:
    from dtlab.mesh import Mesh
    from dtlab.parallel.tensor import dtensor_loss_backward, dtensor_param_groups
    from dtlab.parallel.tensor import dtensor_parallelize_gpt as parallelize

    mesh = Mesh(tp=torch.distributed.get_world_size())
    model = parallelize(GPT(CONFIG, seed=0), mesh.device_mesh["tp"], False)
    tokens, targets = SyntheticTokens(CONFIG, n_batches=1, batch_size=2, seed=5)[0]
    dtensor_loss_backward(model(tokens), targets)
    params = dtensor_param_groups(model) if grouped else model.parameters()
    try:  # foreach: CUDA's default, forced here so a CPU run takes the same path
        torch.optim.AdamW(params, lr=1e-3, foreach=True).step()
    except RuntimeError as error:
        return str(error)
    return "stepped"


def test_a_foreach_optimizer_steps_dtensor_tp_only_with_its_parameters_grouped_by_kind(cluster2):
    """Without SP the norms stay plain tensors: one mixed foreach list raises (the GPU bench's
    failure on an H200); :func:`dtensor_param_groups` steps it."""
    mixed = cluster2.run(_foreach_step_on_rank, False)[0]
    if mixed != "stepped":  # a later torch may accept mixed lists; the grouped path must step
        assert "mixed torch.Tensor and DTensor" in mixed
    assert cluster2.run(_foreach_step_on_rank, True) == ["stepped", "stepped"]
