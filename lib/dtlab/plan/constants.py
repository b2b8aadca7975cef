"""The step-time model's constants, all in one place, each with where it comes from.

One set serves every job the planner prices (Llama 2 presets, Llama 3 405B, Megatron-LM 2021's
GPT-3 175B and 1T, DeepSeek-V3): nothing here is tuned to one run. The published runs
(:mod:`dtlab.plan.published`) test the model against these values; they are not fitted per run.

**Matmul efficiency as a function of GEMM shape: waves of output tiles plus a fixed latency.**
cuBLAS splits a GEMM ``(M × K) @ (K × N)``'s output into tiles, one thread block each — taken
here as ``GEMM_TILE × GEMM_TILE`` = 128 × 128, a common CUTLASS/cuBLAS BF16 tile on Ampere and
Hopper (cuBLAS picks a tile per shape; the model does not follow its choice) — and runs them
in **waves** of one tile per SM (``sm_count`` on the GPU preset,
:class:`dtlab.cost.hardware.GPUSpec`): ``waves = ⌈⌈M/128⌉·⌈N/128⌉ / SMs⌉``. A wave lasts what
one tile's ``2·128·128·K`` FLOPs take at ``η_max`` of one SM's share of the dense peak; a
partial last wave costs a whole one (wave quantisation, NVIDIA "Matrix Multiplication
Background User's Guide", Deep Learning Performance docs, "Wave quantization"). Each kernel also
pays a fixed ``GEMM_KERNEL_LATENCY_S`` (launch inside a CUDA graph, prologue and epilogue):

    t(M, K, N) = t₀ + waves · 2·128²·K / (η_max · peak / SMs),    η = 2·M·K·N / (peak · t)

``η_max`` is what cuBLAS sustains on large BF16 GEMMs: 230–250 of the A100's 312 TFLOP/s
(74–80 %; 0.77 here) and ~75 % on Hopper and Blackwell (same NVIDIA guide; Megatron-LM 2021
reports 52 % of A100 peak end to end for its 1T model, after bubbles and other kernels). The
model is :func:`dtlab.plan.gemm.gemm_efficiency`, the one place that reads these numbers.

**Measured on a lent H200** (:data:`H200_GEMM_MEASURED`; torch 2.11, cuBLAS, ten products
captured in one CUDA graph so no host launch is timed, CUDA events, median of 7:
``pytest -m gpu tests/test_gpu_plan_gemm_curve.py -s``). ``t₀ = 2 µs`` is the one number read
off the first session's measurement (the least-squares value in log space over 1–3 µs); model ÷
measured is then 0.76–1.21 at every point of two sessions from 256³ to 8192³ — 256³ runs 4 tiles
in one wave (≈1 % of peak), 1024³ 64 tiles on 132 SMs (27 %; measured 31–36 %), 2048³ two waves (≈70 %). The
Hockney-style curve it replaces (``η_max / (1 + 256·(1/M + 1/K + 1/N))``, stated, never
measured) was 3–20× too optimistic below 1024³ and ~1.3× pessimistic at 2048³–4096³. Eager
launches on that host measured far less below 2048³ (launch-bound: 0.8 % of peak at 512³); a
training step's kernels are queued ahead of the GPU, so the graphed figure is the one a step
sees.

**FP8 GEMMs** (DeepSeek-V3's recipe) run against the FP8 dense peak at ``FP8_SUSTAINED_SCALE``
of the BF16 fraction, the quantisation kernels around them included: 0.6 makes the FP8 path
1.2× the BF16 one. End-to-end FP8-vs-BF16 training speedups reported for per-tensor FP8 on H100
are ~1.2–1.4× (NVIDIA NeMo / Transformer Engine performance pages), and DeepSeek's fine-grained
(1×128 / 128×128) scaling adds work: partial sums promoted to FP32 on CUDA cores every 128
elements of K and activations re-quantised per tile (DeepSeek-AI 2024, Sec. 3.3.2). An
assumption, stated; the only FP8 run here is DeepSeek-V3's.

**Attention** (FlashAttention-2, Dao 2023: forward up to ~70 % and backward ~45–60 % of A100
peak; FlashAttention-3 similar on H100 in BF16): ``ATTENTION_EFFICIENCY`` of the BF16 peak per
*counted* causal attention FLOP (``6·L·s·d_attn`` per token, forward 2 + backward 4 of the
half-square; the kernel's own backward recompute of the scores is inside this efficiency).

**Overlap is not free.** Communication hidden behind compute still runs kernels: NCCL's
channels occupy SMs (8–32 of the A100's 108 / the H100's 132, one per channel) and share HBM
bandwidth with the GEMMs they hide under, so compute slows while they run. DeepSeek-V3 makes
the cost explicit by reserving 20 of 132 SMs for its all-to-alls (Sec. 3.2.2, 15 %): every
hidden second of communication is charged ``OVERLAP_COST`` = 0.15 seconds of compute, unless
the job already reserves SMs (``comm_sm_fraction``), whose compute runs on fewer SMs instead.

**Attention without a flash kernel.** A job with ``flash_attention=False`` (Megatron-LM 2021's
GPTs, trained before FlashAttention existed) runs attention as separate kernels that write the ``s × s`` scores to HBM and read them back — ``Q·Kᵀ`` out,
softmax in and out, dropout's mask and output, ``A·V`` in: ``SCORE_PASSES`` = 8 passes of
2-byte values over ``b·(a/t)·(s/cp)·s`` scores per layer and micro-batch, forward, at the GPU's
HBM bandwidth (twice that in backward) — memory-bound time FlashAttention removes (Dao et al.
2022, Sec. 3.1: "standard attention ... reads and writes the N×N matrix").

**Everything else** — norms, activations, residual adds, rotary embeddings, softmax outside
flash, the optimizer step: memory-bound kernels priced as ``NON_GEMM_OVERHEAD`` of the GEMM
time (Korthikanti et al. 2022 and Narayanan et al. 2021 profile such kernels at 10–20 % of a
layer; 0.15 is this module's assumption).
"""

