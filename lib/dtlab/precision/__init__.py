"""Number formats in training: which dtype computes, communicates and keeps the master weights.

* :mod:`~dtlab.precision.mixed_precision` — :class:`MixedPrecision` (FSDP2's
  ``MixedPrecisionPolicy`` fields and defaults, which cast nothing; ask for bf16/fp16 compute,
  plus ``master_dtype`` for ZeRO-1/2's fp32 masters) and :func:`norms_in_fp32`.
* :mod:`~dtlab.precision.formats` — FP32, TF32, BF16, FP16, E4M3, E5M2 (and E2M1, E8M0): range
  and resolution computed from the bit layout.
* :mod:`~dtlab.precision.loss_scaler` — :class:`DynamicLossScaler`: FP16 loss scaling with one
  cross-rank overflow flag (DDP, ZeRO, FSDP), an FP32 scale moving as GradScaler's bit for bit,
  hysteresis as DeepSpeed's.
* :mod:`~dtlab.precision.fp8` — FP8 quantisation with saturation, per tensor / row / tile;
  delayed scaling (:class:`AmaxHistory`).
* :mod:`~dtlab.precision.fp8_linear` — :class:`Fp8Linear` (E4M3 forward, E5M2 gradients) on
  ``torch._scaled_mm`` where it runs, simulated where not, and says which.
* :mod:`~dtlab.precision.microscaling` — MXFP8 and NVFP4, simulated bit-exactly (NVFP4 with
  2-D blocks and stochastic rounding).
* :mod:`~dtlab.precision.directional` — row-wise vs column-wise MXFP8 copies: which GEMM each
  serves, their bytes, and the error of making backward's copy from forward's.
* :mod:`~dtlab.precision.nvfp4_linear` — :class:`Nvfp4Linear` under NVIDIA's NVFP4 recipe
  (16×16 weight blocks, random Hadamard transforms on wgrad, stochastic rounding of gradients).
* :mod:`~dtlab.precision.fp8_all_gather` and :mod:`~dtlab.precision.fp8_gather_training` — FSDP
  weights all-gathered in FP8 with one agreed amax per weight, on real ranks, beside BF16.
* :mod:`~dtlab.precision.cast_overhead` — FP8's speed-up against width on the roofline, and the
  layers that stay in BF16.
* :mod:`~dtlab.precision.bf16_updates` — stochastic rounding and Kahan summation in BF16, the
  alternatives to FP32 master weights, on the updates-lost demo.
* :mod:`~dtlab.precision.recipes` — :func:`train_recipe`: the lab GPT under each recipe.
"""

from dtlab.precision.bf16_updates import (
    UPDATE_MODES,
    BF16Updater,
    kahan_add_,
    round_up_probability,
    stochastic_round_to_bf16,
    updates_lost_demo,
    weight_bytes_per_parameter,
)
from dtlab.precision.formats import FORMATS, NumberFormat, format_table, number_format
from dtlab.precision.fp8 import (
    AmaxHistory,
    Quantized,
    fake_quantize,
    flushed_to_zero,
    quantize_fp8,
    relative_error,
)
from dtlab.precision.fp8_linear import (
    GEMM_PATHS,
    PER_ROW,
    PER_TENSOR,
    PER_TILE,
    Fp8Linear,
    Fp8Recipe,
    convert_to_fp8,
)
from dtlab.precision.loss_scaler import (
    DynamicLossScaler,
    ScalerConfig,
    ScalerState,
    gradients_of,
    next_scale_state,
)
from dtlab.precision.microscaling import mxfp8_roundtrip, nvfp4_roundtrip
from dtlab.precision.mixed_precision import MixedPrecision, compute_dtype, norms_in_fp32

__all__ = [
    "FORMATS",
    "GEMM_PATHS",
    "PER_ROW",
    "PER_TENSOR",
    "PER_TILE",
    "UPDATE_MODES",
    "AmaxHistory",
    "BF16Updater",
    "DynamicLossScaler",
    "Fp8Linear",
    "Fp8Recipe",
    "MixedPrecision",
    "NumberFormat",
    "Quantized",
    "ScalerConfig",
    "ScalerState",
    "compute_dtype",
    "convert_to_fp8",
    "fake_quantize",
    "flushed_to_zero",
    "format_table",
    "gradients_of",
    "kahan_add_",
    "mxfp8_roundtrip",
    "next_scale_state",
    "norms_in_fp32",
    "number_format",
    "nvfp4_roundtrip",
    "quantize_fp8",
    "relative_error",
    "round_up_probability",
    "stochastic_round_to_bf16",
    "updates_lost_demo",
    "weight_bytes_per_parameter",
]
