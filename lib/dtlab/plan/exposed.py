"""What each parallelism's communication costs the step once overlap has hidden what it can.

Per mechanism, what is exposed and what hides it (seconds; bytes from
:mod:`dtlab.plan.layout_cost` and :mod:`dtlab.plan.wire`; links from the job's hardware):

* **TP + SP** (per micro-batch, NVLink; a group wider than a node on its nodes' NICs,
  :func:`tp_bus_bandwidth_of`; bytes :func:`dtlab.plan.wire.tp_bytes_per_layer`): forward's 2
  all-reduces per layer (with SP 2 all-gathers and 2 reduce-scatters) sit between GEMMs that
  need their results — exposed, unless ``async_tp`` (collective matmul) splits the GEMMs to
  hide them (then only what outlasts forward's linear GEMMs shows). Backward's input-gradient
  all-reduce (with SP, reduce-scatter) is not needed by that layer's weight-gradient GEMM, so
  Megatron-LM launches it asynchronously and runs wgrad meanwhile
  (``CUDA_DEVICE_MAX_CONNECTIONS=1``): it shows only where it outlasts wgrad. Under SP the
  all-reduce's other half moves: the all-gathers of the output gradient in front of the
  row-parallel layers (the backward of forward's reduce-scatters) feed their dgrad at once —
  exposed, unless ``async_tp`` — and SP adds the re-gathers of the stored input shards
  (:data:`dtlab.plan.wire.SP_BACKWARD_REGATHERS`), which overlap dgrad. A full recomputation's
  rerun forward repeats forward's collectives, exposed like them.
* **CP** (per micro-batch, NVLink while the ``cp·tp`` ranks stay in a node, else the NICs):
  ring attention passes K/V blocks while it computes on the ones it holds (Liu et al. 2023), so
  only what outlasts the attention compute of forward and backward shows; Llama 3's all-gather
  CP gathers K and V before attention and reduce-scatters their gradients after it — exposed
  (small with 8 K/V heads; Dubey et al. 2024, Sec. 3.3.2).
* **EP** (per micro-batch): dispatch and combine, forward and backward, priced with the
  node-limited byte model of :func:`dtlab.cost.moe.inter_node_dispatch_bytes` — a token crosses
  the network once per remote node among its experts (at most ``node_limit``), then NVLink inside
  the node; dispatch in FP8 when the job's GEMMs are FP8 (DeepSeek-V3), combine in BF16. Without
  DualPipe the all-to-alls stand between router, experts and the next layer: exposed. DualPipe
  and DualPipeV run one micro-batch's all-to-alls under another's compute (DeepSeek-V3 Sec.
  3.2.1): only what outlasts a micro-batch's compute shows.
* **PP** (per step): sends are asynchronous and overlap the next micro-batch's compute in the
  steady state; the fill and the drain wait on each hop — ``2·(c − 1)`` sends of
  ``b·(s/cp)·d/tp`` bf16 values (each TP rank sends a slice: its own with SP, a scatter/gather
  one without) over the ``c`` chunks the micro-batch crosses. Software that waits on every
  exchange (Megatron-LM before 2023, :attr:`~dtlab.plan.software.Software.blocking_p2p`)
  exposes all of a device's sends besides, and without SP the NVLink all-gather that rebuilds
  each received tensor.
* **DP** (per step, on pipeline device 0 — the last to finish its backward, so the one with no
  slack: a later stage's sync runs while earlier stages still compute): a reduction hides only
  behind the backward that follows its gradients *on that device* — the last micro-batch's
  backward of device 0's first chunk; ZeRO-1's parameter all-gather behind the next step's first
  forward there. ZeRO-2 reduce-scatters every micro-batch behind that micro-batch's backward;
  ZeRO-3 (FSDP, resharding after forward) gathers every layer for each micro-batch's forward and
  again for its backward, prefetching the next layer under the current one's compute, so only
  what outlasts the compute shows, plus the first layer's gather; without resharding (Llama 3)
  it gathers once per step, priced like ZeRO-1. Bandwidth:
  :func:`dp_bus_bandwidth_of`.
"""

from __future__ import annotations

import math
from functools import lru_cache

from dtlab.cost import gpu
from dtlab.cost.moe import inter_node_dispatch_bytes
from dtlab.memory import shard_numel
from dtlab.plan.compute import MicroBatchCompute, tokens_per_micro_batch
from dtlab.plan.job import Requirements
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.stages import chunk_count
from dtlab.plan.wire import (
    SP_BACKWARD_REGATHERS,
    kv_width_per_tp_rank,
    ring_attention_bytes_per_layer,
    tp_bytes_per_layer,
    tp_collectives_per_layer,
)


