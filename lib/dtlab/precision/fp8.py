"""FP8 quantisation with explicit saturation, at three scaling granularities.

An FP8 tensor is a pair: 8-bit values ``q`` and fp32 *scales* ``s`` with ``x ≈ q · s``. Each
scale serves one block of elements and is chosen from the block's largest magnitude, its
**amax**, so that the block's largest value lands on the format's largest finite value:
``s = amax / max_fp8`` (E4M3: 448, E5M2: 57,344). Values are divided by ``s``, **clamped** to
``±max_fp8`` (a cast alone may give NaN or inf on overflow: E5M2 has infinities and E4M3's
overflow behaviour differs across builds), and rounded to the nearest FP8 value by torch's cast.

The granularity decides how many elements share one scale (what an outlier can spoil):

* ``"tensor"`` — one scale for the whole tensor (Micikevicius et al. 2022; Transformer Engine's
  default). One outlier 10⁴× the rest pushes every other value towards E4M3's subnormals, where
  3 mantissa bits become 2, 1, 0;
* ``"row"`` — one scale per row (per token for activations, per output channel for weights);
* ``"tile"`` — one scale per block: 1×128 for activations and 128×128 for weights in
  DeepSeek-V3 (DeepSeek-AI 2024, §3.3.2). A weight block's scale serves both ``W`` and ``Wᵀ``,
  so backward can reuse the forward quantisation.

:func:`quantize_fp8` takes any tensor, views it as a matrix (rows = all leading dimensions),
pads ragged edges for the amax only, and returns a :class:`Quantized`. Scaling from the current
tensor's amax is *current scaling*; :class:`AmaxHistory` gives *delayed scaling* (a scale from
earlier steps' amaxes, Transformer Engine's recipe), which saves a pass over the tensor but
saturates when the amax jumps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dtlab.precision.formats import TORCH_DTYPES, number_format

GRANULARITIES = ("tensor", "row", "tile")
ACTIVATION_TILE = (1, 128)  # DeepSeek-V3: per token, per 128 channels
WEIGHT_TILE = (128, 128)  # DeepSeek-V3: per 128 x 128 block of a weight


@dataclass
class Quantized:
    """FP8 values, their scales (one per block of ``block`` elements), and how to undo it."""

    data: torch.Tensor  # fp8 values, shape of the original tensor
    scales: torch.Tensor  # fp32, (row blocks, column blocks)
    block: tuple[int, int]
    fmt: str
    saturated: int  # elements that exceeded ±max before clamping (0 under current scaling)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``q · s`` back in ``dtype``."""
        return (_as_blocks(self.data.to(torch.float32), self.block, self.scales)).to(dtype)

    @property
    def scale_bytes(self) -> int:
        return self.scales.numel() * 4


