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

:func:`nvfp4_quantize` is the full NVFP4 quantiser of NVIDIA's training recipe ("Pretraining
Large Language Models with NVFP4", 2025): 1×16 blocks for activations and gradients, **16×16**
blocks for weights (a 2-D block reads the same in ``W`` and ``Wᵀ``, so forward and backward
multiply one quantised weight), and round-to-nearest-even or **stochastic rounding** to E2M1
(gradients: unbiased, ``E[q] = x``). Every value it returns is an exact NVFP4 number — an E2M1
code times an E4M3 block scale times the fp32 tensor scale — and the random bits come from a
``torch.Generator``, so a run is reproducible bit for bit. The recipe's linear layer is in
:mod:`dtlab.precision.nvfp4_linear`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dtlab.precision.formats import E2M1_MAX, E4M3_MAX
from dtlab.precision.fp8 import _as_blocks, block_amax

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


def round_to_e2m1(
    x: torch.Tensor, stochastic: bool = False, generator: torch.Generator | None = None
) -> torch.Tensor:
    """E2M1 value of ``x``, clamped to ±6. Nearest (ties to the even code, the spec's
    round-to-nearest-even) or, with ``stochastic=True``, up with probability equal to the
    distance from the lower neighbour over the gap: unbiased, ``E[q] = x`` inside ±6."""
    mag = x.abs().clamp(max=E2M1_MAX)
    # E2M1's grid is evenly spaced within each binade: 0.5 below 2, 1 in [2, 4), 2 in [4, 6].
    step = torch.where(mag < 2, 0.5, torch.where(mag < 4, 1.0, 2.0))
    if stochastic:
        lo = torch.floor(mag / step) * step
        u = torch.rand(mag.shape, generator=generator, device="cpu").to(x.device)
        q = torch.where(u < (mag - lo) / step, lo + step, lo)
    else:  # torch.round halves to even, and an even multiple of the step is an even code
        q = torch.round(mag / step) * step
    return torch.sign(x) * q


@dataclass
class NVFP4Tensor:
    """A matrix in NVFP4: E2M1 ``values`` (held as fp32 numbers of the E2M1 grid), one E4M3
    ``block_scales`` entry per ``block`` (rows, columns), and one fp32 ``tensor_scale``."""

    values: torch.Tensor
    block_scales: torch.Tensor  # torch.float8_e4m3fn
    tensor_scale: float
    block: tuple[int, int]

    @property
    def nbytes(self) -> float:
        """Storage as the GEMM reads it: 4 bits per value, one 1-byte E4M3 scale per
        ``block[1]`` values of a row, 4 bytes of tensor scale. A 16×16 weight block's scale is
        stored once for each of its 16 rows (the tensor core reads a scale per 16 values along
        the reduction), so 2-D blocks cost the same 4.5 bits: they share values, not bytes."""
        return self.values.numel() / 2 + self.values.numel() / self.block[1] + 4

    def dequantize(self) -> torch.Tensor:
        """``value · block scale · tensor scale`` in fp32."""
        total = self.block_scales.float() * self.tensor_scale
        return _as_blocks(self.values, self.block, total)


def nvfp4_quantize(
    x: torch.Tensor,
    block: tuple[int, int] = (1, NVFP4_BLOCK),
    stochastic: bool = False,
    generator: torch.Generator | None = None,
) -> NVFP4Tensor:
    """``x`` (viewed as a matrix) in NVFP4 with one E4M3 scale per ``block``: ``(1, 16)`` for
    activations and gradients, ``(16, 16)`` for weights. The tensor scale
    ``amax / (448 · 6)`` lets every block scale ``amax_block / 6 / s_tensor`` fit E4M3."""
    matrix = x.detach().float().reshape(-1, x.shape[-1])
    if matrix.shape[0] % block[0] or matrix.shape[1] % block[1]:
        raise ValueError(
            f"a {tuple(matrix.shape)} matrix does not split into {block} NVFP4 blocks; pad it "
            f"to multiples of {block}"
        )
    amax = float(matrix.abs().max())
    tensor_scale = amax / (E4M3_MAX * E2M1_MAX) if amax > 0 else 1.0
    block_scales = (block_amax(matrix, block) / E2M1_MAX / tensor_scale).clamp(max=E4M3_MAX)
    block_scales = block_scales.to(torch.float8_e4m3fn)
    total = block_scales.float() * tensor_scale
    safe = torch.where(total > 0, total, torch.ones_like(total))
    values = round_to_e2m1(_as_blocks(matrix, block, 1.0 / safe), stochastic, generator)
    values = torch.where(_as_blocks(torch.ones_like(matrix), block, total) > 0, values, 0.0)
    return NVFP4Tensor(values, block_scales, tensor_scale, tuple(block))


def nvfp4_roundtrip(x: torch.Tensor, block: int = NVFP4_BLOCK) -> torch.Tensor:
    """``x`` through NVFP4 (E2M1 values, E4M3 scale per ``block``, fp32 tensor scale), in fp32."""
    rows, cols = x.numel() // x.shape[-1], x.shape[-1]
    if cols % block == 0:
        return nvfp4_quantize(x, (1, block)).dequantize().reshape(x.shape)
    padded = torch.nn.functional.pad(x.detach().float().reshape(rows, cols), (0, (-cols) % block))
    return nvfp4_quantize(padded, (1, block)).dequantize()[:, :cols].reshape(x.shape)


def bits_per_value(name: str) -> float:
    """Storage bits per element, scales included: mxfp8 8.25, nvfp4 4.5 (+ one fp32 per tensor)."""
    table = {"mxfp8": 8 + 8 / MX_BLOCK, "nvfp4": 4 + 8 / NVFP4_BLOCK}
    if name not in table:
        raise KeyError(f"no microscaling format {name!r}; choose one of {sorted(table)}")
    return table[name]
