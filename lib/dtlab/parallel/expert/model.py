"""Expert parallelism applied to the lab GPT from outside, composed with data parallelism.

:func:`parallelize_experts` keeps, in every :class:`~dtlab.models.moe.MoE` of the model, only
this EP rank's block of experts (``E/ep`` of them, sliced from the full, identically initialised
weights) and swaps the layer's dispatcher for the all-to-all one
(:class:`~dtlab.parallel.expert.dispatch.AllToAllDispatch`). Router, shared expert, attention and
embeddings stay whole on every rank: each rank routes its own tokens with the same router and
the same rules as one process (ties to the lower expert index; capacity from its own tokens).

The groups (:mod:`dtlab.mesh.layout`; ``ep`` is carved out of ``dp`` — with tensor parallel,
:func:`~dtlab.parallel.compose.compose_gpt` folds them over ``tp × cp × dp`` instead,
:mod:`dtlab.parallel.compose.fold_experts`):

======  ===========================================================  =============================
group   ranks                                                        carries
======  ===========================================================  =============================
``ep``  a block of ``ep`` consecutive dp ranks, different experts    dispatch / combine all-to-all
``dp``  every data-parallel rank (``dp`` of them)                    dense gradients' all-reduce
``edp`` the ``dp/ep`` ranks holding the *same* experts               expert gradients' all-reduce
======  ===========================================================  =============================

Gradient averaging (:func:`average_gradients`): the model's loss is the mean over the ``dp``
batch shards. A dense parameter's gradient on a rank comes from its own shard only: all-reduce
over ``dp``, divide by ``dp``. An expert's gradient already sums every EP rank's tokens that
chose it (the combine's backward brought them in): all-reduce over ``edp`` — which adds the other
EP groups' shards — and divide by ``dp`` too, not by ``dp/ep``.

DeepSeek-V3's balancing bias is a buffer, not a parameter: :func:`update_balancing_biases` sums
the tokens per expert over ``dp`` before the bias step, so all ranks keep routing alike.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from dtlab.comm import Communicator
from dtlab.mesh.layout_rules import expert_parallel_problems, raise_problems
from dtlab.models.moe import MoE, is_expert_param, moe_layers
from dtlab.parallel.expert.dispatch import AllToAllDispatch


def parallelize_experts(model: nn.Module, ep_comm: Communicator) -> list[MoE]:
    """Shard every MoE layer's experts over ``ep_comm``'s ranks; returns the layers."""
    layers = moe_layers(model)
    if not layers:
        raise ValueError(
            "the model has no MoE layer: build it with mlp_factory=moe_mlp_factory(MoEConfig(...))"
        )
    ep, rank = ep_comm.world_size, ep_comm.rank
    for layer in layers:
        n = layer.experts.n_experts
        raise_problems(expert_parallel_problems(ep, n))
        per = n // ep
        for holder in (layer.experts.fc_in, layer.experts.fc_out):
            mine = holder.weight.detach()[rank * per : (rank + 1) * per].clone()
            holder.weight = nn.Parameter(mine)
        layer.dispatcher = AllToAllDispatch(ep_comm)
    return layers


def _all_reduce_mean(grads: list[torch.Tensor], comm: Communicator, divide_by: int) -> None:
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if comm.world_size > 1:
        comm.all_reduce(flat, name=f"{comm.dim}.grad_all_reduce")
    flat /= divide_by
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


@torch.no_grad()
def average_gradients(model: nn.Module, dp_comm: Communicator, edp_comm: Communicator) -> None:
    """Dense gradients all-reduced over ``dp``, expert gradients over ``edp``; both ÷ dp."""
    dense, expert = [], []
    for name, p in model.named_parameters():
        if p.grad is not None:
            (expert if is_expert_param(name) else dense).append(p.grad)
    dp = dp_comm.world_size
    _all_reduce_mean(dense, dp_comm, dp)
    _all_reduce_mean(expert, edp_comm, dp)


@torch.no_grad()
def update_balancing_biases(model: nn.Module, dp_comm: Communicator) -> None:
    """DeepSeek-V3's bias step on the global batch's load: every bias-balanced MoE layer's tokens
    per expert summed over ``dp`` (one all-reduce for all layers), so the bias — a buffer that
    steers every rank's routing — stays the same on every rank, as a replicated router must."""
    layers = [m for m in moe_layers(model) if m.moe.bias_balancing]
    if not layers:
        return
    device = layers[0].balancing_bias.device
    loads = torch.tensor([m.stats.tokens_per_expert for m in layers], device=device).float()
    if dp_comm.world_size > 1:
        dp_comm.all_reduce(loads, name="dp.moe_load_all_reduce")
    for layer, load in zip(layers, loads, strict=True):
        layer.update_balancing_bias(load)


class ExpertParallel:
    """The three communicators of EP × DP on a :class:`~dtlab.mesh.Mesh`: ``ep``, ``dp``, ``edp``.

    ``collectives="torch"`` (the default, as for every other family) moves the token exchange in
    one ``all_to_all_single`` for the counts and header and one for the payload — within about
    10 % of bare ``all_to_all_single`` (``dtlab bench moe``); ``"dtlab"`` posts one message per
    peer on the counted path, slower on gloo by its per-message cost. Both count every byte."""

    def __init__(self, mesh, collectives: str = "torch") -> None:
        self.mesh = mesh
        self.ep = Communicator.along(mesh, "ep", collectives)
        self.dp = Communicator.along(mesh, "dp", collectives)
        self.edp = Communicator.along(mesh, "edp", collectives)

    def parallelize(self, model: nn.Module) -> list[MoE]:
        """:func:`parallelize_experts` over this mesh's EP group."""
        return parallelize_experts(model, self.ep)

    def average_gradients(self, model: nn.Module) -> None:
        """:func:`average_gradients` over this mesh's ``dp`` and ``edp`` groups."""
        average_gradients(model, self.dp, self.edp)

    def update_balancing_biases(self, model: nn.Module) -> None:
        """:func:`update_balancing_biases` over this mesh's ``dp`` group (after the step)."""
        update_balancing_biases(model, self.dp)