def block_shape(x: torch.Tensor, granularity: str, block: tuple[int, int] | None = None):
    """The (rows, columns) block that shares one scale for ``x`` viewed as a matrix."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity {granularity!r} is not one of {GRANULARITIES}")
    rows, cols = _matrix_shape(x)
    if granularity == "tensor":
        return rows, cols
    if granularity == "row":
        return 1, cols
    block = block or ACTIVATION_TILE
    if len(block) != 2 or min(block) < 1:
        raise ValueError(f"a tile is (rows, columns) of positive sizes, e.g. (1, 128); got {block}")
    return tuple(block)


def _matrix_shape(x: torch.Tensor) -> tuple[int, int]:
    if x.dim() == 0:
        return 1, 1
    return x.numel() // max(x.shape[-1], 1), x.shape[-1]


def block_amax(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Largest |value| of each block of ``x`` viewed as a matrix (ragged edges padded by 0)."""
    rows, cols = _matrix_shape(x)
    br, bc = block
    m = x.detach().reshape(rows, cols).abs().float()
    m = F.pad(m, (0, (-cols) % bc, 0, (-rows) % br))
    return m.reshape(m.shape[0] // br, br, m.shape[1] // bc, bc).amax(dim=(1, 3))


def _as_blocks(values: torch.Tensor, block: tuple[int, int], per_block: torch.Tensor):
    """``values`` (matrix view) multiplied by each block's entry of ``per_block``."""
    rows, cols = _matrix_shape(values)
    br, bc = block
    expanded = per_block.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
    return (values.reshape(rows, cols) * expanded).reshape(values.shape)


def scale_from_amax(amax: torch.Tensor, fmt: str) -> torch.Tensor:
    """``amax / max_fp8`` (1 where a block is all zeros): the dequantisation scale."""
    top = number_format(fmt).max
    return torch.where(amax > 0, amax / top, torch.ones_like(amax))


def quantize_fp8(
    x: torch.Tensor,
    fmt: str = "e4m3",
    granularity: str = "tensor",
    block: tuple[int, int] | None = None,
    scale: torch.Tensor | float | None = None,
) -> Quantized:
    """Quantise ``x`` to FP8 ``fmt`` ("e4m3" or "e5m2") with one scale per block.

    ``scale`` (per-tensor only) overrides the current amax: delayed scaling passes the scale from
    an :class:`AmaxHistory` here, and values beyond ``±max · scale`` saturate (counted).
    """
    if fmt not in ("e4m3", "e5m2"):
        raise ValueError(f"FP8 format {fmt!r}: choose 'e4m3' (forward) or 'e5m2' (gradients)")
    if not x.is_floating_point():
        raise TypeError(f"quantize a floating-point tensor, not {x.dtype}")
    shape = block_shape(x, granularity, block)
    if scale is None:
        scales = scale_from_amax(block_amax(x, shape), fmt)
    else:
        if granularity != "tensor":
            raise ValueError("a given scale is per tensor; use granularity='tensor'")
        scales = torch.as_tensor(scale, dtype=torch.float32, device=x.device).reshape(1, 1)
    top = number_format(fmt).max
    scaled = _as_blocks(x.detach().float(), shape, 1.0 / scales)
    # the amax element itself lands on top to within fp32 rounding of amax / (amax / top)
    saturated = int((scaled.abs() > top * (1 + 2**-20)).sum())
    data = scaled.clamp(-top, top).to(TORCH_DTYPES[fmt])
    return Quantized(data, scales, shape, fmt, saturated)


def fake_quantize(x: torch.Tensor, fmt: str = "e4m3", granularity: str = "tensor", block=None):
    """``x`` quantised to FP8 and straight back, in ``x``'s dtype (what FP8 loses of ``x``)."""
    return quantize_fp8(x, fmt, granularity, block).dequantize(x.dtype)


def relative_error(
    x: torch.Tensor, approx: torch.Tensor, where: torch.Tensor | None = None
) -> float:
    """``‖x − approx‖ / ‖x‖`` (Frobenius, fp64) over the elements ``where`` is True (default:
    all). Pass ``where=~outliers`` to measure what quantisation did to the ordinary values: an
    outlier's own error would otherwise dominate the norm."""
    x64, a64 = x.detach().double(), approx.detach().double()
    if where is not None:
        x64, a64 = x64[where], a64[where]
    return float((x64 - a64).norm() / x64.norm().clamp_min(1e-300))


def flushed_to_zero(x: torch.Tensor, approx: torch.Tensor) -> float:
    """Fraction of nonzero elements of ``x`` that ``approx`` turned into zeros (underflow)."""
    nonzero = x != 0
    return float(((approx == 0) & nonzero).sum() / nonzero.sum().clamp_min(1))


class AmaxHistory:
    """Delayed scaling: the scale for this step comes from the amaxes of the last ``length`` steps.

    Transformer Engine's ``DelayedScaling`` recipe: ``scale = max(history) / max_fp8`` (or the
    most recent amax with ``algo="most_recent"``); the current tensor's amax is recorded *after*
    it has been quantised, so a sudden jump saturates for one step. ``margin`` leaves ``2^margin``
    of headroom.
    """

    def __init__(self, length: int = 16, algo: str = "max", margin: int = 0) -> None:
        if length < 1:
            raise ValueError(f"amax history length {length} must be >= 1")
        if algo not in ("max", "most_recent"):
            raise ValueError(f"algo {algo!r}: choose 'max' or 'most_recent'")
        self.history: deque[float] = deque(maxlen=length)
        self.algo, self.margin = algo, margin

    def scale(self, fmt: str) -> float | None:
        """The delayed scale, or ``None`` before the first recorded amax (use current scaling)."""
        if not self.history:
            return None
        amax = max(self.history) if self.algo == "max" else self.history[-1]
        return float(scale_from_amax(torch.tensor(amax), fmt)) * 2.0**self.margin

    def record(self, amax: float) -> None:
        self.history.append(float(amax))

    def quantize(self, x: torch.Tensor, fmt: str = "e4m3") -> Quantized:
        """Quantise ``x`` per tensor with the delayed scale, then record its amax."""
        q = quantize_fp8(x, fmt, "tensor", scale=self.scale(fmt))
        self.record(float(x.detach().abs().max()))
        return q