def nic_bandwidth_per_gpu(req: Requirements) -> float:
    """One GPU's share of its node's NICs: ``nics · NIC / gpus_per_node``."""
    return req.nics * req.nic_bytes_per_s / req.gpus_per_node


def group_bandwidth_of(req: Requirements, span: int) -> float:
    """Bytes/s per GPU for a group spanning ``span`` consecutive ranks: NVLink inside a node,
    else the GPU's share of its node's NICs."""
    nvlink = gpu(req.gpu).nvlink.bandwidth_bytes_per_s
    return nvlink if span <= req.gpus_per_node else min(nvlink, nic_bandwidth_per_gpu(req))


def dp_bus_bandwidth_of(req: Requirements, plan: ParallelPlan) -> float:
    """Bus bandwidth (bytes/s per GPU) of this plan's data-parallel ring.

    Ranks run ``(pp, dp, cp, tp)`` row-major: a dp group strides ``cp·tp`` and spans
    ``dp·cp·tp`` consecutive ranks. Inside a node it runs on NVLink. Across nodes, a node's NICs
    carry the rings of its ``tp`` groups (one ring per NIC, as NCCL runs them), so each group gets
    ``min(NVLink, nics · NIC / tp)`` — 200 GB/s at tp = 2 on eight 400 Gb/s NICs, 50 GB/s at
    tp = 8 (one NIC per DP group: Llama 3's and Megatron's layouts)."""
    nvlink = gpu(req.gpu).nvlink.bandwidth_bytes_per_s
    if plan.dp * plan.cp * plan.tp <= req.gpus_per_node:
        return nvlink
    return min(nvlink, req.nics * req.nic_bytes_per_s / plan.tp)


def tp_bus_bandwidth_of(req: Requirements, plan: ParallelPlan) -> float:
    """Bus bandwidth (bytes/s per GPU) of this plan's TP collectives: NVLink while the group
    fits in a node. A group wider than a node (which :func:`~dtlab.plan.problems.plan_problems`
    refuses, but :func:`~dtlab.plan.step_time.step_time` prices when asked) fills every node it
    spans — TP ranks are innermost — so its rings cross between nodes on all of a node's NICs,
    one ring per NIC as :func:`dp_bus_bandwidth_of` prices them: ``min(NVLink, nics · NIC)``,
    200 GB/s on Selene's eight HDR NICs against NVLink's 300."""
    nvlink = gpu(req.gpu).nvlink.bandwidth_bytes_per_s
    if plan.tp <= req.gpus_per_node:
        return nvlink
    return min(nvlink, req.nics * req.nic_bytes_per_s)


def tp_seconds_per_micro_batch(req: Requirements, plan: ParallelPlan, layers: int) -> float:
    """All of one micro-batch's TP + SP collectives on one device (forward and backward,
    :func:`dtlab.plan.wire.tp_bytes_per_layer`), at :func:`tp_bus_bandwidth_of`."""
    if plan.tp == 1:
        return 0.0
    return tp_bytes_per_layer(req, plan) * layers / tp_bus_bandwidth_of(req, plan)


def tp_exposed(
    plan: ParallelPlan, tp_s: float, c: MicroBatchCompute, overlap_backward: bool = True
) -> tuple[float, float]:
    """(forward-side, backward-side) exposed TP seconds of one micro-batch (module docstring);
    ``overlap_backward=False`` for software whose backward all-reduces wait (Megatron-LM before
    its asynchronous TP all-reduce of September 2021)."""
    forward_units, backward_units = tp_collectives_per_layer(plan)
    unit = tp_s / (forward_units + backward_units)
    forward = forward_units * unit
    linear_forward = c.forward_s - c.attention_forward_s
    shown_forward = max(0.0, forward - linear_forward) if plan.async_tp else forward
    if plan.sequence_parallel:
        # dL/dY all-gathered before the row-parallel layers' dgrad (ḡ's backward) waits, unless
        # collective matmul splits that GEMM; the re-gathers hide behind dgrad; the
        # reduce-scatters of dL/dX behind wgrad
        gathers, scatters = 2 * unit, 2 * unit
        regathers = SP_BACKWARD_REGATHERS * unit
        dgrad = c.input_grad_s - c.recompute_s - 2 * c.attention_forward_s
        if plan.async_tp:
            shown = max(0.0, gathers + regathers - dgrad)
        else:
            shown = gathers + max(0.0, regathers - dgrad)
    else:  # the all-reduces of dL/dX, under wgrad
        shown, scatters = 0.0, backward_units * unit
    shown_backward = shown + (
        max(0.0, scatters - c.weight_grad_s) if overlap_backward else scatters
    )
    if plan.recompute == "full":
        shown_backward += shown_forward  # the rerun forward's collectives
    return shown_forward, shown_backward


