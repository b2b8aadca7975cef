"""``parallelize_gpt``: tensor (and sequence) parallelism applied to the lab GPT from outside.

The torchtitan shape: the model is built whole on every rank — ``GPT(config, seed)`` is
bit-identical everywhere — and this function replaces its modules in place by this rank's
shards; the model's code does not change and knows nothing of ranks. What the training loop
needs besides the model comes back in a :class:`TensorParallel`::

    tp = parallelize_gpt(GPT(config, seed=0), mesh, sequence_parallel=True)
    opt = torch.optim.AdamW(tp.model.parameters())           # this rank's shards
    logits = tp.model(tokens)                                # (b, s, vocab/t): never gathered
    loss = tp.loss(logits, targets)                          # vocab-parallel cross-entropy
    loss.backward()
    tp.finish_gradients()                                    # SP: sum the partial LN/bias grads
    opt.step()

Inputs: every rank of a tensor-parallel group feeds the *same* ``(b, s)`` token ids and
targets (data parallelism, if any, splits the batch across groups). With sequence parallelism
nothing is cut by hand: the vocabulary-parallel embedding's reduce-scatter hands rank ``r``
sequence chunk ``r``, and the LM head's all-gather brings the whole sequence back.

Dropout: masks come from each rank's own RNG. Outside the regions without SP every rank must
draw the same mask (seed the ranks of a group alike); inside a region, and on sequence shards,
Megatron draws different masks per rank from a separate RNG tracker, which dtlab does not model
— the equivalence tests run at ``dropout=0``.

What becomes what (Shoeybi et al. 2019; Korthikanti et al. 2022):

==========================  ===================================================================
module                      becomes
==========================  ===================================================================
``embed``                   :class:`VocabParallelEmbedding` (rows of the vocabulary; leaves by
                            all-reduce, or reduce-scatter along the sequence with SP)
``pos_embed``               unchanged; with SP :class:`SequenceShardedPositions`
``blocks[i].attn``          q/k/v column-parallel, out row-parallel (:mod:`.blocks`)
``blocks[i].mlp``           fc_in column-parallel, fc_out row-parallel
LayerNorms                  unchanged (replicated; on sequence shards with SP)
``lm_head``                 :class:`ColumnParallelLinear` over the vocabulary; when tied, its
                            ``weight`` *is* the embedding's shard Parameter
==========================  ===================================================================

A vocabulary that ``t`` does not divide is padded with zero rows to the next multiple of ``t``
(:func:`~dtlab.parallel.tensor.embedding.padded_vocab_size`; Megatron-LM pads too): each rank's
logits are ``(b, s, ⌈V/t⌉)``, :meth:`TensorParallel.loss` leaves the padding columns out, and
:meth:`~TensorParallel.gather_logits`, :meth:`~TensorParallel.full_parameters` and
:meth:`~TensorParallel.full_gradients` cut them off, so all three have the one-process model's
shapes and values.

Collectives: :meth:`~TensorParallel.loss`, :meth:`~TensorParallel.finish_gradients`,
:meth:`~TensorParallel.gather_logits`, :meth:`~TensorParallel.full_parameters` and
:meth:`~TensorParallel.full_gradients` each run collectives over the tensor-parallel group, so
every rank of the group must call them, in the same order — also when only one rank wants the
result (to print or save it). Called on one rank they wait for ranks that never join; inside
``cluster.run`` the Cluster reports it, naming the method and your line, as soon as the other
ranks have returned (else at its timeout).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from dtlab.comm import Communicator, gather_along
from dtlab.mesh.layout_rules import (
    degree_problems,
    raise_problems,
    sequence_parallel_problems,
    tensor_parallel_problems,
)
from dtlab.models import GPTConfig
from dtlab.parallel.tensor.blocks import parallelize_block
from dtlab.parallel.tensor.cross_entropy import vocab_parallel_cross_entropy
from dtlab.parallel.tensor.embedding import VocabParallelEmbedding, pad_vocab
from dtlab.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear, shard_of
from dtlab.parallel.tensor.sequence import (
    SequenceShardedPositions,
    all_reduce_partial_grads,
    partial_grad_parameters,
)


def check_tensor_parallel(
    config: GPTConfig,
    layout: object | None = None,
    *,
    tp: int | None = None,
    sequence_parallel: bool = False,
) -> None:
    """Refuse a TP degree this GPT cannot take, naming every problem and what to choose.

    The rules (and their messages) are those of :mod:`dtlab.mesh.layout_rules`: ``t`` divides the
    heads, KV heads and ``d_ff``; with sequence parallelism, ``seq_len`` too.
    ``vocab_size`` need not divide: :func:`parallelize_gpt` pads it (see the module docstring).
    Use it before any process starts:
    ``Layout(tp=2).check(2, model_check=tensor_parallel_check(config))``.
    """
    tp = tp if tp is not None else getattr(layout, "tp", 1)
    raise_problems(degree_problems(tp=tp))
    problems = tensor_parallel_problems(tp, config.n_heads, config.n_kv_heads, config.d_ff)
    if sequence_parallel:
        problems += sequence_parallel_problems(tp, config.seq_len)
    raise_problems(problems, f"tensor parallelism tp={tp} does not fit the model")


def tensor_parallel_check(
    config: GPTConfig, sequence_parallel: bool = False
) -> Callable[[object], None]:
    """A ``model_check`` for :meth:`dtlab.mesh.Layout.check`: :func:`check_tensor_parallel`."""
    return lambda layout: check_tensor_parallel(config, layout, sequence_parallel=sequence_parallel)


def _shard_dims(model: nn.Module) -> dict[int, int]:
    """id(parameter) → the dimension it is split along, for every sharded parameter."""
    dims: dict[int, int] = {}
    for module in model.modules():
        if isinstance(module, ColumnParallelLinear | VocabParallelEmbedding):
            dims.update((id(p), 0) for p in module.parameters(recurse=False))
        elif isinstance(module, RowParallelLinear):
            dims[id(module.weight)] = 1
    return dims


@dataclass
class TensorParallel:
    """A tensor-parallel GPT and what its training loop needs (see the module docstring)."""

    model: nn.Module
    comm: Communicator
    sequence_parallel: bool
    shard_dims: dict[str, int] = field(default_factory=dict)
    """Parameter name → the dimension split over the group; names not here are replicated."""
    partial_grads: list[nn.Parameter] = field(default_factory=list)
    """Replicated parameters whose gradients are partial sums under sequence parallelism."""
    vocab_size: int | None = None
    """The model's real vocabulary; the sharded one is padded past it when ``t`` does not
    divide it (``None``: every sharded row is real)."""
    vocab_names: frozenset[str] = frozenset()
    """Names of the parameters split along the (possibly padded) vocabulary, dim 0."""

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy from the vocabulary-sharded logits (never gathered; padding
        columns left out). Collective: three all-reduces over the group."""
        return vocab_parallel_cross_entropy(logits, targets, self.comm, vocab_size=self.vocab_size)

    def finish_gradients(self) -> None:
        """After backward, before the optimizer: with SP, sum the partial gradients of the
        replicated parameters over the group (one all-reduce); without SP, nothing to do.
        Collective: call it on every rank of the group."""
        if self.sequence_parallel:
            all_reduce_partial_grads(self.partial_grads, self.comm)

    @torch.no_grad()
    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The full ``(…, vocab)`` logits, padding cut off — for checking and sampling, not for
        the loss. Collective: an all-gather over the group; call it on every rank."""
        return gather_along(logits, -1, self.comm)[..., : self.vocab_size]

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Name → the full (gathered) parameter, as the single-process model names and shapes
        it. Collective: one all-gather per sharded parameter; call it on every rank of the group
        (every rank gets the result), not inside ``if rank == 0``."""
        return self._gathered(lambda p: p.detach())

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Name → the full (gathered) gradient, as the single-process model names and shapes
        it; call after :meth:`finish_gradients`. Collective: one all-gather per sharded
        gradient; call it on every rank of the group (every rank gets the result), not inside
        ``if rank == 0`` — a lone caller waits for ranks that never join (inside
        ``cluster.run`` the Cluster says so once they return, naming this method and your
        line)."""
        return self._gathered(lambda p: p.grad)

    @torch.no_grad()
    def _gathered(self, value_of) -> dict[str, torch.Tensor]:
        full = {}
        for name, param in self.model.named_parameters():
            value = value_of(param)
            if value is not None and name in self.shard_dims:
                value = gather_along(value, self.shard_dims[name], self.comm)
                if name in self.vocab_names:
                    value = value[: self.vocab_size]
            full[name] = None if value is None else value.clone()
        return full

    def parameter_bytes(self) -> int:
        """Bytes of parameters this rank holds (a tied shard counted once)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


