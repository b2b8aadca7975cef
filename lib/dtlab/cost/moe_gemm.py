"""Tokens per expert and expert-GEMM efficiency, and what spreading experts over ranks moves:
tokens (expert parallelism) or weights (FSDP-sharded experts).

Expert parallelism gathers every rank's rows for an expert onto the rank that holds it, so an
expert's GEMM sees ``ep`` times the rows it would see if every rank ran every expert on its own
tokens (:func:`rows_per_expert`). That matters because a thin GEMM is memory-bound: its weight is
read once per call however few rows use it, and its arithmetic intensity is about the number of
rows (:func:`expert_gemm_intensity`); below the GPU's ridge point (:func:`ridge_rows`) it runs at
HBM speed, not tensor-core speed. Grouped GEMMs (one launch for all local experts) fix the launch
overhead, not the intensity.

Sharding the experts with FSDP instead keeps each rank's tokens home and moves the weights: the
whole expert weight set gathered for forward, again for backward, gradients reduce-scattered,
every step, whatever the batch (:func:`ep_vs_fsdp_expert_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.cost.hardware import GPUS


def rows_per_expert(tokens_per_rank: int, top_k: int, n_experts: int, ep: int) -> float:
    """Rows one expert's GEMM sees per layer and micro-batch under balanced routing: each of the
    ``ep`` ranks routes ``T·k/E`` of its assignments to it, and EP brings them to one rank, so
    ``ep · T · k / E``. Without EP (experts replicated, or FSDP-sharded and gathered) every rank
    runs every expert on its own ``T·k/E`` rows: EP multiplies the rows per GEMM by ``ep``."""
    if ep < 1 or n_experts % ep:
        raise ValueError(f"ep={ep} must divide n_experts={n_experts}")
    return ep * tokens_per_rank * top_k / n_experts


def expert_gemm_intensity(
    rows: float, d_model: int, d_expert: int, bytes_per_elem: float = 2
) -> float:
    """Arithmetic intensity (FLOP per byte of memory traffic) of one expert GEMM
    ``(rows × d_model) · (d_model × d_expert)``: ``2·m·d·h`` FLOPs over reading the input and the
    weight and writing the output once, ``(m·d + d·h + m·h)·e`` bytes. For ``m ≪ d, h`` it is
    about ``m`` FLOP/B (bf16): a GEMM is compute-bound only once its rows pass the GPU's ridge
    point (:func:`ridge_rows`)."""
    flops = 2 * rows * d_model * d_expert
    moved = (rows * d_model + d_model * d_expert + rows * d_expert) * bytes_per_elem
    return flops / moved


def ridge_rows(gpu: str, d_model: int, d_expert: int, bytes_per_elem: float = 2) -> int:
    """The fewest rows per expert at which the GEMM's intensity reaches ``gpu``'s ridge point
    (dense BF16 FLOP/s ÷ HBM bytes/s): below it the expert GEMM is memory-bound."""
    spec = GPUS[gpu]
    ridge = spec.bf16_dense_flops / spec.hbm_bandwidth_bytes_per_s
    rows = 1
    while expert_gemm_intensity(rows, d_model, d_expert, bytes_per_elem) < ridge:
        rows *= 2
    low = rows // 2
    while low + 1 < rows:  # bisect between the last power of two below and the first above
        mid = (low + rows) // 2
        if expert_gemm_intensity(mid, d_model, d_expert, bytes_per_elem) < ridge:
            low = mid
        else:
            rows = mid
    return rows


@dataclass(frozen=True)
class ExpertSharding:
    """Bytes one rank sends per MoE layer and training step (forward and backward) to spread the
    experts over ``degree`` ranks: as EP (tokens move) or as FSDP shards (weights move)."""

    ep_bytes: float  # dispatch + combine, forward and backward: 4 · (deg−1)/deg · T·k·d·e
    fsdp_bytes: float  # all-gather forward + all-gather backward + reduce-scatter of gradients

    @property
    def fsdp_over_ep(self) -> float:
        return self.fsdp_bytes / self.ep_bytes


def ep_vs_fsdp_expert_bytes(
    tokens_per_rank: int,
    d_model: int,
    d_expert: int,
    n_experts: int,
    top_k: int,
    degree: int,
    bytes_per_elem: float = 2,
    matrices: int = 2,
) -> ExpertSharding:
    """Uniform routing. EP: each token's ``k`` rows go out and come back, forward and backward,
    a share ``(deg−1)/deg`` of them to other ranks. FSDP: the ``E·matrices·d·h`` expert
    weights are all-gathered before forward and again before backward, and their gradients
    reduce-scattered: three times ``(deg−1)/deg`` of the weights' bytes (the ring convention,
    :mod:`dtlab.comm.volumes`). ``matrices`` is 2 for ``fc_in``/``fc_out`` (3 with a gated
    MLP). The weights do not depend on the batch, the tokens do: EP wins unless a rank's batch
    is tiny."""
    share = (degree - 1) / degree
    ep = 4 * share * tokens_per_rank * top_k * d_model * bytes_per_elem
    weights = n_experts * matrices * d_model * d_expert * bytes_per_elem
    return ExpertSharding(ep, 3 * share * weights)
