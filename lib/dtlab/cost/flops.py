"""Transformer training FLOPs, model FLOPs utilization (MFU), and a GPT's exact parameter count.

**6N per token.** A matrix multiply of an ``(1 × k)`` activation row by a ``(k × m)`` weight costs
``2km`` FLOPs (a multiply and an add per weight), so the forward pass costs about ``2N`` FLOPs per
token for ``N`` parameters. The backward pass computes two products per weight — the gradient
with respect to the input (to keep backpropagating) and with respect to the weight — so ``4N``.
Training is therefore ``6N`` FLOPs per token (Kaplan et al. 2020, "Scaling Laws for Neural
Language Models", Sec. 2.1; Hoffmann et al. 2022, "Training Compute-Optimal Large Language
Models" (Chinchilla), which uses ``C ≈ 6ND``).

**The attention term.** The score product ``QKᵀ`` has no parameters but costs ``2·s·d`` FLOPs per
token per layer forward (``s`` = context length, ``d`` = model width). Kaplan et al. add it as
``2·n_layers·s·d`` forward, i.e. ``6·n_layers·s·d`` for training, which is what
:func:`flops_per_token` adds when given ``n_layers``, ``seq_len`` and ``d_model``. (PaLM,
Chowdhery et al. 2022, App. B, also counts the attention-weighted sum of ``V``, doubling it to
``12·n_layers·s·d``.) Relative to ``6N ≈ 6·12·n_layers·d²`` it is ``s/(12·d)``: 11% for
GPT-2 small (s = 1024, d = 768), and it dominates for long contexts.

**Recomputation.** Full activation checkpointing runs the forward pass a second time during
backward: ``2N + 2N + 4N = 8N`` FLOPs per token (and ``8·n_layers·s·d`` for attention).

**MFU vs HFU.** Model FLOPs utilization (Chowdhery et al. 2022, Sec. 4.1) counts only the FLOPs the
model *needs* (``6N``, no recomputation) against the hardware peak, so it cannot be inflated by
doing extra work; hardware FLOPs utilization counts what was executed (``8N`` with recompute).
"""

from __future__ import annotations

SECONDS_PER_DAY = 86_400


def flops_per_token(
    n_params: float,
    n_layers: int = 0,
    seq_len: int = 0,
    d_model: int = 0,
    recompute: bool = False,
) -> float:
    """Training FLOPs per token: ``6N (+ 6·n_layers·seq_len·d_model)``; ``8N (+ 8·…)`` with recompute.

    Leave ``n_layers``/``seq_len``/``d_model`` at 0 for the plain ``6N`` rule.
    """
    if n_params < 0 or min(n_layers, seq_len, d_model) < 0:
        raise ValueError("parameter count and model sizes must be >= 0")
    passes = 8 if recompute else 6  # forward 2 + backward 4 (+ a second forward 2)
    return passes * n_params + passes * n_layers * seq_len * d_model


def training_flops(
    total_tokens: float,
    n_params: float,
    n_layers: int = 0,
    seq_len: int = 0,
    d_model: int = 0,
    recompute: bool = False,
) -> float:
    """Total training FLOPs: ``flops_per_token · total_tokens`` (``C ≈ 6ND``)."""
    return flops_per_token(n_params, n_layers, seq_len, d_model, recompute) * total_tokens


def model_flops_utilization(
    tokens_per_s: float,
    n_params: float,
    peak_flops: float,
    n_gpus: int = 1,
    n_layers: int = 0,
    seq_len: int = 0,
    d_model: int = 0,
) -> float:
    """MFU: model FLOPs achieved over peak, as a fraction in [0, 1].

    ``tokens_per_s`` is the throughput of the whole job (all ``n_gpus`` together) and
    ``peak_flops`` the per-GPU dense peak (e.g. ``dtlab.cost.hardware.H100_SXM.bf16_dense_flops``).
    Recomputation is deliberately not counted (see module docstring).
    """
    if peak_flops <= 0 or n_gpus < 1:
        raise ValueError(f"peak_flops={peak_flops} must be > 0 and n_gpus={n_gpus} >= 1")
    achieved = tokens_per_s * flops_per_token(n_params, n_layers, seq_len, d_model)
    return achieved / (peak_flops * n_gpus)


