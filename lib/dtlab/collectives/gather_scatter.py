"""Gather and scatter: one root collects a block from every rank, or hands one block to every rank.

Both are *flat*: the root posts all ``N-1`` receives (sends) in one step, so its link carries
``(N-1)/N · M`` bytes (``M`` the gathered buffer) and every other rank moves one block of
``M/N``. Time ``α + (N-1)/N · M β`` when the root's link is the bottleneck. Collecting per-rank
results for logging (``gather``) and handing out data shards (``scatter``) are their everyday uses.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dtlab.collectives.agreement import CallDescriptor, check_agreement
from dtlab.collectives.p2p import Group, peers_of


def gather(
    tensor: torch.Tensor, root: int = 0, *, group: Group = None
) -> list[torch.Tensor] | None:
    """On rank ``root`` (an index within ``group``): every rank's ``tensor`` in rank order.
    Elsewhere ``None``. Every rank's tensor must have the same shape and dtype."""
    peers = peers_of(group)
    if not 0 <= root < peers.size:
        raise ValueError(f"root {root} is not a rank of this {peers.size}-rank group")
    call = CallDescriptor("gather", "flat", tensor.dtype, tensor.numel(), root=root)
    check_agreement(peers, call, tensor.device)
    source = tensor.contiguous()
    if peers.rank != root:
        peers.send(root, source, name="gather.flat")
        return None
    blocks = [source.clone() if p == root else torch.empty_like(source) for p in range(peers.size)]
    peers.exchange(
        recvs=[(p, blocks[p]) for p in range(peers.size) if p != root], name="gather.flat"
    )
    return blocks


def scatter(
    out: torch.Tensor,
    blocks: Sequence[torch.Tensor] | None = None,
    root: int = 0,
    *,
    group: Group = None,
) -> torch.Tensor:
    """Fill ``out`` on every rank with ``blocks[rank]`` from rank ``root``. Only the root passes
    ``blocks`` (one per rank, each shaped like ``out``)."""
    peers = peers_of(group)
    if not 0 <= root < peers.size:
        raise ValueError(f"root {root} is not a rank of this {peers.size}-rank group")
    call = CallDescriptor("scatter", "flat", out.dtype, out.numel(), root=root)
    check_agreement(peers, call, out.device)
    if peers.rank != root:
        if not out.is_contiguous():
            raise ValueError("scatter receives into out, which must be contiguous")
        peers.recv(root, out, name="scatter.flat")
        return out
    if blocks is None or len(blocks) != peers.size:
        raise ValueError(f"the root must pass one block per rank ({peers.size})")
    if any(b.shape != out.shape for b in blocks):
        raise ValueError(f"every block must have out's shape {tuple(out.shape)}")
    peers.exchange(
        sends=[(p, blocks[p].contiguous()) for p in range(peers.size) if p != root],
        name="scatter.flat",
    )
    out.copy_(blocks[root])
    return out
