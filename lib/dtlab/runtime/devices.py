"""Pick the backend and device for a Cluster (NCCL with one rank per GPU, else gloo on CPU), and
the network interface its ranks listen on."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Placement:
    backend: str  # "gloo" or "nccl"
    device_type: str  # "cpu" or "cuda"


def visible_gpu_count() -> int:
    """GPUs this process can see (0 on a CPU build). Does not create a CUDA context."""
    return torch.cuda.device_count() if torch.backends.cuda.is_built() else 0


def choose_placement(device: str, world_size: int) -> Placement:
    """``auto``: NCCL when there is a GPU for every rank, otherwise gloo on CPU.

    NCCL cannot put two ranks on one GPU, so ``cuda`` with fewer GPUs than ranks is an error.
    """
    if device not in DEVICE_CHOICES:
        raise ValueError(f"device={device!r} is not one of {DEVICE_CHOICES}")
    gpus = visible_gpu_count()
    if device == "cuda":
        if gpus < world_size:
            fixes = f"use world_size <= {gpus} or device='cpu'" if gpus else "use device='cpu'"
            raise ValueError(
                f"device='cuda' needs one GPU per rank: world_size={world_size} but {gpus} GPU(s) "
                f"are visible; {fixes} (gloo ranks on the CPU)."
            )
        return Placement("nccl", "cuda")
    if device == "auto" and gpus >= world_size:
        return Placement("nccl", "cuda")
    return Placement("gloo", "cpu")


def loopback_interface() -> str | None:
    """The name of this machine's loopback network interface (``lo`` on Linux, ``lo0`` on macOS),
    or ``None`` when it cannot be found. Linux marks it with IFF_LOOPBACK (0x8) in sysfs."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in names:
        try:
            with open(f"/sys/class/net/{name}/flags") as f:
                if int(f.read(), 16) & 0x8:
                    return name
        except (OSError, ValueError):
            continue
    return next((n for n in ("lo", "lo0") if n in names), None)
