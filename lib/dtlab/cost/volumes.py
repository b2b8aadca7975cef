"""Bytes on the wire per parallelism axis: DP, TP, SP, PP, CP (ring/Ulysses), EP (MoE), checkpoints.

Every function returns what **one rank sends** (it receives the same amount) for one transformer
layer or one training step, so the numbers can be compared across axes and with the link
bandwidths of :mod:`dtlab.cost.hardware`. Sizes: ``s`` sequence length, ``b`` micro-batch size,
``h`` hidden size, ``e`` bytes per element (2 for bf16), ``t``/``c``/``p`` the TP/CP/EP degree.
Collectives are costed as rings (:mod:`dtlab.cost.bandwidth`): an all-reduce of ``M`` bytes sends
``2(n-1)/n·M`` per rank, an all-gather or reduce-scatter of the full ``M`` sends ``(n-1)/n·M``,
an all-to-all of a per-rank buffer ``M`` sends the ``(n-1)/n`` of it that leaves the rank.

* **Data parallel** (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data
  Parallel Training"): one all-reduce of the gradients per optimizer step; gradient accumulation
  under ``no_sync()`` keeps it at one per step instead of one per micro-batch.
* **Tensor parallel** (Shoeybi et al. 2019, "Megatron-LM", Sec. 3): per layer, the ``g`` operator
  all-reduces the ``s·b·h`` output of the attention block and of the MLP block in forward, and the
  conjugate ``f`` all-reduces the input gradients in backward: **4 all-reduces of s·b·h**.
* **Sequence parallel** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", Sec. 4.2.2): each all-reduce becomes a reduce-scatter plus an all-gather of
  the same tensor, so the bytes are **the same as TP**; what changes is activation memory.
* **Pipeline parallel** (Huang et al. 2019, GPipe; Narayanan et al. 2021, Megatron-LM 1F1B): a
  stage sends its ``s·b·h`` output activation forward and receives its gradient backward, once per
  micro-batch per stage boundary (``v`` times with ``v`` interleaved chunks per device).
* **Ring attention** (Liu et al. 2023, "Ring Attention with Blockwise Transformers"): each of the
  ``c-1`` steps passes this rank's current K and V blocks (``2·(s/c)·b·h_kv`` elements) on.
* **DeepSpeed-Ulysses** (Jacobs et al. 2023): all-to-alls turn sequence shards into head shards
  for Q, K, V before attention and back for the output: four all-to-alls per layer forward.
* **Expert parallel** (Lepikhin et al. 2020, GShard; Fedus et al. 2021, Switch Transformer): the
  dispatch all-to-all sends each token's hidden vector to its ``k`` experts' ranks and the combine
  all-to-all brings the results back; buffers padded to the capacity factor travel in full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _check_positive(**values: float) -> None:
    bad = {name: v for name, v in values.items() if v is None or v < 1}
    if bad:
        names = ", ".join(f"{k}={v}" for k, v in bad.items())
        raise ValueError(f"{names}: sizes and parallel degrees must be >= 1")


def _ring_share(n: int) -> float:
    """The ``(n-1)/n`` of a buffer that leaves a rank in a ring all-gather/reduce-scatter."""
    return (n - 1) / n


def parameter_bytes(num_params: float, bytes_per_elem: float = 2, shards: int = 1) -> float:
    """Bytes of ``num_params`` values at ``bytes_per_elem`` each, split evenly over ``shards``."""
    _check_positive(shards=shards)
    if num_params < 0 or bytes_per_elem <= 0:
        raise ValueError("num_params must be >= 0 and bytes_per_elem > 0")
    return num_params * bytes_per_elem / shards


# ---------------------------------------------------------------------------- data parallel


def dp_allreduce_bytes_per_rank(num_params: float, dp: int, bytes_per_elem: float = 2) -> float:
    """Bytes one rank sends for one ring all-reduce of the gradients: ``2(N-1)/N · Ψ · e``."""
    _check_positive(dp=dp)
    return 2 * _ring_share(dp) * parameter_bytes(num_params, bytes_per_elem)


def dp_bytes_per_optimizer_step(
    num_params: float,
    dp: int,
    accumulation_steps: int = 1,
    no_sync: bool = True,
    bytes_per_elem: float = 2,
) -> float:
    """Gradient bytes one rank sends per optimizer step with ``accumulation_steps`` micro-batches.

    Under DDP's ``no_sync()`` only the last micro-batch all-reduces (one all-reduce per step);
    without it every backward pass all-reduces, ``accumulation_steps`` times the traffic for the
    same update.
    """
    _check_positive(accumulation_steps=accumulation_steps)
    reductions = 1 if no_sync else accumulation_steps
    return reductions * dp_allreduce_bytes_per_rank(num_params, dp, bytes_per_elem)


def accumulation_steps_for_batch(global_batch: float, micro_batch: float, dp: int) -> int:
    """Micro-batches per rank per optimizer step to reach ``global_batch``: ``ceil(B / (b·DP))``.

    Any unit works as long as both batches use it (sequences or tokens).
    """
    _check_positive(global_batch=global_batch, micro_batch=micro_batch, dp=dp)
    return math.ceil(global_batch / (micro_batch * dp) - 1e-9)


# ------------------------------------------------------------------- tensor / sequence parallel


@dataclass(frozen=True)
class LayerCommVolume:
    """Collectives of one transformer layer for one micro-batch, and the bytes one rank sends.

    ``payload_bytes`` is the full (unsharded) tensor each collective is about, ``s·b·h·e``.
    """

    collectives: int
    payload_bytes: float
    bytes_sent_per_rank: float


def tp_allreduce_volume_per_layer(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    tp: int,
    bytes_per_elem: float = 2,
    backward: bool = True,
) -> LayerCommVolume:
    """Megatron TP: 2 all-reduces of ``s·b·h`` forward (attention, MLP) + 2 backward.

    Each ring all-reduce sends ``2(t-1)/t · s·b·h·e`` per rank.
    """
    _check_positive(seq_len=seq_len, micro_batch=micro_batch, hidden=hidden, tp=tp)
    count = 4 if backward else 2
    payload = seq_len * micro_batch * hidden * bytes_per_elem
    return LayerCommVolume(count, payload, count * 2 * _ring_share(tp) * payload)


def sp_collective_volume_per_layer(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    tp: int,
    bytes_per_elem: float = 2,
    backward: bool = True,
) -> LayerCommVolume:
    """Megatron TP + sequence parallel: every all-reduce becomes reduce-scatter + all-gather.

    Forward: 2 all-gathers (into attention and MLP) + 2 reduce-scatters (out of them); backward
    the same again, so 8 collectives each sending ``(t-1)/t · s·b·h·e``: equal to plain TP
    (Korthikanti et al. 2022, Sec. 4.2.2). Megatron-LM's implementation adds two more in
    backward, re-gathering the LayerNorm outputs it stored sharded; the planner counts them
    (:data:`dtlab.plan.wire.SP_BACKWARD_REGATHERS`), this textbook count does not.
    """
    _check_positive(seq_len=seq_len, micro_batch=micro_batch, hidden=hidden, tp=tp)
    count = 8 if backward else 4
    payload = seq_len * micro_batch * hidden * bytes_per_elem
    return LayerCommVolume(count, payload, count * _ring_share(tp) * payload)


# ------------------------------------------------------------------------ pipeline parallel


def pipeline_p2p_bytes_per_microbatch(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    bytes_per_elem: float = 2,
    tp: int = 1,
    scatter_gather: bool = False,
) -> float:
    """Bytes a stage sends to the next one for one micro-batch's forward activation: ``s·b·h·e``.

    The backward gradient coming back is the same size. With TP, every TP rank holds the full
    activation; Megatron's scatter/gather optimisation sends only ``1/t`` of it per TP rank and
    all-gathers over NVLink on the other side (Narayanan et al. 2021, Sec. 4.1).
    """
    _check_positive(seq_len=seq_len, micro_batch=micro_batch, hidden=hidden, tp=tp)
    full = seq_len * micro_batch * hidden * bytes_per_elem
    return full / tp if scatter_gather else full


def pipeline_p2p_bytes_per_step(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    micro_batches: int,
    virtual_stages: int = 1,
    bytes_per_elem: float = 2,
) -> float:
    """Bytes a (middle) stage sends per step: activations forward + gradients backward.

    ``2 · v · m · s·b·h·e``: each of the ``m`` micro-batches crosses each device boundary once per
    direction, and ``v`` times with interleaved 1F1B's ``v`` model chunks per device.
    """
    _check_positive(micro_batches=micro_batches, virtual_stages=virtual_stages)
    one = pipeline_p2p_bytes_per_microbatch(seq_len, micro_batch, hidden, bytes_per_elem)
    return 2 * virtual_stages * micro_batches * one


# ------------------------------------------------------------------------ context parallel


@dataclass(frozen=True)
class RingAttentionVolume:
    """One attention layer's forward pass under ring attention, for one rank."""

    steps: int
    bytes_per_step: float
    bytes_sent_per_rank: float


