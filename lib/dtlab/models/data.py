"""Deterministic synthetic token data with structure a tiny GPT can learn in a few dozen steps.

Each sequence is an arithmetic progression modulo the vocabulary, ``x[t+1] = (x[t] + stride) mod V``,
with a random start and a stride drawn per sequence from a few choices, and a small fraction of
tokens replaced by uniform noise (the progression continues underneath). A model first learns
"next = current + something" (loss falls from ``ln V`` towards ``ln(len(strides))``), then uses
attention to read the stride off the context, approaching the noise floor.

Batch ``i`` depends only on ``(seed, i)``, so every rank can fetch the same global batch and take
its own rows with :func:`shard_for_rank` — data-parallel ranks see disjoint rows of one batch, and
a single-process reference sees the whole of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from dtlab.models.config import GPTConfig


class SyntheticTokens:
    """``n_batches`` batches of ``(inputs, targets)``, each ``(batch_size, seq_len)`` int64.

    ``targets`` is ``inputs`` shifted left by one token (next-token prediction). Indexable and
    re-iterable: every pass yields the same batches.
    """

    def __init__(
        self,
        config: GPTConfig,
        n_batches: int,
        batch_size: int,
        seed: int = 0,
        strides: Sequence[int] = (1, 2, 3),
        noise: float = 0.05,
    ) -> None:
        if n_batches < 1 or batch_size < 1:
            raise ValueError(f"n_batches={n_batches} and batch_size={batch_size} must be >= 1")
        if not 0.0 <= noise < 1.0:
            raise ValueError(f"noise={noise} must be a probability in [0, 1)")
        if not strides:
            raise ValueError("strides must name at least one step size, e.g. (1, 2, 3)")
        self.vocab_size = config.vocab_size
        self.seq_len = config.seq_len
        self.n_batches = n_batches
        self.batch_size = batch_size
        self.seed = seed
        self.strides = torch.tensor(list(strides), dtype=torch.long)
        self.noise = noise

    def __len__(self) -> int:
        return self.n_batches

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not -self.n_batches <= i < self.n_batches:
            raise IndexError(f"batch {i} out of range for {self.n_batches} batches")
        i %= self.n_batches
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        rows, length = self.batch_size, self.seq_len + 1
        start = torch.randint(self.vocab_size, (rows, 1), generator=g)
        stride = self.strides[torch.randint(len(self.strides), (rows, 1), generator=g)]
        tokens = (start + stride * torch.arange(length)) % self.vocab_size
        noisy = torch.rand(rows, length, generator=g) < self.noise
        tokens = torch.where(
            noisy, torch.randint(self.vocab_size, (rows, length), generator=g), tokens
        )
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(self.n_batches):
            yield self[i]


def shard_for_rank(batch, rank: int, world_size: int):
    """This data-parallel rank's rows of a global batch: contiguous block ``rank`` of ``world_size``.

    ``batch`` is a tensor or a tuple/list of tensors sharing the batch dimension 0; the result has
    the same structure. Rank ``r`` gets rows ``[r·b/N, (r+1)·b/N)``, so concatenating the ranks'
    shards in rank order gives the global batch back.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    if isinstance(batch, (tuple, list)):
        return type(batch)(shard_for_rank(t, rank, world_size) for t in batch)
    rows = batch.shape[0]
    if rows % world_size:
        raise ValueError(
            f"global batch of {rows} rows does not split evenly over {world_size} data-parallel "
            f"ranks; use a batch size that is a multiple of {world_size}"
        )
    per_rank = rows // world_size
    return batch[rank * per_rank : (rank + 1) * per_rank]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position of every row.

    The mean is over this rank's rows: with equal shards, averaging the ranks' gradients (what DDP
    does) equals the gradient of the loss on the global batch.
    """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
