"""All-to-all: rank ``i`` sends its ``j``-th block to rank ``j`` and receives everyone's ``i``-th block.

This is the collective of expert parallelism (tokens to their experts and back) and of Ulysses
sequence parallelism. **Pairwise exchange**: ``N-1`` steps; at step ``s`` rank ``r`` sends its
block for ``r+s`` and receives the block ``r-s`` has for it. The block a rank keeps for itself is
copied locally and never touches the wire, so with equal blocks each rank sends
``(N-1)/N · M`` bytes in ``N-1`` messages: time ``(N-1)(α + M/N · β)``.

Blocks are slices along dim 0 and may differ in size (``send_splits``/``recv_splits`` in rows, as
in ``torch.distributed.all_to_all_single``): MoE routing is never balanced.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dtlab.collectives.p2p import Group, Peers, peers_of


def _offsets(splits: Sequence[int]) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for count in splits:
        bounds.append((start, start + count))
        start += count
    return bounds


def exchange_split_sizes(
    send_splits: Sequence[int], peers: Peers, device: torch.device | None = None
) -> list[int]:
    """How many rows every rank will send me: a tiny pairwise all-to-all of the counts (counted
    in :func:`~dtlab.collectives.p2p.comm_stats` like any other traffic)."""
    mine = torch.tensor(list(send_splits), dtype=torch.int64, device=device)
    theirs = torch.empty_like(mine)
    _pairwise(mine.view(-1, 1), theirs.view(-1, 1), [1] * peers.size, [1] * peers.size, peers)
    return theirs.tolist()


def _pairwise(
    source: torch.Tensor,
    target: torch.Tensor,
    send_splits: Sequence[int],
    recv_splits: Sequence[int],
    peers: Peers,
) -> None:
    n, r = peers.size, peers.rank
    send_at, recv_at = _offsets(send_splits), _offsets(recv_splits)
    target[slice(*recv_at[r])] = source[slice(*send_at[r])]
    for s in range(1, n):
        to, frm = (r + s) % n, (r - s) % n
        peers.exchange(
            sends=[(to, source[slice(*send_at[to])])],
            recvs=[(frm, target[slice(*recv_at[frm])])],
            name="all_to_all.pairwise",
            step=s - 1,
        )


def all_to_all(
    tensor: torch.Tensor,
    send_splits: Sequence[int] | None = None,
    recv_splits: Sequence[int] | None = None,
    *,
    algorithm: str = "pairwise",
    group: Group = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scatter ``tensor``'s dim-0 blocks to the ranks and gather theirs, like ``all_to_all_single``.

    Without ``send_splits`` dim 0 must divide evenly by the number of ranks. Without
    ``recv_splits`` (but with ``send_splits``) the counts are exchanged first.
    """
    if algorithm != "pairwise":
        raise ValueError(f"unknown all-to-all algorithm {algorithm!r}; choose 'pairwise'")
    peers = peers_of(group)
    n = peers.size
    rows = tensor.shape[0] if tensor.dim() else 1
    if send_splits is None:
        if rows % n:
            raise ValueError(
                f"dim 0 has {rows} rows, which {n} ranks cannot split evenly; pass send_splits"
            )
        send_splits = [rows // n] * n
        recv_splits = send_splits if recv_splits is None else recv_splits
    if len(send_splits) != n or sum(send_splits) != rows:
        raise ValueError(
            f"send_splits {list(send_splits)} must have {n} entries summing to dim 0 ({rows})"
        )
    if recv_splits is None:
        recv_splits = exchange_split_sizes(send_splits, peers, tensor.device)
    if len(recv_splits) != n:
        raise ValueError(f"recv_splits {list(recv_splits)} must have one entry per rank ({n})")
    source = tensor.contiguous()
    row_shape = tuple(source.shape[1:])
    if out is None:
        out = source.new_empty((sum(recv_splits), *row_shape))
    elif not out.is_contiguous() or tuple(out.shape) != (sum(recv_splits), *row_shape):
        raise ValueError(
            f"out must be a contiguous tensor of shape {(sum(recv_splits), *row_shape)}"
        )
    _pairwise(source, out, send_splits, recv_splits, peers)
    return out
