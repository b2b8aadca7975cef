"""A collective over two levels — NVLink inside the node, the network between nodes — priced per level.

On ``k`` nodes of ``g`` GPUs (:class:`~dtlab.cost.hierarchy.TwoTierCluster`, one NIC per GPU on
rails by default), a collective that spans nodes runs as two collectives, one per level:

* **all-gather** of a gathered buffer ``M`` (each GPU starts with ``M/N``): across nodes, every
  local rank all-gathers with its ``k`` rail peers (each NIC receives ``(k-1)/k · M/g``); inside
  the node, the ``g`` GPUs all-gather the ``M/g`` blocks they now hold (each receives
  ``(g-1)/g · M`` over NVLink);
* **all-reduce** (the hierarchical one, :func:`~dtlab.cost.hierarchy.hierarchical_all_reduce_time`):
  reduce-scatter and all-gather inside the node (``2(g-1)/g · M`` over NVLink) around an
  all-reduce of ``M/g`` across nodes (``2(k-1)/k · M/g`` per NIC).

Run one level after the other and the time is the **sum** of the levels. Cut the buffer into
segments and let segment ``i`` cross the network while segment ``i-1`` crosses NVLink — as
NCCL's NVLSTree algorithm (NVLink SHARP inside the node, a tree between nodes) does — and the
time tends to
the **maximum** of the levels (plus one segment to fill the pipe, left out here): the slower
level paces the pipeline and the faster one hides behind it.

**Which level limits** follows from the bytes each level carries per unit of its bandwidth. The
network's share ``(k-1)/k`` grows with the node count while NVLink's ``(g-1)/g`` does not, so the
network takes over once ``(k-1)/k > (g-1)/g · nics·B_net / B_NV``: for H100 nodes (450 GB/s
NVLink, eight 50 GB/s NICs) that is ``(k-1)/k > 0.78``, i.e. from 5 nodes on for large
buffers (at 1 MiB the network's larger ``α`` tips it at 4). At **2 nodes**
NVLink limits (the network carries only half of ``M/g``); at **32 nodes** the network does
(``31/32`` of it) — and with one NIC per node it limits everywhere.

The network level is priced as each rail's ring on its own NICs, non-blocking: the cluster's
``oversubscription`` and ``nodes_per_leaf`` are not applied (a rail ring that crosses an
oversubscribed spine is slower than this; :func:`~dtlab.cost.hierarchy.all_to_all_spine_bandwidth`
prices that for all-to-all).
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.cost.alpha_beta import Link
from dtlab.cost.collectives import collective_time
from dtlab.cost.hierarchy import TwoTierCluster


@dataclass(frozen=True)
class TwoLevelTime:
    """Seconds per level of one two-level collective, and the two ways to combine them."""

    op: str
    intra_s: float  # NVLink, inside the node
    inter_s: float  # the network, between nodes

    @property
    def sequential_s(self) -> float:
        """One level after the other."""
        return self.intra_s + self.inter_s

    @property
    def pipelined_s(self) -> float:
        """Segments streamed through both levels: the slower level paces the pipeline."""
        return max(self.intra_s, self.inter_s)

    @property
    def limiting_level(self) -> str:
        return "network" if self.inter_s > self.intra_s else "NVLink"


def _rail_link(cluster: TwoTierCluster) -> Link:
    """What each local rank's cross-node flow gets: ``g`` flows share the node's NICs."""
    g = cluster.gpus_per_node
    return Link(
        cluster.inter.alpha_s,
        cluster.inter.bandwidth_bytes_per_s * cluster.nics / g,
        cluster.inter.name,
    )


def two_level_all_gather(nbytes: float, cluster: TwoTierCluster) -> TwoLevelTime:
    """All-gather of ``nbytes`` (the gathered buffer): rail all-gather of ``M/g`` across ``k``
    nodes, then an NVLink all-gather of ``M`` among the node's ``g`` GPUs."""
    g, k = cluster.gpus_per_node, cluster.nodes
    inter = collective_time("all_gather", "ring", nbytes / g, k, _rail_link(cluster))
    intra = collective_time("all_gather", "ring", nbytes, g, cluster.intra)
    return TwoLevelTime("all_gather", intra, inter)


def two_level_all_reduce(nbytes: float, cluster: TwoTierCluster) -> TwoLevelTime:
    """Hierarchical all-reduce: NVLink reduce-scatter + all-gather around a rail all-reduce of
    ``M/g`` (its sequential time is :func:`~dtlab.cost.hierarchy.hierarchical_all_reduce_time`)."""
    g, k = cluster.gpus_per_node, cluster.nodes
    intra = 2 * collective_time("reduce_scatter", "ring", nbytes, g, cluster.intra)
    inter = collective_time("all_reduce", "ring", nbytes / g, k, _rail_link(cluster))
    return TwoLevelTime("all_reduce", intra, inter)


def nodes_where_network_limits(
    op: str, nbytes: float, gpus_per_node: int = 8, max_nodes: int = 4096, **cluster_kwargs
) -> int | None:
    """The fewest nodes (≥ 2) at which the network level takes longer than NVLink, for ``op``
    (``"all_gather"`` or ``"all_reduce"``) of ``nbytes``; ``None`` if NVLink limits up to
    ``max_nodes``. ``cluster_kwargs`` go to :class:`TwoTierCluster` (links, NICs)."""
    price = {"all_gather": two_level_all_gather, "all_reduce": two_level_all_reduce}
    if op not in price:
        raise ValueError(f"op {op!r}: choose 'all_gather' or 'all_reduce'")
    for nodes in range(2, max_nodes + 1):
        cluster = TwoTierCluster(nodes=nodes, gpus_per_node=gpus_per_node, **cluster_kwargs)
        if price[op](nbytes, cluster).limiting_level == "network":
            return nodes
    return None