def cp_exposed(req: Requirements, plan: ParallelPlan, c: MicroBatchCompute) -> tuple[float, float]:
    """(seconds of CP traffic, exposed seconds) of one micro-batch on one device."""
    if plan.cp == 1:
        return 0.0, 0.0
    bandwidth = group_bandwidth_of(req, plan.cp * plan.tp)
    if plan.cp_kind == "allgather":
        kv = kv_width_per_tp_rank(req, plan)
        forward = (plan.cp - 1) * 2 * tokens_per_micro_batch(req, plan) * kv * 2
        passes = 3 if plan.recompute == "full" else 2  # gather, (regather), grads' RS
        seconds = passes * forward * c.layers / bandwidth
        return seconds, seconds
    seconds = ring_attention_bytes_per_layer(req, plan) * c.layers / bandwidth
    hidden = 3 * c.attention_forward_s  # the attention blocks of forward and backward
    return seconds, max(0.0, seconds - hidden)


@lru_cache(maxsize=1024)
def remote_copies_per_token(top_k: int, n_experts: int, nodes: int, limit: int | None) -> float:
    """Network copies of a token's vector per dispatch, uniform routing over ``nodes`` nodes with
    one copy per remote node (:func:`dtlab.cost.moe.inter_node_dispatch_bytes`): 3.5 for
    DeepSeek-V3 (8 of 256 experts, 8 nodes, at most 4 per token) where one copy per expert
    would be 7."""
    return inter_node_dispatch_bytes(
        1, 1, top_k, n_experts, nodes, limit, True, 1
    ).remote_copies_per_token


