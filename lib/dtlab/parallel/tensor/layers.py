"""Column- and row-parallel Linear layers: Megatron's split of one matmul over ``t`` ranks.

Shoeybi et al. 2019 (Megatron-LM, §3, Fig. 3). A Linear ``Y = X Aᵀ + b`` with ``A`` of shape
(out, in) can be split two ways:

=====================  =======================  =================  =========================
layer                  this rank holds          input              output
=====================  =======================  =================  =========================
column-parallel        rows ``A[r·out/t : …]``  full ``X``         ``Y``'s columns
(:class:`Column…`)     (output features) and    (replicated, or    ``r·out/t …`` — a shard
                       the same slice of ``b``  gathered)          of the last dimension
row-parallel           columns ``A[:, r·in/t    ``X``'s last-dim   a *partial sum* of the
(:class:`Row…`)        : …]`` (input features)  shard              full ``Y``; summed on
                       and all of ``b``                            leaving the region
=====================  =======================  =================  =========================

Column-then-row (``fc_in`` then ``fc_out``; ``q/k/v`` then ``out_proj``) needs no
communication in between: the column layer's output shard is exactly the row layer's input
shard. Only the *region* around the pair talks, through Megatron's conjugate operators
(:mod:`dtlab.comm.autograd`):

======================  ===================================  ==================================
where                   forward                              backward
======================  ===================================  ==================================
enter (``f``)           identity                             all-reduce ``dL/dX`` (b·s·h)
leave (``g``)           all-reduce the partial ``Y`` (b·s·h)  identity
enter, sequence-par.    all-gather ``X`` along the sequence  reduce-scatter ``dL/dX``
leave, sequence-par.    reduce-scatter ``Y`` along sequence  all-gather ``dL/dY``
======================  ===================================  ==================================

Each all-reduce moves ``2(t-1)/t · b·s·h`` elements per rank; the sequence-parallel pair moves
``(t-1)/t · b·s·h`` each — the same total, since an all-reduce *is* a reduce-scatter followed
by an all-gather (Korthikanti et al. 2022, §4.2.2).

Tensors are ``(batch, sequence, features)``, so the sequence dimension is :data:`SEQ_DIM` = 1.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab.comm import (
    Communicator,
    copy_to_group,
    gather_along,
    reduce_from_group,
    reduce_scatter_along,
)
from dtlab.parallel.tensor.backward_overlap import column_parallel_linear

SEQ_DIM = 1
"""The sequence dimension of the lab GPT's activations ``(batch, sequence, d_model)``."""


def enter_region(x: torch.Tensor, comm: Communicator, sequence_parallel: bool) -> torch.Tensor:
    """Enter a tensor-parallel region: ``f`` (identity; all-reduce of the gradient), or with
    sequence parallelism all-gather the sequence shards (reduce-scatter of the gradient)."""
    if sequence_parallel:
        # Contiguous once here, so q, k and v save one copy of the gathered input between them
        # (each Linear would otherwise fold the strided gather into a copy of its own).
        return gather_along(x, SEQ_DIM, comm).contiguous()
    return copy_to_group(x, comm)


def leave_region(x: torch.Tensor, comm: Communicator, sequence_parallel: bool) -> torch.Tensor:
    """Leave a tensor-parallel region: ``g`` (all-reduce the partial sums), or with sequence
    parallelism reduce-scatter them along the sequence (all-gather of the gradient)."""
    if sequence_parallel:
        return reduce_scatter_along(x, SEQ_DIM, comm)
    return reduce_from_group(x, comm)


def shard_of(full: torch.Tensor, dim: int, comm: Communicator, what: str) -> torch.Tensor:
    """This rank's contiguous ``1/t`` block of ``full`` along ``dim`` (a copy), or an error
    saying what ``t`` would split it."""
    size, t = full.shape[dim], comm.world_size
    if size % t:
        fits = ", ".join(str(k) for k in range(1, size + 1) if size % k == 0)
        raise ValueError(
            f"{what}: {size} along dimension {dim} do not split evenly over {t} "
            f"tensor-parallel ranks; choose tp from {fits}"
        )
    return full.detach().chunk(t, dim)[comm.rank].clone()


