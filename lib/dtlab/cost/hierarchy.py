"""The two-tier cost model: fast links inside a node, slower ones between nodes.

A GPU cluster is ``k`` nodes of ``g`` GPUs: NVLink inside a node (H100: 450 GB/s per direction),
InfiniBand between nodes (NDR: 50 GB/s per GPU). For an all-reduce of ``M`` bytes over
``N = k·g`` ranks:

* **flat ring** over all ``N`` ranks: every step waits for the slowest link on the ring, an
  inter-node one, so ``T = 2(N-1)·α_IB + 2(N-1)/N · M · β_IB``.
* **hierarchical** (:func:`dtlab.collectives.hierarchical_all_reduce`): intra-node ring
  reduce-scatter and all-gather on NVLink, and a ring all-reduce of only ``M/g`` bytes across
  nodes: ``T = 2(g-1)(α_NV + M/g·β_NV) + 2(k-1)·α_IB + 2(k-1)/k · M/g · β_IB``.

The inter-node bytes drop by ``g`` and the inter-node latencies from ``2(N-1)`` to ``2(k-1)``.
(NCCL's ring over nodes actually keeps ``2(N-1)/N·M`` per link by running ``g`` rings in parallel,
one per NIC; the hierarchical form is what the two-tier model and Horovod's hierarchical
all-reduce describe, and what NCCL's tree algorithm approximates across nodes.)
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.cost.alpha_beta import Link
from dtlab.cost.collectives import collective_time
from dtlab.cost.hardware import IB_NDR_400, NVLINK4_H100


@dataclass(frozen=True)
class TwoTierCluster:
    """``nodes`` machines of ``gpus_per_node`` GPUs; ``intra`` inside a node, ``inter`` between."""

    nodes: int
    gpus_per_node: int
    intra: Link = NVLINK4_H100
    inter: Link = IB_NDR_400

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(
                f"a cluster needs >= 1 node and >= 1 GPU per node, got {self.nodes} × "
                f"{self.gpus_per_node}"
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def flat_ring_all_reduce_time(nbytes: float, cluster: TwoTierCluster) -> float:
    """One ring over every GPU, paced by the inter-node link (intra-node only if one node)."""
    link = cluster.inter if cluster.nodes > 1 else cluster.intra
    return collective_time("all_reduce", "ring", nbytes, cluster.world_size, link)


def hierarchical_all_reduce_time(nbytes: float, cluster: TwoTierCluster) -> float:
    """Intra-node reduce-scatter + inter-node ring all-reduce of ``M/g`` + intra-node all-gather."""
    g, k = cluster.gpus_per_node, cluster.nodes
    inside = 2 * collective_time("reduce_scatter", "ring", nbytes, g, cluster.intra)
    across = collective_time("all_reduce", "ring", nbytes / g, k, cluster.inter)
    return inside + across


def hierarchical_speedup(nbytes: float, cluster: TwoTierCluster) -> float:
    """How many times faster the hierarchical all-reduce is than the flat ring."""
    return flat_ring_all_reduce_time(nbytes, cluster) / hierarchical_all_reduce_time(
        nbytes, cluster
    )


def inter_node_bytes_per_rank(nbytes: float, cluster: TwoTierCluster, hierarchical: bool) -> float:
    """Bytes each rank pushes over the network: ``2(N-1)/N·M`` flat vs ``2(k-1)/k·M/g``."""
    if hierarchical:
        k = cluster.nodes
        return 2 * (k - 1) / k * nbytes / cluster.gpus_per_node
    n = cluster.world_size
    return 2 * (n - 1) / n * nbytes if cluster.nodes > 1 else 0.0
