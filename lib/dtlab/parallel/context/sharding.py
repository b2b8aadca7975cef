"""Which tokens each context-parallel rank holds: contiguous or zig-zag, positions explicit.

Contiguous: rank ``r`` of ``N`` holds tokens ``r·S/N … (r+1)·S/N − 1``. Under a causal mask
rank ``r``'s queries see ``r + ½`` blocks' worth of keys, so the last rank works ~``2N−1`` times
as hard as the first, and the ring waits for it at every step.

Zig-zag (head-tail; Brandon et al. 2023, "Striped attention", and Megatron's load-balanced CP):
cut the sequence into ``2N`` chunks of ``S/(2N)``; rank ``r`` holds chunks ``r`` and
``2N−1−r``. An early chunk (little causal work) pairs with a late one (much), so every rank
computes the same number of unmasked scores. The tokens are no longer consecutive, so each rank
carries their global positions — the causal mask and the position embedding both read them.
"""

from __future__ import annotations

import torch

STYLES = ("contiguous", "zigzag")


def _check(seq_len: int, cp: int, rank: int, style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"style={style!r}; choose one of {STYLES}")
    if not 0 <= rank < cp:
        raise ValueError(f"rank {rank} is not in a cp group of {cp} ranks")
    parts = 2 * cp if style == "zigzag" else cp
    if seq_len % parts:
        raise ValueError(
            f"{style} sharding cuts seq_len={seq_len} into {parts} equal chunks for cp={cp}; "
            f"choose a seq_len that is a multiple of {parts}, or another cp"
        )


def shard_positions(seq_len: int, cp: int, rank: int, style: str = "zigzag") -> torch.Tensor:
    """The global positions (int64, ascending) of the tokens rank ``rank`` of ``cp`` holds."""
    _check(seq_len, cp, rank, style)
    if style == "contiguous":
        size = seq_len // cp
        return torch.arange(rank * size, (rank + 1) * size)
    chunk = seq_len // (2 * cp)
    head = torch.arange(rank * chunk, (rank + 1) * chunk)
    tail_start = (2 * cp - 1 - rank) * chunk
    return torch.cat([head, torch.arange(tail_start, tail_start + chunk)])


def shard_sequence(
    x: torch.Tensor, cp: int, rank: int, style: str = "zigzag", *, dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x's tokens for this rank, their global positions)``, cut along the sequence axis ``dim``.

    ``dim`` has no default because the sequence sits in different places: ``dim=1`` for token
    ids and activations ``(B, S)`` / ``(B, S, d)``, ``dim=2`` for attention's q, k, v
    ``(B, H, S, Dh)``. The wrong axis would cut heads or features without an error whenever
    their size happens to divide evenly. The positions come on ``x``'s device: the model's
    position embedding and the ring's K/V blocks (NCCL moves device tensors only) use them there.
    """
    positions = shard_positions(x.shape[dim], cp, rank, style).to(x.device)  # travel with K/V
    return x.index_select(dim, positions), positions


def unshard_sequence(shards: list[torch.Tensor], style: str = "zigzag", *, dim: int):
    """Put every rank's shard (rank order) back into the full sequence along ``dim`` (the axis
    :func:`shard_sequence` cut: 1 for ``(B, S, …)``, 2 for ``(B, H, S, Dh)``)."""
    cp = len(shards)
    seq_len = sum(s.shape[dim] for s in shards)
    full = torch.empty_like(torch.cat(shards, dim))
    for rank, shard in enumerate(shards):
        positions = shard_positions(seq_len, cp, rank, style).to(shard.device)
        full.index_copy_(dim, positions, shard)
    return full
