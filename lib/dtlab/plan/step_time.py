"""What a plan costs in time: compute by GEMM shape, exposed communication, the bubble, MFU.

A plan that fits in memory can still be slow. Per optimizer step, on the slowest pipeline
device (stages need not be equal), this model adds up:

* **compute** (:mod:`dtlab.plan.compute`): each micro-batch's forward ``F``, input-gradient
  backward ``B`` and weight-gradient backward ``W`` — linear layers at the efficiency their
  GEMM shapes sustain (waves of tiles on the SMs, :mod:`dtlab.plan.gemm`), causal attention at the
  flash kernels' efficiency, recomputation in ``B``;
* **exposed communication** per mechanism (:mod:`dtlab.plan.exposed`: what hides each one and
  what shows) — TP's forward collectives and, with SP, backward's gathers of the output gradient
  (the rest of backward's hide behind its GEMMs), CP beyond the attention it overlaps (all of
  Llama 3's all-gather CP), EP's all-to-alls (all of them, or only what outlasts a micro-batch's
  compute under DualPipe), PP's fill and drain hops (every exchange, where the software waits on
  each), and the DP sync on device 0 beyond the backward that follows its gradients there
  (ZeRO-2/3: per micro-batch, with prefetch; DeepSpeed 2021's per-parameter ZeRO-3 adds its host
  loops and ring latencies, :mod:`dtlab.plan.zero3_per_parameter`);
* **the schedule's idle time** (:func:`dtlab.cost.bubble.schedule_idle`: 1F1B, interleaved,
  ZB-H1, DualPipe/DualPipeV) from those ``F``, ``B``, ``W`` with their exposed communication.

``step = m·(F + B + W + exposed per micro-batch) + idle + exposed PP + exposed DP``;
``MFU = 6·N·T / (G · peak · step)`` (Kaplan's ``6N``, active parameters for an MoE) and, beside
it, on ``6N + 6·L·s·w`` (causal attention counted; :func:`dtlab.plan.compute.attention_flops_per_token`).
Links are the job's (:class:`~dtlab.plan.job.Requirements`: NVLink of its GPU, ``nics_per_node``
NICs of ``nic_bytes_per_s``); :func:`step_time` and :func:`fastest_plans` take a NIC or a NIC
count to ask "what if the fabric were different".
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dtlab.cost import gpu
from dtlab.cost.alpha_beta import Link
from dtlab.cost.bubble import schedule_idle
from dtlab.plan.compute import (
    MicroBatchCompute,
    attention_flops_per_token,
    layer_efficiency,
    micro_batch_compute,
)
from dtlab.plan.constants import OVERLAP_COST
from dtlab.plan.exposed import (
    cp_exposed,
    dp_bus_bandwidth_of,
    dp_exposed,
    dp_seconds,
    dp_total_seconds,
    ep_exposed,
    ep_seconds_per_micro_batch,
    group_bandwidth_of,
    pp_exposed_s,
    tp_exposed,
    tp_seconds_per_micro_batch,
)
from dtlab.plan.job import Requirements
from dtlab.plan.layout_cost import micro_batches
from dtlab.plan.memory_by_category import held_params
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.problems import plan_problems
from dtlab.plan.search import candidate_plans
from dtlab.plan.software import software_of
from dtlab.plan.stages import representative_devices
from dtlab.plan.wire import tp_forward_share
from dtlab.plan.zero3_per_parameter import per_parameter_exposed_s

__all__ = [
    "StepTime",
    "dp_bus_bandwidth_of",
    "fastest_plans",
    "group_bandwidth_of",
    "step_time",
    "with_fabric",
]


@dataclass(frozen=True)
class StepTime:
    """One plan's step, in seconds per optimizer step, by part, and the MFU it implies.

    ``*_s`` are all of a mechanism's seconds; ``*_exposed_s`` the part overlap leaves on the
    critical path (the step adds only those)."""

    compute_s: float  # F + B + W without reruns, all micro-batches, slowest device
    tp_s: float  # all TP collectives, full recomputation's rerun forward included
    pp_s: float
    dp_s: float
    dp_exposed_s: float
    bubble: float  # idle / (busy + idle) of the pipeline part
    step_s: float
    mfu: float  # on 6N
    recompute_s: float = 0.0
    cp_s: float = 0.0
    cp_exposed_s: float = 0.0
    ep_s: float = 0.0
    tp_exposed_s: float = 0.0
    pp_exposed_s: float = 0.0
    ep_exposed_s: float = 0.0
    attention_s: float = 0.0  # of compute_s, causal attention
    idle_s: float = 0.0
    mfu_attention: float = 0.0  # on 6N + causal attention
    gemm_efficiency: float = 0.0  # layer GEMMs' share of their dtype's peak (plan.gemm)

    @property
    def tp_hideable_s(self) -> float:
        """Of ``tp_s``, what overlap hides: backward's input-gradient reductions behind wgrad, SP's
        re-gathers behind dgrad, and with async TP forward's collectives and SP's gathers of the
        output gradient too."""
        return self.tp_s - self.tp_exposed_s

    @property
    def exposed_communication_s(self) -> float:
        return (
            self.tp_exposed_s
            + self.pp_exposed_s
            + self.dp_exposed_s
            + self.cp_exposed_s
            + self.ep_exposed_s
        )

    @property
    def communication_bound(self) -> bool:
        """Whether exposed communication takes longer than the compute itself."""
        return self.exposed_communication_s > self.compute_s


def with_fabric(
    req: Requirements, nic: Link | None = None, nics_per_node: int | None = None
) -> Requirements:
    """``req`` with another NIC or NIC count (None keeps the job's)."""
    if nic is not None:
        req = replace(req, nic_bytes_per_s=nic.bandwidth_bytes_per_s)
    if nics_per_node is not None:
        req = replace(req, nics_per_node=nics_per_node)
    return req


@dataclass(frozen=True)
class _Device:
    compute: MicroBatchCompute
    tp_forward: float
    tp_backward: float
    tp_s: float
    cp_s: float
    cp_shown: float
    ep_s: float
    ep_shown: float
    dp_per_micro_batch: float
    overlap_cost: float  # compute lost to the communication hidden under it

    @property
    def forward(self) -> float:
        c = self.compute
        return c.forward_s + self.tp_forward + (self.cp_shown + self.ep_shown) / 3

    @property
    def input_grad(self) -> float:
        c = self.compute
        shown = 2 * (self.cp_shown + self.ep_shown) / 3 + self.dp_per_micro_batch
        return c.input_grad_s + self.tp_backward + shown + self.overlap_cost

    @property
    def total(self) -> float:
        return self.forward + self.input_grad + self.compute.weight_grad_s


def _device(req: Requirements, plan: ParallelPlan, device: int, m: int) -> _Device:
    c = micro_batch_compute(req, plan, device)
    tp_s = tp_seconds_per_micro_batch(req, plan, c.layers)
    software = software_of(req)
    forward, backward = tp_exposed(plan, tp_s, c, software.tp_backward_overlap)
    if plan.recompute == "full":  # the rerun forward repeats forward's collectives
        tp_s += tp_s * tp_forward_share(plan)  # (tp_exposed counts them)
    cp_s, cp_shown = cp_exposed(req, plan, c)
    ep_s = ep_seconds_per_micro_batch(req, plan, c.layers)
    ep_shown = ep_exposed(plan, ep_s, c)
    rs, ag = dp_seconds(req, plan, *held_params(req, plan, device))
    _, per_micro_batch = dp_exposed(plan, rs, ag, c, m)
    dp_per_micro_batch = 0.0
    if plan.zero_stage == 2:
        dp_per_micro_batch = rs
    elif plan.zero_stage == 3 and plan.reshard_after_forward:
        dp_per_micro_batch = 2 * ag + rs
    hidden = (
        max(0.0, tp_s - forward - backward)
        + max(0.0, cp_s - cp_shown)
        + max(0.0, ep_s - ep_shown)
        + max(0.0, dp_per_micro_batch - per_micro_batch)
    )  # fmt: skip
    cost = overlap_cost(req, hidden)
    return _Device(c, forward, backward, tp_s, cp_s, cp_shown, ep_s, ep_shown, per_micro_batch,
                   cost)  # fmt: skip


def micro_batch_seconds(
    req: Requirements, plan: ParallelPlan, device: int = 0
) -> tuple[float, ...]:
    """One micro-batch's ``(F, B, W)`` on pipeline device ``device`` as the schedule sees them:
    compute, plus the communication that overlap leaves exposed, plus what the hidden part costs
    the compute beside it (:func:`overlap_cost`)."""
    d = _device(req, plan, device, max(1, int(micro_batches(req, plan))))
    return d.forward, d.input_grad, d.compute.weight_grad_s


def overlap_cost(req: Requirements, hidden_s: float) -> float:
    """Compute time lost to ``hidden_s`` of communication running beside it:
    :data:`~dtlab.plan.constants.OVERLAP_COST` of it, or nothing when the job reserves SMs for
    communication (its compute already runs on fewer SMs)."""
    return 0.0 if req.comm_sm_fraction else OVERLAP_COST * max(0.0, hidden_s)


def step_time(
    req: Requirements,
    plan: ParallelPlan,
    nic: Link | None = None,
    nics_per_node: int | None = None,
) -> StepTime:
    """The step of ``plan`` for ``req`` (module docstring); assumes the plan passes
    :func:`plan_problems` (a plan that does not has no step to time)."""
    req = with_fabric(req, nic, nics_per_node)
    m = max(1, int(micro_batches(req, plan)))
    devices = [_device(req, plan, i, m) for i in representative_devices(req, plan)]
    slow = max(devices, key=lambda d: d.total)
    idle = 0.0
    if plan.pp > 1:
        idle = schedule_idle(plan.schedule, plan.pp, plan.virtual_stages, slow.forward,
                             slow.input_grad, slow.compute.weight_grad_s)  # fmt: skip
    pipeline = m * slow.total + idle
    first = devices[0]
    rs, ag = dp_seconds(req, plan, *held_params(req, plan, 0))
    dp_step, _ = dp_exposed(plan, rs, ag, first.compute, m, software_of(req).overlaps_grad_sync)
    dp_all = dp_total_seconds(plan, rs, ag, m)
    per_step_hidden = 0.0  # ZeRO 0-1 (and Llama 3's FSDP): the once-a-step sync's hidden part
    if not (plan.zero_stage == 2 or (plan.zero_stage == 3 and plan.reshard_after_forward)):
        per_step_hidden = max(0.0, dp_all - dp_step)
    pp_s, pp_shown = pp_exposed_s(req, plan, software_of(req).blocking_p2p)
    dp_step += per_parameter_exposed_s(req, plan, m)  # DeepSpeed 2021's ZeRO-3 only
    step = pipeline + pp_shown + dp_step + overlap_cost(req, per_step_hidden + pp_s - pp_shown)
    c = slow.compute
    tokens = req.global_batch_tokens
    peak = gpu(req.gpu).bf16_dense_flops * req.n_gpus
    six_n = 6 * req.active_params * tokens
    return StepTime(
        compute_s=m * (c.total_s - c.recompute_s),
        tp_s=m * slow.tp_s,
        pp_s=pp_s,
        dp_s=dp_all,
        dp_exposed_s=dp_step + m * slow.dp_per_micro_batch,
        bubble=idle / pipeline,
        step_s=step,
        mfu=six_n / (peak * step),
        recompute_s=m * c.recompute_s,
        cp_s=m * slow.cp_s,
        cp_exposed_s=m * slow.cp_shown,
        ep_s=m * slow.ep_s,
        tp_exposed_s=m * (slow.tp_forward + slow.tp_backward),
        pp_exposed_s=pp_shown,
        ep_exposed_s=m * slow.ep_shown,
        attention_s=m * 3 * c.attention_forward_s,
        idle_s=idle,
        mfu_attention=(six_n + attention_flops_per_token(req) * tokens) / (peak * step),
        gemm_efficiency=layer_efficiency(req, plan),
    )


def fastest_plans(
    req: Requirements, limit: int = 5, nics_per_node: int | None = None
) -> list[tuple[ParallelPlan, StepTime]]:
    """The plans that pass every check, fastest step first."""
    req = with_fabric(req, None, nics_per_node)
    timed = [
        (plan, step_time(req, plan))
        for plan in candidate_plans(req)
        if not plan_problems(req, plan)
    ]
    return sorted(timed, key=lambda pair: pair[1].step_s)[:limit]
