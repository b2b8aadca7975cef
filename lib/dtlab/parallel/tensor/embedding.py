"""Vocabulary-parallel embedding: each rank holds ``V/t`` rows of the token-embedding table.

Shoeybi et al. 2019 (Megatron-LM, §3, "input embedding"). Rank ``r`` owns token ids
``[r·V/t, (r+1)·V/t)``. Every rank sees the same (replicated) token ids; it looks up the ones
it owns and writes zeros for the rest, so the full embedding is the *sum* over ranks — which is
how it leaves: an all-reduce of ``b·s·h`` elements (``g``), or with sequence parallelism a
reduce-scatter along the sequence that hands rank ``r`` sequence chunk ``r`` (Korthikanti et
al. 2022), half the bytes. Backward runs no collective of its own: ``g``'s backward is the
identity (the sequence-parallel one all-gathers ``dL/dh``), and each rank's rows receive the
gradients of the tokens it owns.

A vocabulary that ``t`` does not divide is **padded**, as Megatron-LM does: the table gets
zero rows up to :func:`padded_vocab_size` (the next multiple of ``t``), so every rank holds
``⌈V/t⌉`` rows. No token id reaches a padding row, so the embedding is unchanged; the LM
head's padding columns are left out of the loss
(:func:`~dtlab.parallel.tensor.vocab_parallel_cross_entropy` with ``vocab_size``), so their
gradient is zero and they never change what the model computes. Megatron rounds further, to a
multiple of ``make_vocab_size_divisible_by · t`` (128 · t: GPT-2's 50 257 becomes 50 304 at
t = 1) so that each shard's matmul has a tensor-core-friendly width; dtlab pads only what the
split needs, so a padded model stays as close to the unpadded one as possible.

Tied embeddings (GPT-2): the LM head is a column-parallel Linear over the *same* vocabulary
rows, so :func:`~dtlab.parallel.tensor.parallelize.parallelize_gpt` hands it this module's
``weight`` Parameter itself — one shard object, two uses, gradients accumulated into one
``.grad`` exactly as in the single-process model.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab.comm import Communicator
from dtlab.parallel.tensor.layers import leave_region, shard_of


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``tp``: the rows a vocabulary-sharded table
    has, ``tp`` shards of ``⌈vocab_size/tp⌉``."""
    return -(-vocab_size // tp) * tp


def pad_vocab(weight: torch.Tensor, tp: int) -> torch.Tensor:
    """``weight`` (vocab, …) with zero rows appended up to :func:`padded_vocab_size` (a detached
    view of ``weight`` itself when ``tp`` divides the vocabulary)."""
    missing = padded_vocab_size(weight.shape[0], tp) - weight.shape[0]
    weight = weight.detach()
    if not missing:
        return weight
    return torch.cat([weight, weight.new_zeros(missing, *weight.shape[1:])])


class VocabParallelEmbedding(nn.Module):
    """``embed(idx)`` from this rank's ``V/t`` rows, summed over the tensor-parallel group.

    Sharded dimension: ``weight`` dim 0 (the vocabulary). Forward: masked local lookup, then an
    all-reduce — or, with ``sequence_parallel``, a reduce-scatter that returns this rank's
    ``(batch, seq/t, d)`` chunk. Backward: none (identity), or an all-gather with SP.
    ``vocab_size`` is the real vocabulary (default: every rank's rows); rows of ids at or past
    it are padding (see the module docstring).
    """

    def __init__(
        self,
        weight: nn.Parameter,
        vocab_start: int,
        comm: Communicator,
        *,
        sequence_parallel: bool = False,
        vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        self.weight, self.vocab_start = weight, vocab_start
        self.comm, self.sequence_parallel = comm, sequence_parallel
        self.vocab_size = weight.shape[0] * comm.world_size if vocab_size is None else vocab_size

    @classmethod
    def from_embedding(
        cls, embedding: nn.Embedding, comm: Communicator, *, sequence_parallel: bool = False
    ) -> VocabParallelEmbedding:
        """This rank's vocabulary shard of a full ``embedding`` (the same on every rank),
        padded with zero rows when the group's size does not divide the vocabulary."""
        vocab_size = embedding.weight.shape[0]
        full = pad_vocab(embedding.weight, comm.world_size)
        rows = shard_of(full, 0, comm, "the vocabulary (embedding rows)")
        return cls(
            nn.Parameter(rows), comm.rank * len(rows), comm,
            sequence_parallel=sequence_parallel, vocab_size=vocab_size,
        )  # fmt: skip

    @property
    def vocab_end(self) -> int:
        return self.vocab_start + self.weight.shape[0]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        local = idx - self.vocab_start
        elsewhere = (local < 0) | (local >= self.weight.shape[0])  # owned by another rank
        rows = F.embedding(local.masked_fill(elsewhere, 0), self.weight)
        partial = rows.masked_fill(elsewhere.unsqueeze(-1), 0.0)
        return leave_region(partial, self.comm, self.sequence_parallel)

    def extra_repr(self) -> str:
        padded = self.weight.shape[0] * self.comm.world_size
        padding = f" (padded to {padded})" if padded != self.vocab_size else ""
        return (
            f"tokens {self.vocab_start}..{self.vocab_end - 1} of {self.vocab_size}{padding}, "
            f"dim={self.weight.shape[1]}, sequence_parallel={self.sequence_parallel}"
        )
