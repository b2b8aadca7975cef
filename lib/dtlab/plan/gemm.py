"""How long one GEMM takes on one GPU, and what share of the dense peak that is.

A GEMM ``(m × k) @ (k × n)`` runs as ``⌈m/128⌉·⌈n/128⌉`` output tiles, one thread block each, in
waves of one tile per SM; each wave takes what one tile's ``2·128²·k`` FLOPs take at ``η_max``
of one SM's share of the peak, a partial last wave as long as a full one, and the kernel adds a
fixed latency ``t₀`` (NVIDIA, "Matrix Multiplication Background User's Guide": tile and wave
quantisation). Constants, their sources and the H200 measurement the model is held against:
:mod:`dtlab.plan.constants`.

So small GEMMs are not a little slower, they are mostly idle: 1024³ fills 64 of an H100's 132
SMs for one short wave (~26 % of peak), 256³ four of them (~1 %); and one tile more than a full
wave costs a whole wave (133 tiles on 132 SMs take twice as long as 132).

**Skinny GEMMs are bound by memory, not by tiles.** A GEMM must at least read its two operands
and write its output once from HBM: ``(m·k + k·n)·e + 2·m·n`` bytes (``e`` bytes per input
element, the output in BF16) at the preset's HBM bandwidth. Below an arithmetic intensity of
about ``η_max · peak / bandwidth`` (≈ 200 FLOP/B on an H100) that floor outlasts the waves — a
``128 × 16384 × 16384`` product fills one wave in ~0.1 ms of tensor-core time but needs
~0.16 ms to read its 537 MB of weights — so the time is ``t₀ + max(waves, bytes / bandwidth)``
(the roofline; the full bandwidth, so still an optimistic floor). The square GEMMs measured on
the H200 and the published runs' layer GEMMs (2,048–8,192 tokens per micro-batch) never reach
it; a job of a few hundred tokens per micro-batch, or an expert that receives few, does.

**FP8** (``dtype="fp8"``): the same tiles and waves against the FP8 dense peak at
``η_max · FP8_SUSTAINED_SCALE`` (quantisation kernels included, :mod:`dtlab.plan.constants`),
one byte per input element; ``t₀`` is not scaled — a kernel's fixed latency does not shrink
because its arithmetic is narrower. The efficiency is then a share of the FP8 peak.
"""

from __future__ import annotations

import functools
import math

from dtlab.cost import gpu
from dtlab.plan.constants import (
    FP8_SUSTAINED_SCALE,
    GEMM_KERNEL_LATENCY_S,
    GEMM_MAX_FRACTION,
    GEMM_TILE,
)

GEMM_DTYPES = ("bf16", "fp8")


def gemm_waves(gpu_name: str, m: float, n: float) -> int:
    """Waves of ``GEMM_TILE²`` output tiles an ``m × n`` output runs in on ``gpu_name``'s SMs."""
    tiles = math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE)
    return math.ceil(tiles / gpu(gpu_name).sm_count)


def gemm_peak_flops(gpu_name: str, dtype: str = "bf16") -> float:
    """The dense peak a ``dtype`` GEMM's efficiency is a share of (BF16 where the GPU has no FP8)."""
    if dtype not in GEMM_DTYPES:
        raise ValueError(f"GEMM dtype must be one of {GEMM_DTYPES}, got {dtype!r}")
    spec = gpu(gpu_name)
    if dtype == "fp8" and spec.fp8_dense_flops:
        return spec.fp8_dense_flops
    return spec.bf16_dense_flops


def gemm_seconds(gpu_name: str, m: float, k: float, n: float, dtype: str = "bf16") -> float:
    """``t₀ + max(waves · 2·128²·k / (η_max · peak / SMs), bytes / HBM)``: one GEMM's kernel
    time (module docstring; ``dtype`` "bf16" or "fp8")."""
    if min(m, k, n) <= 0:
        raise ValueError(f"GEMM sizes must be > 0, got m={m}, k={k}, n={n}")
    spec = gpu(gpu_name)
    fp8 = dtype == "fp8" and bool(spec.fp8_dense_flops)
    if gpu_name not in GEMM_MAX_FRACTION:
        raise KeyError(
            f"no GEMM ceiling for GPU preset {gpu_name!r}: add its sustained share of the dense "
            "peak to dtlab.plan.constants.GEMM_MAX_FRACTION, with its source"
        )
    ceiling = GEMM_MAX_FRACTION[gpu_name] * (FP8_SUSTAINED_SCALE if fp8 else 1.0)
    per_sm = ceiling * gemm_peak_flops(gpu_name, dtype) / spec.sm_count
    waves_s = gemm_waves(gpu_name, m, n) * 2 * GEMM_TILE * GEMM_TILE * k / per_sm
    hbm_bytes = (m * k + k * n) * (1 if fp8 else 2) + 2 * m * n
    return GEMM_KERNEL_LATENCY_S + max(waves_s, hbm_bytes / spec.hbm_bandwidth_bytes_per_s)


@functools.lru_cache(maxsize=65536)
def gemm_efficiency(gpu_name: str, m: float, k: float, n: float, dtype: str = "bf16") -> float:
    """Fraction of the dense ``dtype`` peak a ``(m × k) @ (k × n)`` GEMM sustains:
    ``2·m·k·n / (peak · gemm_seconds)`` (module docstring). Always in ``(0, η_max]`` (FP8:
    ``(0, η_max · FP8_SUSTAINED_SCALE]``)."""
    seconds = gemm_seconds(gpu_name, m, k, n, dtype)
    return 2 * m * k * n / (gemm_peak_flops(gpu_name, dtype) * seconds)
