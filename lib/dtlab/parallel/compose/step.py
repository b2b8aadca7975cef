"""The second stage of work on a composed GPT: one training step, and clipping.

What moves where in one :meth:`ComposedStep.train_step`, beyond each mechanism's own traffic
(Megatron's f/g all-reduces over tp, the K/V ring over cp, activations point to point over pp,
FSDP's all-gathers and reduce-scatters over dp): after backward, the partial gradients are
summed over tp (sequence parallel's replicated parameters; the routers and shared experts of
MoE layers, whose tokens each TP rank splits), expert gradients are reduced over ``edp`` (÷ dp;
on the folded mapping ÷ cp·dp, :mod:`~dtlab.parallel.compose.fold_experts`), every other
gradient is averaged over cp (each CP rank saw different tokens of the same sequences), then
over dp (``"ddp"``: one flat all-reduce; FSDP reduced while
backward ran; HSDP adds one all-reduce of the shards across the replicas). Which groups each
parameter uses is :attr:`ComposedGPT.placements` (:mod:`~dtlab.parallel.compose.account`).

Everything here finds parameters by name (:attr:`ComposedGPT.parameters_by_name`, made once
when applying: :mod:`~dtlab.parallel.compose.apply`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dtlab.models.moe import is_expert_param
from dtlab.parallel.compose.groups import average_flat
from dtlab.parallel.compose.placement import clip_global_grad_norm_
from dtlab.parallel.context import shard_batch
from dtlab.parallel.expert.balance import step_balancing_biases
from dtlab.parallel.tensor.sequence import all_reduce_partial_grads

if TYPE_CHECKING:
    from dtlab.parallel.compose.apply import ComposedGPT


class ComposedStep:
    """The training step of a :class:`~dtlab.parallel.compose.apply.ComposedGPT` (mixed into it;
    every attribute read here is one of its fields)."""

    def local_batch(self: ComposedGPT, tokens: torch.Tensor, targets: torch.Tensor):
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
        return shard_batch(tokens, targets, self.mesh_communicators["cp"], self.cp_style)

    def train_step(self: ComposedGPT, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        """Forward and backward of the global batch (every rank passes the same one), then every
        gradient reduced over its groups. Returns the global mean loss, on every rank."""
        tokens, targets, positions = self.local_batch(tokens, targets)
        if self.pipeline is not None:
            shards = self.stage_shards
            if shards is not None:  # FSDP over stages: gathered once, reduced at the last B/W
                shards.gather()
                self.pipeline.on_stage_done = shards.on_stage_done
            with _StageAuxLosses(self.pipeline) as aux:
                loss = self.pipeline.step(tokens, targets, positions)
            if shards is not None:
                shards.finish()
            # a stage without the loss still joins its all-reduce: on the data's device (NCCL)
            loss = torch.zeros((), device=tokens.device) if loss is None else loss.detach()
            if aux.total is not None:  # this rank's stages' balancing losses, as trained
                loss = loss + aux.total
                if self.folded and self.mesh.tp_size > 1:
                    loss = loss + self._other_tp_shares(aux.total)
        else:
            kwargs = {} if positions is None else {"positions": positions}
            logits = (self.fsdp or self.module)(tokens, **kwargs)
            loss = self.tp.loss(logits, targets) if self.tp else _cross_entropy(logits, targets)
            aux = getattr(self.module, "aux_loss", None)  # mixture-of-experts balancing losses
            if aux is not None and aux.requires_grad:
                loss = loss + aux
            loss.backward()
            loss = loss.detach()
            if aux is not None and aux.requires_grad and self.folded and self.mesh.tp_size > 1:
                loss = loss + self._other_tp_shares(aux)  # each TP rank's is 1/tp of the loss
        self._reduce_gradients()
        return self._global_mean(loss)

    def _reduce_gradients(self: ComposedGPT) -> None:
        communicators = self.mesh_communicators
        named = [(n, p) for n, p in self.named_parameters() if p.grad is not None]
        if self.tp is not None:
            # Sum the partial gradients over tp — the SP-replicated parameters and the MoE
            # layers' routers (each TP rank routed its own tokens) — by name, since under FSDP
            # the registered tensors are this rank's shard views, not the originals
            # TensorParallel listed (the sum is elementwise, so shards sum like whole tensors).
            partial = [p for n, p in named if "tp" in self.placements[n].reduced_over]
            all_reduce_partial_grads(partial, self.tp.comm)
        if self.folded is not None:  # experts: summed over the folded edp, ÷ the cp·dp shards
            expert = [p.grad for n, p in named if is_expert_param(n)]
            named = [(n, p) for n, p in named if not is_expert_param(n)]
            shards = self.mesh.cp_size * self.mesh.dp_size
            average_flat(expert, communicators["edp"], "edp_grad", divide_by=shards)
        grads = [p.grad for _, p in named]
        if self.mesh.cp_size > 1:
            average_flat(grads, communicators["cp"], "cp_grad")
        if self.mesh.layout.ep > 1 and self.folded is None:  # carved out of dp: ep inside dp
            expert = [p.grad for n, p in named if is_expert_param(n)]
            grads = [p.grad for n, p in named if not is_expert_param(n)]
            average_flat(expert, communicators["edp"], "edp_grad", divide_by=self.mesh.dp_size)
        if self.data_parallel == "ddp" and self.mesh.dp_size > 1:
            average_flat(grads, communicators["dp"], "dp_grad")
        if self.replica_comm is not None and self.replica_comm.world_size > 1:
            average_flat(grads, self.replica_comm, "hsdp_replica_grad")

    def step_balancing_biases(self: ComposedGPT) -> None:
        """DeepSeek-V3's bias step on the load one process sees (call after each
        :meth:`train_step`): every bias-balanced MoE layer's tokens per expert summed over the
        ranks holding the rest of its sequences (``cp``; on the folded layout the ``tp × cp``
        ranks, each TP rank having routed its own slice), then over ``dp`` — one all-reduce of
        float64 loads per group (:func:`~dtlab.parallel.expert.balance.step_balancing_biases`)."""
        along = self.mesh_communicators
        shards = self.folded.shards if self.folded is not None else along["cp"]
        step_balancing_biases(self.module, shards, along["dp"])

    def _other_tp_shares(self: ComposedGPT, aux: torch.Tensor) -> torch.Tensor:
        """The other TP ranks' shares of the balancing losses (a report: a control message)."""
        total = aux.detach().reshape(1).clone()
        self.tp.comm.all_reduce_control(total, name="aux_loss")
        return (total - aux.detach()).reshape(())

    def _global_mean(self: ComposedGPT, loss: torch.Tensor) -> float:
        """Each stage's loss (the last stage's cross-entropy, every stage's balancing losses)
        summed over pp, averaged over dp and cp (a report, not training traffic: control
        messages, not counted)."""
        loss = loss.reshape(1).double().clone()
        for dim in ("pp", "cp", "dp"):
            if getattr(self.mesh, f"{dim}_size") > 1:
                self.mesh_communicators[dim].all_reduce_control(loss, name="loss")
        return loss.item() / (self.mesh.cp_size * self.mesh.dp_size)

    def clip_grad_norm_(self: ComposedGPT, max_norm: float) -> torch.Tensor:
        """Clip by the norm of the whole model's gradient, every element counted once."""
        return clip_global_grad_norm_(
            [(n, p.grad) for n, p in self.named_parameters()],
            self.placements,
            self.coordinates,
            max_norm,
        )


class _StageAuxLosses:
    """While a pipeline step runs, the sum of this rank's stages' balancing losses over the
    micro-batches, each ÷ the micro-batch count as the executor trains it (``None`` without
    any): the executor's own loss is the last stage's cross-entropy only, so without this the
    step would report a mixture-of-experts loss without its balancing terms under ``pp > 1``."""

    def __init__(self, pipeline) -> None:
        self.pipeline, self.total, self.handles = pipeline, None, []

    def _add(self, stage, _args, _output) -> None:
        aux = getattr(stage, "aux_loss", None)
        if aux is not None and aux.requires_grad:
            share = aux.detach() / self.pipeline.schedule.n_micro
            self.total = share if self.total is None else self.total + share

    def __enter__(self) -> _StageAuxLosses:
        stages = self.pipeline.stages.values()
        self.handles = [s.register_forward_hook(self._add) for s in stages]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    from dtlab.models import loss_fn

    return loss_fn(logits, targets)
