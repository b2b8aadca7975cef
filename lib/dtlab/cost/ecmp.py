"""ECMP and flow collisions: why a few big flows over many equal paths leave links idle.

A leaf switch with ``L`` equal uplinks to the spine spreads traffic by **ECMP** (equal-cost
multi-path): it hashes each flow's 5-tuple (addresses, ports, protocol — for RoCE the UDP
source port of the queue pair) to pick one uplink, and every packet of that flow follows it.
Web traffic has thousands of small flows and evens out. A collective has a handful of
elephant flows — one per queue pair, each as fast as a NIC — and ``F`` flows hashed onto ``L``
links collide like balls thrown into bins:

* the expected share of **idle** links is ``(1 - 1/L)^F`` — 34 % for ``F = L = 8``, and
  ``1/e ≈ 37 %`` as ``F = L`` grows;
* the **busiest** link carries several flows (about 2.6 for ``F = L = 8``); they share it, and a
  collective waits for its slowest flow, so the step runs that many times slower than the
  network allows, while a third of the links sit idle.

:func:`ecmp_collisions` simulates it (random hashing, many trials, seeded) and the fixes:

* **more queue pairs per connection** (``NCCL_IB_QPS_PER_CONNECTION``; ``subflows_per_flow``
  here): each flow is split over ``q`` independently hashed QPs, each carrying ``1/q`` of it —
  the law of large numbers evens the load (``F·q`` balls of weight ``1/q``);
* **adaptive routing** (``placement="adaptive"``; InfiniBand AR, Spectrum-X, flowlet switching):
  the switch sends each (sub)flow to the currently least-loaded uplink — balanced whenever
  ``F·q`` is a multiple of ``L``;
* **rail-aligned placement** (``placement="rail"``): rail-optimised wiring keeps traffic
  between GPUs of the same local rank on their rail's leaf, so it never meets the hash; NCCL's
  **PXN** (PCIe × NVLink) gets there when the destination sits on another rail: it first moves
  the data over NVLink to the local GPU whose NIC is on the destination's rail. Each flow then
  has its own path: no collision.

The load unit is one NIC's rate: a flow cannot go faster than its NIC, so the ideal busiest
load is ``max(1, F/L)`` and ``slowdown = max(1, busiest) / max(1, F/L)``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

PLACEMENTS = ("hash", "adaptive", "rail")


@dataclass(frozen=True)
class EcmpResult:
    """Averages over the trials of one scenario."""

    flows: int
    links: int
    subflows_per_flow: int
    placement: str
    idle_share: float  # expected share of uplinks that carry nothing
    busiest_load: float  # expected load of the busiest uplink, in NIC rates (flows' worth)
    slowdown: float  # expected max(1, busiest) / max(1, F/L): how much longer the step takes


def expected_idle_share(flows: int, links: int, subflows_per_flow: int = 1) -> float:
    """``(1 - 1/L)^(F·q)``: the chance that no hashed (sub)flow picks a given uplink."""
    _validate(flows, links, subflows_per_flow)
    return (1 - 1 / links) ** (flows * subflows_per_flow)


def _validate(flows: int, links: int, subflows_per_flow: int) -> None:
    if flows < 1 or links < 1 or subflows_per_flow < 1:
        raise ValueError(
            f"need flows, links and subflows_per_flow >= 1, got {flows}, {links}, "
            f"{subflows_per_flow}"
        )


def _loads_once(flows: int, links: int, q: int, placement: str, rng: random.Random) -> list[float]:
    loads = [0.0] * links
    if placement == "rail":  # flow i on its own rail (wraps when there are more flows than rails)
        for i in range(flows):
            loads[i % links] += 1.0
        return loads
    for _ in range(flows * q):
        if placement == "hash":
            link = rng.randrange(links)
        else:  # adaptive: the least-loaded uplink, ties broken at random
            low = min(loads)
            link = rng.choice([j for j, load in enumerate(loads) if load == low])
        loads[link] += 1.0 / q
    return loads


def ecmp_collisions(
    flows: int,
    links: int,
    *,
    subflows_per_flow: int = 1,
    placement: str = "hash",
    trials: int = 2000,
    seed: int = 0,
) -> EcmpResult:
    """Place ``flows`` equal flows (each split into ``subflows_per_flow``) on ``links`` uplinks,
    ``trials`` times, and average the idle share, the busiest link's load and the slowdown."""
    _validate(flows, links, subflows_per_flow)
    if placement not in PLACEMENTS:
        raise ValueError(f"placement {placement!r} is unknown; choose one of {PLACEMENTS}")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    rng = random.Random(seed)
    ideal = max(1.0, flows / links)
    idle = busiest = slowdown = 0.0
    for _ in range(trials):
        loads = _loads_once(flows, links, subflows_per_flow, placement, rng)
        top = max(loads)
        idle += sum(load == 0 for load in loads) / links
        busiest += top
        slowdown += max(1.0, top) / ideal
    return EcmpResult(
        flows,
        links,
        subflows_per_flow,
        placement,
        idle / trials,
        busiest / trials,
        slowdown / trials,
    )
