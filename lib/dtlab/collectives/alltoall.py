"""All-to-all: rank ``i`` sends its ``j``-th block to rank ``j`` and receives everyone's ``i``-th block.

This is the collective of expert parallelism (tokens to their experts and back) and of Ulysses
sequence parallelism. **Pairwise exchange**: ``N-1`` steps; at step ``s`` rank ``r`` sends its
block for ``r+s`` and receives the block ``r-s`` has for it. The block a rank keeps for itself is
copied locally and never touches the wire, so with equal blocks each rank sends
``(N-1)/N · M`` bytes in ``N-1`` messages: time ``(N-1)(α + M/N · β)``.

Blocks are slices along dim 0 and may differ in size (``send_splits``/``recv_splits`` in rows, as
in ``torch.distributed.all_to_all_single``): MoE routing is never balanced. A split list may be
Python ints or integer tensors — a 1-D tensor (what ``torch.bincount`` of the routed experts
returns) or a list of 0-d ones — and is turned into Python ints once, up front.

Before any row moves, the ranks exchange their send counts (a control message, not counted:
:mod:`~dtlab.collectives.agreement`). Without ``recv_splits`` each rank's receive counts come
from that exchange; with them, a rank whose ``recv_splits`` do not match what the others send it
makes every rank raise, naming the counts, instead of waiting for rows that never come.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch

from dtlab.collectives.agreement import CallDescriptor, CollectiveMismatch, check_agreement
from dtlab.collectives.p2p import Group, Peers, peers_of

Splits = Sequence[int] | Sequence[torch.Tensor] | torch.Tensor
"""Rows per rank: a list of ints, a 1-D integer tensor, or a list of 0-d integer tensors."""


def row_counts(splits: Splits, what: str, n: int) -> list[int]:
    """``splits`` as ``n`` Python ints ≥ 0 — never tensors, whose ``+=`` would work in place."""
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1 or splits.is_floating_point() or splits.is_complex():
            raise ValueError(
                f"{what} must be rows per rank: a 1-D integer tensor or a list of ints, "
                f"got a {splits.dim()}-D {splits.dtype} tensor"
            )
        counts = splits.tolist()
    else:
        counts = []
        for count in splits:
            if isinstance(count, torch.Tensor) and count.numel() == 1:
                count = count.reshape(()).tolist()
            try:
                counts.append(operator.index(count))
            except TypeError:
                raise ValueError(
                    f"{what} must hold whole row counts, got {count!r}; pass ints or an "
                    "integer tensor such as torch.bincount(...)"
                ) from None
    if len(counts) != n:
        raise ValueError(f"{what} {counts} must have one entry per rank ({n})")
    if any(c < 0 for c in counts):
        raise ValueError(f"{what} {counts} must not be negative")
    return counts


def _offsets(splits: Sequence[int]) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for count in splits:
        bounds.append((start, start + count))
        start += count
    return bounds


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


def _agreed_recv_splits(peers: Peers, call: CallDescriptor, device: torch.device) -> list[int]:
    """Rows each rank sends me, from the control exchange; raise on every rank if any rank's
    ``recv_splits`` differ from what is sent to it."""
    calls = check_agreement(peers, call, device, same_numel=False)
    sent_to = [[c.counts[j] for c in calls] for j in range(peers.size)]
    wrong = [
        f"rank {peers.global_ranks[j]} expects {list(c.more_counts)} (its recv_splits) but is "
        f"sent {sent_to[j]}"
        for j, c in enumerate(calls)
        if c.more_counts is not None and list(c.more_counts) != sent_to[j]
    ]
    if wrong:
        raise CollectiveMismatch(
            "all_to_all: the ranks disagree on how many rows go where — "
            + "; ".join(wrong)
            + " (entry i: the rows rank i's send_splits send it). To fix: each rank's "
            "recv_splits must list the rows every rank sends it, in rank order — or leave "
            "recv_splits out and they are exchanged for you."
        )
    return sent_to[peers.rank]


def all_to_all(
    tensor: torch.Tensor,
    send_splits: Splits | None = None,
    recv_splits: Splits | None = None,
    *,
    algorithm: str = "pairwise",
    group: Group = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scatter ``tensor``'s dim-0 blocks to the ranks and gather theirs, like ``all_to_all_single``.

    Without ``send_splits`` dim 0 must divide evenly by the number of ranks (and every rank sends
    the same number of rows). Without ``recv_splits`` (but with ``send_splits``) the counts come
    from the ranks' control exchange.
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
        send = [rows // n] * n
        recv = send if recv_splits is None else row_counts(recv_splits, "recv_splits", n)
    else:
        send = row_counts(send_splits, "send_splits", n)
        recv = None if recv_splits is None else row_counts(recv_splits, "recv_splits", n)
    if sum(send) != rows:
        raise ValueError(f"send_splits {send} must sum to dim 0 ({rows} rows)")
    source = tensor.contiguous()
    row_shape = tuple(source.shape[1:])
    call = CallDescriptor(
        "all_to_all",
        algorithm,
        tensor.dtype,
        rows,
        detail=math.prod(row_shape),
        counts=tuple(send),
        more_counts=None if recv is None else tuple(recv),
    )
    recv = _agreed_recv_splits(peers, call, tensor.device)
    if out is None:
        out = source.new_empty((sum(recv), *row_shape))
    elif not out.is_contiguous() or tuple(out.shape) != (sum(recv), *row_shape):
        raise ValueError(f"out must be a contiguous tensor of shape {(sum(recv), *row_shape)}")
    _pairwise(source, out, send, recv, peers)
    return out
