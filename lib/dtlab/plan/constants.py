"""The step-time model's constants, all in one place, each with where it comes from.

One set serves every job the planner prices (Llama 2 presets, Llama 3 405B, Megatron-LM 2021's
GPT-3 175B and 1T, DeepSeek-V3): nothing here is tuned to one run. The published runs
(:mod:`dtlab.plan.published`) test the model against these values; they are not fitted per run.

**Matmul efficiency as a function of GEMM shape.** A GEMM ``(M × K) @ (K × N)`` sustains

    η(M, K, N) = η_max / (1 + n₀/M + n₀/K + n₀/N)

of the GPU's dense peak: a Hockney-style half-performance size ``n₀`` per dimension (Hockney &
Jesshope, "Parallel Computers 2", 1988: ``r = r_∞ / (1 + n½/n)``). ``η_max`` is what cuBLAS
sustains on large BF16 GEMMs: 230–250 of the A100's 312 TFLOP/s (74–80 %; 0.77 here) and ~75 %
on Hopper and Blackwell (NVIDIA, "Matrix Multiplication Background User's Guide", Deep Learning
Performance docs; Megatron-LM 2021 reports 52 % of A100 peak end to end for its 1T model, after
bubbles and other kernels).
``n₀ = 256`` puts a 1024³ GEMM at ~45 % of peak on H100 and an 8192³ one at ~69 %, the shape of
published cuBLAS sweeps; a GPU lent to the project can measure the curve
(:func:`dtlab.plan.compute.gemm_efficiency` is the one place that reads these numbers).

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

GEMM_HALF_SIZE = 256
"""``n₀``: per GEMM dimension, the size whose own term halves the efficiency."""

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
