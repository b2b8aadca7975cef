"""Hierarchical all-reduce: respect the two tiers of a GPU cluster.

Inside a node GPUs talk over NVLink (hundreds of GB/s); between nodes over InfiniBand/RoCE
(tens of GB/s per GPU). A flat ring over ``N = nodes × g`` ranks pushes ``2 (N-1)/N · M`` bytes
through every link *including* the slow inter-node ones. The hierarchical schedule sends only
``1/g`` of the buffer between nodes:

1. **intra-node ring reduce-scatter** over the ``g`` ranks of my node: I own local chunk ``l``
   (my index in the node) of the node's sum. Sends ``(g-1)/g · M`` on NVLink.
2. **inter-node ring all-reduce** of that chunk with the ranks holding chunk ``l`` on every other
   node (one "rail": same local index on every node). Sends ``2 (k-1)/k · M/g`` on the
   network, ``k`` the number of nodes.
3. **intra-node ring all-gather** of the finished chunks. Sends ``(g-1)/g · M`` on NVLink.

Per *rank* the network bytes drop ``g``-fold; per *node* they do not: the ``g`` rails together
still carry about ``2M`` each way, as a flat ring over rail-optimised nodes (one NIC per GPU,
NCCL running one ring per NIC) does. On such nodes the hierarchical schedule's win is latency —
``2(k-1)`` network steps instead of ``2(N-1)`` — not bandwidth; with one NIC per node it also
saves bandwidth (``dtlab.cost.hierarchy`` prices both).

This is the shape of NCCL's tree/ring-over-nodes and of Horovod's hierarchical all-reduce;
``dtlab.cost.hierarchy`` prices it on the two-tier model. Here a "node" is just a block of ``g``
consecutive ranks of ``group`` — on one CPU machine the tiers are simulated, the schedule is real.
"""

from __future__ import annotations

import torch

from dtlab.collectives.agreement import CallDescriptor, check_agreement
from dtlab.collectives.allgather import all_gather_ring_
from dtlab.collectives.allreduce import all_reduce_ring_
from dtlab.collectives.ops import chunk_bounds, finish_, flat_view, normalize_op
from dtlab.collectives.p2p import Group, peers_of
from dtlab.collectives.reduce_scatter import reduce_scatter_ring_


def node_layout(world_size: int, ranks_per_node: int) -> list[list[int]]:
    """The group indices on each node: consecutive blocks of ``ranks_per_node``."""
    if ranks_per_node <= 0 or world_size % ranks_per_node:
        choices = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(
            f"{ranks_per_node} ranks per node does not divide {world_size} ranks; "
            f"choose one of {choices}"
        )
    return [list(range(s, s + ranks_per_node)) for s in range(0, world_size, ranks_per_node)]


def hierarchical_all_reduce(
    tensor: torch.Tensor, ranks_per_node: int, op: str = "sum", *, group: Group = None
) -> torch.Tensor:
    """All-reduce ``tensor`` in place as intra-node reduce-scatter → inter-node all-reduce →
    intra-node all-gather, with "nodes" of ``ranks_per_node`` consecutive ranks of ``group``."""
    op = normalize_op(op)
    peers = peers_of(group)
    call = CallDescriptor(
        "hierarchical_all_reduce", "", tensor.dtype, tensor.numel(), op=op, detail=ranks_per_node
    )
    check_agreement(peers, call, tensor.device)
    nodes = node_layout(peers.size, ranks_per_node)
    node_index, local = divmod(peers.rank, ranks_per_node)
    within_node = peers.subgroup(nodes[node_index])
    across_nodes = peers.subgroup([node[local] for node in nodes])
    flat, is_view = flat_view(tensor)
    if flat.numel():
        bounds = chunk_bounds(flat.numel(), ranks_per_node)
        if ranks_per_node > 1:
            reduce_scatter_ring_(
                flat, op, within_node, name="hierarchical intra-node reduce-scatter"
            )
        my_chunk = flat[slice(*bounds[local])]
        if len(nodes) > 1:
            # "sum" here even for avg: the division by N happens once, below.
            inter_op = "sum" if op == "avg" else op
            all_reduce_ring_(
                my_chunk, inter_op, across_nodes, name="hierarchical inter-node all-reduce"
            )
        finish_(my_chunk, op, peers.size)
        if ranks_per_node > 1:
            all_gather_ring_(flat, within_node, bounds, name="hierarchical intra-node all-gather")
    if not is_view:
        tensor.copy_(flat.view_as(tensor))
    return tensor
