"""What FP8 buys a model, by width: GEMM time saved against the bytes the casts move (roofline).

An FP8 GEMM runs at twice the BF16 tensor-core rate (H100: 1,979 vs 989 dense TFLOP/s), but its
operands must first be *cast*: a memory-bound pass that reads BF16 and writes FP8. Per linear
layer ``y = x Wᵀ`` (``x``: M tokens × K, ``W``: N×K, ``dy``: M×N) and per training step, each of
``x``, ``W`` and ``dy`` (``E`` elements) is cast once with current scaling:

* an amax pass reads it: ``2E`` bytes;
* the cast pass reads it again (``2E``) and writes **two** FP8 copies (``2 · E``): the row-wise
  copy for one GEMM and the column-wise / transposed one for the other
  (:mod:`dtlab.precision.directional`; Hopper's FP8 GEMM also wants the transposed layout).

So ``6E`` bytes per tensor at HBM bandwidth (:func:`cast_bytes`). The GEMMs themselves follow
the roofline: ``max(FLOPs / peak, operand and output bytes / bandwidth)``. The saved GEMM time
grows as ``M·N·K`` while the cast bytes grow as ``M·K + N·K + M·N``, so the cast is a fixed tax
that only a wide enough layer repays (:func:`linear_speedup`, :func:`block_speedup`).

**What stays in BF16** (:data:`KEPT_IN_BF16`; DeepSeek-V3 §3.3.1 keeps exactly these in their
original precision): layers with no large GEMM to speed up, or whose output is too sensitive to
round. :func:`model_speedup` applies Amdahl's law to the FLOPs that do run in FP8.
"""

from __future__ import annotations

from dtlab.cost.hardware import GPUSpec, gpu

KEPT_IN_BF16: dict[str, str] = {
    "embedding": "a table lookup (and a scatter-add backward): no GEMM for FP8 to speed up",
    "lm_head": "its logits feed a softmax over the whole vocabulary: rounding moves the loss "
    "directly, and DeepSeek-V3 and NVIDIA's NVFP4 recipe both keep the output layer high",
    "norms": "elementwise and reductions, memory-bound: a cast adds bytes and saves no FLOPs; "
    "their statistics want FP32",
    "router": "a tiny GEMM (hidden × experts) whose output picks experts: one rounding flip "
    "sends a token to another expert",
    "attention core": "softmax(QKᵀ)V runs in a fused BF16 kernel in these recipes; its FLOPs "
    "are not the linears'",
}

FP8_LINEARS_PER_BLOCK = {"qkv": (3, 1), "out": (1, 1), "fc1": (4, 1), "fc2": (1, 4)}  # (N/h, K/h)


def cast_bytes(m: int, n: int, k: int, copies: int = 2, amax_pass: bool = True) -> int:
    """HBM bytes of casting ``x`` (M×K), ``W`` (N×K) and ``dy`` (M×N) to FP8 once each: read
    BF16 for the amax (``amax_pass``) and for the cast, write ``copies`` FP8 copies."""
    per_element = 2 * (2 if amax_pass else 1) + copies
    return per_element * (m * k + n * k + m * n)


def gemm_seconds(m: int, n: int, k: int, dtype: str, hardware: GPUSpec) -> float:
    """One ``M×K · K×N`` GEMM on the roofline: FLOPs at the dtype's peak or operand + BF16
    output bytes at HBM bandwidth, whichever is slower."""
    if dtype not in ("bf16", "fp8"):
        raise ValueError(f"dtype {dtype!r}: choose 'bf16' or 'fp8'")
    if dtype == "fp8" and hardware.fp8_dense_flops is None:
        raise ValueError(f"{hardware.name} has no FP8 tensor cores; choose an H100 or later")
    peak = hardware.bf16_dense_flops if dtype == "bf16" else hardware.fp8_dense_flops
    operand = 2 if dtype == "bf16" else 1
    moved = operand * (m * k + n * k) + 2 * m * n
    return max(2 * m * n * k / peak, moved / hardware.hbm_bandwidth_bytes_per_s)


def linear_times(m: int, n: int, k: int, hardware: GPUSpec | str = "h100_sxm") -> dict:
    """Seconds of one linear layer's training step (forward, dgrad, wgrad) in BF16 and in FP8,
    and of its casts."""
    hw = gpu(hardware) if isinstance(hardware, str) else hardware
    shapes = ((m, n, k), (m, k, n), (n, k, m))  # forward, dgrad, wgrad
    return {
        "bf16": sum(gemm_seconds(*s, "bf16", hw) for s in shapes),
        "fp8_gemm": sum(gemm_seconds(*s, "fp8", hw) for s in shapes),
        "cast": cast_bytes(m, n, k) / hw.hbm_bandwidth_bytes_per_s,
    }


def linear_speedup(m: int, n: int, k: int, hardware: GPUSpec | str = "h100_sxm") -> float:
    """BF16 time ÷ (FP8 GEMM time + cast time) of one linear layer's step."""
    t = linear_times(m, n, k, hardware)
    return t["bf16"] / (t["fp8_gemm"] + t["cast"])


def block_speedup(hidden: int, tokens: int, hardware: GPUSpec | str = "h100_sxm") -> float:
    """The same for a transformer block's four linears (QKV, out, MLP up, MLP down; MLP 4h),
    ``tokens`` tokens per micro-batch."""
    bf16 = fp8 = 0.0
    for n_mult, k_mult in FP8_LINEARS_PER_BLOCK.values():
        t = linear_times(tokens, n_mult * hidden, k_mult * hidden, hardware)
        bf16, fp8 = bf16 + t["bf16"], fp8 + t["fp8_gemm"] + t["cast"]
    return bf16 / fp8


def model_speedup(
    hidden: int,
    n_layers: int,
    seq_len: int,
    vocab: int,
    tokens: int,
    hardware: GPUSpec | str = "h100_sxm",
) -> float:
    """Amdahl's law over a step: the block linears speed up by :func:`block_speedup`; attention
    (``4·s·h`` FLOPs per token per layer, causal) and the LM head (``2·h·V`` per token) stay
    BF16 at the same MFU. Elementwise work (norms, activations) is left out on both sides."""
    linears = n_layers * 24 * hidden * hidden
    rest = n_layers * 4 * seq_len * hidden + 2 * hidden * vocab
    share = linears / (linears + rest)
    return 1 / ((1 - share) + share / block_speedup(hidden, tokens, hardware))


def break_even_hidden(tokens: int, hardware: GPUSpec | str = "h100_sxm") -> int:
    """The smallest power-of-two hidden size at which a block's linears run faster in FP8."""
    hidden = 64
    while block_speedup(hidden, tokens, hardware) <= 1.0:
        hidden *= 2
        if hidden > 2**20:
            raise ValueError("FP8 never pays off at this token count")
    return hidden
