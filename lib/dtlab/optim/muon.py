"""Muon under ZeRO: Newton–Schulz needs whole matrices, the optimizer state is sharded.

**Muon** (Jordan et al. 2024, "Muon: an optimizer for hidden layers in neural networks"; Liu et
al. 2025, "Muon is Scalable for LLM Training") keeps SGD momentum ``M ← μM + G`` per weight
matrix and steps along its *orthogonalised* version: the nearest semi-orthogonal matrix
``U Vᵀ`` of ``M = U Σ Vᵀ``, approximated by a few Newton–Schulz iterations on ``X = M/‖M‖_F``
(for ``m ≤ n``, transposing otherwise): ``A = X Xᵀ``, ``X ← aX + (bA + cA²)X`` with
``(a, b, c) = (3.4445, −4.7750, 2.0315)``, five steps. Each step multiplies whole matrices:
``4m²n + 2m³`` FLOPs (:func:`newton_schulz_flops`).

**The problem under ZeRO.** ZeRO-1/2 and FSDP give rank ``r`` a flat ``1/N`` slice of each
matrix's gradient and momentum. The momentum update is elementwise, so it runs on the shard;
``U Vᵀ`` is not — it needs the whole ``M``. Two ways (:data:`STRATEGIES`):

``"replicated"`` — every rank all-gathers every momentum matrix and orthogonalises all of them,
    then keeps its slice of the result. Bytes per rank: an all-gather of every matrix,
    ``(N−1)/N · Σ|W| · b``; FLOPs per rank: all of Newton–Schulz, ``Σ F(W)`` — the same on every
    rank, so ``N`` times the work is done in total. This is Liu et al.'s Distributed Muon (a "DP
    gather" of the matrices a rank's partition touches, the full update computed, all but the
    local part discarded) *when every matrix is split over all N ranks*, as here and in FSDP's
    per-parameter sharding. Under Megatron's ZeRO-1 a rank's partition is one contiguous range of
    a flat buffer, so it touches about ``1/N`` of the matrices (whole ones, plus the two it
    straddles) and gathers and orthogonalises only those: the ranges act as owners, unbalanced
    by where the boundaries fall.

``"owner"`` — each matrix gets one owner rank (largest Newton–Schulz cost first, to the rank with
    the least planned work so far); the other ranks send it their slices (a gather), it
    orthogonalises, and sends each rank its slice of the result (a scatter). Bytes summed over
    ranks: ``2(N−1)/N · Σ|W| · b`` instead of ``(N−1) · Σ|W| · b``; FLOPs per rank: the owned
    matrices only, about ``Σ F(W)/N``. The price: the owners' work must balance, and a rank
    waits for the owners of its slices.

Both give every rank **the same update** as one process running Muon on whole matrices, to the
bit (the same matrix goes through the same operations): ``tests/test_optim_muon.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dtlab.comm import Communicator

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
STRATEGIES = ("replicated", "owner")


def newton_schulz(m: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Approximately orthogonalise a matrix (its ``U Vᵀ``) by quintic Newton–Schulz."""
    if m.dim() != 2:
        raise ValueError(f"Newton–Schulz orthogonalises matrices; got shape {tuple(m.shape)}")
    a, b, c = NS_COEFFICIENTS
    x = m / (m.norm() + eps)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        g = x @ x.T
        x = a * x + (b * g + c * g @ g) @ x
    return x.T if tall else x


def newton_schulz_flops(rows: int, cols: int, steps: int = 5) -> float:
    """FLOPs of :func:`newton_schulz` on a ``rows × cols`` matrix: per step, with ``m ≤ n`` the
    short and long sides, ``X Xᵀ`` (``2m²n``), ``A·A`` (``2m³``) and ``(…)·X`` (``2m²n``)."""
    m, n = sorted((rows, cols))
    return steps * (4 * m * m * n + 2 * m**3)


def muon_scale(rows: int, cols: int) -> float:
    """Keller Jordan's shape factor ``√max(1, rows/cols)``, so tall matrices step comparably."""
    return math.sqrt(max(1.0, rows / cols))


def plan_owners(shapes: Sequence[tuple[int, int]], world: int) -> list[int]:
    """An owner per matrix: largest Newton–Schulz cost first, to the least-loaded rank so far
    (ties: the lowest rank) — the longest-processing-time rule."""
    load = [0.0] * world
    owners = [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda i: -newton_schulz_flops(*shapes[i])):
        owner = min(range(world), key=lambda r: (load[r], r))
        owners[i] = owner
        load[owner] += newton_schulz_flops(*shapes[i])
    return owners


