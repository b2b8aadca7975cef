"""Silent data corruption: what a cross-replica checksum sees, and what it cannot see.

A flipped bit in a GPU's memory, or an arithmetic unit that returns a wrong number, raises no
error: the job trains on, wrong. Meta and Google report it at fleet scale (Dixit et al., "Silent
Data Corruptions at Scale", 2021; Hochschild et al., "Cores that don't count", HotOS 2021).

**The cross-replica parameter checksum** (:func:`compare_replicas`). After the optimizer step
every data-parallel replica holds bit-identical parameters, so a CRC-32 per parameter, compared
across replicas, exposes a replica whose copy differs. What moves: one 32-bit CRC per parameter
per rank (an all-gather of a few bytes), no tensor data.

* It **sees** corruption of one replica's own copy *after the last collective*: a bit flipped in
  its parameters in memory, or a bad receive of its copy from a peer. That damage stays on one
  rank, so the copies differ.
* It **cannot see a compute error**. A wrong forward or backward result on one rank goes into
  that rank's gradient, and the gradient all-reduce averages it into *every* replica: all of them
  apply the same wrong update and stay bit-identical. Under ZeRO or FSDP even a wrong optimizer
  update of one rank's shard is all-gathered to every rank. The checksum compares copies, not
  arithmetic.

**What catches a compute error instead** — checks that compare arithmetic, not copies:

* :func:`compare_gradients` *before* the all-reduce, on a step where every replica computes the
  **same** batch (a replayed or "canary" batch). Only then must the gradients be bit-identical:
  on a normal step each rank has its own data and the gradients differ legitimately, so
  comparing them says nothing. It also needs deterministic kernels (on a GPU,
  ``torch.use_deterministic_algorithms(True)``) and the same kind of device on every rank;
* replaying a step (or a known computation) on another device and comparing the results;
* statistics: a loss or gradient-norm spike that the data does not explain (cheap, not exact).

**Naming the faulty rank.** With three or more replicas a majority vote names the odd one out.
With two, a mismatch says only *that* they differ, not which is wrong: :class:`Disagreement`
then lists both ranks as suspects, and a third opinion (another replica, or a recomputation)
is needed.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from dtlab.checkpoint.storage import tensor_bytes


def parameter_checksums(module: nn.Module) -> dict[str, int]:
    """CRC-32 of every parameter's raw bytes, by name."""
    return {name: zlib.crc32(tensor_bytes(p)) for name, p in module.named_parameters()}


def gradient_checksums(module: nn.Module) -> dict[str, int]:
    """CRC-32 of every parameter's gradient (``.grad``; skipped where it is ``None``), by name."""
    return {
        name: zlib.crc32(tensor_bytes(p.grad))
        for name, p in module.named_parameters()
        if p.grad is not None
    }


@dataclass
class Disagreement:
    parameter: str
    suspects: list[int]  # ranks outside the majority (all ranks when there is none)
    checksums: list[int]
    what: str = "parameter"  # or "gradient of" (compare_gradients)

    def __str__(self) -> str:
        sums = [hex(c) if c >= 0 else "none" for c in self.checksums]
        if len(self.suspects) == len(self.checksums):
            return (
                f"{self.what} {self.parameter!r} differs across data-parallel replicas and no "
                f"majority agrees (CRC-32 per rank: {sums}): any of ranks {self.suspects} may "
                "be wrong; a third replica, or recomputing the step elsewhere, names it"
            )
        return (
            f"{self.what} {self.parameter!r} differs across data-parallel replicas: rank(s) "
            f"{self.suspects} disagree with the majority (CRC-32 per rank: {sums})"
        )


def _compare(mine: dict[str, int], what: str, group) -> list[Disagreement]:
    everyone: list[dict[str, int] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    found = []
    for name in mine:
        sums = [d.get(name, -1) for d in everyone]  # -1: that rank has no such gradient
        if len(set(sums)) == 1:
            continue
        value, votes = Counter(sums).most_common(1)[0]
        majority = votes > len(sums) / 2
        suspects = [r for r, s in enumerate(sums) if not majority or s != value]
        found.append(Disagreement(name, suspects, sums, what))
    return found


def compare_replicas(module: nn.Module, group=None) -> list[Disagreement]:
    """Every rank, after the optimizer step: the parameters whose copies differ across ranks.

    Sees a replica's own copy corrupted after the last collective; misses compute errors,
    which the all-reduce spreads to every replica (module docstring)."""
    return _compare(parameter_checksums(module), "parameter", group)


def compare_gradients(module: nn.Module, group=None) -> list[Disagreement]:
    """Every rank, after ``backward`` and *before* the gradient all-reduce: the gradients that
    differ across ranks. Meaningful only when every rank computed the same batch with
    deterministic kernels (a replayed or canary step); on ordinary data-parallel steps the
    gradients differ by design."""
    return _compare(gradient_checksums(module), "gradient of", group)


@torch.no_grad()
def flip_bit(t: torch.Tensor, index: int, bit: int) -> None:
    """Plant a corruption: flip ``bit`` of element ``index`` of ``t`` (viewed as raw integers)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    raw = t.view(-1).view(ints)
    if not 0 <= bit < 8 * t.element_size():
        raise ValueError(f"bit {bit} is outside a {8 * t.element_size()}-bit element")
    raw[index] ^= torch.tensor(1 << bit, dtype=torch.int64).to(ints)


def wrong_output(module: nn.Module, index: int, bit: int) -> RemovableHandle:
    """Plant a compute error: from now on ``module`` returns its output with ``bit`` of element
    ``index`` flipped, as a faulty arithmetic unit would — the backward pass then computes from
    the wrong value. ``.remove()`` the returned handle to heal it."""

    def corrupt(_module, _inputs, output: torch.Tensor) -> torch.Tensor:
        wrong = output.clone()
        flip_bit(wrong, index, bit)
        return wrong

    return module.register_forward_hook(corrupt)
