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
pays a fixed ``GEMM_KERNEL_LATENCY_S`` (launch inside a CUDA graph, prologue and epilogue),
and no GEMM runs faster than HBM delivers its operands (the roofline floor that binds only for
skinny shapes, ``min(M, N)`` below a few hundred: :mod:`dtlab.plan.gemm`):

    t(M, K, N) = t₀ + max(waves · 2·128²·K / (η_max · peak / SMs), bytes / HBM),
    η = 2·M·K·N / (peak · t)

``η_max`` is the fraction of the dense peak cuBLAS *sustains* on large BF16 GEMMs run back to
back, as a training step runs them for seconds. On Hopper (H100, H800, H200: one GH100 die, one
700 W board power) it is 0.69, **measured**: the longest burst measured on the lent H200 below.
On A100 (0.77: 230–250 of 312 TFLOP/s, 74–80 %) and B200 (0.75) it is **stated, not measured**
(NVIDIA, "Matrix Multiplication Background User's Guide"; Megatron-LM 2021 reports 52 % of A100
peak end to end for its 1T model, after bubbles and other kernels). The model is
:func:`dtlab.plan.gemm.gemm_efficiency`, the one place that reads these numbers.

**Measured on a lent H200** (:data:`H200_GEMM_MEASURED`; torch 2.11, cuBLAS, ten products
captured in one CUDA graph so no host launch is timed, CUDA events, median of 7:
``pytest -m gpu tests/test_gpu_plan_gemm_curve.py -s``). ``t₀ = 2 µs`` is read off the first
session's measurement (the least-squares value in log space over 1–3 µs) and ``η_max`` off the
8192³ point (why that one: :data:`GEMM_MAX_FRACTION`); model ÷ measured is then 0.71–1.17 at
every recorded point from 256³ to 8192³ — 256³ runs 4 tiles in one wave (≈1 % of peak),
1024³ 64 tiles on 132 SMs (26 %; measured 31–36 %: the model's worst point), 2048³ two waves
(≈62 %; measured 70–72 %). The Hockney-style curve it replaces
(``η_max / (1 + 256·(1/M + 1/K + 1/N))``, stated, never measured) was 3–20× too optimistic below
1024³. Eager launches on that host measured far less below 2048³ (launch-bound: 0.8 % of peak at
512³); a training step's kernels are queued ahead of the GPU, so the graphed figure is the one a
step sees.

**FP8 GEMMs** (DeepSeek-V3's recipe) run the same tiles and waves against the FP8 dense peak at
``η_max · FP8_SUSTAINED_SCALE``, the quantisation kernels around them included, with the same
unscaled ``t₀``: 0.6 makes a large FP8 GEMM 1.2× the BF16 one. End-to-end FP8-vs-BF16 training speedups reported for per-tensor FP8 on H100
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
    "h100_sxm": 0.69,
    "h800_sxm": 0.69,
    "h200_sxm": 0.69,
    "b200": 0.75,
}
"""``η_max``: the fraction of the dense peak large BF16 GEMMs sustain back to back, per GPU preset.

**Hopper, 0.69, measured** — and chosen as the *sustained* point, not the best one. On the lent
H200 (:data:`H200_GEMM_MEASURED`) the 8192³ burst (ten products, ≈11 TFLOP, ≈16 ms) is the
longest measured and read 0.687–0.694 in four of five runs; the shorter 4096³ burst (≈2 ms) read
0.73–0.80. A GPU at its power limit lowers its clock as a burst lengthens, so short bursts read
high before the clock drops; power, and so the clock, depends even on the data (this
workplace's notes on its lent H200s record an 8192³ BF16 product at 788 TFLOP/s on random
operands against 894 on zeros, 2026-10-28). The one 8192³ reading of 0.77 was timed eagerly, the
first heavy call of the first session on a cold GPU — the same effect, a cool card at full clock. A training step runs its GEMMs back to back for
seconds, in the sustained regime, so the longest burst is the one that represents it. This
chooses which measured point stands for training; it is not fitted to any published run. H100
and H800 share the H200's GH100 die, SM count, dense peak and 700 W board power, so they take
the same figure (their HBM differs, but large GEMMs are bound by compute, not HBM).

**A100 (0.77) and B200 (0.75) are stated, unmeasured**: 230–250 of the A100's 312 TFLOP/s in
NVIDIA's "Matrix Multiplication Background User's Guide" and ~75 % for Blackwell; no dtlab run
has timed either."""

GEMM_TILE = 128
"""Output tile edge (rows and columns) of one thread block of a cuBLAS BF16 GEMM."""

GEMM_KERNEL_LATENCY_S = 2e-6
"""``t₀``: fixed seconds per GEMM kernel beside its waves (read off :data:`H200_GEMM_MEASURED`)."""

H200_GEMM_MEASURED: dict[int, tuple[float, ...]] = {
    256: (0.008, 0.008, 0.008, 0.008, 0.009),
    512: (0.053, 0.063, 0.066, 0.067, 0.066, 0.067),
    1024: (0.305, 0.357, 0.358, 0.359, 0.361),
    2048: (0.714, 0.715, 0.695, 0.704, 0.714),
    4096: (0.732, 0.787, 0.786, 0.785, 0.795),
    8192: (0.688, 0.77, 0.694, 0.694, 0.687, 0.694),
}
"""Measured BF16 ``n³`` GEMMs on a lent NVIDIA H200 as a fraction of the 989.4 TFLOP/s dense
peak, one value per run: torch 2.11 (CUDA 13.0), cuBLAS, ten products in one CUDA graph,
CUDA-event timing, median of 7 — ``pytest -m gpu tests/test_gpu_plan_gemm_curve.py -s``, in
the device calls of 2026-11-27 (the lead's second call first, then a helper's three, then the
lead's last, run with this model in place and passing). The one
exception is 8192³'s 0.77: the first call timed eagerly, before the graph existed (eager timing
is launch-bound below 2048³, so none of its smaller readings is kept; at 8192³ the launch is
negligible and the reading stands)."""

H200_GEMM_MODEL_FACTOR = 1.42
"""The wave model reproduces every :data:`H200_GEMM_MEASURED` point within this factor (measured
÷ model at most 1.41). Its worst is 1024³ (model 0.256, measured 0.31–0.36): a single short wave
of 64 tiles, half the SMs idle, runs above the sustained ``η_max`` of one SM's share, like the
other short bursts (why they read high: :data:`GEMM_MAX_FRACTION`); then
512³ (0.052 against 0.053–0.067, up to 1.30) and 4096³ (0.663 against 0.73–0.80, up to 1.20)."""

FP8_SUSTAINED_SCALE = 0.6
"""FP8 GEMMs sustain this much of the BF16 fraction ``η`` against the FP8 peak (assumption)."""

ATTENTION_EFFICIENCY = 0.45
"""Fraction of the BF16 peak a flash-attention kernel sustains per counted causal FLOP."""

SCORE_PASSES = 8
"""HBM passes over the attention scores of a non-flash attention forward (2 bytes each)."""

NON_GEMM_OVERHEAD = 0.15
"""Memory-bound kernels (norms, activations, adds, optimizer) as a fraction of the GEMM time."""

REPLICATED_BYTES_PER_TOKEN: tuple[int, int] = (22, 34)
"""HBM bytes per token and layer, in units of the width ``h``, of the kernels that tensor
parallelism without sequence parallelism runs whole on every rank (forward, backward): the two
LayerNorms and the two bias-dropout-residual adds of a GPT block, on 2-byte activations and
1-byte dropout masks, as Megatron-LM's fused kernels move them —

* forward 22: each LayerNorm reads its input and writes its output (4), each fused
  bias-dropout-add reads its input and the residual and writes its output and mask (7);
* backward 34: each LayerNorm's backward reads the output gradient and the input and writes the
  input gradient (6: one pass, apex.contrib's persistent ``FastLayerNorm``, which Megatron-LM
  runs for these widths from October 2021), each dropout's backward reads the gradient and the
  mask and writes one (5), and at each block input the residual stream's gradient is added to
  the branch's (6). A two-pass kernel — apex's ``FusedLayerNorm``, vendored by Megatron-LM of
  April 2021 as ``MixedFusedLayerNorm`` — reads the output gradient and the input twice, once
  for the weight gradients and once for the input gradient:
  :data:`TWO_PASS_LAYER_NORM_EXTRA_BYTES` more.

:data:`NON_GEMM_OVERHEAD` prices these kernels as if sharded ``1/t`` like the GEMMs (what
sequence parallelism does: Korthikanti et al. 2022, Sec. 4.2.2); without SP the other
``(t − 1)/t`` is redundant work on every rank, priced from these bytes at the GPU's HBM
bandwidth. Korthikanti et al. measured it: with SP their 22B layer's forward ran 6 % faster
(7.7 → 7.2 ms), "from the layer-norm and dropout layers being performed on 1/t of the data"
(Table 4, :mod:`dtlab.plan.published_layer_times`); these bytes give 0.48 ms of the 0.5. The
count is a GPT block's (the only jobs planned without SP are Megatron-LM's GPTs); a block
without dropout moves less."""

TWO_PASS_LAYER_NORM_EXTRA_BYTES = 8
"""Backward bytes per token and unit of width that a two-pass LayerNorm backward (apex's
``FusedLayerNorm`` and Megatron-LM's 2021 copy of it, ``MixedFusedLayerNorm``:
``cuComputePartGradGammaBeta``, then ``cuComputeGradInput``) adds for a GPT block's two
LayerNorms, reading the output gradient and the input again (2 + 2 each): 42 in all
instead of :data:`REPLICATED_BYTES_PER_TOKEN`'s 34, for software without the persistent kernel
(:attr:`dtlab.plan.software.Software.persistent_layer_norm`)."""

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
01afd20a, v2.7.5-1 of June 2020; unchanged in every release through 2.29), the
generation Megatron-LM 2021 ran on."""

NCCL_RING_NVLINK_HOP_S = 3.4e-6
"""NCCL's ring/Simple latency per step between two GPUs of a node over NVLink (``hwLat``, same
file and commit)."""

NCCL_RING_NET_HOP_S = 9.6e-6
"""NCCL's ring/Simple latency per step that crosses the network (``hwLat``, same file and
commit; 9.6 µs from 2.7 through 2.11 and again in 2.14–2.17, 28 µs in 2.12, 14 µs from 2.18)."""

ZERO3_LIST_ENTRY_HOST_S = 9e-6
"""Host seconds per rank of one list collective of DeepSpeed's 2021 ZeRO-3 (v0.3.13–v0.5.4,
:mod:`dtlab.plan.zero3_per_parameter`), the midpoint of a 7–11 µs estimate: one pass of
``_allgather_param``'s Python loop over the world (``narrow``, ``get_rank(group)``, ``append``:
2.2–2.7 µs per rank measured on this project's 2-core CPU under torch 2.13, 6.0 µs in a loaded
run — ``python -m dtlab.perf.list_collective_loop``), plus the copy kernel PyTorch's list
``all_gather``/``reduce_scatter`` launches per rank out of (or into) its flat buffer, ~5 µs (a
C++ launch: the lent H200's eager per-op floor was 11.1 µs from Python, README "On a lent GPU",
of which a C++ caller skips the Python half — stated, not measured). Not measured on a 2021
host (PyTorch 1.8, Python 3.8, AMD EPYC 7742), which was slower per operation than this one.
The three published rows it prices stay within ±15 % for 8.0–10.1 µs, so they check the
mechanism's shape (``C/N + k·N``) more than this constant."""
