"""The third stage of work on a composed GPT: the accounts — where each parameter lives, what
every group sent, and the whole gradients for checking against a single process.

* :func:`place_composed` — each parameter's :class:`~dtlab.parallel.compose.placement.Placement`
  (which groups hold copies, which reduce its gradient), worked out once when applying;
* :attr:`ComposedAccount.communicators` — every communicator the step uses, by group, whose
  :class:`~dtlab.collectives.stats.CommStats` hold the bytes (:meth:`~ComposedAccount.traffic`);
* :meth:`ComposedAccount.local_full_gradients` — this rank's gradients gathered whole over tp and
  FSDP's dp, under the full model's names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dtlab.comm import Communicator, gather_along
from dtlab.models.moe import is_expert_param
from dtlab.parallel.compose.placement import Placement, place_parameters

if TYPE_CHECKING:
    from dtlab.parallel.compose.apply import ComposedGPT


def place_composed(
    composed: ComposedGPT, *, tp_partial: set[str], tied: bool
) -> dict[str, Placement]:
    """Name → placement of every parameter ``composed`` trains on this rank. ``tp_partial``:
    the names whose gradients are partial sums over tp (sequence parallel); ``tied``: the LM
    head is the token embedding (held by the first and the last stage under pipelining)."""
    mesh = composed.mesh
    names = list(composed.parameters_by_name)
    degrees = {d: getattr(mesh, f"{d}_size") for d in ("pp", "dp", "cp", "tp", "ep", "edp")}
    folded = composed.folded is not None
    if folded:  # the MoE layers' own mapping of the same ranks
        degrees |= composed.folded.degrees
    if composed.hsdp_shard:  # sharded inside the block, replicated across: dp splits in two
        degrees["dp_shard"] = composed.hsdp_shard
        degrees["dp_replicate"] = mesh.dp_size // composed.hsdp_shard
    return place_parameters(
        names,
        degrees,
        tp_sharded=set(composed.tp_shard_dims),
        tp_partial=tp_partial,
        dp_sharded=set(names) if composed.fsdp or composed.stage_shards else set(),
        tied={"embed.weight", "lm_head.weight"} if tied and mesh.pp_size > 1 else set(),
        hybrid=bool(composed.hsdp_shard),
        expert={n for n in names if is_expert_param(n)} if mesh.layout.ep > 1 or folded else set(),
        folded=folded,
    )


class ComposedAccount:
    """The accounts of a :class:`~dtlab.parallel.compose.apply.ComposedGPT` (mixed into it;
    every attribute read here is one of its fields)."""

    @property
    def communicators(self: ComposedGPT) -> dict[str, Communicator]:
        """Every communicator this rank's training step uses, by group: ``tp``, ``cp``, ``pp``
        (the pipeline's sends), ``embedding`` (the tied embedding's two stages), ``dp`` (DDP's
        all-reduce or FSDP's gathers and reduce-scatters), ``dp_replicate`` (HSDP)."""
        communicators = {d: c for d, c in self.mesh_communicators.items() if c.world_size > 1}
        if self.pipeline is not None:
            communicators["pp"] = self.pipeline.comm
            if self.pipeline.tied_comm is not None:
                communicators["embedding"] = self.pipeline.tied_comm
        if self.fsdp is not None:
            communicators["dp"] = self.fsdp.comm
        if self.stage_shards is not None:
            communicators["dp"] = self.stage_shards.comm
        if self.replica_comm is not None and self.replica_comm.world_size > 1:
            communicators["dp_replicate"] = self.replica_comm
        return communicators

    def reset_traffic(self: ComposedGPT) -> None:
        """Zero every communicator's byte counts."""
        for comm in self.communicators.values():
            comm.comm_stats.reset()

    def traffic(self: ComposedGPT) -> dict[str, dict[str, int]]:
        """Bytes this rank sent since :meth:`reset_traffic`, by group and collective — counted
        from real messages when built with ``collectives="dtlab"`` (``comm_stats.counted``)."""
        return {
            group: dict(comm.comm_stats.bytes_by_op)
            for group, comm in self.communicators.items()
            if comm.comm_stats.bytes_by_op
        }

    def local_full_gradients(self: ComposedGPT) -> dict[str, torch.Tensor]:
        """Name → gradient of every parameter this rank's stage holds, gathered whole over tp
        and dp (FSDP); pipeline stages differ, so each rank returns only its own. FSDP keeps
        the model's own names (it registers its shards in the model's slots), so both paths
        name parameters as the full model does."""
        if self.fsdp is not None:
            grads = self.fsdp.full_gradients()
        elif self.stage_shards is not None:
            grads = self.stage_shards.full_gradients()
        else:
            grads = {n: p.grad.detach().clone() for n, p in self.named_parameters()}
        if self.tp is None:
            return grads
        grads = {
            n: gather_along(g, self.tp_shard_dims[n], self.tp.comm)
            if n in self.tp_shard_dims
            else g
            for n, g in grads.items()
        }
        # a vocabulary tp does not divide was padded: cut the padding rows off again
        return {
            n: g[: self.tp.vocab_size] if n in self.tp_vocab_names else g for n, g in grads.items()
        }
