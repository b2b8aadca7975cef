"""The two-tier cost model: NVLink inside a node, a rail-optimised network between nodes.

**Topology assumed.** ``k`` nodes of ``g`` GPUs. Inside a node every GPU reaches every other
through NVSwitch (H100: 450 GB/s per direction per GPU). Between nodes each node has
``nics_per_node`` NICs (InfiniBand NDR: 400 Gb/s = 50 GB/s per direction each). A current
training node (DGX/HGX H100, the Llama 3 and DeepSeek clusters) has **one NIC per GPU**, the
default here, wired **rail-optimised**: NIC ``j`` of every node plugs into leaf switch ``j``
(rail ``j``), so GPUs with the same local rank reach each other in one switch hop. A node
therefore has ``g × 50 = 400 GB/s`` of network bandwidth per direction, not 50. Set
``nics_per_node=1`` to model the older one-NIC-per-node box (or a cloud VM with one network).

For an all-reduce of ``M`` bytes over ``N = k·g`` ranks:

* **flat ring**, as NCCL runs it: one ring through all ``N`` GPUs per NIC (NCCL opens a
  channel per NIC), each ring carrying ``M/nics`` and leaving each node through its own NIC.
  Each step waits for its slowest hop, so per ring
  ``T = 2(N-1)·α_IB + 2(N-1)/N · (M/nics) · β_IB``, or the NVLink term
  ``2(N-1)/N · M · β_NV`` if that is larger. Every NIC carries ``2(N-1)/N · M/nics`` bytes:
  with one NIC per GPU, about ``2M/g``.
* **hierarchical** (:func:`dtlab.collectives.hierarchical_all_reduce`): ring reduce-scatter
  inside the node on NVLink, a ring all-reduce of ``M/g`` across nodes by every local rank at
  once (each on its own rail: ``g`` flows share ``nics`` NICs), ring all-gather inside the node:
  ``T = 2(g-1)(α_NV + M/g·β_NV) + 2(k-1)·α_IB + 2(k-1)/k · (M/g) · β_IB · g/nics``.

The classic argument for the hierarchical form (Horovod's hierarchical all-reduce, Sergeev &
Del Balso 2018) sets a flat ring's ``2M`` network bytes per GPU against ``2M/g``. But in a ring
only one GPU per node per ring has its successor in another node: a node sends about ``2M`` over
the network in *either* schedule (``2(N-1)/N·M`` flat, ``2(k-1)/k·M`` hierarchical), and the time
depends on how many NICs share it. With a NIC per GPU both schedules put about ``2M/g`` on each
NIC, and the flat ring overlaps its NVLink and network traffic where the hierarchical form runs
them one after the other, so for large buffers the flat ring is as fast or faster. The
hierarchical form wins on **latency**: ``2(k-1)`` network steps instead of ``2(N-1)``, which
matters for small messages and many nodes (NCCL's tree across nodes serves the same purpose).

**Leaves, spine and oversubscription.** A leaf switch has as many ports up (to the spine) as
down only in a non-blocking fat tree; an ``r:1`` oversubscribed leaf has ``1/r`` of them.
Traffic between two nodes on the same leaf (same rail group) never touches the spine. A ring
crosses the spine only where it moves from one leaf group to the next (a few flows per leaf), so
it barely notices oversubscription; a uniform all-to-all (expert parallelism) sends most of its
bytes to other leaf groups and is slowed by ``r`` (:func:`all_to_all_spine_bandwidth`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.cost.alpha_beta import Link
from dtlab.cost.collectives import collective_time
from dtlab.cost.hardware import IB_NDR_400, NVLINK4_H100


@dataclass(frozen=True)
class TwoTierCluster:
    """``nodes`` machines of ``gpus_per_node`` GPUs; ``intra`` inside a node, ``inter`` per NIC.

    ``nics_per_node`` defaults to ``gpus_per_node`` (rail-optimised, one NIC per GPU);
    ``nodes_per_leaf`` nodes share each rail's leaf switch (``None``: one leaf holds them all),
    and ``oversubscription`` is the leaf's down:up port ratio (1.0 = non-blocking fat tree).
    """

    nodes: int
    gpus_per_node: int
    intra: Link = NVLINK4_H100
    inter: Link = IB_NDR_400
    nics_per_node: int | None = None
    nodes_per_leaf: int | None = None
    oversubscription: float = 1.0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(
                f"a cluster needs >= 1 node and >= 1 GPU per node, got {self.nodes} × "
                f"{self.gpus_per_node}"
            )
        if self.nics_per_node is not None and not 1 <= self.nics_per_node <= self.gpus_per_node:
            raise ValueError(
                f"nics_per_node={self.nics_per_node} must be between 1 and gpus_per_node="
                f"{self.gpus_per_node} (rail-optimised nodes have one NIC per GPU)"
            )
        if self.nodes_per_leaf is not None and self.nodes_per_leaf < 1:
            raise ValueError(f"nodes_per_leaf={self.nodes_per_leaf} must be >= 1")
        if self.oversubscription < 1.0:
            raise ValueError(
                f"oversubscription={self.oversubscription} is a down:up ratio and must be >= 1 "
                "(1 = non-blocking)"
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def nics(self) -> int:
        """NICs per node (one per GPU unless told otherwise)."""
        return self.gpus_per_node if self.nics_per_node is None else self.nics_per_node

    @property
    def rail_optimised(self) -> bool:
        return self.nics == self.gpus_per_node

    @property
    def node_network_bytes_per_s(self) -> float:
        """A node's bandwidth to the network, per direction: NICs × per-NIC bandwidth."""
        return self.nics * self.inter.bandwidth_bytes_per_s


