"""Where communication hides behind compute, for every kind of parallelism.

A transfer hides behind a computation that runs beside it when the compute takes at least as
long: ``FLOPs / C ≥ bytes / B``, with ``C`` the GPU's peak FLOP/s and ``B`` the link's bandwidth
per direction. Rearranged, the work must do at least ``C / B`` FLOPs per byte moved — the
hardware's **critical intensity** (:func:`critical_intensity`): about 2,200 FLOP/B for an H100 on
NVLink 4 (989 TFLOP/s over 450 GB/s) and 19,800 on one 400 Gb/s NIC. Each function below writes
FLOPs and bytes for one parallelism and solves for the size at which they balance (the method of
Austin et al. 2025, "How to Scale Your Model", the "scaling book"). Peaks are
dense BF16; real kernels reach 50-70% of both, which roughly cancels in the ratio.

* **Data parallel**: backward does ``4·P·T`` FLOPs for ``T`` tokens per GPU while the ring
  all-reduce moves ``2(N-1)/N·b·P`` bytes per GPU (``b`` bytes per gradient element) at the bus
  bandwidth (:func:`dp_bus_bandwidth`): hidden when ``T ≥ 2(N-1)/N·b·C / (4·B)`` —
  :func:`dp_min_tokens_per_gpu`. The parameter count cancels.
* **Tensor parallel** (Megatron MLP, degree ``t``, FFN width ``F``, ``m`` weight matrices: 2, or
  3 when gated): each GPU does ``2·m·d·F/t`` FLOPs per token and all-reduces ``b·d`` bytes per
  token, ``2(t-1)/t`` of it per GPU: hidden when ``t - 1 ≤ m·F·B / (b·C)`` —
  :func:`tp_max_degree`.
* **Context parallel** (ring attention): a ``q``-token query block against a ``k``-token KV block
  costs ``4·q·k·d`` FLOPs while the next KV block (``2·k·d_kv·b`` bytes) arrives: hidden when
  ``q ≥ b·d_kv·C / (2·d·B)`` (twice that for a causal block, half masked) —
  :func:`cp_min_block_tokens`.
* **Expert parallel**: a token's hidden vector goes out and back (``2·d·b`` bytes, or
  ``d·(b + b_c)`` with a cheaper dispatch, a fraction ``(ep-1)/ep`` off-GPU) per routed expert, which spends ``2·m·d·F_e`` FLOPs on it (``m`` = 3
  matrices for a gated MLP): :func:`ep_compute_to_comm_ratio`, hidden when ≥ 1.
* **Pipeline parallel**: a stage of ``L`` layers does ``24·L·d²`` FLOPs per token forward and
  sends ``b·d`` bytes per token to the next stage: :func:`pp_compute_to_p2p_ratio`.
"""

from __future__ import annotations

import math

from dtlab.cost.alpha_beta import Link
from dtlab.cost.hardware import GPUSpec, gpu, link
from dtlab.cost.hierarchy import TwoTierCluster


def _gpu(spec: str | GPUSpec) -> GPUSpec:
    return gpu(spec) if isinstance(spec, str) else spec


def _link(spec: str | Link | float) -> float:
    """Bandwidth in bytes/s of a preset name, a :class:`Link`, or a number of bytes/s."""
    if isinstance(spec, str):
        return link(spec).bandwidth_bytes_per_s
    if isinstance(spec, Link):
        return spec.bandwidth_bytes_per_s
    if spec <= 0:
        raise ValueError(f"bandwidth {spec} must be > 0 bytes/s")
    return float(spec)


def _positive(**values: float) -> None:
    bad = {k: v for k, v in values.items() if not v > 0}
    if bad:
        raise ValueError(f"these sizes must be > 0: {bad}")


def critical_intensity(gpu_spec: str | GPUSpec, bandwidth: str | Link | float) -> float:
    """FLOPs the GPU does in the time one byte crosses the link: ``C / B`` (FLOP per byte)."""
    return _gpu(gpu_spec).bf16_dense_flops / _link(bandwidth)