def parallelize_gpt(
    model: nn.Module,
    mesh_or_comm,
    sequence_parallel: bool = False,
    collectives: str = "torch",
    backward_overlap: bool = False,
) -> TensorParallel:
    """Shard ``model`` (a :class:`dtlab.models.GPT`) over the tensor-parallel group, in place.

    ``backward_overlap=True``: every MLP's ``fc_in`` and the LM head wait for their
    input-gradient collective only after their weight-gradient GEMM (bit-identical gradients;
    :func:`~dtlab.parallel.tensor.blocks.parallelize_block` says why attention's entry does not).

    ``mesh_or_comm``: a :class:`dtlab.mesh.Mesh` (its ``tp`` group is used, with
    ``collectives`` — ``"torch"``, or ``"dtlab"`` to count every byte) or a ready
    :class:`~dtlab.comm.Communicator` (whose own ``collectives`` choice is kept). Every rank
    must pass the same full model (``GPT(config, seed)`` is identical on every rank).
    """
    if isinstance(mesh_or_comm, Communicator):
        comm = mesh_or_comm
    else:
        comm = Communicator.along(mesh_or_comm, "tp", collectives)
    check_tensor_parallel(model.config, tp=comm.world_size, sequence_parallel=sequence_parallel)
    tied = model.lm_head.weight is model.embed.weight
    sp, vocab_size = sequence_parallel, model.embed.weight.shape[0]

    model.embed = VocabParallelEmbedding.from_embedding(model.embed, comm, sequence_parallel=sp)
    if sp:
        model.pos_embed = SequenceShardedPositions(model.pos_embed.weight, comm)
    for block in model.blocks:
        parallelize_block(block, comm, sp, backward_overlap)
    if tied:  # one shard object: the head's rows are the embedding's rows
        model.lm_head = ColumnParallelLinear(
            model.embed.weight, None, comm, sequence_parallel=sp, backward_overlap=backward_overlap
        )
    else:
        model.lm_head = _vocab_parallel_head(model.lm_head, comm, sp, backward_overlap)

    dims = _shard_dims(model)
    vocab_params = {id(p) for m in (model.embed, model.lm_head) for p in m.parameters()}
    return TensorParallel(
        model,
        comm,
        sp,
        {name: dims[id(p)] for name, p in model.named_parameters() if id(p) in dims},
        partial_grad_parameters(model),
        vocab_size,
        frozenset(name for name, p in model.named_parameters() if id(p) in vocab_params),
    )


def _vocab_parallel_head(
    head: nn.Linear, comm: Communicator, sp: bool, backward_overlap: bool = False
) -> ColumnParallelLinear:
    """An untied LM head split over the vocabulary, padded like the embedding."""
    t, what = comm.world_size, "the LM head's vocabulary"
    weight = nn.Parameter(shard_of(pad_vocab(head.weight, t), 0, comm, what))
    bias = None
    if head.bias is not None:
        bias = nn.Parameter(shard_of(pad_vocab(head.bias, t), 0, comm, what))
    return ColumnParallelLinear(
        weight, bias, comm, sequence_parallel=sp, backward_overlap=backward_overlap
    )
