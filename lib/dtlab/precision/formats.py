"""Floating-point formats used in training, computed from their bit layout.

A binary floating-point number with ``e`` exponent bits and ``m`` stored mantissa bits is
``(-1)^s · 2^(E - bias) · 1.f`` (normal) or ``2^(1 - bias) · 0.f`` (subnormal), ``bias =
2^(e-1) - 1``. From that layout alone follow the three numbers this module tabulates:

* **range** — the largest finite value (``max``) and the smallest normal one;
* **resolution** — ``eps = 2^-m``, the gap between 1.0 and the next value: a relative step of
  about ``2^-(m+1)`` is the worst rounding error of a value in the normal range;
* **underflow** — the smallest subnormal, ``2^(1 - bias - m)``; anything below half of it
  rounds to zero.

Two FP8 formats break IEEE's rules (Micikevicius et al., "FP8 Formats for Deep Learning", 2022):
**E4M3** has no infinities and only one NaN mantissa pattern, so its top exponent holds normal
numbers and its max is ``1.75 · 2^8 = 448`` (not 240); **E5M2** keeps IEEE's rules (max
57,344). TF32 is what tensor cores multiply fp32 inputs with: fp32's 8 exponent bits and
fp16's 10 mantissa bits, in a 32-bit container. E2M1 (FP4) and E8M0 (a pure power-of-two scale)
are the microscaling formats of the OCP MX specification.

:data:`FORMATS` is checked against ``torch.finfo`` for every dtype torch has (tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class NumberFormat:
    """One binary floating-point format: its bit split and the range/resolution it implies."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    storage_bits: int
    special_values: str = "ieee"  # "ieee"; "nan_only" (E4M3: one NaN pattern); "none" (E2M1)
    has_sign: bool = True

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def bits(self) -> int:
        """Bits that carry information (TF32: 19, stored in 32)."""
        return int(self.has_sign) + self.exponent_bits + self.mantissa_bits

    @property
    def max(self) -> float:
        """Largest finite value."""
        if self.mantissa_bits == 0:  # E8M0: exponents only, the top pattern is NaN
            return 2.0 ** (2**self.exponent_bits - 2 - self.bias)
        if self.special_values == "ieee":
            top_exponent = 2**self.exponent_bits - 2 - self.bias
            return (2 - 2.0**-self.mantissa_bits) * 2.0**top_exponent
        top_exponent = 2**self.exponent_bits - 1 - self.bias  # the top exponent is finite
        if self.special_values == "none":  # E2M1: every pattern is a number
            return (2 - 2.0**-self.mantissa_bits) * 2.0**top_exponent
        # E4M3: only the all-ones mantissa of the top exponent is NaN.
        return (2 - 2.0 ** (1 - self.mantissa_bits)) * 2.0**top_exponent

    @property
    def smallest_normal(self) -> float:
        return 2.0 ** (1 - self.bias) if self.mantissa_bits else 2.0 ** (-self.bias)

    @property
    def smallest_subnormal(self) -> float:
        """Smallest positive value (E8M0 has no subnormals: its smallest normal)."""
        if self.mantissa_bits == 0:
            return self.smallest_normal
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """Gap between 1.0 and the next representable value: the resolution."""
        return 2.0**-self.mantissa_bits

    @property
    def dynamic_range_decades(self) -> float:
        """log10(max / smallest subnormal): how many decades the format spans."""
        return math.log10(self.max / self.smallest_subnormal)

    def spacing_at(self, x: float) -> float:
        """Gap between ``|x|`` and the next representable value (0 < |x| <= max)."""
        x = abs(x)
        if x < self.smallest_normal:
            return self.smallest_subnormal
        return 2.0 ** (math.floor(math.log2(x)) - self.mantissa_bits)


FORMATS: dict[str, NumberFormat] = {
    "fp32": NumberFormat("fp32", 8, 23, 32),
    "tf32": NumberFormat("tf32", 8, 10, 32),
    "bf16": NumberFormat("bf16", 8, 7, 16),
    "fp16": NumberFormat("fp16", 5, 10, 16),
    "e4m3": NumberFormat("e4m3", 4, 3, 8, special_values="nan_only"),
    "e5m2": NumberFormat("e5m2", 5, 2, 8),
    "e2m1": NumberFormat("e2m1", 2, 1, 4, special_values="none"),
    "e8m0": NumberFormat("e8m0", 8, 0, 8, has_sign=False),
}

TORCH_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
}
E4M3_MAX = FORMATS["e4m3"].max  # 448
E5M2_MAX = FORMATS["e5m2"].max  # 57344
E2M1_MAX = FORMATS["e2m1"].max  # 6


def number_format(name: str) -> NumberFormat:
    """The format called ``name`` (one of :data:`FORMATS`), with an error listing them."""
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"no number format {name!r}; choose one of {sorted(FORMATS)}") from None


def format_table(names: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "e4m3", "e5m2")):
    """Rows of (name, bits, exponent, mantissa, max, smallest normal, smallest subnormal, eps)."""
    return [
        {
            "format": f.name,
            "bits": f.bits,
            "exponent": f.exponent_bits,
            "mantissa": f.mantissa_bits,
            "max": f.max,
            "smallest_normal": f.smallest_normal,
            "smallest_subnormal": f.smallest_subnormal,
            "eps": f.eps,
        }
        for f in (number_format(n) for n in names)
    ]


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded to TF32's 10 mantissa bits (round to nearest even), kept as fp32."""
    bits = x.float().contiguous().view(torch.int32)
    dropped = 13  # 23 - 10 mantissa bits
    half = 1 << (dropped - 1)
    odd = (bits >> dropped) & 1
    rounded = ((bits + half - 1 + odd) >> dropped) << dropped
    finite = torch.isfinite(x.float())
    return torch.where(finite, rounded.view(torch.float32), x.float())


def lost_updates(weight: float, update: float, fmt: str) -> bool:
    """Whether ``weight + update`` rounds back to ``weight`` in ``fmt`` (one of fp32/bf16/fp16)."""
    dtype = TORCH_DTYPES[fmt]
    w = torch.tensor(weight, dtype=dtype)
    return bool((w + torch.tensor(update, dtype=dtype)) == w)
