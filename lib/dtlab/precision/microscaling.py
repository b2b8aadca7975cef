"""Microscaling formats, simulated: MXFP8 and NVFP4 (quantise → dequantise in fp32).

Blackwell tensor cores read a scale per small block of elements along the reduction dimension,
so fine-grained scaling costs nothing in the GEMM:

* **MXFP8** (OCP Microscaling Formats spec v1.0, 2023): 32 consecutive E4M3 values share one
  **E8M0** scale — a pure power of two, ``2^k``. The spec picks ``k = floor(log2(amax)) −
  emax_elem`` (``emax_elem = 8`` for E4M3, whose max is ``1.75 · 2^8``), so the block's amax
  lands in ``[256, 512)`` and anything above 448 is clamped. A power-of-two scale is exact to
  apply but wastes up to one binade of E4M3's range. 8 + 8/32 = 8.25 bits per value.
* **NVFP4** (NVIDIA, 2025): 16 consecutive **E2M1** values (±{0, 0.5, 1, 1.5, 2, 3, 4, 6}) share
  an **E4M3** scale, and the tensor has one more fp32 scale on top, so the block scales
  themselves fit E4M3's range: ``s_tensor = amax / (448 · 6)``, ``s_block = E4M3(amax_block / 6
  / s_tensor)``, ``x ≈ q · s_block · s_tensor``. 4 + 8/16 = 4.5 bits per value.

Both quantise along the last dimension (the reduction dimension of ``x @ Wᵀ``); ragged ends are
padded for the block amax only. Nothing here calls an MX kernel: these are numerics, for the
error table beside per-tile FP8 (:func:`dtlab.precision.fp8.quantize_fp8`).
"""

from __future__ import annotations

import math

import torch

from dtlab.precision.formats import E2M1_MAX, E4M3_MAX
from dtlab.precision.fp8 import block_amax

MX_BLOCK = 32
NVFP4_BLOCK = 16
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E4M3_EMAX = math.floor(math.log2(E4M3_MAX))  # 8
E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT = -127, 127


def _per_block(x: torch.Tensor, block: int, per_block: torch.Tensor) -> torch.Tensor:
    rows, cols = x.numel() // x.shape[-1], x.shape[-1]
    expanded = per_block.repeat_interleave(block, 1)[:, :cols]
    return (x.reshape(rows, cols) * expanded).reshape(x.shape)


def mxfp8_scales(x: torch.Tensor, block: int = MX_BLOCK) -> torch.Tensor:
    """The E8M0 scales ``2^k`` of each ``block`` along the last dimension (fp32 tensor)."""
    amax = block_amax(x, (1, block))
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    k = torch.floor(torch.log2(safe)) - E4M3_EMAX
    return torch.exp2(k.clamp(E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT))


def mxfp8_roundtrip(x: torch.Tensor, block: int = MX_BLOCK) -> torch.Tensor:
    """``x`` through MXFP8 (E4M3 values, E8M0 scale per ``block``) and back, in fp32."""
    scales = mxfp8_scales(x, block)
    scaled = _per_block(x.detach().float(), block, 1.0 / scales)
    q = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()
    return _per_block(q, block, scales)


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 value (ties to the even code, as the spec's round-to-nearest-even), clamped
    to ±6."""
    grid = E2M1_GRID.to(x.device)
    mag = x.abs().clamp(max=E2M1_MAX)
    upper = torch.bucketize(mag, grid).clamp(1, len(grid) - 1)
    lo, hi = grid[upper - 1], grid[upper]
    to_hi = (mag - lo > hi - mag) | ((mag - lo == hi - mag) & (upper % 2 == 0))
    return torch.sign(x) * torch.where(to_hi, hi, lo)


def nvfp4_roundtrip(x: torch.Tensor, block: int = NVFP4_BLOCK) -> torch.Tensor:
    """``x`` through NVFP4 (E2M1 values, E4M3 scale per ``block``, fp32 tensor scale), in fp32."""
    amax = x.detach().abs().max().float()
    tensor_scale = amax / (E4M3_MAX * E2M1_MAX) if amax > 0 else torch.tensor(1.0)
    block_scales = (block_amax(x, (1, block)) / E2M1_MAX / tensor_scale).clamp(max=E4M3_MAX)
    block_scales = block_scales.to(torch.float8_e4m3fn).float()
    total = block_scales * tensor_scale
    safe = torch.where(total > 0, total, torch.ones_like(total))
    q = round_to_e2m1(_per_block(x.detach().float(), block, 1.0 / safe))
    return _per_block(q, block, torch.where(total > 0, total, torch.zeros_like(total)))


def bits_per_value(name: str) -> float:
    """Storage bits per element, scales included: mxfp8 8.25, nvfp4 4.5 (+ one fp32 per tensor)."""
    table = {"mxfp8": 8 + 8 / MX_BLOCK, "nvfp4": 4 + 8 / NVFP4_BLOCK}
    if name not in table:
        raise KeyError(f"no microscaling format {name!r}; choose one of {sorted(table)}")
    return table[name]
