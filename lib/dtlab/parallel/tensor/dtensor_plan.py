"""The same split in PyTorch's production tensor parallelism (DTensor), for parity and benchmarks.

``torch.distributed.tensor.parallel.parallelize_module`` with torchtitan's plan for a Llama,
adapted to the lab GPT's module names. Each style states layouts; DTensor inserts the
collectives that convert one layout into the next:

=========================  ==================================================================
module                     style (TP; the SP variant where it differs)
=========================  ==================================================================
``embed``                  ``RowwiseParallel`` — vocabulary rows; output ``Replicate``
                           (all-reduce), SP ``Shard(1)`` (reduce-scatter along the sequence)
``pos_embed``              SP only: ``PrepareModuleOutput`` Replicate → ``Shard(0)``: this
                           rank's positions (its gradient is all-gathered in backward)
``attn_norm``/``mlp_norm``  SP only: ``SequenceParallel``
``attn``/``mlp``           ``PrepareModuleInput`` → ``Replicate`` DTensor: entering the
                           region once (SP: from ``Shard(1)``, the all-gather)
``q/k/v_proj``, ``fc_in``  ``ColwiseParallel``
``out_proj``, ``fc_out``   ``RowwiseParallel`` (SP: output ``Shard(1)``, a reduce-scatter)
``final_norm``             SP only: ``SequenceParallel``
``lm_head``                ``ColwiseParallel`` with output ``Shard(-1)`` kept as a DTensor,
                           for :func:`torch.distributed.tensor.parallel.loss_parallel`
=========================  ==================================================================

A tied head is re-tied after sharding (``parallelize_module`` gives each module its own
parameter; both are ``Shard(0)`` of the same vocabulary rows, so one DTensor serves both).
The loss is ``F.cross_entropy`` under ``with loss_parallel():`` (:func:`dtensor_loss_backward`).
Gradients of the SP-replicated parameters come back as ``Partial`` DTensors — DTensor sums
them lazily, when they are read as replicated (``.full_tensor()``, or the optimizer's update).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def dtensor_parallelize_gpt(model: nn.Module, tp_mesh, sequence_parallel: bool = False):
    """Apply PyTorch's tensor (and sequence) parallelism to a lab GPT over the 1-D ``tp_mesh``
    (e.g. ``mesh.device_mesh["tp"]``), in place; returns the model."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    sp = sequence_parallel
    tied = model.lm_head.weight is model.embed.weight
    between_blocks = Shard(1) if sp else Replicate()
    ends = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=between_blocks),
        "lm_head": ColwiseParallel(
            input_layouts=between_blocks, output_layouts=Shard(-1), use_local_output=False
        ),
    }
    if sp:
        ends["pos_embed"] = PrepareModuleOutput(
            output_layouts=Replicate(), desired_output_layouts=Shard(0)
        )
        ends["final_norm"] = SequenceParallel()
    parallelize_module(model, tp_mesh, ends)
    if tied:
        model.lm_head.weight = model.embed.weight

    for block in model.blocks:
        plan = {
            # One layout change per region (an all-gather with SP; without, a single
            # all-reduce of dL/dx in backward instead of one per projection).
            "attn": PrepareModuleInput(
                input_layouts=(between_blocks, None), desired_input_layouts=(Replicate(), None)
            ),
            "mlp": PrepareModuleInput(
                input_layouts=(between_blocks,), desired_input_layouts=(Replicate(),)
            ),
            "attn.q_proj": ColwiseParallel(),
            "attn.k_proj": ColwiseParallel(),
            "attn.v_proj": ColwiseParallel(),
            "attn.out_proj": RowwiseParallel(output_layouts=between_blocks),
            "mlp.fc_in": ColwiseParallel(),
            "mlp.fc_out": RowwiseParallel(output_layouts=between_blocks),
        }
        if sp:
            plan["attn_norm"] = SequenceParallel()
            plan["mlp_norm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, plan)
    return model


def dtensor_loss_backward(logits, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of vocabulary-sharded DTensor logits, and its backward, both under
    :func:`~torch.distributed.tensor.parallel.loss_parallel` (it must cover both). Returns the
    loss as a plain tensor."""
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
    return loss.full_tensor().detach()


def dtensor_param_groups(model: nn.Module) -> list[dict]:
    """``model``'s parameters as two optimizer groups: the DTensors, then the plain tensors.

    Without SP the norms stay plain tensors beside the sharded DTensor weights, and a fused
    (``foreach``) optimizer step over one mixed list raises "got mixed torch.Tensor and DTensor"
    — torch's default on CUDA (seen on an H200, torch 2.11), not on CPU. Each group is stepped
    by its own foreach call, so each list is of one kind; an empty group is left out.
    """
    from torch.distributed.tensor import DTensor

    params = [p for p in model.parameters() if p.requires_grad]
    kinds = ([p for p in params if isinstance(p, DTensor)],
             [p for p in params if not isinstance(p, DTensor)])  # fmt: skip
    return [{"params": group} for group in kinds if group]
