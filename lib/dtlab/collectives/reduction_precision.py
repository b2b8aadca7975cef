"""How exact is a gradient all-reduce in BF16? Rounding error by schedule, dtype and rank count.

A collective reduces in the dtype of its buffer. In a **ring** all-reduce every chunk is summed
hop by hop: rank ``c+1``'s value, plus rank ``c+2``'s, plus rank ``c+3``'s … and each partial
sum is stored back in the buffer's dtype before it moves on (:mod:`dtlab.collectives.ring_pipeline`
folds chunk ``c`` starting at rank ``c+1``; NCCL's ring does the same per hop). With BF16's
8-bit mantissa (unit roundoff ``2⁻⁸``) that is ``N-1`` roundings in a row, and the error grows
with the number of ranks, roughly like ``N`` in the worst case and ``√N`` on average (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed. 2002, Sec. 4.2). A **tree** (recursive
doubling, NCCL's tree) adds in pairs, ``log₂ N`` roundings deep. Accumulating in **FP32** and
rounding once to BF16 at the end leaves only that last rounding.

So a BF16 reduction halves the bytes but is *not* exact. Frameworks let you reduce in FP32:
FSDP's ``MixedPrecision(reduce_dtype=torch.float32)`` (FSDP2: ``MixedPrecisionPolicy``),
Megatron-LM's ``--accumulate-allreduce-grads-in-fp32``, DeepSpeed's ``communication_data_type``;
DDP's ``bf16_compress_hook`` is the opposite choice, made on purpose.

* :func:`measure_reduction_errors` runs on every rank of a Cluster: real all-reduces in BF16 and
  in FP32, by ring and by recursive doubling, each compared with the FP64 sum of the same inputs.
* :func:`simulated_ring_sum` and :func:`simulated_tree_sum` reproduce those summation orders in
  one process, bit for bit (the tests check it on the ranks), so :func:`reduction_error_table`
  can go to hundreds of ranks.
"""

from __future__ import annotations

import torch

from dtlab.collectives.ops import chunk_bounds

SCHEDULES = ("ring", "tree")


def gradient_like(rank: int, numel: int, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s BF16 gradient: a shared signal plus per-rank noise (as in data parallel)."""
    if numel < 1 or rank < 0:
        raise ValueError(f"need numel >= 1 and rank >= 0, got numel={numel}, rank={rank}")
    shared = torch.Generator().manual_seed(seed)
    own = torch.Generator().manual_seed(seed * 100_003 + rank + 1)
    signal = torch.randn(numel, generator=shared, dtype=torch.float64)
    noise = torch.randn(numel, generator=own, dtype=torch.float64)
    return (1e-3 * (signal + noise)).to(torch.bfloat16)


def simulated_ring_sum(inputs: list[torch.Tensor]) -> torch.Tensor:
    """The ring all-reduce's sum, in the inputs' dtype: chunk ``c`` starts at rank ``c+1`` and
    adds ranks ``c+2, …, c+N`` one hop at a time, rounding after every addition."""
    n = len(inputs)
    out = torch.empty_like(inputs[0])
    for c, (lo, hi) in enumerate(chunk_bounds(inputs[0].numel(), n)):
        acc = inputs[(c + 1) % n][lo:hi].clone()
        for k in range(2, n + 1):
            acc = inputs[(c + k) % n][lo:hi] + acc
        out[lo:hi] = acc
    return out


def simulated_tree_sum(inputs: list[torch.Tensor]) -> torch.Tensor:
    """Pairwise sums level by level, as recursive doubling adds on a power-of-two world."""
    level = list(inputs)
    if len(level) & (len(level) - 1):
        raise ValueError(f"the tree order here needs a power-of-two rank count, got {len(level)}")
    while len(level) > 1:
        level = [level[i] + level[i + 1] for i in range(0, len(level), 2)]
    return level[0].clone()


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """``‖approx − exact‖₂ / ‖exact‖₂``, computed in FP64."""
    exact = exact.double()
    return float((approx.double() - exact).norm() / exact.norm())


def _exact_sum(n: int, numel: int, seed: int) -> torch.Tensor:
    return sum(gradient_like(r, numel, seed).double() for r in range(n))


def reduction_error_table(
    ranks: list[int], numel: int = 4096, seed: int = 0
) -> list[dict[str, float]]:
    """For each rank count: relative error against FP64 of ring and tree sums in BF16, of the ring
    accumulating in FP32 (rounded once to BF16), and of merely rounding the exact sum to BF16."""
    rows = []
    for n in ranks:
        inputs = [gradient_like(r, numel, seed) for r in range(n)]
        exact = sum(x.double() for x in inputs)
        rows.append(
            {
                "ranks": n,
                "ring_bf16": relative_error(simulated_ring_sum(inputs), exact),
                "tree_bf16": relative_error(simulated_tree_sum(inputs), exact),
                "ring_fp32": relative_error(
                    simulated_ring_sum([x.float() for x in inputs]).bfloat16(), exact
                ),
                "rounding_floor": relative_error(exact.bfloat16(), exact),
            }
        )
    return rows


def ring_bf16_error(ranks: int, numel: int = 4096, seed: int = 0) -> float:
    """Relative error of a BF16 ring all-reduce over ``ranks`` ranks (one entry of the table)."""
    return reduction_error_table([ranks], numel, seed)[0]["ring_bf16"]


def error_growth(ranks_small: int, ranks_large: int, numel: int = 4096, seed: int = 0) -> float:
    """How many times larger the BF16 ring's error is at ``ranks_large`` than at ``ranks_small``."""
    return ring_bf16_error(ranks_large, numel, seed) / ring_bf16_error(ranks_small, numel, seed)


def measure_reduction_errors(numel: int = 4096, seed: int = 0) -> dict[str, float]:
    """Run on every rank: real all-reduces of this rank's BF16 gradient, each against FP64.

    ``ring_bf16`` / ``tree_bf16``: the buffer is BF16, so every addition rounds to BF16.
    ``ring_fp32``: the same gradient upcast to FP32, reduced, rounded once to BF16. ``tree`` is
    recursive doubling (power-of-two worlds). ``ring_matches_simulation`` says whether the
    one-process replay of the ring order gave the same bits.
    """
    from dtlab import collectives as C
    from dtlab.runtime.context import device

    peers = C.peers_of(None)  # real ranks or simulated ones alike
    n, me = peers.size, peers.rank
    mine = gradient_like(me, numel, seed)
    exact = _exact_sum(n, numel, seed)
    ring = mine.to(device(), copy=True)  # under NCCL on the GPU: the same adds, same rounding
    C.all_reduce(ring, algorithm="ring")
    ring = ring.cpu()
    ring32 = mine.to(device(), torch.float32, copy=True)
    C.all_reduce(ring32, algorithm="ring")
    ring32 = ring32.cpu()
    result = {
        "ranks": float(n),
        "ring_bf16": relative_error(ring, exact),
        "ring_fp32": relative_error(ring32.bfloat16(), exact),
        "rounding_floor": relative_error(exact.bfloat16(), exact),
    }
    inputs = [gradient_like(r, numel, seed) for r in range(n)]
    result["ring_matches_simulation"] = float(torch.equal(ring, simulated_ring_sum(inputs)))
    if n & (n - 1) == 0:
        tree = mine.to(device(), copy=True)
        C.all_reduce(tree, algorithm="recursive_doubling")
        tree = tree.cpu()
        result["tree_bf16"] = relative_error(tree, exact)
        result["tree_matches_simulation"] = float(torch.equal(tree, simulated_tree_sum(inputs)))
    return result
