"""Silent data corruption: replicas that should be identical, checked after a step.

A flipped bit in a GPU's memory or arithmetic raises no error — the job trains on, wrong (the
"silent data corruption" Meta and Google report at fleet scale: Dixit et al., "Silent Data
Corruptions at Scale", 2021). Data parallelism gives a free check: after the optimizer step every
replica holds *bit-identical* parameters, so a checksum per parameter, compared across replicas,
exposes any replica that differs. What moves: one 32-bit CRC per parameter per rank (an
all-gather of a few bytes), no tensor data. With three or more replicas a majority vote names
the corrupted rank; with two it can only say that they disagree.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from dtlab.checkpoint.storage import tensor_bytes


def parameter_checksums(module: nn.Module) -> dict[str, int]:
    """CRC-32 of every parameter's raw bytes, by name."""
    return {name: zlib.crc32(tensor_bytes(p)) for name, p in module.named_parameters()}


@dataclass
class Disagreement:
    parameter: str
    suspects: list[int]  # ranks outside the majority (all ranks when there is none)
    checksums: list[int]

    def __str__(self) -> str:
        if len(self.suspects) == len(self.checksums):
            return (
                f"parameter {self.parameter!r} differs across data-parallel replicas and no "
                f"majority agrees (CRC-32 per rank: {[hex(c) for c in self.checksums]}); one "
                "more replica, or recomputing the step, would name the corrupted rank"
            )
        return (
            f"parameter {self.parameter!r} differs across data-parallel replicas: rank(s) "
            f"{self.suspects} disagree with the majority (CRC-32 per rank: "
            f"{[hex(c) for c in self.checksums]})"
        )


def compare_replicas(module: nn.Module, group=None) -> list[Disagreement]:
    """Every rank: gather all ranks' checksums and return the parameters that disagree."""
    mine = parameter_checksums(module)
    everyone: list[dict[str, int] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    found = []
    for name in mine:
        sums = [d[name] for d in everyone]
        if len(set(sums)) == 1:
            continue
        value, votes = Counter(sums).most_common(1)[0]
        majority = votes > len(sums) / 2
        suspects = [r for r, s in enumerate(sums) if not majority or s != value]
        found.append(Disagreement(name, suspects, sums))
    return found


@torch.no_grad()
def flip_bit(t: torch.Tensor, index: int, bit: int) -> None:
    """Plant a corruption: flip ``bit`` of element ``index`` of ``t`` (viewed as raw integers)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    raw = t.view(-1).view(ints)
    if not 0 <= bit < 8 * t.element_size():
        raise ValueError(f"bit {bit} is outside a {8 * t.element_size()}-bit element")
    raw[index] ^= torch.tensor(1 << bit, dtype=torch.int64).to(ints)