def ring_attention_kv_bytes(
    seq_len: int,
    micro_batch: int,
    kv_hidden: int,
    cp: int,
    bytes_per_elem: float = 2,
) -> RingAttentionVolume:
    """Ring attention forward: ``c-1`` steps, each sending the K and V blocks a rank holds.

    ``kv_hidden`` is ``n_kv_heads · head_dim`` (equal to ``h`` without grouped-query attention).
    Per step ``2 · (s/c) · b · kv_hidden · e`` bytes; the backward pass circulates K and V again
    together with their gradients.
    """
    _check_positive(seq_len=seq_len, micro_batch=micro_batch, kv_hidden=kv_hidden, cp=cp)
    if seq_len % cp:
        raise ValueError(f"CP degree {cp} does not divide sequence length {seq_len}")
    per_step = 2 * (seq_len // cp) * micro_batch * kv_hidden * bytes_per_elem
    return RingAttentionVolume(cp - 1, per_step, (cp - 1) * per_step)


def ulysses_all_to_all_bytes(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    cp: int,
    kv_hidden: int | None = None,
    bytes_per_elem: float = 2,
) -> float:
    """DeepSpeed-Ulysses forward, one layer: all-to-alls of Q, K, V in and of the output back.

    A rank holds ``s/c`` tokens of each tensor and keeps ``1/c`` of it:
    ``(c-1)/c · (s/c) · b · (2h + 2·kv_hidden) · e`` bytes sent. The head count must be divisible
    by ``c``: Ulysses' parallel degree is capped by the number of (KV) heads.
    """
    _check_positive(seq_len=seq_len, micro_batch=micro_batch, hidden=hidden, cp=cp)
    kv = hidden if kv_hidden is None else kv_hidden
    local_tokens = seq_len / cp * micro_batch
    return _ring_share(cp) * local_tokens * (2 * hidden + 2 * kv) * bytes_per_elem


# ------------------------------------------------------------------------- expert parallel


@dataclass(frozen=True)
class ExpertParallelVolume:
    """The all-to-alls of one MoE layer for one rank."""

    all_to_alls: int
    bytes_per_all_to_all: float
    bytes_sent_per_rank: float


def moe_all_to_all_bytes_per_layer(
    tokens_per_rank: int,
    hidden: int,
    top_k: int,
    ep: int,
    capacity_factor: float = 1.0,
    bytes_per_elem: float = 2,
    backward: bool = True,
) -> ExpertParallelVolume:
    """Dispatch + combine (+ their two backward all-to-alls) of one MoE layer, per rank.

    Each token goes to ``k`` experts, so a rank's dispatch buffer holds ``capacity_factor · k · T``
    token slots of ``h`` values (padded slots travel too). Experts spread evenly over ``ep`` ranks
    and routing uniform, the ``(ep-1)/ep`` of it bound for other ranks is sent:
    ``cf · k · T · h · e · (ep-1)/ep`` per all-to-all.
    """
    _check_positive(tokens_per_rank=tokens_per_rank, hidden=hidden, top_k=top_k, ep=ep)
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor={capacity_factor} must be > 0 (1.0 = no headroom)")
    count = 4 if backward else 2
    per = capacity_factor * top_k * tokens_per_rank * hidden * bytes_per_elem * _ring_share(ep)
    return ExpertParallelVolume(count, per, count * per)


# ------------------------------------------------------------------------------ checkpoints


def checkpoint_bytes_per_rank(
    num_params: float, ranks: int = 1, bytes_per_param: float = 12
) -> float:
    """Bytes each rank writes for a restartable, sharded checkpoint.

    Mixed-precision Adam needs the fp32 master weights, momentum and variance: 12 bytes/param
    (the bf16 weights are a rounding of the master copy and the gradients are recomputed), split
    over ``ranks`` writers.
    """
    return parameter_bytes(num_params, bytes_per_param, ranks)


def checkpoint_write_seconds(
    num_params: float,
    ranks: int,
    write_bytes_per_s_per_rank: float,
    bytes_per_param: float = 12,
) -> float:
    """Seconds a synchronous sharded save blocks when every rank writes its shard in parallel."""
    if write_bytes_per_s_per_rank <= 0:
        raise ValueError("write bandwidth must be > 0 bytes/s")
    return (
        checkpoint_bytes_per_rank(num_params, ranks, bytes_per_param) / write_bytes_per_s_per_rank
    )
