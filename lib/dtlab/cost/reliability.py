"""How often to checkpoint: cluster failure rates and the Young/Daly optimal interval.

**Cluster MTBF.** If each of ``n`` GPUs fails independently with mean time between failures
``M`` (exponential failures), the first failure anywhere arrives ``n`` times as often:
``MTBF_cluster = M / n``. A 16,384-GPU job whose GPUs each fail once in 5 years sees a failure
every ~2.7 hours — the reason large jobs checkpoint often and restart automatically.

**Young/Daly.** Checkpointing every ``τ`` seconds at cost ``C`` seconds each wastes ``C/τ`` of the
time writing checkpoints and, per failure, on average ``τ/2`` of lost work, i.e. ``τ/(2M)`` of the
time. Minimising ``C/τ + τ/(2M)`` gives ``τ* = sqrt(2·C·M)`` (Young 1974, "A first order
approximation to the optimum checkpoint interval", CACM 17(9); Daly 2006, "A higher order estimate
of the optimum checkpoint interval for restart dumps", FGCS 22(3), which refines it for
``C`` not much smaller than ``M``).
"""

from __future__ import annotations

import math


def cluster_mtbf(per_gpu_mtbf_s: float, n_gpus: int) -> float:
    """Mean time between failures of a job on ``n_gpus`` independent GPUs: ``per_gpu_mtbf / n``."""
    if per_gpu_mtbf_s <= 0 or n_gpus < 1:
        raise ValueError(f"per_gpu_mtbf_s={per_gpu_mtbf_s} must be > 0 and n_gpus={n_gpus} >= 1")
    return per_gpu_mtbf_s / n_gpus


def young_daly_interval(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """The checkpoint interval minimising expected waste: ``sqrt(2 · C · MTBF)`` seconds."""
    if checkpoint_cost_s <= 0 or mtbf_s <= 0:
        raise ValueError(
            f"checkpoint cost {checkpoint_cost_s} s and MTBF {mtbf_s} s must both be > 0"
        )
    return math.sqrt(2 * checkpoint_cost_s * mtbf_s)


def expected_waste_fraction(interval_s: float, checkpoint_cost_s: float, mtbf_s: float) -> float:
    """First-order share of time lost: ``C/τ`` writing checkpoints + ``τ/(2·MTBF)`` redoing work."""
    if interval_s <= 0 or checkpoint_cost_s < 0 or mtbf_s <= 0:
        raise ValueError("interval and MTBF must be > 0 and checkpoint cost >= 0 (seconds)")
    return checkpoint_cost_s / interval_s + interval_s / (2 * mtbf_s)


def expected_waste_fraction_async(
    interval_s: float, blocking_s: float, write_s: float, mtbf_s: float
) -> float:
    """First-order waste with *asynchronous* saves: ``C_b/τ + (τ/2 + W)/MTBF``.

    Training stalls only for the blocking snapshot ``C_b``; the write of ``W`` seconds overlaps
    training but a checkpoint is durable only once written, so a failure loses on average
    ``τ/2 + W`` of work. ``W`` does not depend on ``τ``, so the optimum is Young/Daly with the
    *blocking* cost: ``τ* = sqrt(2·C_b·MTBF)`` (valid while ``W < τ``: one write in flight).
    """
    if interval_s <= 0 or blocking_s < 0 or write_s < 0 or mtbf_s <= 0:
        raise ValueError("interval and MTBF must be > 0, blocking and write times >= 0 (seconds)")
    return blocking_s / interval_s + (interval_s / 2 + write_s) / mtbf_s


def young_daly_interval_async(blocking_s: float, write_s: float, mtbf_s: float) -> float:
    """Young/Daly for asynchronous saves: ``max(sqrt(2·C_b·MTBF), W)`` — the stall sets the
    interval, but a new save cannot start before the last write finished."""
    return max(young_daly_interval(blocking_s, mtbf_s), write_s)


# -- spare pools ---------------------------------------------------------------------------------
#
# A node that fails is out until it is repaired or replaced (hours: drain, diagnose, reboot, swap
# a GPU). With ``n`` nodes each failing at rate ``1/M`` and each repair taking ``R`` on average,
# the number of nodes out at once is Poisson with mean ``n·R/M`` (the steady state of an M/G/∞
# queue: Little's law gives the mean, Palm's theorem the Poisson shape, whatever the distribution
# of repair times). It treats failures as arriving at ``n/M`` whether or not nodes are out; since a
# node that is out cannot fail, the exact mean is ``n·R/(M + R)`` — the same to first order in
# ``R/M`` (0.3 % apart for a year's MTBF and a day's repair). A **hot-spare pool** of ``k`` idle
# nodes lets the job restart at full size at once as long as at most ``k`` are out: size ``k``
# from the Poisson tail. **Elastic shrinking** keeps no spares: the job drops the data-parallel
# replica that held the failed node and runs narrower until the repair, losing ``g/n`` of its
# throughput per node out (``g`` nodes per replica). :func:`spare_pool_size` and
# :func:`elastic_throughput` price the two.


def nodes_down_mean(n_nodes: int, node_mtbf_s: float, repair_s: float) -> float:
    """Mean number of nodes out at once: ``n · R / M`` (failure rate times time out)."""
    if n_nodes < 1 or node_mtbf_s <= 0 or repair_s < 0:
        raise ValueError("need n_nodes >= 1, node_mtbf_s > 0 and repair_s >= 0 (seconds)")
    return n_nodes * repair_s / node_mtbf_s


def poisson_cdf(k: int, mean: float) -> float:
    """P(X ≤ k) for X ~ Poisson(mean), summed term by term (stable for the means used here)."""
    if k < 0:
        return 0.0
    term = total = math.exp(-mean)
    for i in range(1, k + 1):
        term *= mean / i
        total += term
    return min(total, 1.0)


def spare_pool_size(
    n_nodes: int, node_mtbf_s: float, repair_s: float, confidence: float = 0.99
) -> int:
    """The smallest ``k`` with P(nodes out ≤ k) ≥ ``confidence``: spares that cover the nodes
    out at once all but ``1 − confidence`` of the time."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    mean = nodes_down_mean(n_nodes, node_mtbf_s, repair_s)
    k = 0
    while poisson_cdf(k, mean) < confidence:
        k += 1
    return k


def spare_pool_overhead(n_nodes: int, spares: int) -> float:
    """Share of the bought nodes that sit idle as spares: ``k / (n + k)``."""
    if n_nodes < 1 or spares < 0:
        raise ValueError("need n_nodes >= 1 and spares >= 0")
    return spares / (n_nodes + spares)


def elastic_throughput(
    n_nodes: int, node_mtbf_s: float, repair_s: float, nodes_per_replica: int = 1
) -> float:
    """Expected share of full throughput with elastic shrinking and no spares: each node out
    takes its whole data-parallel replica (``g`` nodes) with it, ``1 − g·E[out]/n``
    (first order: replicas rarely lose two nodes at once)."""
    if nodes_per_replica < 1 or n_nodes % nodes_per_replica:
        raise ValueError(
            f"nodes_per_replica={nodes_per_replica} must divide n_nodes={n_nodes}: a replica is "
            "a whole number of nodes"
        )
    lost = nodes_per_replica * nodes_down_mean(n_nodes, node_mtbf_s, repair_s) / n_nodes
    return max(0.0, 1.0 - lost)
