"""The lab GPT on a ``pp × dp × cp × tp`` mesh: every parallelism applied from outside, in the
order production code applies them (torchtitan's ``parallelize_llama``; Megatron-LM).

1. **tensor (and sequence) parallel** inside each block, over ``tp`` (:func:`parallelize_gpt`);
2. **context parallel** attention over ``cp`` (:func:`parallelize_context`);
3. **pipeline stages** over ``pp`` (:func:`pipeline_gpt`, any schedule);
4. **expert parallel** (a mixture-of-experts GPT): experts sharded over ``ep``, carved out of
   ``dp`` (:func:`parallelize_experts`); expert gradients summed over ``edp`` and divided by dp;
5. **data parallel** outermost over ``dp``: replicas whose gradients are all-reduced
   (``"ddp"``), FSDP shards (``"fsdp"``), or HSDP — FSDP inside groups of ``hsdp_shard``
   consecutive dp ranks (default: those on one node, :meth:`Mesh.node_of`), replicas
   all-reduced across them (``"hsdp"``).

What moves where in one :meth:`ComposedGPT.train_step`, beyond each mechanism's own traffic
(Megatron's f/g all-reduces over tp, the K/V ring over cp, activations point to point over pp,
FSDP's all-gathers and reduce-scatters over dp): after backward, the sequence-parallel partial
gradients are summed over tp, every gradient is averaged over cp (each CP rank saw different
tokens of the same sequences), then over dp (``"ddp"``: one flat all-reduce; FSDP reduced while
backward ran; HSDP adds one all-reduce of the shards across the replicas). Which groups each
parameter uses is :attr:`ComposedGPT.placements` (:mod:`~dtlab.parallel.compose.placement`).

Not composed here, and refused with a reason: FSDP/HSDP together with pipeline stages (a stage
runs once per micro-batch, and dtlab's FSDP gathers per forward — use ``"ddp"`` with pp), and
sequence parallel together with pipeline stages (the activation a stage sends would be
sequence-sharded; the executor sends full sequences).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from dtlab.comm import Communicator
from dtlab.mesh import Mesh
from dtlab.models.moe import is_expert_param, moe_layers
from dtlab.parallel.compose.checks import check_composed_layout, check_composition
from dtlab.parallel.compose.groups import average_flat, hsdp_groups, node_share_of_dp
from dtlab.parallel.compose.placement import Placement, clip_global_grad_norm_, place_parameters
from dtlab.parallel.context import parallelize_context, shard_batch
from dtlab.parallel.expert import parallelize_experts
from dtlab.parallel.pipeline import PipelineExecutor, Schedule, pipeline_gpt
from dtlab.parallel.tensor import TensorParallel, parallelize_gpt
from dtlab.parallel.tensor.sequence import all_reduce_partial_grads
from dtlab.parallel.zero.fsdp import FullyShardedDataParallel


@dataclass
class ComposedGPT:
    """This rank's part of a composed GPT and its training step (build with :func:`compose_gpt`)."""

    mesh: Mesh
    module: nn.Module  # this rank's model (all blocks, tp-sharded) or its pipeline stages
    data_parallel: str
    cp_style: str
    tp: TensorParallel | None = None
    pipeline: PipelineExecutor | None = None
    fsdp: FullyShardedDataParallel | None = None
    comms: dict[str, Communicator] = field(default_factory=dict)
    placements: dict[str, Placement] = field(default_factory=dict)
    replica_comm: Communicator | None = None  # HSDP: the same shard on the other nodes
    hsdp_shard: int = 0
    tp_shard_dims: dict[str, int] = field(default_factory=dict)
    tp_vocab_names: frozenset[str] = frozenset()  # split along the (padded) vocabulary
    """Name → dimension split over tp, under every name a tensor has (a tied head included)."""

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """This rank's trainable parameters with their full-model names (each tensor once)."""
        seen, out = set(), []
        modules = list(self.pipeline.stages.values()) if self.pipeline else [self.module]
        named = [item for module in modules for item in module.named_parameters()]
        for name, p in named:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append((_full_name(name), p))
        return out

    def parameters(self) -> list[nn.Parameter]:
        """What the optimizer steps on this rank."""
        return [p for _, p in self.named_parameters()]

    @property
    def coordinates(self) -> dict[str, int]:
        """This rank's index along every mesh dimension (``ep``/``edp`` included)."""
        coordinates = {
            d: getattr(self.mesh, f"{d}_rank") for d in ("pp", "dp", "cp", "tp", "ep", "edp")
        }
        if self.hsdp_shard:
            coordinates["dp_shard"] = self.mesh.dp_rank % self.hsdp_shard
            coordinates["dp_replicate"] = self.mesh.dp_rank // self.hsdp_shard
        return coordinates

    def local_batch(self, tokens: torch.Tensor, targets: torch.Tensor):
        """``(tokens, targets, positions)`` of this rank: its dp rows, its cp share of each
        sequence (``positions`` None without CP)."""
        dp, dp_rank = self.mesh.dp_size, self.mesh.dp_rank
        if tokens.shape[0] % dp:
            raise ValueError(
                f"a global batch of {tokens.shape[0]} sequences does not split over dp={dp}; "
                f"use a multiple of {dp}"
            )
        rows = tokens.shape[0] // dp
        tokens = tokens[dp_rank * rows : (dp_rank + 1) * rows]
        targets = targets[dp_rank * rows : (dp_rank + 1) * rows]
        if self.mesh.cp_size == 1:
            return tokens, targets, None
        return shard_batch(tokens, targets, self.comms["cp"], self.cp_style)

    def train_step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        """Forward and backward of the global batch (every rank passes the same one), then every
        gradient reduced over its groups. Returns the global mean loss, on every rank."""
        tokens, targets, positions = self.local_batch(tokens, targets)
        if self.pipeline is not None:
            loss = self.pipeline.step(tokens, targets, positions)
            loss = torch.zeros(()) if loss is None else loss.detach()
        else:
            kwargs = {} if positions is None else {"positions": positions}
            logits = (self.fsdp or self.module)(tokens, **kwargs)
            loss = self.tp.loss(logits, targets) if self.tp else _cross_entropy(logits, targets)
            aux = getattr(self.module, "aux_loss", None)  # mixture-of-experts balancing losses
            if aux is not None and aux.requires_grad:
                loss = loss + aux
            loss.backward()
            loss = loss.detach()
        self._reduce_gradients()
        return self._global_mean(loss)

    def _reduce_gradients(self) -> None:
        named = [(n, p) for n, p in self.named_parameters() if p.grad is not None]
        if self.tp is not None and self.tp.sequence_parallel:
            # Sum the partial gradients of the SP-replicated parameters over tp — by name, since
            # under FSDP the registered tensors are this rank's shard views, not the originals
            # TensorParallel listed (the sum is elementwise, so shards sum like whole tensors).
            partial = [p for n, p in named if "tp" in self.placements[n].reduced_over]
            all_reduce_partial_grads(partial, self.tp.comm)
        grads = [p.grad for _, p in named]
        if self.mesh.cp_size > 1:
            average_flat(grads, self.comms["cp"], "cp_grad")
        if self.mesh.layout.ep > 1:  # an expert's gradient already holds its EP block's tokens
            expert = [p.grad for n, p in named if is_expert_param(n)]
            grads = [p.grad for n, p in named if not is_expert_param(n)]
            average_flat(expert, self.comms["edp"], "edp_grad", divide_by=self.mesh.dp_size)
        if self.data_parallel == "ddp" and self.mesh.dp_size > 1:
            average_flat(grads, self.comms["dp"], "dp_grad")
        if self.replica_comm is not None and self.replica_comm.world_size > 1:
            average_flat(grads, self.replica_comm, "hsdp_replica_grad")

    def _global_mean(self, loss: torch.Tensor) -> float:
        """The last stage's loss summed over pp, averaged over dp and cp (a report, not
        training traffic: torch's collectives, not counted)."""
        loss = loss.reshape(1).double().clone()
        for dim in ("pp", "cp", "dp"):
            if getattr(self.mesh, f"{dim}_size") > 1:
                dist.all_reduce(loss, group=getattr(self.mesh, f"{dim}_group"))
        return loss.item() / (self.mesh.cp_size * self.mesh.dp_size)

    def communicators(self) -> dict[str, Communicator]:
        """Every communicator this rank's training step uses, by group: ``tp``, ``cp``, ``pp``
        (the pipeline's sends), ``embedding`` (the tied embedding's two stages), ``dp`` (DDP's
        all-reduce or FSDP's gathers and reduce-scatters), ``dp_replicate`` (HSDP)."""
        comms = {d: c for d, c in self.comms.items() if c.world_size > 1}
        if self.pipeline is not None:
            comms["pp"] = self.pipeline.comm
            if self.pipeline.tied_comm is not None:
                comms["embedding"] = self.pipeline.tied_comm
        if self.fsdp is not None:
            comms["dp"] = self.fsdp.comm
        if self.replica_comm is not None and self.replica_comm.world_size > 1:
            comms["dp_replicate"] = self.replica_comm
        return comms

    def reset_traffic(self) -> None:
        """Zero every communicator's byte counts."""
        for comm in self.communicators().values():
            comm.stats.reset()

    def traffic(self) -> dict[str, dict[str, int]]:
        """Bytes this rank sent since :meth:`reset_traffic`, by group and collective — counted
        from real messages when built with ``collectives="dtlab"`` (``stats.counted``)."""
        return {
            group: dict(comm.stats.bytes_by_op)
            for group, comm in self.communicators().items()
            if comm.stats.bytes_by_op
        }

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the norm of the whole model's gradient, every element counted once."""
        return clip_global_grad_norm_(
            [(n, p.grad) for n, p in self.named_parameters()],
            self.placements,
            self.coordinates,
            max_norm,
        )

    def local_full_gradients(self) -> dict[str, torch.Tensor]:
        """Name → gradient of every parameter this rank's stage holds, gathered whole over tp
        and dp (FSDP); pipeline stages differ, so each rank returns only its own."""
        if self.fsdp is not None:
            grads = {_full_name(n): g for n, g in self.fsdp.full_gradients().items()}
        else:
            grads = {n: p.grad.detach().clone() for n, p in self.named_parameters()}
        if self.tp is not None:
            from dtlab.comm import gather_along

            grads = {
                n: gather_along(g, self.tp_shard_dims[n], self.tp.comm)
                if n in self.tp_shard_dims
                else g
                for n, g in grads.items()
            }
            # a vocabulary tp does not divide was padded: cut the padding rows off again
            grads = {
                n: g[: self.tp.vocab_size] if n in self.tp_vocab_names else g
                for n, g in grads.items()
            }
        return grads


