"""What a plan costs in time: compute, the communication that does not hide, the bubble, MFU.

A plan that fits in memory can still be communication-bound. Per optimizer step and GPU
(Narayanan et al. 2021, Sec. 3; the scaling-book's compute-vs-communication accounting):

* **compute** ``= 6·Ψ·T / (G · peak · η)``: forward and backward FLOPs of ``Ψ`` parameters over
  the step's ``T`` tokens, shared by ``G`` GPUs, at the GPU's dense BF16 peak times a matmul
  efficiency ``η`` (default 0.7: what large, well-shaped GEMMs sustain; an assumption, stated);
* **tensor parallel**: its all-gathers/reduce-scatters sit between the layer's matmuls, so their
  time is exposed, at NVLink bandwidth (TP stays inside a node — :func:`plan_problems` checks);
* **pipeline**: point-to-point activations, exposed, at the NIC's bandwidth (stages span nodes);
  the bubble stretches the compute-and-TP part by ``1/(1 − bubble)``;
* **data parallel**: the gradient reduce-scatter/all-reduce overlaps the backward pass (⅔ of the
  compute), so only the part longer than the backward is exposed — at the ring's bus bandwidth
  (:func:`dp_bus_bandwidth_of`: NVLink inside a node; across nodes the NICs of the group's
  members in each node).

Links: ``req.gpu``'s NVLink inside a node; one 400 Gb/s NIC per GPU across nodes (a
rail-optimised fabric: each GPU's traffic leaves on its own NIC; pipeline sends use one). Bytes per step per GPU are
:func:`~dtlab.plan.layout_cost.traffic_per_gpu`'s. ``step = (compute + tp + pp) / (1 − bubble)
+ exposed dp``; ``MFU = 6·Ψ·T / (G · peak · step)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.cost import gpu
from dtlab.cost.hardware import IB_NDR_400, Link
from dtlab.plan.job import Requirements
from dtlab.plan.layout_cost import pipeline_bubble, traffic_per_gpu
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.problems import plan_problems
from dtlab.plan.search import candidate_plans

MATMUL_EFFICIENCY = 0.7


@dataclass(frozen=True)
class StepTime:
    """One plan's step, in seconds per optimizer step, and the MFU it implies."""

    compute_s: float
    tp_s: float
    pp_s: float
    dp_s: float
    dp_exposed_s: float
    bubble: float
    step_s: float
    mfu: float

    @property
    def communication_bound(self) -> bool:
        """Whether exposed communication takes longer than the compute itself."""
        return self.tp_s + self.pp_s + self.dp_exposed_s > self.compute_s


def dp_bus_bandwidth_of(
    req: Requirements, plan: ParallelPlan, nic: Link = IB_NDR_400, nics_per_node: int | None = None
) -> float:
    """Bus bandwidth (bytes/s per GPU) of this plan's data-parallel ring.

    Ranks run ``(pp, dp, tp)`` row-major: a dp group strides ``tp``, so it spans ``dp·tp``
    consecutive ranks. Inside a node it runs on NVLink. Across nodes, a node's ``nics_per_node``
    NICs (default one per GPU: rail-optimised) carry the rings of its ``tp`` dp groups, one ring
    per NIC as NCCL runs them, so each group gets ``min(NVLink, nics · NIC / tp)`` — 200 GB/s at
    tp = 2 on eight 400 Gb/s NICs, 25 GB/s with one NIC per node
    (:func:`dtlab.cost.crossover.dp_bus_bandwidth` is the tp = 1 case).
    """
    spec = gpu(req.gpu)
    if plan.dp * plan.tp <= req.gpus_per_node:
        return spec.nvlink.bandwidth_bytes_per_s
    nics = nics_per_node or req.gpus_per_node
    return min(spec.nvlink.bandwidth_bytes_per_s, nics * nic.bandwidth_bytes_per_s / plan.tp)


def step_time(
    req: Requirements,
    plan: ParallelPlan,
    efficiency: float = MATMUL_EFFICIENCY,
    nic: Link = IB_NDR_400,
    nics_per_node: int | None = None,
) -> StepTime:
    """The step of ``plan`` for ``req`` (module docstring); assumes the plan passes
    :func:`plan_problems` (a plan that does not has no step to time)."""
    spec = gpu(req.gpu)
    flops = 6 * req.params * req.global_batch_tokens / req.n_gpus
    compute = flops / (spec.bf16_dense_flops * efficiency)
    traffic = traffic_per_gpu(req, plan)
    tp = traffic.tp / spec.nvlink.bandwidth_bytes_per_s
    pp = traffic.pp / nic.bandwidth_bytes_per_s
    dp = traffic.dp / dp_bus_bandwidth_of(req, plan, nic, nics_per_node)
    dp_exposed = max(0.0, dp - compute * 2 / 3)
    bubble = pipeline_bubble(req, plan)
    step = (compute + tp + pp) / (1 - bubble) + dp_exposed
    mfu = flops / (spec.bf16_dense_flops * step)
    return StepTime(compute, tp, pp, dp, dp_exposed, bubble, step, mfu)


def fastest_plans(
    req: Requirements, limit: int = 5, nics_per_node: int | None = None
) -> list[tuple[ParallelPlan, StepTime]]:
    """The plans that pass every check, fastest step first."""
    timed = [
        (plan, step_time(req, plan, nics_per_node=nics_per_node))
        for plan in candidate_plans(req)
        if not plan_problems(req, plan)
    ]
    return sorted(timed, key=lambda pair: pair[1].step_s)[:limit]
