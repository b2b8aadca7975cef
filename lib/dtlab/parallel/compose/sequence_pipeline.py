"""Sequence parallel inside pipeline stages: what a stage sends is its sequence shard.

Under sequence parallelism (Korthikanti et al. 2022, §4.2.2) the activation *between* two
transformer blocks is cut along the sequence over the ``t`` tensor-parallel ranks: rank ``r``
holds tokens ``[r·S/t, (r+1)·S/t)`` of the residual stream, and each block all-gathers the
sequence on entering its attention and MLP regions and reduce-scatters on leaving them. A
pipeline boundary falls between two blocks, so the activation a stage hands to the next is
already that shard: tp rank ``r`` of stage ``s`` sends its ``(b, S/t, d)`` to tp rank ``r`` of
stage ``s+1`` (the same tp coordinate on the next pp rank), and the gradient comes back the same
size. Megatron-LM does the same (its p2p communication sends the sequence-parallel shard when
``sequence_parallel`` is on: ``get_tensor_shapes`` divides the sequence length by the tp size).

Bytes per boundary and micro-batch, each way (:func:`stage_boundary_bytes`): ``b·S·d·e / t``
with sequence parallel against ``b·S·d·e`` without — ``1/t`` of the non-SP case, where every tp
rank sends the same whole activation (Megatron's ``scatter_gather_tensors_in_pipeline`` dedupe is
the other way to avoid that redundancy).

The executor receives into a buffer it shapes itself (``(b, S, d)``) and a later stage takes its
positions from its input's length; :class:`SequenceShardedPipeline` changes both: it receives
``(b, S/t, d)`` and hands every stage the whole sequence's positions.
"""

from __future__ import annotations

import torch

from dtlab.comm import Communicator
from dtlab.models.gpt import default_positions
from dtlab.parallel.pipeline import PipelineExecutor, Schedule, embedding_group
from dtlab.parallel.pipeline.replay import peer_stage


def stage_boundary_bytes(
    micro_batch: int, seq_len: int, d_model: int, element_size: int, *, tp: int = 1, sp: bool
) -> int:
    """Bytes one tp rank sends over one stage boundary for one micro-batch, one way: the
    sequence shard ``b·(S/t)·d·e`` with sequence parallel, the whole ``b·S·d·e`` without."""
    return micro_batch * (seq_len // (tp if sp else 1)) * d_model * element_size


class SequenceShardedPipeline(PipelineExecutor):
    """A :class:`~dtlab.parallel.pipeline.PipelineExecutor` whose stages exchange sequence
    shards: each receive buffer is ``(b, S/t, d)`` (``seq_shards = t``)."""

    seq_shards: int = 1

    def step(self, inputs, targets, positions=None):
        """As the executor's, with the whole sequence's positions handed to every stage: a
        later stage receives ``S/t`` tokens but its blocks gather all ``S`` (their default,
        ``0..x.shape[1]-1``, would be the shard's length)."""
        if positions is None:
            config = next(iter(self.stages.values())).config
            positions = default_positions(inputs.shape[1], config, inputs.device)
        return super().step(inputs, targets, positions)

    def _message(self, a) -> None:
        if a.kind.startswith("SEND"):
            super()._message(a)
            return
        direction = a.kind[-1]
        peer = self.schedule.stage_ranks[peer_stage(a)]
        inputs = self._inputs[a.micro_batch]
        shape = (inputs.shape[0], inputs.shape[1] // self.seq_shards, self.hidden_size)
        buffer = torch.empty(shape, dtype=self.dtype, device=inputs.device)
        self.comm.recv(buffer, source=peer, name=str(a))
        self._inbox[(direction, a.stage, a.micro_batch)] = (
            buffer.requires_grad_() if direction == "F" else buffer
        )


def sequence_parallel_pipeline(
    model, mesh, schedule: Schedule, *, tp: int, collectives: str, loss_fn
) -> SequenceShardedPipeline:
    """The lab GPT (already tensor- and sequence-parallel over ``tp`` ranks) cut into the
    schedule's stages, this pipeline rank's kept, exchanging ``(b, S/tp, d)`` shards.
    Every rank must call this (the embedding groups are made collectively)."""
    from dtlab.models import split_into_stages

    if mesh.pp_size != schedule.n_ranks:
        raise ValueError(
            f"{schedule.name} is for p={schedule.n_ranks} pipeline ranks, but the mesh has "
            f"pp={mesh.pp_size}; build the schedule for p={mesh.pp_size}"
        )
    stages = split_into_stages(model, schedule.n_stages)
    mine = {s: stages[s] for s in schedule.stages_of(mesh.pp_rank)}
    tied = None
    if any(stage.tied_parameters for stage in stages):
        tied = embedding_group(mesh, schedule, collectives)
    pipe = SequenceShardedPipeline(
        mine,
        schedule,
        Communicator.along(mesh, "pp", collectives),
        hidden_size=model.config.d_model,
        loss_fn=loss_fn,
        dtype=next(model.parameters()).dtype,
        tied_comm=tied,
    )
    pipe.seq_shards = tp
    return pipe
