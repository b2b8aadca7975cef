"""In-network reduction (NVLS, SHARP) on ranks: one rank plays the switch that adds.

With NVLink SHARP (NVLS, H100 NVSwitch) or SHARP in InfiniBand switches (NCCL's CollNet), the
*switch* does the adding. NVLS's all-reduce, as NCCL runs it, in two phases over ``N`` GPUs:

1. **reduce** (``multimem.ld_reduce``): GPU ``j`` asks the switch for slice ``j`` summed over
   every GPU; the switch reads slice ``j`` from all ``N`` GPUs and returns the sum. Over all
   requests, every GPU's whole buffer leaves it once (``M`` out) and each gets ``M/N`` back;
2. **multicast** (``multimem.st``): GPU ``j`` writes its summed slice once (``M/N`` out) and the
   switch copies it to every GPU; each GPU takes in every slice (``M`` in).

Each GPU therefore sends — and receives — ``(1 + 1/N)·M``, against the ring's ``2(N-1)/N·M``:
more than the ring at ``N = 2``, equal at 3, fewer from 4 on and about half at large ``N`` —
and in 2 steps instead of ``2(N-1)``. nccl-tests still prints
``busbw = algbw · 2(N-1)/N``, which over-states the link's load by ``2(N-1)/(N+1)``
(:func:`dtlab.cost.nccl_protocols.in_network_busbw`).

Here group member ``switch`` plays the switch: it holds no data of its own, receives what the
GPUs send, adds, and multicasts (as ``N`` unicast messages — a real switch replicates the packet
itself). The other ``N = size - 1`` members are the GPUs. Their counted bytes must equal
``(1 + 1/N)·M`` each way (``N`` dividing the length); the switch's own counters are the switch
ports', not a GPU link's.
"""

from __future__ import annotations

import torch

from dtlab.collectives.agreement import CallDescriptor, check_agreement
from dtlab.collectives.ops import chunk_bounds, combine_, finish_, flat_view, normalize_op
from dtlab.collectives.p2p import Group, Peers, peers_of


def _switch_reduces_and_multicasts(flat: torch.Tensor, op: str, peers: Peers, gpus: list[int]):
    n = len(gpus)
    bounds = chunk_bounds(flat.numel(), n)
    inbox = flat.new_empty((n, flat.numel()))
    peers.exchange(recvs=list(zip(gpus, inbox, strict=True)), name="in_network switch reads")
    total = flat.new_empty(flat.numel())
    total.copy_(inbox[0])
    for row in inbox[1:]:
        combine_(total, row, op)  # slice j of total is what GPU j's ld_reduce returns
    finish_(total, op, n)
    peers.exchange(
        sends=[(g, total[slice(*bounds[j])]) for j, g in enumerate(gpus)],
        name="in_network reduce (ld_reduce)",
    )
    slices = flat.new_empty(flat.numel())
    peers.exchange(
        recvs=[(g, slices[slice(*bounds[j])]) for j, g in enumerate(gpus)],
        name="in_network switch takes stores",
    )
    peers.exchange(sends=[(g, slices) for g in gpus], name="in_network multicast (st)")


def _gpu_side(flat: torch.Tensor, peers: Peers, gpus: list[int], switch: int) -> None:
    j = gpus.index(peers.rank)
    lo, hi = chunk_bounds(flat.numel(), len(gpus))[j]
    peers.exchange(sends=[(switch, flat)], name="in_network reduce (ld_reduce)", step=0)
    peers.exchange(recvs=[(switch, flat[lo:hi])], name="in_network reduce (ld_reduce)", step=0)
    peers.exchange(sends=[(switch, flat[lo:hi])], name="in_network multicast (st)", step=1)
    peers.exchange(recvs=[(switch, flat)], name="in_network multicast (st)", step=1)


def switch_all_reduce(
    tensor: torch.Tensor, op: str = "sum", *, switch: int, group: Group = None
) -> torch.Tensor:
    """All-reduce ``tensor`` over every member of ``group`` but ``switch`` (an index in the
    group), which plays an NVLS/SHARP switch. Every member calls it with a tensor of the same
    shape; the switch's contents are ignored and left as they were."""
    op = normalize_op(op)
    peers = peers_of(group)
    if not 0 <= switch < peers.size or peers.size < 3:
        raise ValueError(
            f"switch={switch} must index a member of a group of at least 3 (2 GPUs and the "
            f"switch); this group has {peers.size}"
        )
    call = CallDescriptor(
        "all_reduce", "in_network", tensor.dtype, tensor.numel(), root=switch, op=op
    )
    check_agreement(peers, call, tensor.device)
    gpus = [r for r in range(peers.size) if r != switch]
    flat, is_view = flat_view(tensor)
    if peers.rank == switch:
        _switch_reduces_and_multicasts(flat.clone(), op, peers, gpus)
        return tensor
    _gpu_side(flat, peers, gpus, switch)
    if not is_view:
        tensor.copy_(flat.view_as(tensor))
    return tensor
