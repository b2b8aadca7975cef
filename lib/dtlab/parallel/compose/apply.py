"""The first stage of work on a composed GPT: apply every parallelism to the lab GPT from outside,
over a ``pp × dp × cp × tp`` mesh, in the order production code applies them (torchtitan's
``parallelize_llama``; Megatron-LM).

1. **tensor (and sequence) parallel** inside each block, over ``tp`` (:func:`parallelize_gpt`);
2. **context parallel** attention over ``cp`` (:func:`parallelize_context`);
3. **pipeline stages** over ``pp`` (:func:`pipeline_gpt`, any schedule);
4. **expert parallel** (a mixture-of-experts GPT): with ``tp = 1``, experts sharded over
   ``ep``, carved out of ``dp`` (:func:`parallelize_experts`); expert gradients summed over
   ``edp`` and divided by dp; inside pipeline stages too, and with ``cp`` for a router that
   decides per token (:func:`~dtlab.parallel.compose.checks.per_token_router_problems`). With
   ``tp > 1`` (or ``expert_parallel=`` given) the MoE layers train on the *folded* mapping —
   EP groups of consecutive ranks over tp × cp × dp, each TP rank routing its own tokens
   (:mod:`~dtlab.parallel.compose.fold_experts`); ``ep`` may then exceed dp;
5. **data parallel** outermost over ``dp``: replicas whose gradients are all-reduced
   (``"ddp"``), FSDP shards (``"fsdp"``), or HSDP — FSDP inside groups of ``hsdp_shard``
   consecutive dp ranks (default: those on one node, :meth:`Mesh.node_of`), replicas
   all-reduced across them (``"hsdp"``).

The result, :class:`ComposedGPT`, is this rank's part of the model plus two more stages of work,
each in its own file: the training step (:mod:`~dtlab.parallel.compose.step`) and the accounts —
placements, traffic, whole gradients (:mod:`~dtlab.parallel.compose.account`).

Parameters are named once, here: every wrapper keeps the full model's names (pipeline stages
share the model's modules, FSDP registers its shards in the model's own slots), so
:attr:`ComposedGPT.parameters_by_name` is made by walking ``named_parameters()`` after the last
wrapper is applied, and everything after finds a parameter by its name.

With pipeline stages, FSDP and HSDP shard each *stage* over dp and gather it once per step,
resharding after its last micro-batch's backward (torchtitan's way:
:mod:`~dtlab.parallel.compose.stage_fsdp`), not around every micro-batch; there
:attr:`ComposedGPT.parameters_by_name` holds this rank's 1-D shard of each parameter, under the
model's names. With sequence parallel, pipeline stages exchange the ``(b, S/tp, d)`` sequence
shard (:mod:`~dtlab.parallel.compose.sequence_pipeline`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist
import torch.nn as nn

from dtlab.comm import Communicator
from dtlab.mesh import Mesh
from dtlab.mesh.layout_rules import raise_problems
from dtlab.models.moe import moe_layers
from dtlab.parallel.compose.account import ComposedAccount, place_composed
from dtlab.parallel.compose.checks import (
    check_composed_layout,
    check_composition,
    per_token_router_problems,
)
from dtlab.parallel.compose.fold_experts import (
    FoldedExperts,
    fold_experts,
    folded_problems,
    uses_folding,
)
from dtlab.parallel.compose.groups import hsdp_groups, node_share_of_dp
from dtlab.parallel.compose.placement import Placement
from dtlab.parallel.compose.sequence_pipeline import sequence_parallel_pipeline
from dtlab.parallel.compose.stage_fsdp import StageShards
from dtlab.parallel.compose.step import ComposedStep
from dtlab.parallel.context import parallelize_context
from dtlab.parallel.expert import parallelize_experts
from dtlab.parallel.expert.balance import count_like_one_process
from dtlab.parallel.pipeline import PipelineExecutor, Schedule, pipeline_gpt
from dtlab.parallel.tensor import TensorParallel, parallelize_gpt
from dtlab.parallel.zero.fsdp import FullyShardedDataParallel

# The lab GPT's one tie: with ``tie_embeddings`` the LM head's weight *is* the embedding's.
TIED_HEAD, TIED_EMBEDDING = "lm_head.weight", "embed.weight"


@dataclass
class ComposedGPT(ComposedStep, ComposedAccount):
    """This rank's part of a composed GPT (build with :func:`compose_gpt`); its training step
    comes from :class:`~dtlab.parallel.compose.step.ComposedStep`, its accounts from
    :class:`~dtlab.parallel.compose.account.ComposedAccount`."""

    mesh: Mesh
    module: nn.Module  # this rank's model (all blocks, tp-sharded) or its pipeline stages
    data_parallel: str
    cp_style: str
    tp: TensorParallel | None = None
    pipeline: PipelineExecutor | None = None
    fsdp: FullyShardedDataParallel | None = None
    stage_shards: StageShards | None = None  # FSDP/HSDP with pipeline stages
    mesh_communicators: dict[str, Communicator] = field(default_factory=dict)
    """One communicator along each mesh dimension (``dp``, ``cp``, ``tp``, ``pp``; ``ep`` and
    ``edp`` with experts — the folded mapping's with ``tp > 1``, plus ``tp_cp`` for the routers'
    counts when both ``tp`` and ``cp`` exceed 1), made first; the mechanisms and the step run on
    them."""
    parameters_by_name: dict[str, nn.Parameter] = field(default_factory=dict)
    """Full-model name → this rank's trainable parameter (each tensor once), made once when
    applying, after the last wrapper: :func:`name_parameters`."""
    placements: dict[str, Placement] = field(default_factory=dict)
    replica_comm: Communicator | None = None  # HSDP: the same shard on the other nodes
    hsdp_shard: int = 0
    tp_shard_dims: dict[str, int] = field(default_factory=dict)
    """Name → dimension split over tp, under every name a tensor has (a tied head included)."""
    tp_vocab_names: frozenset[str] = frozenset()  # split along the (padded) vocabulary
    folded: FoldedExperts | None = None  # MoE layers on the folded etp × ep × edp mapping

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """This rank's trainable parameters with their full-model names (each tensor once)."""
        return list(self.parameters_by_name.items())

    def parameters(self) -> list[nn.Parameter]:
        """What the optimizer steps on this rank."""
        return list(self.parameters_by_name.values())

    @property
    def coordinates(self) -> dict[str, int]:
        """This rank's index along every mesh dimension (``ep``/``edp`` included)."""
        coordinates = {
            d: getattr(self.mesh, f"{d}_rank") for d in ("pp", "dp", "cp", "tp", "ep", "edp")
        }
        if self.folded is not None:
            coordinates |= self.folded.coordinates
        if self.hsdp_shard:
            coordinates["dp_shard"] = self.mesh.dp_rank % self.hsdp_shard
            coordinates["dp_replicate"] = self.mesh.dp_rank // self.hsdp_shard
        return coordinates


