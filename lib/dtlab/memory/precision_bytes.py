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

Activations per layer: a transformer layer's four GEMMs save their inputs — the QKV input
(``sbh``), the attention output projection's (``sbh``), the MLP's up (``sbh``) and down
(``(d_ff/h)·sbh``) inputs: ``14·sbh`` of Korthikanti et al.'s 16-bit ``34·sbh``.
:func:`gemm_input_bytes_per_layer` prices them in any storage (an FP8 layer also saves its FP8
weight, 1 B/param, and every scale), and :func:`activation_bytes_per_layer_for` swaps them into
:func:`~dtlab.memory.formulas.activation_bytes_per_layer`. Separate ``q/k/v`` projections (the
lab GPT) share one 16-bit input but quantise it three times: ``qkv_copies=3``. FP8 saves
``7·sbh`` bytes on the inputs but keeps ``12h²`` bytes of FP8 weights per layer, so it shrinks
activations only past about ``12h/7 ≈ 1.7·h`` tokens per micro-batch (tests measure both).
"""

from __future__ import annotations

import math

from dtlab.memory.formulas import RECIPES, Recipe, activation_bytes_per_layer

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


def _scale_count(rows: int, cols: int, granularity: str, block: tuple[int, int]) -> int:
    """fp32 scales of one (rows × cols) FP8 operand at ``granularity``."""
    if granularity == "tensor":
        return 1
    if granularity == "row":
        return rows
    return math.ceil(rows / block[0]) * math.ceil(cols / block[1])


def gemm_input_bytes_per_layer(
    seq_len: int,
    batch_size: int,
    d_model: int,
    d_ff: int,
    storage: str,
    granularity: str = "tensor",
    qkv_copies: int = 1,
) -> int:
    """Bytes one layer's GEMMs save for backward: their inputs in ``storage`` (fp32, bf16,
    fp16, fp8) and, for fp8, each input's scales plus the FP8 weight copies of ``q, k, v, out,
    up, down`` and their scales (what :class:`~dtlab.precision.Fp8Linear` saves; tiles 1×128 for
    inputs, 128×128 for weights). ``qkv_copies``: saved copies of the shared QKV input (1 in
    16/32-bit, where the projections save the same tensor; 3 for separate FP8 q/k/v)."""
    tokens, h = seq_len * batch_size, d_model
    # (features, saved copies) of each GEMM input: QKV, attention output, MLP up, MLP down
    inputs = [(h, qkv_copies if storage == "fp8" else 1), (h, 1), (h, 1), (d_ff, 1)]
    if storage != "fp8":
        if storage not in ("fp32", "bf16", "fp16"):
            raise KeyError(f"GEMM inputs in {storage!r}: choose fp32, bf16, fp16 or fp8")
        return int(sum(tokens * k * c for k, c in inputs) * _ELEMENT_BYTES[storage])
    if granularity not in ("tensor", "row", "tile"):
        raise ValueError(f"granularity {granularity!r}: choose tensor, row or tile")
    total = sum(c * (tokens * k + 4 * _scale_count(tokens, k, granularity, (1, 128)))
                for k, c in inputs)  # fmt: skip
    weights = [(h, h)] * 4 + [(d_ff, h), (h, d_ff)]  # (out, in): q, k, v, out, up, down
    total += sum(n * k + 4 * _scale_count(n, k, granularity, (128, 128)) for n, k in weights)
    return total


def activation_bytes_per_layer_for(
    storage: str,
    seq_len: int,
    batch_size: int,
    d_model: int,
    n_heads: int,
    granularity: str = "tensor",
    **kwargs,
) -> int:
    """Korthikanti's per-layer activation bytes (16-bit, ``d_ff = 4h``, fused QKV) with the
    GEMM inputs (``14·sbh``) stored in ``storage`` instead (the rest stays 16-bit)."""
    base = activation_bytes_per_layer(seq_len, batch_size, d_model, n_heads, **kwargs)
    if kwargs.get("recompute", "none") == "full" or kwargs.get("tensor_parallel", 1) != 1:
        raise ValueError("per-recipe GEMM inputs are priced without TP and without full recompute")
    sixteen_bit = gemm_input_bytes_per_layer(seq_len, batch_size, d_model, 4 * d_model, "bf16")
    mine = gemm_input_bytes_per_layer(
        seq_len, batch_size, d_model, 4 * d_model, storage, granularity
    )
    return base - sixteen_bit + mine
