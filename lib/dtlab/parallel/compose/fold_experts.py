"""Expert parallel composed with tensor parallel: the MoE layers trained on the folded mapping.

Attention and dense MLPs keep the mesh's ``tp × cp × dp`` mapping (tensor parallel inside, as
without experts); the MoE layers use :class:`~dtlab.parallel.compose.folding.FoldedMapping`'s
``etp × ep × edp`` over the *same* ranks of each pipeline stage, with ``etp = 1``:

* **which ranks form an EP group**: ``ep`` consecutive ranks of the stage — the innermost
  dimension first, so the ranks of one TP group, then the next TP group (the next cp or dp
  index). With ``ep ≤ tp`` an EP group lies inside a TP group; with ``ep = tp · k`` it is ``k``
  whole TP groups. Why: TP is already kept inside a node (its collectives run between every
  layer's matmuls), so an EP group of consecutive ranks is inside a node whenever
  ``ep ≤ ranks per node`` — the dispatch and combine all-to-alls stay on the fast link.
  Carving EP out of dp instead puts its ranks ``tp·cp`` apart, one per node once TP fills a
  node (:func:`~dtlab.parallel.compose.folding.ep_carved_from_dp`).
* **which tokens an MoE layer takes**: each TP rank a distinct ``1/tp`` slice of the sequence
  (:mod:`dtlab.parallel.expert.tensor_split`; with sequence parallelism its own shard), so
  every token of the stage is routed and computed exactly once; the ranks of an EP group hold
  distinct tokens whichever of tp, cp or dp they differ in.
* **which gradients go where** (:meth:`~dtlab.parallel.compose.step.ComposedStep.
  _reduce_gradients`): the router and a shared expert saw only this TP rank's tokens — summed
  over ``tp``, then averaged over cp and dp like every dense parameter. An expert's gradient
  already holds its EP group's tokens; the ``edp = tp·cp·dp/ep`` ranks holding the same experts
  hold the rest of the stage's tokens: summed over ``edp`` and divided by ``cp · dp`` (the loss
  is the mean over the cp × dp shards) — never also averaged over cp.
* **what the routers count**: the ``tp · cp`` ranks of one dp index hold the parts of the same
  sequences, so the balancing losses' counts are summed over them (``shards``, one all-reduce
  per MoE layer and forward of ``E`` float64 counts — ``B·E`` for the sequence scope — so
  ``2(tp·cp−1)/(tp·cp) · 8E`` bytes per rank on the ring; the global scope then sums over
  ``dp`` as well; :mod:`dtlab.parallel.expert.balance`), as
  Megatron-Core reduces them over its tp × cp group; each TP rank's loss share is ``1/tp``
  (:mod:`dtlab.parallel.expert.tensor_split`). DeepSeek-V3's bias step sums the load over the
  same ``shards`` and then ``dp`` (:meth:`~dtlab.parallel.compose.step.ComposedStep.
  step_balancing_biases`). Capacity is not composed with ``tp > 1`` (:func:`folded_problems`
  says what to choose).

:func:`fold_experts` builds the two groups (every rank enumerates every group, in the same
order) and shards the experts; ``compose_gpt`` calls it before tensor parallel is applied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
import torch.nn as nn

from dtlab.comm import Communicator
from dtlab.mesh import Mesh
from dtlab.models.moe import moe_layers
from dtlab.parallel.compose.checks import capacity_problems
from dtlab.parallel.compose.folding import FoldedMapping
from dtlab.parallel.expert import parallelize_experts
from dtlab.parallel.expert.balance import count_like_one_process
from dtlab.parallel.expert.tensor_split import split_moe_layers_over_tp, tp_partial_names


@dataclass
class FoldedExperts:
    """The MoE side of a folded composition on this rank."""

    mapping: FoldedMapping
    ep: Communicator
    edp: Communicator
    partial_names: set[str]  # router and shared-expert parameters: partial over tp
    shards: Communicator  # the tp × cp ranks holding parts of the same sequences

    @property
    def coordinates(self) -> dict[str, int]:
        """This rank's ``ep`` and ``edp`` indices in the folded mapping."""
        c = self.mapping.coordinates(dist.get_rank())
        return {"ep": c["ep"], "edp": c["edp"]}

    @property
    def degrees(self) -> dict[str, int]:
        return {"ep": self.mapping.ep, "edp": self.mapping.edp}


