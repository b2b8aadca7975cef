"""Where one transformer layer's activation bytes go, by tensor family: measured and in formula.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", §4.1)
derive ``s·b·h·(34 + 5·a·s/h)`` bytes per layer by listing what each op saves for backward in a
16-bit Megatron layer with dropout. The same derivation for **the lab GPT** — element size ``e``
(4 in fp32), dropout masks of ``k`` bytes each, ``m = 1`` with dropout and 0 without, ``f = d_ff``,
tensor-parallel degree ``t`` and ``u = t`` with sequence parallelism (else 1) — gives, family by
family (bytes per layer):

===============  =======================================  ===================================
family           the lab GPT                              Korthikanti et al. (e = 2, f = 4h)
===============  =======================================  ===================================
layernorm        ``2·sbh·e/u`` (the two LN inputs)        ``4·sbh/u``
qkv              ``(sbh + 3·sbh/t)·e`` (input, q, k, v)   ``2·sbh/u + 6·sbh/t``
scores           ``a·s²·b·(e + m·(k + e))/t`` (softmax    ``5·a·s²·b/t``
                 output; dropout mask and output)
attention_out    ``sbh·e/t + m·k·sbh/u`` (out_proj input, ``2·sbh/t + sbh/u``
                 residual dropout mask)
mlp              ``(sbh + 2·s·b·f/t)·e + m·k·sbh/u``      ``2·sbh/u + 16·sbh/t + sbh/u``
                 (fc_in input, GELU input and output)
layernorm_stats  ``2·2·(sb/u)·4`` (fp32 mean and rstd)    — (too small to list)
causal_mask      ``s²`` (one bool per query/key pair)     — (Megatron fuses the mask)
===============  =======================================  ===================================

**The dropout mask's size depends on the kernel.** The fused kernel (``native_dropout``, used on
GPUs) saves a bool mask, ``k = 1`` as in Megatron; PyTorch's CPU path computes
``x · noise`` and saves the scaled noise in the activations' dtype, ``k = e``
(:func:`dropout_mask_bytes`). On CPU in fp32 the score family is therefore ``3·4 = 12`` bytes per
entry with dropout, where Korthikanti's fused 16-bit layer has ``2 + 1 + 2 = 5``.

At ``e = 2``, ``k = 1``, ``f = 4h``, ``t = 1`` with dropout the first five rows are Korthikanti's
``4 + 8 + 5·as/h + 3 + 19 = 34 + 5·as/h`` (times ``sbh``). Two differences under SP: the lab GPT
keeps the *gathered* input of each tensor-parallel region (``sbh·e`` in qkv and mlp, not
``/t``), where Megatron stores the shard and all-gathers again in backward.

Recomputation removes families: ``selective`` (recompute the attention core) drops ``scores``
and ``causal_mask`` — the core's inputs q, k, v are then what is kept, the same bytes as the
copies the core saved; ``full`` keeps only the block's input (``sbh·e/u``). Both recomputations
also keep the region's ``positions`` (int64, ``8·s`` bytes, one storage shared by every layer),
as ``torch.utils.checkpoint`` does.

:func:`measured_families` sorts what an :class:`~dtlab.memory.ActivationMeter` saw into the
same families, from each storage's saving module, dtype and shape — never from this formula.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from dtlab.memory.activations import SavedStorage

FAMILIES = (
    "layernorm",
    "qkv",
    "scores",
    "attention_out",
    "mlp",
    "layernorm_stats",
    "causal_mask",
    "block_input",
    "positions",
)
"""Tensor families of one layer, in plotting order (the last four are the lab GPT's only).
``positions`` holds every int64 index saved (positions; at model level also the token ids the
embedding saves); ``block_input`` whatever is saved outside the block's modules."""

RECOMPUTE_MODES = ("none", "selective", "full")


def dropout_mask_bytes(device: torch.device | str, bytes_per_element: int) -> int:
    """Bytes per element of a saved dropout mask: 1 (bool) with the fused kernel PyTorch uses on
    CUDA/XPU, the activations' element size on CPU (it saves the scaled noise tensor)."""
    kind = torch.device(device).type
    return 1 if kind in ("cuda", "xpu") else bytes_per_element


def _check(seq: int, batch: int, tp: int, d_model: int, n_heads: int, recompute: str) -> None:
    if min(seq, batch, tp) < 1:
        raise ValueError(f"seq={seq}, batch={batch} and tp={tp} must be >= 1")
    if n_heads % tp or d_model % tp:
        raise ValueError(f"tp={tp} must divide n_heads={n_heads} and d_model={d_model}")
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute={recompute!r}; choose one of {RECOMPUTE_MODES}")


def lab_layer_families(
    config,
    batch: int,
    seq: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    bytes_per_element: int = 4,
    recompute: str = "none",
    training: bool = True,
    mask_bytes: int | None = None,
) -> dict[str, int]:
    """Bytes one lab-GPT block saves for backward, by family (the module docstring's table).

    Exact for multi-head attention (``n_kv_heads == n_heads``; GQA saves repeated k/v) with the
    default :func:`~dtlab.models.attention.math_attention` core. Dropout masks count when
    ``training`` and ``config.dropout > 0``; ``bytes_per_element`` is the activations' dtype size
    (LayerNorm statistics are fp32 whatever it is); ``mask_bytes`` is a dropout mask's bytes
    per element (default: the CPU kernel's, ``bytes_per_element``; 1 on GPUs, see
    :func:`dropout_mask_bytes`).
    """
    if config.n_kv_heads != config.n_heads:
        raise ValueError("the count covers multi-head attention; set n_kv_heads=None")
    _check(seq, batch, tp, config.d_model, config.n_heads, recompute)
    s, b, h, a, t, e = seq, batch, config.d_model, config.n_heads, tp, bytes_per_element
    u = t if sequence_parallel else 1
    m = 1 if training and config.dropout > 0 else 0
    k = e if mask_bytes is None else mask_bytes
    sbh = s * b * h
    if sequence_parallel and s % t:
        raise ValueError(f"sequence parallelism needs tp={t} to divide seq={s}")
    out = dict.fromkeys(FAMILIES, 0)
    if recompute == "full":
        out["block_input"] = sbh * e // u
        out["positions"] = 8 * s
        return out
    out["layernorm"] = 2 * sbh * e // u
    out["qkv"] = (sbh + 3 * sbh // t) * e
    out["attention_out"] = sbh * e // t + m * k * sbh // u
    out["mlp"] = (sbh + 2 * s * b * config.d_ff // t) * e + m * k * sbh // u
    out["layernorm_stats"] = 2 * 2 * (s * b // u) * 4
    if recompute == "selective":
        out["positions"] = 8 * s
    else:
        out["scores"] = a * s * s * b * (e + m * (k + e)) // t
        out["causal_mask"] = s * s
    return out


def korthikanti_families(
    seq: int,
    batch: int,
    d_model: int,
    n_heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> dict[str, int]:
    """Korthikanti et al.'s 16-bit per-layer bytes (with dropout, ``d_ff = 4h``) by family.

    The families sum to :func:`dtlab.memory.activation_bytes_per_layer` with the same arguments.
    """
    _check(seq, batch, tp, d_model, n_heads, recompute)
    s, b, h, a, t = seq, batch, d_model, n_heads, tp
    u = t if sequence_parallel else 1
    sbh = s * b * h
    out = dict.fromkeys(FAMILIES, 0)
    if recompute == "full":
        out["block_input"] = 2 * sbh // u
        return out
    out["layernorm"] = 4 * sbh // u
    out["qkv"] = 2 * sbh // u + 6 * sbh // t
    out["attention_out"] = 2 * sbh // t + sbh // u
    out["mlp"] = 2 * sbh // u + 16 * sbh // t + sbh // u
    if recompute == "none":
        out["scores"] = 5 * a * s * s * b // t
    return out


def _family_in_attention(record: SavedStorage, seq: int, d_model: int) -> str:
    """Inside the attention module (its core and residual dropout), by dtype and shape."""
    shape = record.shape
    square = len(shape) >= 2 and shape[-1] == shape[-2] == seq
    leading = 1
    for n in shape[:-2]:
        leading *= n
    if record.dtype == torch.bool and square and leading == 1:
        return "causal_mask"
    if square:
        return "scores"  # softmax output, its dropout mask, the dropout output
    if record.dtype == torch.bool or shape[-1:] == (d_model,):
        return "attention_out"  # the residual dropout mask after out_proj, (b, s, h)
    return "qkv"  # q, k, v as the core's matmuls saved them


def family_of(record: SavedStorage, seq: int, d_model: int) -> str:
    """The family of one saved storage, from the module that saved it, its dtype and shape.

    ``seq`` is the attention's (full) sequence length and ``d_model`` the residual width: in the
    attention module a tensor ending in ``(seq, seq)`` is a score, one ending in ``d_model`` the
    residual dropout mask, anything else q, k or v (ending in ``seq`` or ``head_dim``).
    """
    leaf = record.module.rsplit(".", 1)[-1]
    if record.dtype == torch.int64:
        return "positions"
    if leaf.endswith("norm"):
        return "layernorm_stats" if record.shape[-1:] == (1,) else "layernorm"
    if leaf in ("q_proj", "k_proj", "v_proj"):
        return "qkv"
    if leaf == "out_proj":
        return "attention_out"
    if leaf in ("fc_in", "fc_out", "mlp"):
        return "mlp"
    if leaf == "attn" or leaf == "core":
        return _family_in_attention(record, seq, d_model)
    return "block_input"


def measured_families(
    records: Iterable[SavedStorage], seq: int, d_model: int, head_dim: int
) -> dict[str, int]:
    """Sum measured storages (:attr:`ActivationMeter.records`) by family; every byte lands once.

    Shapes tell the families apart only when ``seq``, ``d_model`` and ``head_dim`` differ.
    """
    if len({seq, d_model, head_dim}) < 3:
        raise ValueError(
            f"seq={seq}, d_model={d_model} and head_dim={head_dim} must all differ so that "
            "scores, residual-width and per-head tensors are told apart by shape; change seq"
        )
    out = dict.fromkeys(FAMILIES, 0)
    for record in records:
        out[family_of(record, seq, d_model)] += record.nbytes
    return out