from __future__ import annotations

GEMM_MAX_FRACTION: dict[str, float] = {
    "a100_40gb": 0.77,
    "a100_80gb": 0.77,
    "h100_sxm": 0.75,
    "h800_sxm": 0.75,
    "h200_sxm": 0.75,
    "b200": 0.75,
}
"""``η_max``: the fraction of the dense peak a large, well-shaped GEMM sustains, per GPU preset."""

GEMM_TILE = 128
"""Output tile edge (rows and columns) of one thread block of a cuBLAS BF16 GEMM."""

GEMM_KERNEL_LATENCY_S = 2e-6
"""``t₀``: fixed seconds per GEMM kernel beside its waves (read off :data:`H200_GEMM_MEASURED`)."""

H200_GEMM_MEASURED: dict[int, tuple[float, ...]] = {
    256: (0.008, 0.008, 0.008, 0.008),
    512: (0.053, 0.063, 0.066, 0.067, 0.066),
    1024: (0.305, 0.357, 0.358, 0.359),
    2048: (0.714, 0.715, 0.695, 0.704),
    4096: (0.732, 0.787, 0.786, 0.785),
    8192: (0.688, 0.77, 0.694, 0.694, 0.687),
}
"""Measured BF16 ``n³`` GEMMs on a lent NVIDIA H200 as a fraction of the 989.4 TFLOP/s dense
peak, one value per run: torch 2.11 (CUDA 13.0), cuBLAS, ten products in one CUDA graph,
CUDA-event timing, median of 7 — ``pytest -m gpu tests/test_gpu_plan_gemm_curve.py -s``, two
GPU sessions of issue 29 (the first one or two values from the first, the last three from the
second)."""

H200_GEMM_MODEL_FACTOR = 1.35
"""The wave model reproduces every :data:`H200_GEMM_MEASURED` point within this factor: its
worst is 1024³ (model 0.27, measured 0.31–0.36: a single wave of 64 tiles runs faster than
``η_max`` of one SM's share, with half the SMs idle), then 512³ (0.054 against 0.053–0.067)."""

FP8_SUSTAINED_SCALE = 0.6
"""FP8 GEMMs sustain this much of the BF16 fraction ``η`` against the FP8 peak (assumption)."""

ATTENTION_EFFICIENCY = 0.45
"""Fraction of the BF16 peak a flash-attention kernel sustains per counted causal FLOP."""

SCORE_PASSES = 8
"""HBM passes over the attention scores of a non-flash attention forward (2 bytes each)."""

NON_GEMM_OVERHEAD = 0.15
"""Memory-bound kernels (norms, activations, adds, optimizer) as a fraction of the GEMM time."""

OVERLAP_COST = 0.15
"""Hidden communication is not free: while it runs beside compute it slows compute by this share
of its own duration (unless the job reserves SMs for communication, ``comm_sm_fraction``)."""

DEFAULT_MAX_BUBBLE = 0.15
"""Policy default: at most 15 % of a step idle in the pipeline (a job may set its own)."""

DEFAULT_USABLE_MEMORY_FRACTION = 0.9
"""Policy default: plan within 90 % of HBM, 10 % left for NCCL buffers and fragmentation."""

NCCL_RING_BASE_LATENCY_S = 8.4e-6
"""NCCL's ring/Simple base latency per collective: ``baseLat`` in ``src/graph/tuning.cc`` of the
NCCL releases with Tree, Ring and CollNet only (before NVLS; read at NVIDIA/nccl commit
01afd20a), the generation Megatron-LM 2021 ran on."""

NCCL_RING_NVLINK_HOP_S = 3.4e-6
"""NCCL's ring/Simple latency per step between two GPUs of a node over NVLink (``hwLat``, same
file and commit)."""

NCCL_RING_NET_HOP_S = 9.6e-6
"""NCCL's ring/Simple latency per step that crosses the network (``hwLat``, same file and
commit; later releases raise it to 14 µs)."""
