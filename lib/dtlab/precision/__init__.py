"""Number formats in training: which dtype computes, communicates and keeps the master weights.

* :mod:`~dtlab.precision.mixed_precision` — :class:`MixedPrecision` (bf16/fp16 compute with fp32
  masters, as ZeRO and FSDP2's ``MixedPrecisionPolicy`` use it) and :func:`norms_in_fp32`.
"""

from dtlab.precision.mixed_precision import MixedPrecision, compute_dtype, norms_in_fp32

__all__ = ["MixedPrecision", "compute_dtype", "norms_in_fp32"]