def _full_name(name: str) -> str:
    """A stage or wrapper's parameter name as the full model names it."""
    for prefix in ("module.", "_fsdp_wrapped_module."):
        name = name.removeprefix(prefix)
    return name


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    from dtlab.models import loss_fn

    return loss_fn(logits, targets)


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
) -> ComposedGPT:
    """Apply TP → CP → PP → DP to ``model`` (the same full GPT on every rank) over ``mesh``.

    ``collectives="dtlab"`` runs every collective on dtlab's counted rings, so each
    communicator's ``stats`` (``composed.comms[dim].stats``) holds measured bytes.
    """
    check_composition(mesh, data_parallel, sequence_parallel, schedule)
    experts = {m.experts.n_experts for m in moe_layers(model)}
    check_composed_layout(
        model.config, mesh.layout, dist.get_world_size(), ranks_per_node=mesh.ranks_per_node,
        cp_style=cp_style, n_experts=min(experts) if experts else None,
        data_parallel=data_parallel, sequence_parallel=sequence_parallel,
    )  # fmt: skip
    comms = {d: Communicator.along(mesh, d, collectives) for d in ("dp", "cp", "tp", "pp")}
    if mesh.layout.ep > 1:
        comms["ep"] = Communicator.along(mesh, "ep", collectives)
        comms["edp"] = Communicator.along(mesh, "edp", collectives)
        parallelize_experts(model, comms["ep"])
    tied = model.lm_head.weight is model.embed.weight
    tp = None
    if mesh.tp_size > 1:
        tp = parallelize_gpt(model, comms["tp"], sequence_parallel=sequence_parallel)
    if mesh.cp_size > 1:
        parallelize_context(model, comms["cp"], cp_style)
    composed = ComposedGPT(mesh, model, data_parallel, cp_style, tp=tp, comms=comms)
    partial_names: set[str] = set()
    if tp is not None:  # names now: FSDP below replaces the tensors with its shard views
        partial = {id(p) for p in tp.partial_grads} if sequence_parallel else set()
        partial_names = {
            n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in partial
        }
        by_id = {id(p): tp.shard_dims[n] for n, p in model.named_parameters() if n in tp.shard_dims}
        composed.tp_shard_dims = {
            n: by_id[id(p)]
            for n, p in model.named_parameters(remove_duplicate=False)
            if id(p) in by_id
        }
        vocab = {id(p) for n, p in model.named_parameters() if n in tp.vocab_names}
        composed.tp_vocab_names = frozenset(
            n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in vocab
        )
    if mesh.pp_size > 1:
        loss = tp.loss if tp is not None else None
        composed.pipeline = pipeline_gpt(
            model, mesh, schedule, collectives=collectives, loss_fn=loss
        )
        composed.module = nn.ModuleDict({str(s): m for s, m in composed.pipeline.stages.items()})
    elif data_parallel in ("fsdp", "hsdp"):
        group = mesh.dp_group
        if data_parallel == "hsdp":
            composed.hsdp_shard = hsdp_shard or node_share_of_dp(mesh)
            group, replicas = hsdp_groups(mesh, composed.hsdp_shard)
            composed.replica_comm = Communicator(replicas, collectives=collectives, dim="dp")
        composed.fsdp = FullyShardedDataParallel(
            model, units=list(model.blocks), process_group=group, collectives=collectives
        )
        composed.module = model
    names = [n for n, _ in composed.named_parameters()]
    sharded_dp = set(names) if composed.fsdp is not None else set()
    degrees = {d: getattr(mesh, f"{d}_size") for d in ("pp", "dp", "cp", "tp", "ep", "edp")}
    if composed.hsdp_shard:  # sharded inside the block, replicated across: dp splits in two
        degrees["dp_shard"] = composed.hsdp_shard
        degrees["dp_replicate"] = mesh.dp_size // composed.hsdp_shard
    composed.placements = place_parameters(
        names,
        degrees,
        tp_sharded=set(composed.tp_shard_dims),
        tp_partial=partial_names,
        dp_sharded=sharded_dp,
        tied={"embed.weight", "lm_head.weight"} if tied and mesh.pp_size > 1 else set(),
        hybrid=bool(composed.hsdp_shard),
        expert={n for n in names if is_expert_param(n)} if mesh.layout.ep > 1 else set(),
    )
    return composed