def hardware_flops_utilization(
    tokens_per_s: float,
    n_params: float,
    peak_flops: float,
    n_gpus: int = 1,
    recompute: bool = True,
    n_layers: int = 0,
    seq_len: int = 0,
    d_model: int = 0,
) -> float:
    """HFU: FLOPs actually executed (``8N`` per token with full recompute) over peak."""
    if peak_flops <= 0 or n_gpus < 1:
        raise ValueError(f"peak_flops={peak_flops} must be > 0 and n_gpus={n_gpus} >= 1")
    executed = tokens_per_s * flops_per_token(n_params, n_layers, seq_len, d_model, recompute)
    return executed / (peak_flops * n_gpus)


def training_days(
    total_tokens: float,
    n_params: float,
    n_gpus: int,
    peak_flops: float,
    mfu: float,
) -> float:
    """Wall-clock days to train on ``total_tokens``: ``6·N·D / (n_gpus · peak · mfu) / 86400``."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu={mfu} must be a fraction in (0, 1], e.g. 0.4 for 40%")
    if peak_flops <= 0 or n_gpus < 1:
        raise ValueError(f"peak_flops={peak_flops} must be > 0 and n_gpus={n_gpus} >= 1")
    seconds = training_flops(total_tokens, n_params) / (n_gpus * peak_flops * mfu)
    return seconds / SECONDS_PER_DAY


def gpt_param_count(
    n_layers: int,
    d_model: int,
    vocab_size: int,
    seq_len: int,
    d_ff: int | None = None,
    tie_embeddings: bool = True,
    bias: bool = True,
    kv_width: int | None = None,
) -> int:
    """The exact number of parameters of ``dtlab.models.GPT`` with this shape.

    Per block: attention ``4·d²`` (q, k, v, out projections) + MLP ``2·d·d_ff`` (``8d²`` when
    ``d_ff = 4d``) — the familiar ``12·d²`` — plus biases ``4d + d_ff + d`` and two LayerNorms
    (``2d`` each, ``d`` without bias). Outside the blocks: token embedding ``vocab·d``, learned
    positions ``seq_len·d``, the final LayerNorm, and an untied LM head ``vocab·d`` (a tied head
    shares the embedding's matrix and adds nothing). GPT-2 small: 124,439,808.

    Grouped-query attention (Ainslie et al. 2023) narrows the k and v projections to
    ``kv_width = n_kv_heads · head_dim`` outputs: attention is then ``2·d² + 2·d·kv_width``.
    """
    d_ff = 4 * d_model if d_ff is None else d_ff
    kv_width = d_model if kv_width is None else kv_width
    norm = 2 * d_model if bias else d_model
    attention = 2 * d_model * (d_model + kv_width) + (2 * (d_model + kv_width) if bias else 0)
    mlp = 2 * d_model * d_ff + ((d_ff + d_model) if bias else 0)
    per_block = attention + mlp + 2 * norm
    embeddings = vocab_size * d_model + seq_len * d_model
    head = 0 if tie_embeddings else vocab_size * d_model
    return n_layers * per_block + embeddings + norm + head


def gpt_param_count_approx(n_layers: int, d_model: int, vocab_size: int) -> int:
    """The back-of-the-envelope count ``12·n_layers·d² + vocab·d`` (tied embeddings, no biases)."""
    return 12 * n_layers * d_model * d_model + vocab_size * d_model


def tokens_per_second_at_mfu(mfu: float, n_params: float, n_gpus: int, peak_flops: float) -> float:
    """The throughput at which a run's ``6N``-only MFU equals ``mfu``: ``mfu · n_gpus · peak / 6N``."""
    if not 0 < mfu <= 1 or n_params <= 0 or n_gpus < 1 or peak_flops <= 0:
        raise ValueError("need 0 < mfu <= 1, n_params > 0, n_gpus >= 1 and peak_flops > 0")
    return mfu * n_gpus * peak_flops / (6 * n_params)