def name_parameters(modules: list[nn.Module], tied: bool) -> dict[str, nn.Parameter]:
    """Full-model name → trainable parameter over ``modules`` (the model, or this rank's
    pipeline stages), each tensor once under its first name. One module's walk lists a tied
    tensor once already; across two stages on one rank (a V-shaped schedule puts the first and
    the last stage on rank 0) the tied head is dropped, since it *is* the embedding."""
    by_name: dict[str, nn.Parameter] = {}
    for module in modules:
        for name, param in module.named_parameters():
            if param.requires_grad:
                by_name.setdefault(name, param)
    if tied and TIED_EMBEDDING in by_name:
        by_name.pop(TIED_HEAD, None)
    return by_name


def _with_tied_head(names: dict[str, int] | frozenset[str], tied: bool):
    """``names`` (tensor parallel lists a tied tensor once, as the embedding) with the head's
    name added when the head is the embedding: a pipeline's last stage holds it under that name."""
    if not tied or TIED_EMBEDDING not in names:
        return names
    if isinstance(names, dict):
        return {**names, TIED_HEAD: names[TIED_EMBEDDING]}
    return names | {TIED_HEAD}


def compose_gpt(
    model: nn.Module,
    mesh: Mesh,
    *,
    data_parallel: str = "ddp",
    sequence_parallel: bool = False,
    cp_style: str = "zigzag",
    schedule: Schedule | None = None,
    hsdp_shard: int | None = None,
    collectives: str = "torch",
    expert_parallel: int | None = None,
) -> ComposedGPT:
    """Apply TP → CP → PP → DP to ``model`` (the same full GPT on every rank) over ``mesh``.

    ``collectives="dtlab"`` runs every collective on dtlab's counted rings, so each
    communicator's ``comm_stats`` (``composed.communicators[group].comm_stats``) holds measured
    bytes. ``expert_parallel``: the MoE layers' EP degree on the folded mapping (default the
    mesh's ``ep``; folded whenever ``tp > 1``), which may exceed dp — ``Mesh(tp=2, dp=2)`` with
    ``expert_parallel=4`` puts all four experts' blocks on the four ranks of the stage.
    """
    check_composition(mesh, data_parallel, sequence_parallel, schedule)
    experts = {m.experts.n_experts for m in moe_layers(model)}
    moe_configs = [m.moe for m in moe_layers(model)]
    folded = uses_folding(model, mesh, expert_parallel)
    ep = expert_parallel or mesh.layout.ep
    if folded:
        raise_problems(
            folded_problems(
                mesh.layout,
                ep,
                min(experts),
                moe_configs,
                given=expert_parallel is not None,
                data_parallel=data_parallel,
            )
        )
    raise_problems(per_token_router_problems(mesh.layout, moe_configs))
    check_composed_layout(
        model.config, mesh.layout, dist.get_world_size(), ranks_per_node=mesh.ranks_per_node,
        cp_style=cp_style, n_experts=min(experts) if experts else None,
        data_parallel=data_parallel, sequence_parallel=sequence_parallel,
    )  # fmt: skip
    along = {d: Communicator.along(mesh, d, collectives) for d in ("dp", "cp", "tp", "pp")}
    moe_side = None
    if folded:  # before TP: the blocks then leave the split MoE layers whole
        moe_side = fold_experts(
            model, mesh, ep, along["tp"], sequence_parallel, collectives, along["dp"], along["cp"]
        )
        if moe_side.shards.dim == "tp_cp":
            along["tp_cp"] = moe_side.shards
        along["ep"], along["edp"] = moe_side.ep, moe_side.edp
    elif mesh.layout.ep > 1:
        along["ep"] = Communicator.along(mesh, "ep", collectives)
        along["edp"] = Communicator.along(mesh, "edp", collectives)
        parallelize_experts(model, along["ep"])
    if moe_configs and not folded:  # routers count what one process counts: over cp (and dp)
        count_like_one_process(model, along["cp"], along["dp"])
    tied = model.lm_head.weight is model.embed.weight
    tp = None
    if mesh.tp_size > 1:
        tp = parallelize_gpt(model, along["tp"], sequence_parallel=sequence_parallel)
    if mesh.cp_size > 1:
        parallelize_context(model, along["cp"], cp_style)
    composed = ComposedGPT(mesh, model, data_parallel, cp_style, tp=tp, mesh_communicators=along)
    composed.folded = moe_side
    partial_names: set[str] = set(moe_side.partial_names) if moe_side else set()
    if tp is not None:  # names now: FSDP below replaces the tensors with its shard views
        if sequence_parallel:
            partial = tp.partial_grads
            partial_names |= {
                n for n, p in model.named_parameters() if any(p is q for q in partial)
            }
        composed.tp_shard_dims = _with_tied_head(tp.shard_dims, tied)
        composed.tp_vocab_names = _with_tied_head(tp.vocab_names, tied)
    if mesh.pp_size > 1:
        loss = tp.loss if tp is not None else None
        if sequence_parallel and tp is not None:  # stages exchange (b, S/tp, d) shards
            composed.pipeline = sequence_parallel_pipeline(
                model, mesh, schedule, tp=mesh.tp_size, collectives=collectives, loss_fn=loss
            )
        else:
            composed.pipeline = pipeline_gpt(
                model, mesh, schedule, collectives=collectives, loss_fn=loss
            )
        composed.module = nn.ModuleDict({str(s): m for s, m in composed.pipeline.stages.items()})
    if data_parallel in ("fsdp", "hsdp"):
        group = mesh.dp_group
        if data_parallel == "hsdp":
            composed.hsdp_shard = hsdp_shard or node_share_of_dp(mesh)
            group, replicas = hsdp_groups(mesh, composed.hsdp_shard)
            composed.replica_comm = Communicator(replicas, collectives=collectives, dim="dp")
        if composed.pipeline is not None:  # a stage per unit, gathered once per step
            shard_comm = Communicator(group, collectives=collectives, dim="dp")
            composed.stage_shards = StageShards(composed.pipeline.stages, shard_comm)
        else:
            composed.fsdp = FullyShardedDataParallel(
                model, units=list(model.blocks), process_group=group, collectives=collectives
            )
            composed.module = model
    stages = list(composed.pipeline.stages.values()) if composed.pipeline else [model]
    composed.parameters_by_name = (
        composed.stage_shards.shards if composed.stage_shards else name_parameters(stages, tied)
    )
    composed.placements = place_composed(composed, tp_partial=partial_names, tied=tied)
    return composed
