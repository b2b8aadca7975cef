"""What one GPU computes per micro-batch, and how long it takes: GEMM shapes, attention, reruns.

**Linear layers.** A token costs ``2`` FLOPs per active parameter forward; backward computes the
input gradient (dgrad) and the weight gradient (wgrad), ``2`` each (Kaplan et al. 2020, Sec.
2.1) — so ``6·N`` per token, the basis of MFU. The layers' share, ``N − 2·vocab·d`` (the input
embedding does no FLOPs; the output head's ``2·vocab·d`` runs on the last stage), is spread
evenly over the ``L`` layers (DeepSeek-V3's three dense layers, ``3·d·18,432``, cost what its
MoE layers' nine active experts do, ``9·3·d·2,048``). Each device does ``1/tp`` of its layers'
work for the ``b·s/cp`` tokens of its micro-batch, at the efficiency of its GEMMs' shapes
(:func:`dtlab.plan.gemm.gemm_efficiency`: waves of output tiles on the SMs): QKV ``(n, d, (w +
2·kv)/t)``, output ``(n, w/t, d)``, the MLP's ``(n, d, g·f/t)`` and ``(n, f/t, d)`` — ``n =
b·s/cp`` tokens, ``w`` the attention width, ``g`` 2 for a gated MLP. An MoE layer's routed
experts run ``(n_e, d, 2·f_e)`` and ``(n_e, f_e, d)`` on ``n_e = n·k·ep/E`` tokens each
(balanced routing over the EP group), each of the GPU's ``E/ep`` experts its own GEMMs, and its
shared experts one MLP of their joint width on all ``n`` tokens. Backward runs two GEMMs per
forward one ``(n, in, out)`` — dgrad ``(n, out, in)`` (the input gradient ``dY·Wᵀ``) and wgrad
``(in, n, out)`` (the weight gradient ``Xᵀ·dY``) — with the same FLOPs but their own outputs, so
their own tile counts and waves: each pass is priced at its own GEMMs' shapes
(:func:`pass_gemms`), the flop-weighted harmonic mean of its GEMMs' efficiencies, and so is the
output head ``(n, d, V/t)``. Wave quantisation differs by pass: for GPT-3 175B at TP 8 on an
A100 (108 SMs) the forward QKV GEMM's ``2,048 × 4,608`` output is 576 tiles, 5.3 waves run as 6,
while its wgrad's ``12,288 × 4,608`` is 3,456 tiles, exactly 32 waves. Memory-bound kernels add
:data:`~dtlab.plan.constants.NON_GEMM_OVERHEAD` of each pass's GEMM time, as if sharded like the
GEMMs; without sequence parallelism every TP rank runs the LayerNorms and dropouts on the whole
sequence, and the redundant ``(t − 1)/t`` of them is priced from their bytes at HBM bandwidth
(:data:`~dtlab.plan.constants.REPLICATED_BYTES_PER_TOKEN`, forward and input-gradient backward;
checked against Korthikanti et al. 2022's Table 4, :mod:`dtlab.plan.published_layer_times`).

**Attention** (the convention, stated): causal, so half the ``s × s`` square — forward ``2·s·w``
FLOPs per token and layer (``Q·Kᵀ`` and ``A·V`` at ``s·w`` each over the half square), backward
twice that: ``6·L·s·w`` per token, the MFU basis "6N + attention" uses. Per device ``1/tp`` of
the heads; with context parallelism each rank's ``s/cp`` queries still see the whole causal
prefix on average (zig-zag balancing), so per token the same. Timed at
:data:`~dtlab.plan.constants.ATTENTION_EFFICIENCY` of the BF16 peak; a job without a flash kernel
(``flash_attention=False``: Megatron-LM 2021) also pays
:data:`~dtlab.plan.constants.SCORE_PASSES` HBM passes over its scores.

**Recomputation** (Korthikanti et al. 2022), extra work MFU does not count: ``"full"`` reruns
the whole forward; ``"selective"`` reruns the attention core's forward for a GPT-shaped job
without flash attention (Korthikanti's scores are then not stored), nothing for one with flash
attention (the kernel stores no scores and reruns them inside its own backward anyway; Megatron-LM
checkpoints the core attention only ``if not self.use_flash_attn``), and only norms and
activation functions — elementwise work inside
:data:`~dtlab.plan.constants.NON_GEMM_OVERHEAD` — for a job that states its shapes.

**The job's own overheads**, both stated by DeepSeek-V3 (Sec. 2.2 and 3.2.2):
``comm_sm_fraction`` of the SMs run communication kernels (20 of the H800's 132 for DualPipe's
all-to-alls), so compute runs on the rest; ``mtp_layers`` multi-token-prediction blocks and their
output heads run on the last stage, work ``6N`` (of the main model) does not count.

The per-micro-batch times split as the pipeline schedules need them (DeepSeek-V3 Table 2's
``F``, ``B``, ``W``): forward ``F``, input-gradient backward ``B`` (attention's backward is all
``B``: it has no weights; recomputation runs just before it, so it is counted in ``B``) and
weight-gradient ``W``.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from functools import lru_cache

from dtlab.cost import gpu
from dtlab.plan.constants import (
    ATTENTION_EFFICIENCY,
    NON_GEMM_OVERHEAD,
    REPLICATED_BYTES_PER_TOKEN,
    SCORE_PASSES,
    TWO_PASS_LAYER_NORM_EXTRA_BYTES,
)
from dtlab.plan.gemm import gemm_efficiency, gemm_peak_flops
from dtlab.plan.job import Requirements
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.software import software_of
from dtlab.plan.stages import device_layer_counts, holds_head


def tokens_per_micro_batch(req: Requirements, plan: ParallelPlan) -> int:
    """Tokens one GPU's GEMMs see per micro-batch: ``b·s/cp`` (SP re-gathers the TP shard)."""
    return max(1, plan.micro_batch_size * req.seq_len // plan.cp)


def layer_gemms(req: Requirements, plan: ParallelPlan) -> list[tuple[float, float, float]]:
    """The ``(m, k, n)`` forward GEMMs of one layer on one GPU for one micro-batch, one entry per
    kernel: an MoE layer lists each of the GPU's ``E/ep`` routed experts (so their share of the
    flop-weighted efficiency is their share of the work) and its shared experts."""
    n, d, t, w = tokens_per_micro_batch(req, plan), req.d_model, plan.tp, req.attn_width
    gemms = [(n, d, (w + 2 * req.kv_width) / t), (n, w / t, d)]
    g = 2 if req.gated_mlp else 1
    if req.is_moe and req.expert_d_ff:
        routed = max(1.0, n * req.top_k * plan.ep / req.n_experts)
        expert = [(routed, d, g * req.expert_d_ff / t), (routed, req.expert_d_ff / t, d)]
        gemms += expert * (req.n_experts // plan.ep)  # each of the GPU's experts runs its own
        if req.shared_experts:  # one MLP of their joint width, on every token
            f = req.shared_experts * req.expert_d_ff
            gemms += [(n, d, g * f / t), (n, f / t, d)]
    else:
        gemms += [(n, d, g * req.ffn / t), (n, req.ffn / t, d)]
    return gemms


PASSES = ("forward", "input_grad", "weight_grad")
"""A linear layer's three GEMMs: forward ``X·W``, dgrad ``dY·Wᵀ``, wgrad ``Xᵀ·dY``."""


def pass_gemms(
    forward: list[tuple[float, float, float]], which: str
) -> list[tuple[float, float, float]]:
    """The ``(m, k, n)`` GEMMs of pass ``which`` of forward GEMMs ``(n, in, out)``: the same
    FLOPs, each with its own output (dgrad ``n × in`` over ``out``; wgrad ``in × out`` over the
    ``n`` tokens)."""
    shapes = {
        "forward": lambda m, k, n: (m, k, n),
        "input_grad": lambda m, k, n: (m, n, k),
        "weight_grad": lambda m, k, n: (k, m, n),
    }[which]
    return [shapes(*gemm) for gemm in forward]


def gemms_efficiency(gpu_name: str, gemms: list[tuple[float, float, float]], dtype: str) -> float:
    """The flop-weighted harmonic mean of ``gemms``' efficiencies (their FLOPs over their time)."""
    flops = [m * k * n for m, k, n in gemms]
    times = [
        f / gemm_efficiency(gpu_name, *g, dtype=dtype) for f, g in zip(flops, gemms, strict=True)
    ]
    return sum(flops) / sum(times)


@lru_cache(maxsize=16384)
def layer_efficiency(req: Requirements, plan: ParallelPlan, which: str | None = None) -> float:
    """:func:`layer_gemms`' efficiency in pass ``which`` (one of :data:`PASSES`), or over all three
    (``None``: forward, dgrad and wgrad, equal FLOPs each), as a share of the dense peak of the
    job's GEMM dtype (FP8 or BF16: :func:`dtlab.plan.gemm.gemm_peak_flops`)."""
    forward = layer_gemms(req, plan)
    gemms = [g for p in ((which,) if which else PASSES) for g in pass_gemms(forward, p)]
    return gemms_efficiency(req.gpu, gemms, req.gemm_dtype)


def gemm_flops_per_second(req: Requirements, plan: ParallelPlan, which: str | None = None) -> float:
    """What this plan's layer GEMMs sustain on one GPU in pass ``which`` (all three: ``None``),
    FP8 or BF16 as the job says."""
    return gemm_peak_flops(req.gpu, req.gemm_dtype) * layer_efficiency(req, plan, which)


def linear_params_per_layer(req: Requirements) -> float:
    """Active parameters per layer: ``(N_active − 2·vocab·d) / L``."""
    return (req.active_params - req.embedding_params) / req.n_layers


def attention_flops_per_token(req: Requirements) -> float:
    """Causal attention, forward and backward, all layers: ``6·L·s·w`` (module docstring)."""
    return 6 * req.n_layers * req.seq_len * req.attn_width


@dataclass(frozen=True)
class MicroBatchCompute:
    """One device's compute for one micro-batch, in seconds, split as the schedules need."""

    forward_s: float  # F: linear + attention forward
    input_grad_s: float  # B: dgrad + attention backward + recomputation
    weight_grad_s: float  # W: wgrad
    attention_forward_s: float  # of F, the attention core
    recompute_s: float  # of B, the rerun forward
    layers: int

    @property
    def total_s(self) -> float:
        return self.forward_s + self.input_grad_s + self.weight_grad_s


@lru_cache(maxsize=65536)
def micro_batch_compute(req: Requirements, plan: ParallelPlan, device: int) -> MicroBatchCompute:
    """F, B, W of one micro-batch on pipeline device ``device`` (module docstring). Under
    DualPipe half the micro-batches run stage ``i`` on device ``i`` and half its mirror
    ``pp−1−i``, so the device's micro-batch is their average (the two directions balance the
    embedding's stage against the head's)."""
    if plan.schedule == "dualpipe" and plan.pp > 1:
        one = _stage_compute(req, plan, device)
        other = _stage_compute(req, plan, plan.pp - 1 - device)
        return MicroBatchCompute(
            *((a + b) / 2 for a, b in zip(astuple(one)[:-1], astuple(other)[:-1], strict=True)),
            layers=max(one.layers, other.layers),
        )
    return _stage_compute(req, plan, device)


_UNIT_SECONDS: dict[tuple, tuple[tuple[float, ...], float, tuple[float, ...]]] = {}


def _unit_seconds(
    req: Requirements, plan: ParallelPlan
) -> tuple[tuple[float, ...], float, tuple[float, ...]]:
    """Seconds of one layer's linear part in each of :data:`PASSES`, of one layer's attention
    forward, and of the output head in each pass, for one micro-batch on one GPU (module
    docstring) — kept per job and the plan degrees they depend on (thousands of plans share
    them)."""
    key = (req, plan.tp, plan.cp, plan.ep, plan.micro_batch_size, plan.sequence_parallel)
    if key not in _UNIT_SECONDS:
        if len(_UNIT_SECONDS) >= 65536:  # bounded, for sessions that build jobs without end
            _UNIT_SECONDS.clear()
        _UNIT_SECONDS[key] = _unit_seconds_of(req, plan)
    return _UNIT_SECONDS[key]


def _unit_seconds_of(
    req: Requirements, plan: ParallelPlan
) -> tuple[tuple[float, ...], float, tuple[float, ...]]:
    n = tokens_per_micro_batch(req, plan)
    sms = 1 - req.comm_sm_fraction
    per_flop = (1 + NON_GEMM_OVERHEAD) / (gemm_peak_flops(req.gpu, req.gemm_dtype) * sms)
    layer_flops = 2 * linear_params_per_layer(req) * n / plan.tp
    head_flops = 2 * req.vocab_size * req.d_model * n / plan.tp
    head_gemm = [(n, req.d_model, req.vocab_size / plan.tp)]
    layer = [layer_flops * per_flop / layer_efficiency(req, plan, p) for p in PASSES]
    if plan.tp > 1 and not plan.sequence_parallel:  # norms and dropouts run whole on each rank
        redundant = (
            (plan.tp - 1) / plan.tp * n * req.d_model / gpu(req.gpu).hbm_bandwidth_bytes_per_s
        )
        layer[0] += REPLICATED_BYTES_PER_TOKEN[0] * redundant
        backward = REPLICATED_BYTES_PER_TOKEN[1]
        if not software_of(req).persistent_layer_norm:
            backward += TWO_PASS_LAYER_NORM_EXTRA_BYTES
        layer[1] += backward * redundant
    head = tuple(
        head_flops * per_flop / gemms_efficiency(req.gpu, pass_gemms(head_gemm, p), req.gemm_dtype)
        if req.vocab_size
        else 0.0
        for p in PASSES
    )
    attention_flops = 2 * req.seq_len * req.attn_width * n / plan.tp
    attention = attention_flops / (gpu(req.gpu).bf16_dense_flops * ATTENTION_EFFICIENCY * sms)
    if not req.flash_attention:  # separate kernels: the scores go through HBM
        scores = plan.micro_batch_size * req.n_heads / plan.tp * n / plan.micro_batch_size
        attention += (
            SCORE_PASSES * 2 * scores * req.seq_len / gpu(req.gpu).hbm_bandwidth_bytes_per_s
        )
    return tuple(layer), attention, head


def _stage_compute(req: Requirements, plan: ParallelPlan, stage: int) -> MicroBatchCompute:
    layers = device_layer_counts(req, plan)[stage]
    heads = 0
    head_here = stage == plan.pp - 1 if plan.schedule == "dualpipe" else holds_head(plan, stage)
    if head_here:
        layers += req.mtp_layers
        heads = 1 + req.mtp_layers
    return _compute_of(req, plan, layers, heads)


def layer_compute(req: Requirements, plan: ParallelPlan) -> MicroBatchCompute:
    """F, B, W of one transformer layer (no embedding, no head) for one micro-batch on one GPU —
    what Korthikanti et al. 2022's Table 4 timed (:mod:`dtlab.plan.published_layer_times`)."""
    return _compute_of(req, plan, 1, 0)


def _compute_of(
    req: Requirements, plan: ParallelPlan, layers: int, heads: int
) -> MicroBatchCompute:
    layer_s, attention_layer_s, head_s = _unit_seconds(req, plan)
    forward, dgrad, wgrad = (
        lay * layers + head * heads for lay, head in zip(layer_s, head_s, strict=True)
    )
    attention_s = attention_layer_s * layers
    core_rerun = 0.0 if req.counts_tensors or req.flash_attention else attention_s
    rerun = {"none": 0.0, "selective": core_rerun, "full": attention_s + forward}[plan.recompute]
    return MicroBatchCompute(
        forward_s=forward + attention_s,
        input_grad_s=dgrad + 2 * attention_s + rerun,
        weight_grad_s=wgrad,
        attention_forward_s=attention_s,
        recompute_s=rerun,
        layers=layers,
    )
