"""What tensor parallelism holds and moves per rank, in closed form — for the lab GPT exactly.

**Communication per transformer layer per pass** (Shoeybi et al. 2019; Korthikanti et al.
2022, §4.2.2), for the layer's ``b·s·h``-element input and ``e`` bytes per element:

===========  ==============================================  ================================
             collectives, forward (backward: the same)        bytes each rank sends
===========  ==============================================  ================================
TP           2 all-reduces of ``b·s·h``                       ``2 · 2(t-1)/t · b·s·h·e``
TP + SP      2 all-gathers + 2 reduce-scatters of ``b·s·h``   ``2 · 2(t-1)/t · b·s·h·e`` too
===========  ==============================================  ================================

**Parameters per rank.** Every weight matrix and the vocabulary split ``t`` ways; the
row-parallel biases, LayerNorms and learned positions are replicated:
``Ψ_t = (matrices + column biases + V_t·d)/t + replicated``, where ``V_t`` is the vocabulary
padded to a multiple of ``t`` (:func:`~dtlab.parallel.tensor.embedding.padded_vocab_size`).

**Activations per layer** (what autograd saves for backward). Korthikanti et al.'s
``s·b·h·(34 + 5·a·s/h)`` bytes (:func:`dtlab.memory.activation_bytes_per_layer`) counts a
16-bit layer *with dropout* (three dropout masks and a dropout output). The lab GPT at
``dropout=0`` (no masks) keeps, in elements of its own dtype (``u = t`` with SP, else 1):

==================================  ====================  =================================
saved tensor                        elements              Korthikanti's term (no dropout)
==================================  ====================  =================================
two LayerNorm inputs                ``2·sbh/u``           4sbh (2 bytes each)
attention and MLP inputs            ``2·sbh``             4sbh → ``/t`` with SP, see below
q, k, v; out_proj's input           ``4·sbh/t``           8sbh/t
softmax output                      ``a·s²·b/t``          2as²b/t
GELU input and output               ``2·s·b·d_ff/t``      16sbh/t at d_ff = 4h
LayerNorm mean and rstd             ``4·s·b/u``           — (too small to list)
causal mask (bool, 1 byte each)     ``s²`` bytes           —
==================================  ====================  =================================

The one real difference is the row marked "see below": with SP we keep the *gathered* inputs
of the two regions (``2·sbh``, as DTensor's ``SequenceParallel`` + ``PrepareModuleInput`` do);
Korthikanti et al. store the ``sbh/t`` shard and all-gather it again in backward, one more
all-gather per region, to reach ``34·sbh/t``.
"""

from __future__ import annotations


def comm_bytes_per_layer(
    batch: int, seq: int, d_model: int, tp: int, sequence_parallel: bool, bytes_per_element=4
) -> dict[str, int]:
    """Bytes one rank sends per layer per pass (forward, or backward), by collective."""
    elements = batch * seq * d_model
    if sequence_parallel:
        one = (tp - 1) * elements * bytes_per_element // tp
        return {"all_gather": 2 * one, "reduce_scatter": 2 * one}
    return {"all_reduce": 2 * 2 * (tp - 1) * elements * bytes_per_element // tp}


def params_per_rank(config, tp: int) -> int:
    """Parameters one tensor-parallel rank holds of ``GPT(config)`` (tied head counted once).

    At ``tp=1`` this is :meth:`GPTConfig.num_params`; a vocabulary ``tp`` does not divide is
    counted padded, as :func:`~dtlab.parallel.tensor.parallelize_gpt` holds it.
    """

    d, kv, ff, bias = config.d_model, config.kv_width, config.d_ff, config.bias
    norm = 2 * d if bias else d
    sharded_per_block = 2 * d * d + 2 * d * kv + 2 * d * ff + ((d + 2 * kv + ff) if bias else 0)
    replicated_per_block = 2 * norm + (2 * d if bias else 0)  # + out_proj and fc_out biases
    padded_vocab = -(-config.vocab_size // tp) * tp  # embedding.padded_vocab_size
    vocab = padded_vocab * d * (1 if config.tie_embeddings else 2)
    sharded = config.n_layers * sharded_per_block + vocab
    replicated = config.n_layers * replicated_per_block + config.seq_len * d + norm
    return sharded // tp + replicated


def activation_bytes_per_layer(
    config, batch: int, seq: int, tp: int, sequence_parallel: bool, bytes_per_element: int = 4
) -> int:
    """Bytes one rank's layer saves for backward: exact for the lab GPT (table above).

    Holds for multi-head attention (``n_kv_heads == n_heads``: with GQA the core saves the
    repeated k and v) and ``dropout=0`` (no masks), which this refuses otherwise.
    """
    if config.n_kv_heads != config.n_heads or config.dropout:
        raise ValueError(
            "the exact count covers multi-head attention without dropout; set "
            "n_kv_heads=None and dropout=0 (GQA saves repeated k/v, dropout saves masks)"
        )
    b, s, h, a, t = batch, seq, config.d_model, config.n_heads, tp
    u = t if sequence_parallel else 1
    sbh = s * b * h
    elements = (
        2 * sbh // u  # LayerNorm inputs
        + 2 * sbh  # the regions' (gathered) inputs, saved by q/k/v and fc_in
        + 4 * sbh // t  # q, k, v, out_proj input
        + a * s * s * b // t  # softmax output
        + 2 * s * b * config.d_ff // t  # GELU input, fc_out input
        + 4 * s * b // u  # LayerNorm mean and rstd
    )
    return elements * bytes_per_element + s * s  # + the causal mask, one byte per entry


def korthikanti_without_dropout(
    batch: int, seq: int, d_model: int, n_heads: int, tp: int, sequence_parallel: bool
) -> int:
    """Korthikanti et al.'s 16-bit bytes per layer minus what dropout stores there: two 1-byte
    residual masks (``2·sbh``, ``/t`` with SP), the attention mask (``a·s²·b/t``) and the
    2-byte dropout output (``2·a·s²·b/t``). In elements: ``(4 + 12/t)·sbh + a·s²·b/t`` (TP),
    ``16·sbh/t + a·s²·b/t`` (SP)."""
    from dtlab.memory import activation_bytes_per_layer as korthikanti

    b, s, h, a, t = batch, seq, d_model, n_heads, tp
    full = korthikanti(s, b, h, a, tensor_parallel=t, sequence_parallel=sequence_parallel)
    masks = 2 * s * b * h // (t if sequence_parallel else 1)
    return full - masks - 3 * a * s * s * b // t