class ColumnParallelLinear(nn.Module):
    """``Y_r = X · A_rᵀ + b_r``: this rank's ``out/t`` output features.

    Sharded dimension: ``weight`` dim 0 (output features), ``bias`` dim 0. Forward: enter the
    region (``f``, or all-gather along the sequence) unless ``enters_region=False`` — then the
    caller has entered once for several layers reading the same input (q, k and v) — then a
    local matmul; the output stays sharded along its last dimension. Backward: the entry's
    all-reduce (or reduce-scatter) of ``dL/dX``.

    ``backward_overlap=True`` (it needs ``enters_region=True``: the layer owns its entry) waits
    for that collective only after the weight-gradient GEMM, so the transfer hides under wgrad
    (and, with sequence parallelism, the re-gather of the input under dgrad); the gradients are
    bit-identical (:mod:`~dtlab.parallel.tensor.backward_overlap`).
    """

    def __init__(
        self,
        weight: nn.Parameter,
        bias: nn.Parameter | None,
        comm: Communicator,
        *,
        sequence_parallel: bool = False,
        enters_region: bool = True,
        backward_overlap: bool = False,
    ) -> None:
        super().__init__()
        if backward_overlap and not enters_region:
            raise ValueError(
                "backward_overlap=True overlaps the region entry's input-gradient collective "
                "with this layer's wgrad, so the layer must own the entry: pass "
                "enters_region=True (or leave backward_overlap off for q/k/v sharing one entry)"
            )
        self.weight, self.bias = weight, bias
        self.comm, self.sequence_parallel = comm, sequence_parallel
        self.enters_region, self.backward_overlap = enters_region, backward_overlap

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        comm: Communicator,
        *,
        sequence_parallel: bool = False,
        enters_region: bool = True,
        backward_overlap: bool = False,
    ) -> ColumnParallelLinear:
        """This rank's column shard of a full ``linear`` (every rank passes the same one)."""
        weight = nn.Parameter(shard_of(linear.weight, 0, comm, "the layer's output features"))
        bias = None
        if linear.bias is not None:
            bias = nn.Parameter(shard_of(linear.bias, 0, comm, "the layer's bias"))
        return cls(
            weight,
            bias,
            comm,
            sequence_parallel=sequence_parallel,
            enters_region=enters_region,
            backward_overlap=backward_overlap,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backward_overlap:
            return column_parallel_linear(
                x, self.weight, self.bias, self.comm, sequence_parallel=self.sequence_parallel
            )
        if self.enters_region:
            x = enter_region(x, self.comm, self.sequence_parallel)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        out, inp = self.weight.shape
        return (
            f"in={inp}, out={out} of {out * self.comm.world_size} (rank {self.comm.rank}), "
            f"enters_region={self.enters_region}, sequence_parallel={self.sequence_parallel}, "
            f"backward_overlap={self.backward_overlap}"
        )


class RowParallelLinear(nn.Module):
    """``Y = Σ_r X_r · A_rᵀ + b``: this rank's ``in/t`` input features.

    Sharded dimension: ``weight`` dim 1 (input features); ``bias`` is replicated and added once,
    *after* the sum. Input: the last-dimension shard a column-parallel layer produced. Forward:
    a local matmul, then leave the region (all-reduce, or reduce-scatter along the sequence).
    Backward: identity (or all-gather of ``dL/dY`` along the sequence), then the local matmul.

    With sequence parallelism the bias is added to a sequence shard, so each rank's bias
    gradient covers only its tokens: it is one of the parameters whose gradients
    :func:`~dtlab.parallel.tensor.sequence.all_reduce_partial_grads` sums over the group.
    """

    def __init__(
        self,
        weight: nn.Parameter,
        bias: nn.Parameter | None,
        comm: Communicator,
        *,
        sequence_parallel: bool = False,
    ) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias
        self.comm, self.sequence_parallel = comm, sequence_parallel

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, comm: Communicator, *, sequence_parallel: bool = False
    ) -> RowParallelLinear:
        """This rank's row shard of a full ``linear`` (every rank passes the same one)."""
        weight = nn.Parameter(shard_of(linear.weight, 1, comm, "the layer's input features"))
        bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())
        return cls(weight, bias, comm, sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)
        y = leave_region(partial, self.comm, self.sequence_parallel)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        out, inp = self.weight.shape
        return (
            f"in={inp} of {inp * self.comm.world_size} (rank {self.comm.rank}), out={out}, "
            f"sequence_parallel={self.sequence_parallel}"
        )