def dp_bus_bandwidth(cluster: TwoTierCluster) -> float:
    """Bus bandwidth (bytes/s per GPU) of a ring all-reduce over the whole cluster.

    In one node: NVLink. Across rail-optimised nodes the ``g`` GPUs of a node share its ``nics``
    NICs, and every byte of the buffer crosses the network once per direction per node: ``nics ×
    B_NIC`` (400 GB/s for eight 400 Gb/s NICs), capped by NVLink. With one NIC per node: 50 GB/s.
    """
    if cluster.nodes == 1:
        return cluster.intra.bandwidth_bytes_per_s
    return min(cluster.intra.bandwidth_bytes_per_s, cluster.node_network_bytes_per_s)


def dp_min_tokens_per_gpu(
    gpu_spec: str | GPUSpec,
    cluster: TwoTierCluster,
    grad_bytes: float = 2,
    volume_factor: float = 1.0,
) -> float:
    """Fewest tokens per GPU per step for the gradient all-reduce to hide behind backward.

    Backward ``4·P·T / C`` against ``volume_factor · 2(N-1)/N·b·P / B_bus``: ``T = volume_factor
    · 2(N-1)/N·b·C / (4·B_bus)``. ``volume_factor`` is 1 for DDP and ZeRO-1/2, 1.5 for ZeRO-3/FSDP (the
    extra parameter all-gather, Rajbhandari et al. 2020, Sec. 7). ``grad_bytes`` is 2 for a BF16
    reduction, 4 for FP32.
    """
    return dp_min_tokens_for(
        _gpu(gpu_spec).bf16_dense_flops,
        dp_bus_bandwidth(cluster),
        cluster.world_size,
        grad_bytes,
        volume_factor,
    )


def dp_min_tokens_for(
    peak_flops: float,
    bus_bytes_per_s: float,
    ranks: int,
    grad_bytes: float = 2,
    volume_factor: float = 1.0,
) -> float:
    """:func:`dp_min_tokens_per_gpu` from plain numbers: ``vf · 2(N-1)/N · b · C / (4·B)``."""
    _positive(
        peak_flops=peak_flops,
        bus_bytes_per_s=bus_bytes_per_s,
        ranks=ranks,
        grad_bytes=grad_bytes,
        volume_factor=volume_factor,
    )
    ring = 2 * (ranks - 1) / ranks
    return volume_factor * ring * grad_bytes * peak_flops / (4 * bus_bytes_per_s)


def tp_max_degree(
    ffn_dim: int,
    gpu_spec: str | GPUSpec,
    bandwidth: str | Link | float,
    act_bytes: float = 2,
    matrices: int = 2,
) -> int:
    """Largest tensor-parallel degree whose MLP all-reduce hides behind the MLP's matmuls.

    Forward per token per GPU: ``2·m·d·F/t`` FLOPs (``m`` = 2 matrices for a plain MLP, 3 for a
    gated one: Llama's SwiGLU) against a ring all-reduce of ``b·d`` bytes, ``2(t-1)/t·b·d`` per
    GPU: ``t ≤ 1 + m·F·B / (b·C)``. The model width ``d`` cancels. The default is the two-matrix
    MLP of Megatron's paper; pass ``matrices=3`` for a Llama-like model (F = 28,672 on NVLink 4:
    20 instead of 14).
    """
    _positive(ffn_dim=ffn_dim, act_bytes=act_bytes, matrices=matrices)
    return max(
        1,
        math.floor(1 + matrices * ffn_dim / (act_bytes * critical_intensity(gpu_spec, bandwidth))),
    )


def cp_min_block_tokens(
    d_model: int,
    kv_dim: int,
    gpu_spec: str | GPUSpec,
    bandwidth: str | Link | float,
    act_bytes: float = 2,
    causal: bool = False,
) -> float:
    """Smallest ring-attention query block (tokens per rank) that hides the next KV transfer.

    ``4·q·k·d`` FLOPs (scores and the weighted sum of V) against ``2·k·d_kv·b`` bytes of K and V:
    ``q ≥ b·d_kv·C / (2·d·B)``; a causal diagonal block does half the work, doubling it.
    ``kv_dim`` is ``n_kv_heads · head_dim`` (= ``d_model`` without grouped-query attention).
    """
    _positive(d_model=d_model, kv_dim=kv_dim, act_bytes=act_bytes)
    block = act_bytes * kv_dim * critical_intensity(gpu_spec, bandwidth) / (2 * d_model)
    return 2 * block if causal else block


