"""Honest MFU: which FLOPs a utilisation number counts, side by side.

The same run can be reported as four different percentages:

* ``6N`` only (Kaplan et al. 2020): parameters' matmuls, no attention scores, no recompute;
* ``6N`` plus causal attention, ``6·L·s·d`` (the score and value products, half the square
  masked; this is :func:`dtlab.cost.flops.flops_per_token`'s attention term);
* ``6N`` plus full-square attention, ``12·L·s·d`` (PaLM, Chowdhery et al. 2022, App. B counts the
  full square even for a causal model);
* hardware FLOPs with full recomputation, ``8N + 16·L·s·d``: what the GPUs executed (HFU). PaLM
  reports 46.2% MFU and 57.8% HFU for the same run; Megatron-LM's ``96·B·s·l·h²`` formula
  (Narayanan et al. 2021) counts the recomputed forward, so its "% of peak" is an HFU.

MFU as PaLM defines it is the useful work a model needs (no recompute) against peak: say which
attention convention and which peak (dense, not the 2:4-sparse figure).
"""

from __future__ import annotations


def mfu_report(
    tokens_per_s: float,
    n_gpus: int,
    peak_flops: float,
    n_params: float,
    n_layers: int,
    seq_len: int,
    d_model: int,
) -> dict[str, float]:
    """Utilisation of one run under each convention (fractions of ``n_gpus · peak_flops``)."""
    if min(tokens_per_s, n_gpus, peak_flops, n_params) <= 0 or min(n_layers, seq_len, d_model) < 0:
        raise ValueError("throughput, GPUs, peak and parameters must be > 0; sizes >= 0")
    peak = n_gpus * peak_flops
    attention = n_layers * seq_len * d_model
    per_token = {
        "mfu_6n": 6 * n_params,
        "mfu_causal_attention": 6 * n_params + 6 * attention,
        "mfu_full_attention": 6 * n_params + 12 * attention,
        "hfu_recompute_full_attention": 8 * n_params + 16 * attention,
    }
    return {name: flops * tokens_per_s / peak for name, flops in per_token.items()}


def attention_flops_share(n_params: float, n_layers: int, seq_len: int, d_model: int) -> float:
    """Share of training FLOPs that causal attention adds: ``6Lsd / (6N + 6Lsd)``."""
    if n_params <= 0 or min(n_layers, seq_len, d_model) < 0:
        raise ValueError("parameters must be > 0 and sizes >= 0")
    attention = 6 * n_layers * seq_len * d_model
    return attention / (6 * n_params + attention)
