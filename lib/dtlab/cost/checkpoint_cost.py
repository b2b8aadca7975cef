"""What a checkpoint costs the training loop, synchronous or asynchronous, and how often to take one.

**Bytes per parameter: 12.** A checkpoint that resumes mixed-precision Adam exactly holds the
FP32 master weights (4 B), Adam's first and second moments (4 + 4 B): **12 B/param**, the
convention everywhere in dtlab (:data:`CHECKPOINT_BYTES_PER_PARAM`; the bank and the labs use
it). The BF16 working weights are the master rounded, so they add nothing a restart needs; a
framework that saves them too writes 14 B/param. Say which one you mean.

**Synchronous.** Training stops while the state is written: the cost per checkpoint is the full
write time ``W = bytes / write bandwidth``, and Young/Daly (:func:`dtlab.cost.young_daly_interval`)
balances ``W/τ`` against ``τ/(2·MTBF)``.

**Asynchronous** (PyTorch DCP ``async_save``, Megatron-LM's async save, CheckFreq, Mohan et al.
FAST 2021): training stops only while each GPU copies its shard of the state to pinned host
memory (the **stall** ``S = bytes / n_gpus / PCIe bandwidth``); a background thread writes it to
storage while training goes on. The cost term in Young/Daly is then ``S``, not ``W``:
``τ* = sqrt(2·S·MTBF)``, much shorter. Two things stay from ``W``: a snapshot cannot start before
the previous one is on storage (``τ ≥ W``), and a failure during a write loses the work back to
the previous finished checkpoint, so the expected lost work per failure is ``τ/2 + W``:
waste ``S/τ + (τ/2 + W)/MTBF`` (:func:`async_expected_waste_fraction`).
"""

from __future__ import annotations

from dtlab.cost.reliability import (
    expected_waste_fraction_async,
    young_daly_interval,
    young_daly_interval_async,
)

CHECKPOINT_BYTES_PER_PARAM = 12
"""FP32 master weights + Adam m + Adam v: what resuming mixed-precision Adam needs."""


def _check(**values: float) -> None:
    bad = {k: v for k, v in values.items() if not v > 0}
    if bad:
        raise ValueError(f"these must be > 0: {bad}")


def checkpoint_bytes(params: float, bytes_per_param: float = CHECKPOINT_BYTES_PER_PARAM) -> float:
    """Bytes in one full checkpoint (all ranks together)."""
    _check(params=params, bytes_per_param=bytes_per_param)
    return params * bytes_per_param


def sync_checkpoint_cost_s(
    params: float,
    write_bytes_per_s: float,
    bytes_per_param: float = CHECKPOINT_BYTES_PER_PARAM,
) -> float:
    """Seconds training stops for a synchronous checkpoint: the whole write, ``W``."""
    _check(write_bytes_per_s=write_bytes_per_s)
    return checkpoint_bytes(params, bytes_per_param) / write_bytes_per_s


def async_checkpoint_stall_s(
    params: float,
    n_gpus: int,
    host_copy_bytes_per_s: float,
    bytes_per_param: float = CHECKPOINT_BYTES_PER_PARAM,
) -> float:
    """Seconds training stops for an asynchronous sharded checkpoint: every GPU copies its
    ``1/n_gpus`` share to host memory at once, ``S = bytes / n_gpus / PCIe bandwidth``."""
    _check(n_gpus=n_gpus, host_copy_bytes_per_s=host_copy_bytes_per_s)
    return checkpoint_bytes(params, bytes_per_param) / n_gpus / host_copy_bytes_per_s


def async_checkpoint_interval_s(stall_s: float, write_s: float, mtbf_s: float) -> float:
    """Young/Daly with the stall as the cost, no shorter than one background write:
    ``max(sqrt(2·S·MTBF), W)``."""
    _check(stall_s=stall_s, write_s=write_s, mtbf_s=mtbf_s)
    return young_daly_interval_async(stall_s, write_s, mtbf_s)


def async_expected_waste_fraction(
    interval_s: float, stall_s: float, write_s: float, mtbf_s: float
) -> float:
    """Share of time lost: ``S/τ`` stalled + ``(τ/2 + W)/MTBF`` redone after failures."""
    _check(interval_s=interval_s, mtbf_s=mtbf_s)
    if stall_s < 0 or write_s < 0:
        raise ValueError(f"stall {stall_s} s and write {write_s} s must be >= 0")
    return expected_waste_fraction_async(interval_s, stall_s, write_s, mtbf_s)


def sync_vs_async_interval_ratio(stall_s: float, write_s: float, mtbf_s: float) -> float:
    """How many times shorter the asynchronous interval is than the synchronous one."""
    return young_daly_interval(write_s, mtbf_s) / async_checkpoint_interval_s(
        stall_s, write_s, mtbf_s
    )


def waste_if_async_is_priced_as_sync(
    params: float,
    n_gpus: int,
    per_gpu_mtbf_s: float,
    write_bytes_per_s: float,
    host_copy_bytes_per_s: float,
    bytes_per_param: float = CHECKPOINT_BYTES_PER_PARAM,
) -> dict[str, float]:
    """Waste with async saves at the synchronous interval vs at their own: the lab 14 comparison."""
    mtbf = per_gpu_mtbf_s / n_gpus
    write = sync_checkpoint_cost_s(params, write_bytes_per_s, bytes_per_param)
    stall = async_checkpoint_stall_s(params, n_gpus, host_copy_bytes_per_s, bytes_per_param)
    sync_tau = young_daly_interval(write, mtbf)
    async_tau = async_checkpoint_interval_s(stall, write, mtbf)
    return {
        "sync_interval_s": sync_tau,
        "async_interval_s": async_tau,
        "sync_waste": write / sync_tau + sync_tau / (2 * mtbf),
        "async_at_sync_interval_waste": async_expected_waste_fraction(sync_tau, stall, write, mtbf),
        "async_waste": async_expected_waste_fraction(async_tau, stall, write, mtbf),
        "stall_s": stall,
        "write_s": write,
        "mtbf_s": mtbf,
    }
