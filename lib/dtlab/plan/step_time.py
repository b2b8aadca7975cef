"""What a plan costs in time: compute, the communication that does not hide, the bubble, MFU.

A plan that fits in memory can still be communication-bound. Per optimizer step and GPU
(Narayanan et al. 2021, Sec. 3; the scaling-book's compute-vs-communication accounting):

* **compute** ``= 6·Ψ·T / (G · peak · η)``: forward and backward FLOPs of ``Ψ`` parameters over
  the step's ``T`` tokens, shared by ``G`` GPUs, at the GPU's dense BF16 peak times a matmul
  efficiency ``η`` (default 0.7: what large, well-shaped GEMMs sustain; an assumption, stated).
  For a mixture of experts ``Ψ`` is the *active* parameters (a token runs through ``top_k``
  experts, not all of them: :attr:`~dtlab.plan.job.Requirements.active_params`);
* **recomputation** (:func:`recompute_flops_per_gpu`), extra work MFU does not count: selective
  reruns the attention core's forward, ``4·L·s·d`` FLOPs per token (a third of PaLM's
  ``12·L·s·d`` for the attention core's forward and backward, Chowdhery et al. 2022, App. B);
  full reruns the whole forward, ``2·Ψ`` more (``8·Ψ`` in all, :mod:`dtlab.cost.flops`);
* **context parallel**: ring attention's K/V sends overlap the attention blocks they feed (Liu
  et al. 2023, Sec. 3), so only the part longer than the attention core's own compute
  (``12·L·s·d`` per token) is exposed — an assumption that holds while ``s/cp`` stays long;
  at NVLink speed when the ring (``cp·tp`` consecutive ranks) stays in a node, else at the
  GPU's own NIC;
* **expert parallel**: dispatch and combine all-to-alls stand between the router and the
  experts and between the experts and the next layer, so they are exposed (DeepSeek-V3's
  DualPipe overlaps them with another micro-batch's compute, which this model does not price);
  at NVLink speed when an EP group (``ep·cp·tp`` consecutive ranks) stays in a node, else every
  byte at the GPU's own NIC (an upper bound: some peers share the node);
* **tensor parallel** (TP + SP, at NVLink bandwidth: TP stays inside a node —
  :func:`plan_problems` checks): charged **whole**, an upper bound on its exposed time. Forward's
  all-gathers and reduce-scatters sit between a layer's matmuls (the next GEMM needs their
  result), so they are exposed unless async TP (collective matmul) splits the GEMMs to hide
  them. Backward is different: the reduce-scatter of a column-parallel linear's input gradient
  is not needed by that linear's weight-gradient GEMM, so Megatron-LM launches it asynchronously
  and runs wgrad meanwhile (``LinearWithGradAccumulationAndAsyncCommunication``, with
  ``CUDA_DEVICE_MAX_CONNECTIONS=1`` so the collective is queued first); its re-all-gather of the
  saved input overlaps the dgrad GEMM and is not counted here. The all-gather of the output
  gradient before a row-parallel linear stays exposed (its dgrad needs it). So 2 of the 8
  counted collectives per layer (a quarter of the bytes; without SP it would be 2 of 4
  all-reduces, half) can hide, each behind its own wgrad GEMM:
  :attr:`StepTime.tp_hideable_s` reports ``min(¼·tp, wgrad of the column-parallel linears)``,
  the latter ``7/12`` of the weight-gradient compute (QKV ``3h²`` and FC1 ``4h²`` of a GPT
  layer's ``12h²``; an approximation). The step does **not** subtract it: ``tp`` stays an upper
  bound, ``tp − tp_hideable`` the exposed time under Megatron's backward overlap. It is kept
  whole because dtlab's own TP issues the backward collective synchronously, and the hidden
  share rests on GEMM shapes this model approximates; plans are ranked on the bound;
* **pipeline**: point-to-point activations, exposed, at the NIC's bandwidth (stages span nodes);
  the bubble stretches the compute-and-TP part by ``1/(1 − bubble)``;
* **data parallel**: the gradient reduce-scatter/all-reduce overlaps the backward pass (⅔ of the
  compute), so only the part longer than the backward is exposed — at the ring's bus bandwidth
  (:func:`dp_bus_bandwidth_of`: NVLink inside a node; across nodes the NICs of the group's
  members in each node).

Links: ``req.gpu``'s NVLink inside a node; one 400 Gb/s NIC per GPU across nodes (a
rail-optimised fabric: each GPU's traffic leaves on its own NIC; pipeline sends use one). Bytes
per step per GPU are :func:`~dtlab.plan.layout_cost.traffic_per_gpu`'s.
``step = (compute + recompute + tp + pp + exposed cp + ep) / (1 − bubble) + exposed dp``;
``MFU = 6·Ψ·T / (G · peak · step)``.
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
    recompute_s: float = 0.0
    cp_s: float = 0.0
    cp_exposed_s: float = 0.0
    ep_s: float = 0.0
    tp_hideable_s: float = 0.0
    """Of ``tp_s``, the backward reduce-scatters that Megatron's async launch hides behind the
    weight-gradient GEMMs (module docstring); ``tp_s`` charges them anyway (an upper bound)."""

    @property
    def communication_bound(self) -> bool:
        """Whether exposed communication takes longer than the compute itself."""
        exposed = self.tp_s + self.pp_s + self.dp_exposed_s + self.cp_exposed_s + self.ep_s
        return exposed > self.compute_s


def attention_core_flops_per_gpu(req: Requirements) -> float:
    """The attention core's forward and backward FLOPs one GPU runs per step: ``12·L·s·d``
    per token (PaLM, Chowdhery et al. 2022, App. B; causal masking would halve it)."""
    return 12 * req.n_layers * req.seq_len * req.d_model * req.global_batch_tokens / req.n_gpus


def recompute_flops_per_gpu(req: Requirements, plan: ParallelPlan) -> float:
    """FLOPs one GPU spends per step redoing forward work: 0 without recomputation; the
    attention core's forward (a third of :func:`attention_core_flops_per_gpu`) when selective;
    that plus ``2·Ψ_active·T/G`` (one more forward of the matmuls) when full."""
    if plan.recompute == "none":
        return 0.0
    attention = attention_core_flops_per_gpu(req) / 3
    if plan.recompute == "selective":
        return attention
    return attention + 2 * req.active_params * req.global_batch_tokens / req.n_gpus


def tp_backward_hideable_share(plan: ParallelPlan) -> float:
    """The share of a plan's TP bytes (:func:`traffic_per_gpu`'s ``tp``) that backward can hide
    without async TP: the 2 input-gradient reduce-scatters of the 8 TP + SP collectives per layer
    and micro-batch, ``1/4`` — of the un-recomputed bytes, so ``1/6`` under full recomputation,
    whose rerun forward (the extra half) is exposed like forward's."""
    return 0.25 / (1.5 if plan.recompute == "full" else 1.0)


