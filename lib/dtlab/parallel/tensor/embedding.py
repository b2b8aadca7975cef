"""Vocabulary-parallel embedding: each rank holds ``V/t`` rows of the token-embedding table.

Shoeybi et al. 2019 (Megatron-LM, §3, "input embedding"). Rank ``r`` owns token ids
``[r·V/t, (r+1)·V/t)``. Every rank sees the same (replicated) token ids; it looks up the ones
it owns and writes zeros for the rest, so the full embedding is the *sum* over ranks — which is
how it leaves: an all-reduce of ``b·s·h`` elements (``g``), or with sequence parallelism a
reduce-scatter along the sequence that hands rank ``r`` sequence chunk ``r`` (Korthikanti et
al. 2022), half the bytes. Backward runs no collective of its own: ``g``'s backward is the
identity (the sequence-parallel one all-gathers ``dL/dh``), and each rank's rows receive the
gradients of the tokens it owns.

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


class VocabParallelEmbedding(nn.Module):
    """``embed(idx)`` from this rank's ``V/t`` rows, summed over the tensor-parallel group.

    Sharded dimension: ``weight`` dim 0 (the vocabulary). Forward: masked local lookup, then an
    all-reduce — or, with ``sequence_parallel``, a reduce-scatter that returns this rank's
    ``(batch, seq/t, d)`` chunk. Backward: none (identity), or an all-gather with SP.
    """

    def __init__(
        self,
        weight: nn.Parameter,
        vocab_start: int,
        comm: Communicator,
        *,
        sequence_parallel: bool = False,
    ) -> None:
        super().__init__()
        self.weight, self.vocab_start = weight, vocab_start
        self.comm, self.sequence_parallel = comm, sequence_parallel

    @classmethod
    def from_embedding(
        cls, embedding: nn.Embedding, comm: Communicator, *, sequence_parallel: bool = False
    ) -> VocabParallelEmbedding:
        """This rank's vocabulary shard of a full ``embedding`` (the same on every rank)."""
        rows = shard_of(embedding.weight, 0, comm, "the vocabulary (embedding rows)")
        return cls(
            nn.Parameter(rows), comm.rank * len(rows), comm, sequence_parallel=sequence_parallel
        )

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
        return (
            f"tokens {self.vocab_start}..{self.vocab_end - 1} of "
            f"{self.weight.shape[0] * self.comm.world_size}, dim={self.weight.shape[1]}, "
            f"sequence_parallel={self.sequence_parallel}"
        )