def folded_mapping(mesh: Mesh, ep: int) -> FoldedMapping:
    """The mesh's attention degrees with the MoE layers' ``ep`` folded over them (``etp = 1``)."""
    layout = mesh.layout
    return FoldedMapping(tp=layout.tp, cp=layout.cp, dp=layout.dp, pp=layout.pp, etp=1, ep=ep)


def fold_experts(
    model: nn.Module,
    mesh: Mesh,
    ep: int,
    tp_comm: Communicator,
    sequence_parallel: bool,
    collectives: str,
    dp_comm: Communicator,
    cp_comm: Communicator,
) -> FoldedExperts:
    """Shard ``model``'s experts over the folded EP group and make each MoE layer take this TP
    rank's tokens; returns the groups. Collective over the world (the groups are made here)."""
    mapping = folded_mapping(mesh, ep)
    partial = tp_partial_names(model) if mesh.tp_size > 1 else set()
    ep_comm = Communicator.among(mapping.groups("ep"), collectives, "ep")
    edp_comm = Communicator.among(mapping.groups("edp"), collectives, "edp")
    if ep > 1:
        parallelize_experts(model, ep_comm)
    if mesh.tp_size > 1:
        split_moe_layers_over_tp(model, tp_comm, sequence_parallel)
    shards = sequence_shards(mesh, tp_comm, cp_comm, collectives)
    count_like_one_process(model, shards, dp_comm)
    return FoldedExperts(mapping, ep_comm, edp_comm, partial, shards)


def sequence_shards(
    mesh: Mesh, tp_comm: Communicator, cp_comm: Communicator, collectives: str
) -> Communicator:
    """The ``tp · cp`` ranks holding parts of this rank's sequences — consecutive ranks (tp
    innermost, then cp): the tp group itself when ``cp = 1``, the cp group when ``tp = 1``."""
    if mesh.cp_size == 1:
        return tp_comm
    if mesh.tp_size == 1:
        return cp_comm
    groups = sequence_shard_groups(dist.get_world_size(), mesh.tp_size, mesh.cp_size)
    return Communicator.among(groups, collectives, "tp_cp")


def sequence_shard_groups(world_size: int, tp: int, cp: int) -> list[list[int]]:
    """Blocks of ``tp · cp`` consecutive ranks: with the mesh's rank order (``pp, dp, cp, tp``,
    :data:`dtlab.mesh.layout.ORDER`) each block is one ``(pp, dp)`` index."""
    block = tp * cp
    return [list(range(start, start + block)) for start in range(0, world_size, block)]


def folded_problems(
    mesh_layout, ep: int, n_experts: int | None, moe_configs, *, given: bool, data_parallel: str
) -> list[str]:
    """Why the folded MoE layers cannot train on ``mesh_layout`` ([] when they can)."""
    problems = []
    if data_parallel != "ddp":
        problems.append(
            f"MoE layers on the folded mapping with data_parallel={data_parallel!r}: expert "
            "weights are reduced over the folded edp group, which dtlab's FSDP does not shard; "
            "use data_parallel='ddp'"
        )
    if given and mesh_layout.ep > 1:
        problems.append(
            f"expert_parallel={ep} given beside a mesh with ep={mesh_layout.ep}: give the "
            "expert-parallel degree once (Mesh(ep=...) carves it out of dp; expert_parallel= "
            "folds it over the stage's tp · cp · dp ranks)"
        )
    stage = mesh_layout.tp * mesh_layout.cp * mesh_layout.dp
    if stage % ep:
        fits = [d for d in range(1, stage + 1) if stage % d == 0]
        problems.append(
            f"ep={ep} must divide a stage's tp·cp·dp = {stage} ranks; choose ep from {fits}"
        )
    if n_experts is not None and n_experts % ep:
        problems.append(f"ep={ep} must divide n_experts={n_experts}; choose ep dividing it")
    problems += capacity_problems(
        moe_configs, "tp", mesh_layout.tp, "TP rank routes a 1/tp slice of every sequence"
    )
    return problems


def uses_folding(model: nn.Module, mesh: Mesh, expert_parallel: int | None) -> bool:
    """Whether ``compose_gpt`` trains ``model``'s MoE layers on the folded mapping: it has MoE
    layers and either tensor parallel or an explicit ``expert_parallel`` degree."""
    return bool(moe_layers(model)) and (mesh.tp_size > 1 or expert_parallel is not None)