def column_parallel_wgrad_s(compute_s: float) -> float:
    """The time of the weight-gradient GEMMs the backward reduce-scatters can hide behind: wgrad
    is a third of ``compute_s`` (``2·Ψ`` of ``6·Ψ``), of which the column-parallel linears (QKV
    ``3h²`` and FC1 ``4h²`` of a GPT layer's ``12h²``) take ``7/12`` — an approximation."""
    return compute_s / 3 * 7 / 12


def group_bandwidth_of(
    req: Requirements, span: int, nic: Link = IB_NDR_400, nics_per_node: int | None = None
) -> float:
    """Bytes/s per GPU for a group spanning ``span`` consecutive ranks: NVLink inside a node,
    else the GPU's share of its node's NICs (one each, rail-optimised, by default)."""
    spec = gpu(req.gpu)
    if span <= req.gpus_per_node:
        return spec.nvlink.bandwidth_bytes_per_s
    nics = nics_per_node or req.gpus_per_node
    share = nics * nic.bandwidth_bytes_per_s / req.gpus_per_node
    return min(spec.nvlink.bandwidth_bytes_per_s, share)


def dp_bus_bandwidth_of(
    req: Requirements, plan: ParallelPlan, nic: Link = IB_NDR_400, nics_per_node: int | None = None
) -> float:
    """Bus bandwidth (bytes/s per GPU) of this plan's data-parallel ring.

    Ranks run ``(pp, dp, tp)`` row-major: a dp group strides ``tp``, so it spans ``dp·tp``
    consecutive ranks. Inside a node it runs on NVLink. Across nodes, a node's ``nics_per_node``
    NICs (default one per GPU: rail-optimised) carry the rings of its ``tp`` dp groups, one ring
    per NIC as NCCL runs them, so each group gets ``min(NVLink, nics · NIC / tp)`` — 200 GB/s at
    tp = 2 on eight 400 Gb/s NICs, 25 GB/s with one NIC per node
    (:func:`dtlab.cost.crossover.dp_bus_bandwidth` is the tp = 1 case). With context
    parallelism the gradients are reduced over the ``dp·cp`` ranks holding the same shard — one
    group striding ``tp`` over ``dp·cp·tp`` ranks, so still ``tp`` groups per node (an MoE's
    expert gradients, over ``dp·cp/ep`` ranks, are priced at the same bandwidth).
    """
    spec = gpu(req.gpu)
    if plan.dp * plan.cp * plan.tp <= req.gpus_per_node:
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
    sustained = spec.bf16_dense_flops * efficiency
    flops = 6 * req.active_params * req.global_batch_tokens / req.n_gpus
    compute = flops / sustained
    recompute = recompute_flops_per_gpu(req, plan) / sustained
    traffic = traffic_per_gpu(req, plan)
    tp = traffic.tp / spec.nvlink.bandwidth_bytes_per_s
    tp_hideable = min(tp_backward_hideable_share(plan) * tp, column_parallel_wgrad_s(compute))
    pp = traffic.pp / nic.bandwidth_bytes_per_s
    dp = traffic.dp / dp_bus_bandwidth_of(req, plan, nic, nics_per_node)
    dp_exposed = max(0.0, dp - compute * 2 / 3)
    cp = traffic.cp / group_bandwidth_of(req, plan.cp * plan.tp, nic, nics_per_node)
    cp_exposed = max(0.0, cp - attention_core_flops_per_gpu(req) / sustained) if cp else 0.0
    span = plan.ep * plan.cp * plan.tp
    ep = traffic.ep / group_bandwidth_of(req, span, nic, nics_per_node) if traffic.ep else 0.0
    bubble = pipeline_bubble(req, plan)
    step = (compute + recompute + tp + pp + cp_exposed + ep) / (1 - bubble) + dp_exposed
    mfu = flops / (spec.bf16_dense_flops * step)
    return StepTime(
        compute,
        tp,
        pp,
        dp,
        dp_exposed,
        bubble,
        step,
        mfu,
        recompute,
        cp,
        cp_exposed,
        ep,
        tp_hideable_s=tp_hideable,
    )


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