def ep_seconds_per_micro_batch(req: Requirements, plan: ParallelPlan, layers: int) -> float:
    """Dispatch and combine, forward and backward, of one micro-batch's MoE layers on one GPU."""
    if not req.is_moe or plan.ep == 1:
        return 0.0
    moe_layers = layers * req.moe_layers / req.n_layers
    tokens = max(1, tokens_per_micro_batch(req, plan) // plan.tp)  # the SP shard it routes
    d, k = req.d_model, req.top_k
    dispatch_bytes = 1 if req.gemm_dtype == "fp8" else 2
    nvlink = gpu(req.gpu).nvlink.bandwidth_bytes_per_s
    span = plan.ep * plan.cp * plan.tp
    on_nvlink = tokens * d * k * (dispatch_bytes + 2) * (plan.ep - 1) / plan.ep / nvlink
    if span <= req.gpus_per_node:
        network = 0.0
    else:
        nodes = math.ceil(span / req.gpus_per_node)
        while req.n_experts % nodes:
            nodes -= 1
        limit = min(req.node_limit, nodes) if req.node_limit else None
        copies = remote_copies_per_token(k, req.n_experts, nodes, limit)
        network = tokens * d * copies * (dispatch_bytes + 2) / nic_bandwidth_per_gpu(req)
    forward = on_nvlink + network
    passes = 3 if plan.recompute == "full" else 2
    return passes * forward * moe_layers


def ep_exposed(plan: ParallelPlan, ep_s: float, c: MicroBatchCompute) -> float:
    """Exposed EP seconds: all of it, or under DualPipe what outlasts a micro-batch's compute."""
    if plan.schedule in ("dualpipe", "dualpipev"):
        return max(0.0, ep_s - c.total_s)
    return ep_s


def pp_exposed_s(
    req: Requirements, plan: ParallelPlan, blocking: bool = False
) -> tuple[float, float]:
    """(all PP seconds per step on one device, exposed seconds).

    Asynchronous sends (``blocking=False``) hide in the steady state; the fill's and drain's
    ``2·(c − 1)`` hops are exposed. ``blocking=True`` is Megatron-LM's exchange before its 2023
    ``--overlap-p2p-comm``: ``_communicate`` waited on every ``batch_isend_irecv`` request and
    then called ``torch.cuda.synchronize()``, so each of a device's exchanges — per micro-batch
    and chunk, its input and output activations forward and their gradients backward, both
    directions at once on full-duplex links — sits on its critical path, beside the fill's and
    drain's hops. Without sequence parallelism each TP rank sends a ``1/tp`` slice and the
    receiver all-gathers the whole tensor over NVLink (Megatron's scatter/gather, Narayanan et
    al. 2021 Sec. 4.1, measured up to 11 % faster than sending it whole in their Fig. 18 — a
    gain only exposed sends can give; removed from Megatron-LM in January 2023, when SP had
    made it moot): those gathers are on the path too."""
    if plan.pp == 1:
        return 0.0, 0.0
    hop_bytes = tokens_per_micro_batch(req, plan) * req.d_model * 2 / plan.tp
    bandwidth = group_bandwidth_of(req, plan.dp * plan.cp * plan.tp * 2)
    m = req.global_batch_sequences / (plan.dp * plan.micro_batch_size)
    hops = chunk_count(plan) if plan.schedule != "dualpipe" else plan.pp
    total = 2 * m * hops / plan.pp * hop_bytes / bandwidth
    fill_and_drain = 2 * (hops - 1) * hop_bytes / bandwidth
    if not blocking:
        return total, fill_and_drain
    gathers = 0.0
    if plan.tp > 1 and not plan.sequence_parallel:
        gathers = (
            2 * m * hops / plan.pp * (plan.tp - 1) * hop_bytes / tp_bus_bandwidth_of(req, plan)
        )
    every = total + gathers + fill_and_drain
    return every, every


def dp_seconds(
    req: Requirements, plan: ParallelPlan, dense: float, experts: float
) -> tuple[float, float]:
    """(reduce-scatter, all-gather) seconds of one full-shard pass over the dp groups for a
    GPU holding ``dense`` and ``experts`` parameters (gradients FP32 when asked)."""
    bandwidth = dp_bus_bandwidth_of(req, plan)
    ranks = plan.dp * plan.cp
    grad_bytes = 4 if plan.fp32_grad_accum else 2
    one = (ranks - 1) * shard_numel(math.ceil(dense), ranks)
    if experts:
        e_ranks = max(1, ranks // plan.ep)
        one += (e_ranks - 1) * shard_numel(math.ceil(experts), e_ranks)
    return one * grad_bytes / bandwidth, one * 2 / bandwidth


def dp_total_seconds(plan: ParallelPlan, rs: float, ag: float, m: int) -> float:
    """All data-parallel seconds per step: one reduce-scatter and one all-gather for ZeRO 0–1
    (and ZeRO-3 without resharding), ``m`` reduce-scatters for ZeRO-2, ``m·(2 all-gathers + 1
    reduce-scatter)`` for ZeRO-3 (:func:`dtlab.plan.layout_cost.dp_bytes_per_step`)."""
    if plan.zero_stage == 2:
        return m * rs + ag
    if plan.zero_stage == 3 and plan.reshard_after_forward:
        return m * (2 * ag + rs)
    return rs + ag


def dp_exposed(
    plan: ParallelPlan,
    rs: float,
    ag: float,
    c: MicroBatchCompute,
    m: int,
    overlap_once_a_step: bool = True,
) -> tuple[float, float]:
    """(exposed seconds per step on device 0, exposed seconds per micro-batch on every device)
    of the data-parallel traffic (module docstring); ``c`` is device 0's micro-batch.
    ``overlap_once_a_step=False`` for software that reduces after the backward and gathers
    after the optimizer step (Megatron-LM's ``--DDP-impl local`` before its 2023
    ``--overlap-grad-reduce``): ZeRO-0 and ZeRO-1's once-a-step sync fully exposed."""
    chunks = plan.virtual_stages if plan.schedule == "1f1b" else 1
    chunks = 2 if plan.schedule == "dualpipev" else chunks
    last_backward = (c.input_grad_s + c.weight_grad_s) / chunks
    first_forward = c.forward_s / chunks
    stage = plan.zero_stage
    if stage in (0, 1) and not overlap_once_a_step:
        return rs + ag, 0.0
    if stage == 0:
        return max(0.0, rs + ag - last_backward), 0.0
    if stage == 1 or (stage == 3 and not plan.reshard_after_forward):
        return max(0.0, rs - last_backward) + max(0.0, ag - first_forward), 0.0
    if stage == 2:
        per_micro_batch = max(0.0, rs - (c.input_grad_s + c.weight_grad_s))
        return max(0.0, ag - first_forward), per_micro_batch
    first_layer = ag / max(1, c.layers)
    per_micro_batch = (
        max(0.0, ag - c.forward_s)
        + max(0.0, ag + rs - (c.input_grad_s + c.weight_grad_s))
        + first_layer
    )
    return 0.0, per_micro_batch
