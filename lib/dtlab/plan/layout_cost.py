"""What a parallel plan costs one GPU at a job's scale: memory, bytes on the wire, idle time.

Each function takes the job (:class:`~dtlab.plan.job.Requirements`) and a plan
(:class:`~dtlab.plan.parallel_plan.ParallelPlan`) and returns one number of the interview's
back-of-the-envelope table, built from the library's formulas:

* **model state** — ``16 B/param`` for mixed-precision Adam (bf16 weights 2 + grads 2, fp32
  master, momentum and variance 4 + 4 + 4) of the ``params/(tp·pp)`` model shard, ZeRO then
  sharding it over ``dp`` (Rajbhandari et al. 2020, "ZeRO", Sec. 5):
  :func:`dtlab.memory.model_state_bytes`;
* **activations** — TP + sequence parallel with selective recomputation keeps ``34·s·b·h/t``
  bytes per layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", Table 2), ``2·s·b·h/t`` with full recomputation, ``s/cp`` tokens under
  context parallelism: :func:`dtlab.memory.activation_bytes_per_layer`; with recomputation,
  plus what the one layer being backpropagated reruns (:func:`rerun_bytes`);
* **bubble** — ``(p-1)/(m+p-1)`` of a 1F1B step idle, ``(p-1)/(v·m+p-1)`` interleaved
  (Narayanan et al. 2021, Sec. 2.2): :mod:`dtlab.cost.bubble`;
* **communication** — the bytes one GPU sends per optimizer step along each mesh dimension
  (:mod:`dtlab.cost.volumes`, :mod:`dtlab.plan.wire` for CP and EP): :func:`traffic_per_gpu`.

The by-category memory of a mixture of experts is :func:`dtlab.plan.memory_by_category.memory_per_gpu`;
:func:`state_bytes_per_gpu` prices every parameter as dense.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dtlab.cost.bubble import schedule_idle
from dtlab.cost.volumes import pipeline_p2p_bytes_per_step
from dtlab.memory import activation_bytes_per_layer, model_state_bytes, shard_numel
from dtlab.plan.job import Requirements
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.software import software_of
from dtlab.plan.stages import activation_layers_in_flight, in_flight_chunks, representative_devices
from dtlab.plan.wire import (
    expert_all_to_all_bytes_per_layer,
    ring_attention_bytes_per_layer,
    tp_bytes_per_layer,
    tp_forward_share,
)


def micro_batches(req: Requirements, plan: ParallelPlan) -> float:
    """Micro-batches per step per pipeline: global batch / (dp · micro-batch size)."""
    return req.global_batch_sequences / (plan.dp * plan.micro_batch_size)


def micro_batch_rule(plan: ParallelPlan, filled: bool = True) -> tuple[int, int, str]:
    """``(fewest, multiple of, why)`` micro-batches per pipeline the plan's schedule runs:

    * plain 1F1B: ``pp`` to fill the pipeline (``filled``; the policy for a job's batch) —
      it also runs fewer, its bubble then most of the step, as a batch ramp's early stages may;
    * interleaved 1F1B: a multiple of ``pp`` (Megatron-LM's schedule asserts it);
    * ZB-H1: ``pp`` — its deferred weight gradients fill the drain only with that many;
    * DualPipe and DualPipeV: ``2·pp``, and an even number for DualPipe's two directions
      (DeepSeek's implementation asserts both)."""
    p = plan.pp
    if p == 1:
        return 1, 1, "no pipeline"
    if plan.schedule in ("dualpipe", "dualpipev"):
        even = 2 if plan.schedule == "dualpipe" else 1
        return 2 * p, even, f"{plan.schedule} runs at least 2·pp micro-batches"
    if plan.virtual_stages > 1:
        return p, p, "interleaving needs micro-batches divisible by pp"
    if plan.schedule == "zb-h1":
        return p, 1, "ZB-H1 fills its drain with deferred weight gradients of pp micro-batches"
    return (p if filled else 1), 1, "1F1B fills the pipeline with pp micro-batches"


def state_bytes_per_gpu(params: float, plan: ParallelPlan) -> float:
    """Model-state bytes per GPU: ``params/(tp·pp)`` per model shard, 16 B/param, ZeRO over the
    ``dp·cp`` ranks holding the same shard (every parameter dense)."""
    shard = math.ceil(params / (plan.tp * plan.pp))
    return float(model_state_bytes(shard, plan.dp * plan.cp, plan.zero_stage, "mixed_adam").total)


def activation_bytes_per_layer_of(req: Requirements, plan: ParallelPlan) -> float:
    """Bytes one layer keeps for backward, one micro-batch, one GPU (TP, SP, ``s/cp`` tokens).

    A GPT-shaped job (no ``d_ff``, no gated MLP: the Llama 2 presets, Megatron-LM 2021's GPT)
    uses Korthikanti et al. 2022's Table 2 (:func:`dtlab.memory.activation_bytes_per_layer`),
    without its ``5·a·s²·b/t`` scores when the job runs flash attention (which never stores
    them: its ``"none"`` keeps what ``"selective"`` keeps).
    A job that states its shapes (:attr:`~dtlab.plan.job.Requirements.counts_tensors`) is counted
    tensor by tensor, flash attention (no scores kept), per token: each block's input (``2d``)
    and, without recomputation, its normalised input (``2d``); what attention keeps besides
    (``2·saved``: Q, K and V, ``w + 2·kv``, or MLA's latents) and its output (``2w``); FC1's
    outputs (``2·g·f``; the activation function's output is recomputed from them, an elementwise
    op); an MoE layer's FC1 runs on ``top_k`` routed copies of each token (``d·k`` more, 1 B each
    when its GEMMs are FP8 — DeepSeek-V3 caches them in FP8 — else 2 B) for ``k + shared``
    experts of width ``f_e``. ``"selective"`` recomputes the norms (their outputs are not
    kept); ``"full"`` keeps only the layer's input, ``2d``. All of it over ``tp`` with sequence
    parallelism; without it (``plan.sequence_parallel=False``) the blocks' inputs and normalised
    inputs stay whole on every TP rank and only the rest is over ``tp``."""
    s, b = req.seq_len // plan.cp, plan.micro_batch_size
    if not req.counts_tensors:
        recompute = plan.recompute
        if recompute == "none" and req.flash_attention:
            recompute = "selective"  # flash attention never stores the 5·a·s²·b scores
        return float(
            activation_bytes_per_layer(
                s, b, req.d_model, req.n_heads, plan.tp, plan.sequence_parallel, recompute
            )
        )
    d, w, g = req.d_model, req.attn_width, 2 if req.gated_mlp else 1
    if plan.recompute == "full":
        whole, split = 2 * d, 0
    else:
        norms = 2 * d if plan.recompute == "none" else 0
        saved = req.attention_saved_width or (w + 2 * req.kv_width)
        if req.is_moe and req.expert_d_ff:
            copy = 1 if req.gemm_dtype == "fp8" else 2
            experts = (req.top_k + req.shared_experts) * req.expert_d_ff
            mlp = copy * d * req.top_k + 2 * g * experts
        else:
            mlp = 2 * g * req.ffn
        whole, split = 2 * (2 * d + norms), 2 * saved + 2 * w + mlp
    sp = plan.tp if plan.sequence_parallel else 1
    return (whole / sp + split / plan.tp) * s * b


def activation_bytes_by_device(req: Requirements, plan: ParallelPlan) -> list[float]:
    """Peak activations on each pipeline device: its layers' bytes per micro-batch times the
    micro-batches in flight (:func:`dtlab.plan.stages.activation_layers_in_flight`), plus
    :func:`held_stage_outputs_by_device` where the job's software keeps them. Recomputation
    adds one layer's working set: the backward reruns what the layer dropped (full: its whole
    forward, Megatron-LM's ``CheckpointFunction`` with one layer per checkpoint by default, like
    ``torch.utils.checkpoint``; selective: attention's scores without flash attention, the
    norms of a job that states its shapes, nothing for a GPT-shaped job with flash attention)
    and holds it until that layer's backward ends — :func:`rerun_bytes`, less what is kept."""
    per_layer = activation_bytes_per_layer_of(req, plan)
    m = max(1, int(micro_batches(req, plan)))
    rerun = rerun_bytes(req, plan) - per_layer if plan.recompute != "none" else 0.0
    layers = [n * per_layer + rerun for n in activation_layers_in_flight(req, plan, m)]
    if not software_of(req).keeps_stage_outputs:
        return layers
    return [a + b for a, b in zip(layers, held_stage_outputs_by_device(req, plan, m), strict=True)]


def rerun_bytes(req: Requirements, plan: ParallelPlan) -> float:
    """Bytes one layer holds, one micro-batch, while its backward runs: what it keeps without
    recomputation (no scores where flash attention runs: :func:`activation_bytes_per_layer_of`)."""
    return activation_bytes_per_layer_of(req, replace(plan, recompute="none"))


def held_stage_outputs_by_device(req: Requirements, plan: ParallelPlan, m: int) -> list[float]:
    """Bytes of the stage outputs each device keeps until their backward, where the software
    keeps them: Megatron-LM's 1F1B schedules of 2021 appended every micro-batch's output tensor
    to ``output_tensors`` and freed it only at that micro-batch's backward (the output was
    freed right after its send from December 2021, ``free_output_tensor``, later
    ``deallocate_output_tensor``). One output is the chunk's last hidden state, ``2·s·b·d``
    bytes, whole on every TP rank without sequence parallelism. Every in-flight
    (micro-batch, chunk) holds one, except on the last device without interleaving, whose only
    chunk ends in the loss; interleaved, its in-flight chunks are all earlier ones (its loss
    chunk's backward runs right after that chunk's forward)."""
    whole = 2.0 * (req.seq_len // plan.cp) * plan.micro_batch_size * req.d_model
    one = whole / (plan.tp if plan.sequence_parallel else 1)
    if plan.pp == 1:
        return [0.0]
    held = []
    for device in range(plan.pp):
        chunks = in_flight_chunks(plan, device, m) * plan.virtual_stages
        if device == plan.pp - 1 and plan.virtual_stages == 1:  # its one chunk ends in the loss
            chunks = 0.0
        held.append(chunks * one)
    return held


def activation_bytes_per_gpu(req: Requirements, plan: ParallelPlan) -> float:
    """Peak activations on the worst pipeline device (:func:`activation_bytes_by_device`).

    1F1B keeps ``pp − i`` micro-batches of device ``i``'s layers; with equal stages that is
    ``L`` layers' worth on device 0 whatever ``pp`` is, and interleaving multiplies it by
    ``1 + (pp-1)/(pp·v)`` (Korthikanti et al. 2022, Sec. 4.2.3). With the first and last stage
    trimmed (Llama 3) device 0 holds less and device 1 the most: ``(pp−1)·(slots/pp)``.
    """
    return max(activation_bytes_by_device(req, plan))


def pipeline_bubble(req: Requirements, plan: ParallelPlan) -> float:
    """Idle share of a step from the schedule's idle time, compute only
    (:func:`dtlab.cost.bubble.schedule_idle` on the slowest device's ``F``, ``B``, ``W``):
    ``(p-1)/(m+p-1)`` for 1F1B with equal stages, ``(p-1)/(v·m+p-1)`` interleaved."""
    if plan.pp == 1:
        return 0.0
    from dtlab.plan.compute import micro_batch_compute  # compute imports this module's peers

    m = max(1, int(micro_batches(req, plan)))
    # Devices with as many layers and no head compute the same: only the representatives can be
    # the slowest (DualPipe pairs each device with its mirror, so every device is priced there).
    devices = range(plan.pp) if plan.schedule == "dualpipe" else representative_devices(req, plan)
    slow = max((micro_batch_compute(req, plan, i) for i in devices), key=lambda c: c.total_s)
    idle = schedule_idle(
        plan.schedule, plan.pp, plan.virtual_stages, slow.forward_s, slow.input_grad_s,
        slow.weight_grad_s,
    )  # fmt: skip
    return idle / (m * slow.total_s + idle)


@dataclass(frozen=True)
class StepTraffic:
    """Bytes one GPU sends in one optimizer step, by mesh dimension (it receives as many)."""

    dp: float
    tp: float
    pp: float
    cp: float = 0.0
    ep: float = 0.0

    @property
    def total(self) -> float:
        return self.dp + self.tp + self.pp + self.cp + self.ep


def dp_bytes_per_step(
    params: int, ranks: int, zero_stage: int, micro_batches: int, bytes_per_elem: int = 2
) -> float:
    """Bytes one rank sends per optimizer step to reduce ``params`` gradients over ``ranks``
    data-parallel ranks when the step accumulates ``micro_batches`` micro-batches.

    What a stage keeps between micro-batches decides how often it talks (Rajbhandari et al.
    2020, Sec. 5 and 7; the per-micro-batch cost is why ZeRO-2/3 are paired with few, large
    micro-batches):

    * ZeRO 0–1 accumulate the *full* gradient locally and reduce once: one all-reduce,
      ``2(N−1)·⌈Ψ/N⌉·e`` per step, whatever ``m`` is;
    * ZeRO-2 keeps only its gradient shard, so every micro-batch's gradient is reduce-scattered
      into it, and the updated parameters are all-gathered once: ``(m + 1)(N−1)·⌈Ψ/N⌉·e``;
    * ZeRO-3 also keeps only a parameter shard, so every micro-batch all-gathers the parameters
      in forward and again in backward, and reduce-scatters its gradient: ``3m(N−1)·⌈Ψ/N⌉·e``
      (:func:`dtlab.memory.zero_comm_bytes_per_rank` is the ``m = 1`` case).
    """
    one = (ranks - 1) * shard_numel(params, ranks) * bytes_per_elem  # one RS or AG of a shard
    m = max(1, micro_batches)
    if zero_stage <= 1:
        return 2 * one
    if zero_stage == 2:
        return (m + 1) * one
    return 3 * m * one


def traffic_per_gpu(req: Requirements, plan: ParallelPlan, bytes_per_elem: int = 2) -> StepTraffic:
    """Bytes one GPU sends per optimizer step along dp, tp, pp, cp and ep (ring collectives, bf16;
    ``s`` below is the rank's ``seq_len/cp`` tokens).

    * ``dp``: the gradients of its ``Ψ = Ψ_dense/(tp·pp)`` shard over the ``N = dp·cp`` ranks
      holding it, with ``m`` micro-batches accumulated per step (:func:`dp_bytes_per_step`:
      ZeRO 0–1 once per step, ZeRO-2 and ZeRO-3 once per micro-batch); an MoE model adds the
      same for its ``Ψ_e/(tp·pp·ep)`` experts over the ``dp·cp/ep`` expert-data-parallel ranks;
    * ``tp``: per layer and micro-batch 4 all-reduces of ``s·b·h·e`` — with SP 4 all-gathers
      and 4 reduce-scatters, the same bytes, and backward's 2 re-gathers of the stored input
      shards — each sending ``(t-1)/t`` of it, for the ``L/pp`` layers of its stage and the
      ``m`` micro-batches (:func:`dtlab.plan.wire.tp_bytes_per_layer`); full recomputation
      repeats forward's 4: 1.5× without SP, 1.4× with it;
    * ``pp``: a middle stage's activations forward and gradients back, ``2·v·m·s·b·h·e``
      (:func:`dtlab.cost.volumes.pipeline_p2p_bytes_per_step`) over the ``tp`` ranks of the
      stage, each sending its slice (Megatron's scatter-gather, on by default since 2021 — as
      :func:`dtlab.plan.exposed.pp_exposed_s` times it); 0 without a pipeline;
    * ``cp``: ring attention's K/V blocks, ``m·(L/pp)`` times
      :func:`dtlab.plan.wire.ring_attention_bytes_per_layer`;
    * ``ep``: the all-to-alls of its stage's ``moe_layers/pp`` MoE layers, ``m`` times
      :func:`dtlab.plan.wire.expert_all_to_all_bytes_per_layer`.
    """
    shard = math.ceil(req.dense_params / (plan.tp * plan.pp))
    m = int(micro_batches(req, plan))
    dp_ranks = plan.dp * plan.cp
    dp = dp_bytes_per_step(shard, dp_ranks, plan.zero_stage, m, bytes_per_elem)
    if req.is_moe:
        experts = math.ceil(req.expert_params / (plan.tp * plan.pp * plan.ep))
        dp += dp_bytes_per_step(experts, dp_ranks // plan.ep, plan.zero_stage, m, bytes_per_elem)
    seq = req.seq_len // plan.cp
    per_layer = tp_bytes_per_layer(req, plan, bytes_per_elem)
    rerun = tp_forward_share(plan) if plan.recompute == "full" else 0.0
    tp = m * (req.n_layers / plan.pp) * per_layer * (1 + rerun)
    pp = 0.0
    if plan.pp > 1:
        pp = (
            pipeline_p2p_bytes_per_step(
                seq, plan.micro_batch_size, req.d_model, m, plan.virtual_stages, bytes_per_elem
            )
            / plan.tp
        )
    cp = m * (req.n_layers / plan.pp) * ring_attention_bytes_per_layer(req, plan, bytes_per_elem)
    ep = 0.0
    if req.is_moe:
        per_moe_layer = expert_all_to_all_bytes_per_layer(req, plan, bytes_per_elem)
        ep = m * (req.moe_layers / plan.pp) * per_moe_layer
    return StepTraffic(dp, tp, pp, cp, ep)