def flat_ring_all_reduce_time(nbytes: float, cluster: TwoTierCluster) -> float:
    """NCCL's flat ring over every GPU, one ring per NIC, each carrying ``M/nics`` bytes.

    Network term ``2(N-1)/N · M/nics · β_IB`` against NVLink term ``2(N-1)/N · M · β_NV`` (every
    GPU forwards every ring's chunks to its NVLink neighbour): the larger paces the ring.
    """
    if cluster.nodes == 1:
        return collective_time("all_reduce", "ring", nbytes, cluster.gpus_per_node, cluster.intra)
    n = cluster.world_size
    steps = 2 * (n - 1)
    network = steps / n * nbytes / cluster.nics * cluster.inter.beta_s_per_byte
    nvlink = steps / n * nbytes * cluster.intra.beta_s_per_byte
    return steps * cluster.inter.alpha_s + max(network, nvlink)


def hierarchical_all_reduce_time(nbytes: float, cluster: TwoTierCluster) -> float:
    """Intra-node reduce-scatter + inter-node ring all-reduce of ``M/g`` + intra-node all-gather.

    The ``g`` inter-node all-reduces (one per local rank) run at once, sharing the node's NICs.
    """
    g, k = cluster.gpus_per_node, cluster.nodes
    inside = 2 * collective_time("reduce_scatter", "ring", nbytes, g, cluster.intra)
    per_flow = Link(
        cluster.inter.alpha_s,
        cluster.inter.bandwidth_bytes_per_s * cluster.nics / g,
        cluster.inter.name,
    )
    across = collective_time("all_reduce", "ring", nbytes / g, k, per_flow)
    return inside + across


def hierarchical_speedup(nbytes: float, cluster: TwoTierCluster) -> float:
    """How many times faster the hierarchical all-reduce is than the flat ring (< 1: slower)."""
    return flat_ring_all_reduce_time(nbytes, cluster) / hierarchical_all_reduce_time(
        nbytes, cluster
    )


def inter_node_bytes_per_nic(nbytes: float, cluster: TwoTierCluster, hierarchical: bool) -> float:
    """Bytes each NIC sends per all-reduce: ``2(N-1)/N·M/nics`` flat vs ``2(k-1)/k·M/nics``."""
    if cluster.nodes == 1:
        return 0.0
    n = cluster.nodes if hierarchical else cluster.world_size
    return 2 * (n - 1) / n * nbytes / cluster.nics


def inter_node_bytes_per_rank(nbytes: float, cluster: TwoTierCluster, hierarchical: bool) -> float:
    """Network bytes per GPU (the node's total over ``g``): ``2(N-1)/N·M/g`` flat, ``2(k-1)/k·M/g``.

    The node sends ``2(N-1)/N·M`` (flat ring) or ``2(k-1)/k·M`` (hierarchical) in all, whatever
    the NIC count; how many NICs share it decides the time, not the bytes.
    """
    if cluster.nodes == 1:
        return 0.0
    n = cluster.nodes if hierarchical else cluster.world_size
    return 2 * (n - 1) / n * nbytes / cluster.gpus_per_node


def all_to_all_spine_bandwidth(cluster: TwoTierCluster) -> float:
    """Per-NIC bandwidth (bytes/s) of a uniform all-to-all across every node, after the spine.

    A fraction ``f = (nodes - nodes_per_leaf) / (nodes - 1)`` of each NIC's all-to-all bytes goes
    to nodes under other leaves and must climb to the spine, where an ``r:1`` leaf offers ``1/r``
    of its down bandwidth: per-NIC bandwidth ``B · min(1, 1 / (r·f))``.
    """
    per_leaf = cluster.nodes if cluster.nodes_per_leaf is None else cluster.nodes_per_leaf
    if cluster.nodes <= per_leaf:
        return cluster.inter.bandwidth_bytes_per_s
    leaving = (cluster.nodes - per_leaf) / (cluster.nodes - 1)
    return cluster.inter.bandwidth_bytes_per_s * min(
        1.0, 1.0 / (cluster.oversubscription * leaving)
    )