def muon_bytes_per_rank(
    shapes: Sequence[tuple[int, int]], world: int, strategy: str, bytes_per_elem: int = 4
) -> list[float]:
    """Bytes each rank sends in one distributed Muon step (flat ``1/N`` shards, ``N`` dividing
    every matrix): replicated, a ring all-gather of each matrix; owner, each non-owner's slice to
    the owner plus the owner's ``N − 1`` slices of the result back."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: choose one of {STRATEGIES}")
    sizes = [r * c * bytes_per_elem for r, c in shapes]
    if strategy == "replicated":
        return [sum(s * (world - 1) / world for s in sizes)] * world
    owners = plan_owners(shapes, world)
    out = [0.0] * world
    for size, owner in zip(sizes, owners, strict=True):
        for r in range(world):
            out[r] += size * (world - 1) / world if r == owner else size / world
    return out


def muon_flops_per_rank(
    shapes: Sequence[tuple[int, int]], world: int, strategy: str, steps: int = 5
) -> list[float]:
    """Newton–Schulz FLOPs each rank runs in one step under ``strategy``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: choose one of {STRATEGIES}")
    flops = [newton_schulz_flops(r, c, steps) for r, c in shapes]
    if strategy == "replicated":
        return [sum(flops)] * world
    out = [0.0] * world
    for f, owner in zip(flops, plan_owners(shapes, world), strict=True):
        out[owner] += f
    return out


def muon_total_bytes(
    shapes: Sequence[tuple[int, int]], world: int, strategy: str, bytes_per_elem: int = 4
) -> float:
    """Bytes summed over every rank: ``(N−1)·Σ|W|·b`` replicated, ``2(N−1)/N·Σ|W|·b`` owner."""
    return sum(muon_bytes_per_rank(shapes, world, strategy, bytes_per_elem))


def muon_busiest_flops(
    shapes: Sequence[tuple[int, int]], world: int, strategy: str, steps: int = 5
) -> float:
    """Newton–Schulz FLOPs of the busiest rank (the step waits for it)."""
    return max(muon_flops_per_rank(shapes, world, strategy, steps))


def repeated(shape: Sequence[int], count: int) -> list[tuple[int, int]]:
    """``count`` matrices of one ``shape`` (a bank key's way to say "64 layers of 4096 × 4096")."""
    return [tuple(shape)] * count


def muon_update(momentum: torch.Tensor) -> torch.Tensor:
    """The whole-matrix Muon direction: ``newton_schulz(M) · √max(1, rows/cols)``."""
    return newton_schulz(momentum) * muon_scale(*momentum.shape)


def sharded_muon_updates(
    momentum_shards: Sequence[torch.Tensor],
    shapes: Sequence[tuple[int, int]],
    comm: Communicator,
    strategy: str,
) -> list[torch.Tensor]:
    """Every rank: this rank's flat slice of each matrix's Muon direction, from its flat slice of
    each momentum matrix (``N`` must divide every matrix's size). Bytes go through ``comm``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: choose one of {STRATEGIES}")
    n, me = comm.world_size, comm.rank
    for shape in shapes:
        if math.prod(shape) % n:
            raise ValueError(f"a {shape} matrix does not split into {n} equal flat shards")
    if strategy == "replicated":
        out = []
        for shard, shape in zip(momentum_shards, shapes, strict=True):
            full = torch.empty(math.prod(shape), dtype=shard.dtype, device=shard.device)
            comm.all_gather(full, shard.contiguous(), name="muon all_gather")
            out.append(muon_update(full.view(shape)).reshape(-1).chunk(n)[me].clone())
        return out
    out = []
    for shard, shape, owner in zip(momentum_shards, shapes, plan_owners(shapes, n), strict=True):
        mine = torch.empty_like(shard)
        if me == owner:
            pieces = [shard if r == me else torch.empty_like(shard) for r in range(n)]
            for r in range(n):
                if r != me:
                    comm.recv(pieces[r], r, name="muon gather")
            update = muon_update(torch.cat(pieces).view(shape)).reshape(-1).chunk(n)
            for r in range(n):
                if r != me:
                    comm.send(update[r].contiguous(), r, name="muon scatter")
            mine.copy_(update[me])
        else:
            comm.send(shard.contiguous(), owner, name="muon gather")
            comm.recv(mine, owner, name="muon scatter")
        out.append(mine)
    return out