def ep_compute_to_comm_ratio(
    expert_ffn_dim: int,
    ep: int,
    gpu_spec: str | GPUSpec,
    bandwidth: str | Link | float,
    act_bytes: float = 2,
    matrices: int = 3,
    combine_bytes: float | None = None,
) -> float:
    """Expert compute time over all-to-all time per routed token: hidden behind it when ≥ 1.

    Per routed copy of a token: ``2·matrices·d·F_e`` FLOPs (a gated MLP has 3 matrices) against
    dispatch ``d·b`` plus combine ``d·b_c`` bytes, a fraction ``(ep-1)/ep`` of them off-GPU.
    ``d`` cancels, so the ratio is ``2·matrices·F_e / ((b + b_c)·(ep-1)/ep·C/B)``. ``b`` is the
    dispatch's bytes per value (1 for FP8), ``b_c`` the combine's (``combine_bytes``; the same as
    ``b`` unless given — DeepSeek-V3 dispatches in FP8 but combines in BF16, ``b_c = 2``).
    """
    combine = act_bytes if combine_bytes is None else combine_bytes
    _positive(
        expert_ffn_dim=expert_ffn_dim,
        ep=ep,
        act_bytes=act_bytes,
        matrices=matrices,
        combine_bytes=combine,
    )
    if ep == 1:
        return math.inf
    off_gpu = (ep - 1) / ep
    return (
        2
        * matrices
        * expert_ffn_dim
        / ((act_bytes + combine) * off_gpu * critical_intensity(gpu_spec, bandwidth))
    )


def ep_min_expert_ffn(
    ep: int,
    gpu_spec: str | GPUSpec,
    bandwidth: str | Link | float,
    act_bytes: float = 2,
    matrices: int = 3,
) -> float:
    """Smallest expert FFN width whose FLOPs hide its tokens' all-to-all (ratio = 1)."""
    return expert_ffn_dim_for_ratio(1.0, ep, gpu_spec, bandwidth, act_bytes, matrices)


def expert_ffn_dim_for_ratio(
    ratio: float,
    ep: int,
    gpu_spec: str | GPUSpec,
    bandwidth: str | Link | float,
    act_bytes: float = 2,
    matrices: int = 3,
) -> float:
    """Expert FFN width giving compute/communication ``ratio`` (see :func:`ep_compute_to_comm_ratio`)."""
    _positive(ratio=ratio, ep=ep, act_bytes=act_bytes, matrices=matrices)
    if ep == 1:
        return 0.0
    return ratio * act_bytes * (ep - 1) / ep * critical_intensity(gpu_spec, bandwidth) / matrices


def pp_compute_to_p2p_ratio(
    d_model: int,
    layers_per_stage: int,
    gpu_spec: str | GPUSpec,
    bandwidth: str | Link | float,
    act_bytes: float = 2,
) -> float:
    """A pipeline stage's forward compute time over its activation send time, per token.

    ``24·L·d²`` FLOPs (a dense block is ``12·d²`` parameters, 2 FLOPs each) against ``b·d`` bytes:
    ``24·L·d / (b·C/B)``. Usually in the hundreds or thousands: why PP crosses nodes cheaply.
    """
    _positive(d_model=d_model, layers_per_stage=layers_per_stage, act_bytes=act_bytes)
    return 24 * layers_per_stage * d_model / (act_bytes * critical_intensity(gpu_spec, bandwidth))


def comm_hidden_fraction(compute_s: float, comm_s: float) -> float:
    """Share of a transfer hidden behind compute running beside it: ``min(1, compute / comm)``."""
    if compute_s < 0 or comm_s < 0:
        raise ValueError(f"times must be >= 0 seconds, got compute {compute_s}, comm {comm_s}")
    return 1.0 if comm_s == 0 else min(1.0, compute_s / comm_s)


def dp_tokens_per_replica(global_batch_tokens: float, dp: int) -> float:
    """Tokens one data-parallel replica processes per step: the global batch over ``dp``.

    Every GPU of a replica (its TP × PP × CP ranks) runs all of them through its shard of the
    model, so this — not tokens per GPU — is what :func:`dp_min_tokens_per_gpu` compares against
    when the model is split.
    """
    _positive(global_batch_tokens=global_batch_tokens, dp=dp)
    return global_batch_tokens / dp
