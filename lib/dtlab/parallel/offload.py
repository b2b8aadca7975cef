"""ZeRO-Offload: keep the optimizer's fp32 master shard and its state in host memory.

Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training" (USENIX ATC 2021): the
12Ψ/N bytes of optimizer state per rank (fp32 master, Adam m and v) are the biggest item of the
ZeRO budget and are touched once per step, so they can live in CPU memory. Each step the
rank copies its gradient shard device → host (2Ψ/N bytes in bf16), runs the optimizer on the CPU,
and copies the updated parameter shard host → device (2Ψ/N bytes). The device then holds only
parameters and gradients.

On a CPU-only cluster "device" and "host" are the same memory, so offloading changes nothing
physical; the accounting (``held_bytes()["offloaded_optimizer_state"]``) still shows what would
leave the accelerator, and on GPUs the same code moves it for real (pinned host memory so the
copies can run asynchronously).
"""

from __future__ import annotations

import torch


def offload_device() -> torch.device:
    """Where offloaded optimizer state lives: always host memory."""
    return torch.device("cpu")


def to_host(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A host copy of ``t`` in ``dtype``; pinned when a GPU is present so copies can overlap."""
    host = torch.empty(t.shape, dtype=dtype, device="cpu")
    if torch.cuda.is_available():
        host = host.pin_memory()
    host.copy_(t)
    return host
