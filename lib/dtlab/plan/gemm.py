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
"""

from __future__ import annotations

import math

from dtlab.cost import gpu
from dtlab.plan.constants import GEMM_KERNEL_LATENCY_S, GEMM_MAX_FRACTION, GEMM_TILE


def gemm_waves(gpu_name: str, m: float, n: float) -> int:
    """Waves of ``GEMM_TILE²`` output tiles an ``m × n`` output runs in on ``gpu_name``'s SMs."""
    tiles = math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE)
    return math.ceil(tiles / gpu(gpu_name).sm_count)


def gemm_seconds(gpu_name: str, m: float, k: float, n: float) -> float:
    """``t₀ + waves · 2·128²·k / (η_max · peak / SMs)``: one BF16 GEMM's kernel time."""
    if min(m, k, n) <= 0:
        raise ValueError(f"GEMM sizes must be > 0, got m={m}, k={k}, n={n}")
    spec = gpu(gpu_name)
    per_sm = GEMM_MAX_FRACTION.get(gpu_name, 0.75) * spec.bf16_dense_flops / spec.sm_count
    wave_s = 2 * GEMM_TILE * GEMM_TILE * k / per_sm
    return GEMM_KERNEL_LATENCY_S + gemm_waves(gpu_name, m, n) * wave_s


def gemm_efficiency(gpu_name: str, m: float, k: float, n: float) -> float:
    """Fraction of the dense BF16 peak a ``(m × k) @ (k × n)`` GEMM sustains:
    ``2·m·k·n / (peak · gemm_seconds)`` (module docstring)."""
    seconds = gemm_seconds(gpu_name, m, k, n)
    return 2 * m * k * n / (gpu(gpu_name).bf16_dense_flops * seconds)
