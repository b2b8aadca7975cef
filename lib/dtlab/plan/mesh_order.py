"""Which mesh dimension goes inside a node: the order of the dimensions decides it.

Ranks are numbered node by node (torchrun: node ``k`` runs ranks ``k·g … k·g + g − 1``), and a
mesh lays its dimensions out row-major in some order, the last one innermost (consecutive ranks).
The innermost dimensions' groups therefore stay inside a node and talk over NVLink; the outer
ones cross nodes and talk over the NICs — here one 400 Gb/s NIC per GPU (a rail-optimised
fabric: each GPU's traffic leaves on its own NIC), so a crossing group with ``m`` members in a
node runs at ``m · 50`` GB/s per GPU at most, against NVLink's ~450 GB/s.

dtlab's :class:`~dtlab.mesh.Layout` uses ``(pp, dp, cp, tp)``, torchtitan's and Megatron's order:
``tp`` moves the most bytes per step (activations, every layer, forward and backward, blocking),
so it goes innermost; ``pp`` moves the least (one activation per micro-batch, point to point),
so it goes outermost. :func:`compare_orders` prices every order of a layout with the bytes each
dimension moves (:func:`dtlab.plan.predict.predicted_traffic`, or a job-scale estimate), so the
cost of putting the wrong dimension inside a node is a number, not a rule.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from dtlab.cost.hardware import IB_NDR_400, NVLINK4_H100, Link

DEFAULT_ORDER = ("pp", "dp", "cp", "tp")


def groups_in_order(degrees: dict[str, int], order: tuple[str, ...]) -> dict[str, list[list[int]]]:
    """Every group of each dimension when ranks are laid out row-major over ``order``."""
    shape = [degrees.get(d, 1) for d in order]
    world = math.prod(shape)
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    groups: dict[str, list[list[int]]] = {}
    for axis, dim in enumerate(order):
        seen, found = set(), []
        for rank in range(world):
            coordinate = (rank // strides[axis]) % shape[axis]
            base = rank - coordinate * strides[axis]
            if base not in seen:
                seen.add(base)
                found.append([base + k * strides[axis] for k in range(shape[axis])])
        groups[dim] = found
    return groups


def crosses_nodes(
    degrees: dict[str, int], order: tuple[str, ...], ranks_per_node: int
) -> dict[str, bool]:
    """Per dimension: whether any of its groups spans two nodes."""
    return {
        dim: any(len({r // ranks_per_node for r in g}) > 1 for g in groups)
        for dim, groups in groups_in_order(degrees, order).items()
    }


@dataclass(frozen=True)
class OrderCost:
    """One order: which dimensions cross nodes, and each dimension's transfer time per step."""

    order: tuple[str, ...]
    crosses: dict[str, bool]
    seconds: dict[str, float]

    @property
    def total_s(self) -> float:
        """Communication time per step if nothing overlapped (an upper bound; the ranking is the
        point)."""
        return sum(self.seconds.values())


def price_order(
    bytes_per_dim: dict[str, float],
    degrees: dict[str, int],
    order: tuple[str, ...],
    ranks_per_node: int,
    intra: Link = NVLINK4_H100,
    inter: Link = IB_NDR_400,
) -> OrderCost:
    """Time per step to send ``bytes_per_dim`` (bytes one rank sends along each dimension): at
    ``intra``'s bandwidth where the dimension's groups stay in a node; where they cross, at the
    NICs of the group's members in a node (one 400 Gb/s NIC per GPU, NCCL running one ring per
    NIC), capped by ``intra`` — ``m`` members per node give ``min(NVLink, m · NIC)``."""
    crosses = crosses_nodes(degrees, order, ranks_per_node)
    groups = groups_in_order(degrees, order)
    seconds = {}
    for dim, nbytes in bytes_per_dim.items():
        bandwidth = intra.bandwidth_bytes_per_s
        if crosses.get(dim):  # one ring per NIC of the group's members in a node
            members = sum(1 for r in groups[dim][0] if r // ranks_per_node == 0) or 1
            bandwidth = min(bandwidth, members * inter.bandwidth_bytes_per_s)
        seconds[dim] = nbytes / bandwidth
    return OrderCost(tuple(order), crosses, seconds)


def compare_orders(
    bytes_per_dim: dict[str, float],
    degrees: dict[str, int],
    ranks_per_node: int,
    intra: Link = NVLINK4_H100,
    inter: Link = IB_NDR_400,
) -> list[OrderCost]:
    """Every order of the dimensions of size > 1, cheapest first."""
    dims = tuple(d for d in DEFAULT_ORDER if degrees.get(d, 1) > 1)
    costs = [
        price_order(bytes_per_dim, degrees, order, ranks_per_node, intra, inter)
        for order in itertools.permutations(dims)
    ]
    return sorted(costs, key=lambda c: c.total_s)
