"""Pick the backend and device for a Cluster: NCCL with one rank per GPU, else gloo on CPU."""

from __future__ import annotations

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
