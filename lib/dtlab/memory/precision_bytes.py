"""Bytes per parameter and per saved activation element under each precision recipe.

Model state per parameter with Adam (Rajbhandari et al. 2020 count mixed precision as
``2 + 2 + 12 = 16``; :data:`dtlab.memory.formulas.RECIPES` ``"mixed_adam"`` is that baseline):

===============  ======  =====  ==========================================  =====
recipe           param   grad   optimizer state                             total
===============  ======  =====  ==========================================  =====
fp32             4       4      m 4 + v 4 (the fp32 params are the masters)  16
bf16_master      2       2      master 4 + m 4 + v 4                         16
  + fp32 accum   2       4      master 4 + m 4 + v 4                         18
fp16_scaled      2       2      master 4 + m 4 + v 4 (+ one scale)           16
bf16_pure        2       2      m 2 + v 2 (no master: updates get lost)      8
fp8 (ours)       4       4      m 4 + v 4                                    16
===============  ======  =====  ==========================================  =====

``bf16_master_fp32_accum`` is Megatron-LM's layout (its ``main_grad``): the 16-bit gradients
are added into a persistent fp32 buffer (micro-batch after micro-batch) and freed, so the
gradient costs 4 bytes, not 2 — what :func:`dtlab.precision.recipes.train_recipe` does.

Mixed precision does **not** shrink model state: the 16-bit copy is *added* to the fp32 master.
What it buys is faster GEMMs, half the bytes on the wire and half the **activations**: the
tensors saved for backward are stored in the compute dtype. FP8 GEMM inputs are saved in FP8
(:class:`~dtlab.precision.Fp8Linear` saves its quantised ``x``): 1 byte per element plus the
scales — one fp32 per tensor, per row of ``K`` elements or per 1×128 tile; MXFP8 adds one E8M0
byte per 32 values, NVFP4 half a byte per value plus one E4M3 byte per 16.

:func:`model_state_recipe` returns the :class:`~dtlab.memory.formulas.Recipe` of a precision
recipe, so :func:`~dtlab.memory.formulas.model_state_bytes` prices it under any ZeRO stage.
"""

from __future__ import annotations

from dtlab.memory.formulas import RECIPES, Recipe

MODEL_STATE: dict[str, Recipe] = {
    "fp32": Recipe(4, 4, 8, "fp32"),
    "bf16_master": Recipe(2, 2, 12, "bf16_master"),
    "bf16_master_fp32_accum": Recipe(2, 4, 12, "bf16_master_fp32_accum"),
    "fp16_scaled": Recipe(2, 2, 12, "fp16_scaled"),
    "bf16_pure": Recipe(2, 2, 4, "bf16_pure"),
    "fp8": Recipe(4, 4, 8, "fp8"),
}
BASELINE_BYTES_PER_PARAM = RECIPES["mixed_adam"].bytes_per_param  # 16

_ELEMENT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "mxfp8": 1.0, "nvfp4": 0.5}


def model_state_recipe(name: str) -> Recipe:
    """The bytes/param :class:`Recipe` of precision recipe ``name`` (table in the module doc)."""
    try:
        return MODEL_STATE[name]
    except KeyError:
        raise KeyError(
            f"no precision recipe {name!r}; choose one of {sorted(MODEL_STATE)}"
        ) from None


def activation_bytes_per_element(
    storage: str, granularity: str = "tensor", numel: int = 1 << 20, row: int = 4096
) -> float:
    """Bytes per saved activation element in ``storage`` (fp32, bf16, fp16, fp8, mxfp8, nvfp4),
    scales included: fp8 ``granularity`` "tensor" adds 4 B per ``numel``, "row" 4 B per ``row``
    elements, "tile" 4 B per 128; mxfp8 1 B per 32; nvfp4 1 B per 16 (+ 4 B per tensor)."""
    if storage not in _ELEMENT_BYTES:
        raise KeyError(f"no storage {storage!r}; choose one of {sorted(_ELEMENT_BYTES)}")
    base = _ELEMENT_BYTES[storage]
    if storage == "fp8":
        per = {"tensor": numel, "row": row, "tile": 128}
        if granularity not in per:
            raise ValueError(f"granularity {granularity!r}: choose one of {sorted(per)}")
        return base + 4 / per[granularity]
    if storage == "mxfp8":
        return base + 1 / 32
    if storage == "nvfp4":
        return base + 1 / 16 + 4 / numel
    return base


def bytes_per_param_table() -> list[dict]:
    """Rows of (recipe, params, grads, optimizer, total, vs the 16 B/param baseline)."""
    return [
        {
            "recipe": name,
            "param": r.param_bytes,
            "grad": r.grad_bytes,
            "optimizer": r.optimizer_bytes,
            "total": r.bytes_per_param,
            "vs_baseline": r.bytes_per_param / BASELINE_BYTES_PER_PARAM,
        }
        for name, r in MODEL_STATE.items()
    ]
