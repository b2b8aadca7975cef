"""ZeRO-Offload: keep the optimizer's fp32 master shard and its state in host memory.

Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training" (USENIX ATC 2021): the
12Ψ/N bytes of optimizer state per rank (fp32 master, Adam m and v) are the biggest item of the
ZeRO budget and are touched once per step, so they can live in CPU memory. Each step the
rank copies its gradient shard device → host (2Ψ/N bytes in bf16), runs the optimizer on the CPU,
and copies the updated parameter shard host → device (2Ψ/N bytes). The device then holds only
parameters and gradients.

On a GPU the host buffers are *pinned* (page-locked), which is what lets ``copy_(...,
non_blocking=True)`` run as a DMA alongside other GPU work. On a CPU-only cluster the compute
device *is* the host: offloading moves nothing and only adds the copies, and the held-bytes
reports (``held_bytes()["by_device"]``) say so by listing every byte under ``cpu``.
"""

from __future__ import annotations

import torch


def offload_device() -> torch.device:
    """Where offloaded optimizer state lives: always host memory."""
    return torch.device("cpu")


def host_buffer(shape, dtype: torch.dtype) -> torch.Tensor:
    """An empty host tensor; pinned when a GPU is present so device copies can be asynchronous."""
    host = torch.empty(shape, dtype=dtype, device="cpu")
    return host.pin_memory() if torch.cuda.is_available() else host
