"""A transformer block's two tensor-parallel regions: attention split by heads, MLP by width.

Shoeybi et al. 2019 (Megatron-LM, §3, Fig. 3), applied from outside to the lab GPT's modules.

**Attention.** ``q_proj``, ``k_proj``, ``v_proj`` become column-parallel: rank ``r`` computes
query heads ``[r·H/t, (r+1)·H/t)`` and KV heads ``[r·Hkv/t, (r+1)·Hkv/t)``. Each head attends on
its own, so the core runs unchanged on the local heads (the model reads its head count from the
projections' widths). ``out_proj`` becomes row-parallel: each rank multiplies its heads' slice
of the concatenated output and the partial results are summed on leaving. With grouped-query
attention (Ainslie et al. 2023) query head ``i`` reads KV head ``i // (H/Hkv)``; the contiguous
split keeps every query head on the rank of its KV head exactly when ``t`` divides ``Hkv``
(:func:`dtlab.mesh.layout_rules.tensor_parallel_problems` says what to choose otherwise).

**MLP.** ``fc_in`` column-parallel (``d_ff/t`` hidden units per rank, GELU applied locally —
element-wise, so no communication), ``fc_out`` row-parallel. A mixture-of-experts MLP is not
split here (expert-TP = 1): it must already route distinct tokens per TP rank
(:mod:`dtlab.parallel.expert.tensor_split`; :func:`~dtlab.parallel.compose.compose_gpt` does it).

**Per block, per pass** (``b·s·h`` elements of the block's input; :mod:`.layers` has the table):

=============  ===========================================  =================================
               forward                                      backward
=============  ===========================================  =================================
TP             2 all-reduces (leaving attention, MLP)       2 all-reduces (entering them)
TP + SP        2 all-gathers (entering), 2 reduce-scatters  2 reduce-scatters, 2 all-gathers
               (leaving)
=============  ===========================================  =================================

The entry is registered once per region as a forward pre-hook on ``attn`` / ``mlp`` (what
torchtitan's ``PrepareModuleInput`` does), so q, k and v share one ``f`` — one all-reduce of
``dL/dX`` in backward, not three — as Megatron's fused QKV projection does.
"""

from __future__ import annotations

import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from dtlab.comm import Communicator
from dtlab.mesh.layout_rules import raise_problems, tensor_parallel_problems
from dtlab.models import MLP, CausalSelfAttention
from dtlab.models.moe import MoE
from dtlab.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear, enter_region


def enter_region_on_input(
    module: nn.Module, comm: Communicator, sequence_parallel: bool
) -> RemovableHandle:
    """Make ``module``'s first input enter a tensor-parallel region before its forward runs."""

    def enter(_module, args):
        return (enter_region(args[0], comm, sequence_parallel), *args[1:])

    return module.register_forward_pre_hook(enter)


def check_heads(n_heads: int, n_kv_heads: int, tp: int) -> None:
    """Refuse a head split that leaves a rank with part of a head, or of a KV group.

    The rule and its message are those of
    :func:`dtlab.mesh.layout_rules.tensor_parallel_problems`."""
    raise_problems(tensor_parallel_problems(tp, n_heads, n_kv_heads))


def parallelize_attention(
    attn: CausalSelfAttention, comm: Communicator, sequence_parallel: bool = False
) -> CausalSelfAttention:
    """Shard ``attn``'s heads over ``comm``'s ranks, in place; returns ``attn``."""
    if not isinstance(attn, CausalSelfAttention):
        raise TypeError(
            f"parallelize_attention expects the lab GPT's CausalSelfAttention, got "
            f"{type(attn).__name__}"
        )
    heads = attn.q_proj.out_features // attn.head_dim
    check_heads(heads, attn.k_proj.out_features // attn.head_dim, comm.world_size)
    for name in ("q_proj", "k_proj", "v_proj"):
        column = ColumnParallelLinear.from_linear(getattr(attn, name), comm, enters_region=False)
        setattr(attn, name, column)
    attn.out_proj = RowParallelLinear.from_linear(
        attn.out_proj, comm, sequence_parallel=sequence_parallel
    )
    enter_region_on_input(attn, comm, sequence_parallel)
    return attn


def parallelize_mlp(
    mlp: MLP, comm: Communicator, sequence_parallel: bool = False, backward_overlap: bool = False
) -> MLP:
    """Shard ``mlp``'s hidden width over ``comm``'s ranks, in place; returns ``mlp``.

    ``backward_overlap``: ``fc_in`` owns the region entry and waits for its input-gradient
    collective after its wgrad GEMM (:mod:`~dtlab.parallel.tensor.backward_overlap`)."""
    if not isinstance(mlp, MLP):
        raise TypeError(
            f"parallelize_mlp shards the dense MLP (fc_in, GELU, fc_out); this block has "
            f"{type(mlp).__name__}. A mixture-of-experts layer is split by experts (expert "
            "parallelism), not by tensor parallelism here"
        )
    mlp.fc_in = ColumnParallelLinear.from_linear(
        mlp.fc_in, comm, sequence_parallel=sequence_parallel,
        enters_region=backward_overlap, backward_overlap=backward_overlap,
    )  # fmt: skip
    mlp.fc_out = RowParallelLinear.from_linear(
        mlp.fc_out, comm, sequence_parallel=sequence_parallel
    )
    if not backward_overlap:
        enter_region_on_input(mlp, comm, sequence_parallel)
    return mlp


def parallelize_block(
    block: nn.Module,
    comm: Communicator,
    sequence_parallel: bool = False,
    backward_overlap: bool = False,
) -> nn.Module:
    """Both regions of one :class:`dtlab.models.Block`, in place; returns ``block``.

    ``backward_overlap`` applies to the MLP's entry (``fc_in`` alone reads it). Attention's
    entry stays as it is: q, k and v are three GEMMs sharing one entry, whose backward sums their
    three partial ``dL/dX`` before reducing — after all three wgrads have run, so nothing is left
    to hide it. Megatron fuses q, k, v into one QKV GEMM, which is what lets its attention entry
    overlap too.

    The LayerNorms stay as they are: a LayerNorm normalises each token on its own, so with
    sequence parallelism it simply runs on this rank's tokens (its gradients become partial:
    :func:`~dtlab.parallel.tensor.sequence.all_reduce_partial_grads`).
    """
    parallelize_attention(block.attn, comm, sequence_parallel)
    if isinstance(block.mlp, MoE):
        check_moe_split(block.mlp)
    else:
        parallelize_mlp(block.mlp, comm, sequence_parallel, backward_overlap)
    return block


def check_moe_split(moe: MoE) -> None:
    """A mixture-of-experts layer stays whole under tensor parallelism (expert-TP = 1) — but
    only once it routes distinct tokens on each TP rank
    (:func:`~dtlab.parallel.expert.tensor_split.split_moe_over_tp`, which
    :func:`~dtlab.parallel.compose.compose_gpt` applies with the gradient reductions it needs)."""
    if getattr(moe, "tp_split", None) is None:
        raise TypeError(
            "this block's MLP is a mixture-of-experts layer: tensor parallelism keeps its experts "
            "whole but must give each TP rank distinct tokens, and its router and expert "
            "gradients then need reducing over tp and the folded expert-data-parallel group; "
            "use dtlab.parallel.compose.compose_gpt (MoE parallel folding), or split it first "
            "with dtlab.parallel.expert.tensor_split.split_moe_over_tp"
        )
