"""Row-wise and column-wise block quantisation: one 1-D block-scaled copy serves one GEMM only.

A block scale multiplies a partial sum, so its block must run along the GEMM's **reduction**
dimension: the tensor core adds ``B`` products, then applies the one scale of that block. For a
linear layer ``y = x Wᵀ`` (``x``: M×K tokens × features, ``W``: N×K) the three GEMMs reduce
over three different dimensions:

=========  ===================  ==================  ==================  ==================
GEMM       reduces over         ``x`` needs         ``W`` needs         ``dy`` needs
=========  ===================  ==================  ==================  ==================
forward    K (features in)      row-wise (1×B)      row-wise (1×B)      —
dgrad      N (features out)     —                   column-wise (B×1)   row-wise (1×B)
wgrad      M (tokens)           column-wise (B×1)   —                   column-wise (B×1)
=========  ===================  ==================  ==================  ==================

So with 1-D blocks (MXFP8's 1×32, NVFP4's 1×16, DeepSeek-V3's 1×128 activation tiles) every
operand is quantised **twice**: a row-wise copy for one GEMM and a column-wise copy, stored
transposed (K×M, so its blocks again lie along the last dimension, the layout the kernel reads),
for the other. Transformer Engine's MXFP8 recipe keeps both ("rowwise" and "columnwise usage").
A per-tensor scale, or a 2-D B×B weight block (DeepSeek-V3's 128×128, NVFP4's 16×16), reads the
same both ways: one copy serves both GEMMs — the reason those recipes pick square weight blocks.

The column-wise copy of ``x`` can be made two ways:

* **fresh** — from the high-precision ``x`` during forward, while it is still at hand: both FP8
  copies are saved for backward (twice the FP8 bytes and scales), and forward pays two casts;
* **from the forward copy** — backward dequantises the saved row-wise copy and quantises it
  column-wise: half the saved bytes, but every value is rounded twice (double quantisation),
  so its error is larger than one rounding's. :func:`requantize_error` measures both.

The format here is **MXFP8** (OCP MX v1.0; :mod:`dtlab.precision.microscaling`): E4M3 values and
one E8M0 scale (a power of two, stored as its 8-bit biased exponent) per 32 elements, so
``nbytes`` counts the real tensors: 1 B per value plus 1 B per 32 values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dtlab.precision.formats import E4M3_MAX
from dtlab.precision.microscaling import MX_BLOCK, mxfp8_scales

E8M0_BIAS = 127


@dataclass
class MXTensor:
    """An M×K matrix in MXFP8, quantised along one direction.

    ``data`` holds the E4M3 values and ``scale_codes`` the E8M0 exponents (``2^(code − 127)``),
    one per ``block`` values along ``data``'s last dimension. ``columnwise`` copies store the
    transpose (``data`` is K×M), so the blocks run down the columns of the original matrix."""

    data: torch.Tensor
    scale_codes: torch.Tensor
    block: int
    columnwise: bool

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors this copy holds: values plus scales (read from the tensors)."""
        return self.data.nbytes + self.scale_codes.nbytes

    def dequantize(self) -> torch.Tensor:
        """The M×K matrix it stands for, in fp32 (the transpose undone for a column-wise copy)."""
        scales = torch.exp2(self.scale_codes.float() - E8M0_BIAS)
        values = self.data.float() * scales.repeat_interleave(self.block, dim=1)
        return values.t() if self.columnwise else values


def _quantize_last_dim(matrix: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = matrix.shape
    if cols % block:
        raise ValueError(
            f"a dimension of {cols} does not split into blocks of {block} along the reduction "
            f"dimension; pad it to a multiple of {block}"
        )
    scales = mxfp8_scales(matrix, block)  # (rows, cols / block), powers of two
    scaled = matrix.float() / scales.repeat_interleave(block, dim=1)
    data = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    codes = (torch.log2(scales) + E8M0_BIAS).round().to(torch.uint8)
    return data, codes


def quantize_rowwise(x: torch.Tensor, block: int = MX_BLOCK) -> MXTensor:
    """``x`` (M×K) in MXFP8 with 1×``block`` blocks along K: the forward GEMM's operand."""
    data, codes = _quantize_last_dim(x.detach(), block)
    return MXTensor(data, codes, block, columnwise=False)


def quantize_columnwise(x: torch.Tensor, block: int = MX_BLOCK) -> MXTensor:
    """``x`` (M×K) in MXFP8 with ``block``×1 blocks along M, stored transposed (K×M): the
    operand of a GEMM that reduces over M (wgrad for ``x`` and ``dy``; dgrad for ``W``)."""
    data, codes = _quantize_last_dim(x.detach().t().contiguous(), block)
    return MXTensor(data, codes, block, columnwise=True)


def columnwise_from_rowwise(rowwise: MXTensor) -> MXTensor:
    """Backward's column-wise copy made from the saved forward copy: dequantise, re-quantise."""
    return quantize_columnwise(rowwise.dequantize(), rowwise.block)


def both_directions(x: torch.Tensor, block: int = MX_BLOCK) -> tuple[MXTensor, MXTensor]:
    """The row-wise and the fresh column-wise copy of ``x``, as a forward that saves both makes."""
    return quantize_rowwise(x, block), quantize_columnwise(x, block)


def _relative(exact: torch.Tensor, approx: torch.Tensor) -> float:
    exact64 = exact.double()
    return float((exact64 - approx.double()).norm() / exact64.norm().clamp_min(1e-300))


def requantize_error(x: torch.Tensor, dy: torch.Tensor, block: int = MX_BLOCK) -> dict:
    """What re-using the forward copy costs, for ``x`` (M×K) and its layer's ``dy`` (M×N).

    Returns relative errors (Frobenius, against the exact fp64 value) of the column-wise ``x``
    made ``fresh`` and ``from_forward_copy`` (``x_fresh``, ``x_from_forward``), and of the weight
    gradient ``dW = dyᵀ x`` computed from each (``wgrad_fresh``, ``wgrad_from_forward``), with
    ``dy`` quantised column-wise fresh in both; plus the fraction of ``x``'s elements whose value
    the second rounding changed (``changed``)."""
    rowwise = quantize_rowwise(x, block)
    fresh = quantize_columnwise(x, block).dequantize()
    reused = columnwise_from_rowwise(rowwise).dequantize()
    dy_col = quantize_columnwise(dy, block).dequantize()
    exact = dy.double().t() @ x.double()
    return {
        "x_fresh": _relative(x, fresh),
        "x_from_forward": _relative(x, reused),
        "wgrad_fresh": _relative(exact, dy_col.double().t() @ fresh.double()),
        "wgrad_from_forward": _relative(exact, dy_col.double().t() @ reused.double()),
        "changed": float((reused != rowwise.dequantize()).float().mean()),
    }


def saved_bytes_per_element(strategy: str, block: int = MX_BLOCK) -> float:
    """Bytes per element of ``x`` kept between forward and backward for its two GEMMs.

    ``"bf16"``: the BF16 ``x`` (2 B; backward quantises column-wise itself); ``"both"``: the
    row-wise and column-wise MXFP8 copies (2 × (1 + 1/``block``)); ``"rowwise_only"``: the
    forward copy alone (1 + 1/``block``; backward re-quantises it)."""
    per_copy = 1 + 1 / block
    table = {"bf16": 2.0, "both": 2 * per_copy, "rowwise_only": per_copy}
    if strategy not in table:
        raise ValueError(f"no strategy {strategy!r}; choose one of {sorted(table)}")
    return table[strategy]
