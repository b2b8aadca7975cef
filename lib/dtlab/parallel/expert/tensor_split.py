"""A mixture-of-experts layer inside a tensor-parallel group: every token routed exactly once.

Outside the attention and dense-MLP regions the residual stream of a tensor-parallel group is
*replicated* over its ``t`` ranks (or, with sequence parallelism, each rank holds its own
``S/t`` slice of the sequence). Experts are not split by tensor parallelism here (expert-TP
``etp = 1``, Liu et al. 2025, "MoE Parallel Folding"): if every rank of the group routed the
replicated tokens, each token would be computed ``t`` times and its expert gradients summed
``t`` times. So an MoE layer takes *distinct* tokens on each TP rank:

===================  ======================================  ===================================
residual stream      forward (this file)                     backward
===================  ======================================  ===================================
replicated (TP)      keep this rank's ``S/t`` slice of the   all-gather the slices' input
                     sequence (no message); route, dispatch,  gradients (each rank's slice
                     compute, combine it; all-gather the      computed once, the full
                     ``t`` output slices along the sequence  ``dL/dX`` on every rank); keep
                                                             this rank's slice of ``dL/dY``
sequence-parallel    nothing: the shard *is* distinct        nothing
===================  ======================================  ===================================

Without sequence parallelism this costs two all-gathers of ``(t−1)/t · b·S·d`` elements per
MoE layer and step (one forward, one backward) over ``tp`` — the bytes of one all-reduce, half
of the ``f``/``g`` pair a dense MLP region moves; with it, nothing. Megatron-Core takes only the
second road: its ``TransformerConfig`` refuses expert parallel with tensor parallel unless
sequence parallelism is on, so its MoE layers always receive the shard. Taking a slice of ``dL/dY`` in
backward is exact because the gradient reaching a replicated activation is the same on every
TP rank (each region's ``f`` all-reduced it).

What the split leaves *partial* over ``tp``: the router (each rank routed its own tokens), a
shared expert, and — with ``ep = 1`` — the experts themselves. :func:`tp_partial_names` lists
the first two; the composed step sums them over ``tp``
(:mod:`dtlab.parallel.compose.step`) and the experts over the folded ``edp`` group.

**Balancing losses.** A TP rank's router sees ``1/tp`` of the tokens, like a context-parallel
rank: its counts are summed over the ``tp × cp`` ranks that share the sequences
(:class:`~dtlab.parallel.expert.balance.SequenceShards`, installed by
:mod:`~dtlab.parallel.compose.fold_experts`), ``P`` stays its own mean. Because the router's
gradient is then *summed* over tp (not averaged, as over cp), each TP rank's balancing loss is
divided by ``t`` on leaving the layer: ``Σ_tp E·Σ_i f_i·P_i(slice)/t = E·Σ_i f_i·P_i(whole)``,
and the same for the z-loss's mean. The step reports the loss with the ``t`` parts summed.
"""

from __future__ import annotations

import torch.nn as nn

from dtlab.comm import Communicator, gather_slices_along, slice_along
from dtlab.models.moe import MoE, is_expert_param, moe_layers

SEQ_DIM = 1  # (batch, sequence, d_model), as the tensor-parallel layers use


def split_moe_over_tp(moe: MoE, comm: Communicator, sequence_parallel: bool) -> MoE:
    """Make ``moe`` route each token of its TP group once, in place (hooks; names unchanged).

    Marks the layer (``moe.tp_split``) so that :func:`dtlab.parallel.tensor.blocks.
    parallelize_block` leaves it whole; its balancing loss leaves divided by ``t``. With
    ``sequence_parallel`` the input is already this rank's shard and is not sliced (with one
    rank the slice is the whole sequence)."""
    moe.tp_split = comm
    t = comm.world_size

    def aux_share(_module, _args, output):
        out, aux = output
        return out, aux / t

    if sequence_parallel:
        moe.register_forward_hook(aux_share)
        return moe

    def keep_slice(_module, args):
        x = args[0]
        if x.dim() != 3 or x.shape[SEQ_DIM] % t:
            raise ValueError(
                f"an MoE layer under tp={t} routes a 1/{t} slice of the sequence on each rank; "
                f"input {tuple(x.shape)} does not split — feed sequences whose length (per "
                f"context-parallel rank) is a multiple of {t}, or use sequence_parallel=True"
            )
        return (slice_along(x, SEQ_DIM, comm), *args[1:])

    def gather_slices(_module, _args, output):
        out, aux = output
        return gather_slices_along(out, SEQ_DIM, comm), aux / t

    moe.register_forward_pre_hook(keep_slice)
    moe.register_forward_hook(gather_slices)
    return moe


def split_moe_layers_over_tp(model: nn.Module, comm: Communicator, sequence_parallel: bool):
    """:func:`split_moe_over_tp` for every MoE layer of ``model``; returns the layers."""
    return [split_moe_over_tp(m, comm, sequence_parallel) for m in moe_layers(model)]


def token_split_bytes(
    batch: int, seq_len: int, d_model: int, tp: int, element_size: int = 2, layers: int = 1
) -> int:
    """Bytes one rank sends per step in the token split of ``layers`` MoE layers under ``tp``
    without sequence parallelism: an all-gather of the ``(b, S/t, d)`` outputs forward and one
    of the input gradients backward, ``(t−1)/t · b·S·d`` elements each (with sequence
    parallelism: 0). ``batch`` is this rank's rows (the dp shard), ``seq_len`` the length it
    holds of each sequence (``S/cp`` under context parallelism)."""
    return layers * 2 * (tp - 1) * batch * seq_len * d_model * element_size // tp


def tp_partial_names(model: nn.Module) -> set[str]:
    """Names of the MoE parameters replicated over tp whose gradients a TP rank holds only for
    its own tokens: every router and shared expert (not the routed experts — reduced over the
    folded ``edp`` group instead)."""
    names = set()
    for name, module in model.named_modules():
        if isinstance(module, MoE):
            for sub, p in module.named_parameters():
                full = f"{name}.{sub}"
                if p.requires_grad and not is_expert_param(full):
                    names.add(full)
    return names
