"""Alpha-beta cost of every collective algorithm in :mod:`dtlab.collectives`, and its bytes per rank.

Each algorithm's time is ``a·α + b·M·β`` for a buffer of ``M`` bytes over ``N`` ranks on one
:class:`~dtlab.cost.alpha_beta.Link`: ``a`` sequential message latencies and ``b·M`` bytes through
the busiest link on the critical path (Thakur, Rabenseifner & Gropp 2005, Table 1; reductions'
arithmetic is left out). ``M`` follows the nccl-tests convention of :mod:`dtlab.cost.bandwidth`:
the buffer for all-reduce, broadcast and reduce, the *gathered* buffer for all-gather and gather,
the *input* buffer for reduce-scatter and scatter, the send buffer for all-to-all. ``p`` is the
largest power of two ≤ ``N``; "fold" means the ``2(N-p)`` ranks that pair up first. The double
binary tree all-reduce takes ``segments`` (per half; default :func:`~dtlab.cost.trees.tree_segments`)
and its trees' height from :mod:`dtlab.cost.trees`. The one-shot and two-shot all-reduces
(:mod:`dtlab.collectives.peer_memory`) are priced on a full mesh — a step's transfers to every
peer share the rank's link and pay one latency: ``α + (N-1)·M·β`` and ``2α + 2(N-1)/N·M·β``.

:func:`bytes_sent_per_rank` gives every rank's sent bytes for a length that divides evenly (by
``N``, and by ``p`` for Rabenseifner): the numbers :class:`~dtlab.collectives.CommStats` must show.
For other lengths chunks follow the tensor_split rule (:func:`~dtlab.collectives.chunk_bounds`):
ring and pairwise reduce-scatter send ``M - |chunk r|``, ring all-gather ``M - |chunk r+1|``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dtlab.cost.alpha_beta import Link
from dtlab.cost.trees import double_binary_trees, tree_segments


@dataclass(frozen=True)
class AlphaBetaTerms:
    """``time = latencies·α + bandwidth_bytes·β``."""

    latencies: float
    bandwidth_bytes: float

    def time(self, link: Link) -> float:
        return self.latencies * link.alpha_s + self.bandwidth_bytes * link.beta_s_per_byte


def _log2_ceil(n: int) -> int:
    return (n - 1).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _tree_height(n: int) -> int:
    return n.bit_length() - 1  # heap-ordered binary tree with n nodes


def chain_segments(nbytes: float, n: int) -> int:
    """The segment count :func:`dtlab.collectives.broadcast` picks by default (about 256 KiB each)."""
    return max(1, min(64, max(n - 1, int(nbytes) // (256 * 1024))))


def terms(
    op: str, algorithm: str, nbytes: float, n: int, segments: int | None = None
) -> AlphaBetaTerms:
    """The ``(a, b·M)`` of :func:`collective_time` (see the module docstring for ``M``)."""
    if n < 1:
        raise ValueError(f"a collective needs at least 1 rank, got n={n}")
    m, p = float(nbytes), _pow2_floor(n)
    folded = n != p  # non-powers of two fold in and out: two extra full-buffer messages
    if n == 1:
        return AlphaBetaTerms(0.0, 0.0)
    table = {
        ("broadcast", "flat"): (n - 1, (n - 1) * m),
        ("broadcast", "binomial"): (_log2_ceil(n), _log2_ceil(n) * m),
        ("reduce", "flat"): (n - 1, (n - 1) * m),
        ("reduce", "binomial"): (_log2_ceil(n), _log2_ceil(n) * m),
        ("all_reduce", "naive"): (2 * (n - 1), 2 * (n - 1) * m),
        ("all_reduce", "ring"): (2 * (n - 1), 2 * (n - 1) / n * m),
        ("all_reduce", "recursive_doubling"): (
            math.log2(p) + 2 * folded,
            (math.log2(p) + 2 * folded) * m,
        ),
        ("all_reduce", "rabenseifner"): (
            2 * math.log2(p) + 2 * folded,
            (2 * (p - 1) / p + 2 * folded) * m,
        ),
        ("all_reduce", "binary_tree"): (
            2 * _tree_height(n),
            2 * _tree_height(n) * min(2, n - 1) * m,
        ),
        # peer memory (dtlab.collectives.peer_memory): one step reaches every peer at once
        ("all_reduce", "one_shot"): (1, (n - 1) * m),
        ("all_reduce", "two_shot"): (2, 2 * (n - 1) / n * m),
        ("reduce_scatter", "ring"): (n - 1, (n - 1) / n * m),
        ("reduce_scatter", "pairwise"): (n - 1, (n - 1) / n * m),
        ("reduce_scatter", "recursive_halving"): (
            math.log2(p) + 2 * folded,
            _recursive_halving_critical_bytes(m, n),
        ),
        ("all_gather", "ring"): (n - 1, (n - 1) / n * m),
        ("all_gather", "recursive_doubling"): (
            math.log2(p) + 2 * folded,
            ((p - 1) / p + (1 / n + 1) * folded) * m,
        ),
        ("all_to_all", "pairwise"): (n - 1, (n - 1) / n * m),
        ("gather", "flat"): (n - 1, (n - 1) / n * m),
        ("scatter", "flat"): (n - 1, (n - 1) / n * m),
        ("barrier", "dissemination"): (_log2_ceil(n), 0.0),
    }
    if (op, algorithm) == ("broadcast", "chain"):
        s = segments if segments is not None else chain_segments(m, n)
        return AlphaBetaTerms(n - 2 + s, (n - 2 + s) / s * m)
    if (op, algorithm) == ("all_reduce", "double_binary_tree"):
        # 2 (h + S - 1) steps; in each the busiest rank sends two segments of M/(2S) (one for N=2)
        s = segments if segments is not None else tree_segments(m)
        steps = 2 * (double_binary_trees(n)[0].height + s - 1)
        return AlphaBetaTerms(steps, steps * min(2, n - 1) * m / (2 * s))
    if (op, algorithm) not in table:
        known = sorted({o for o, _ in table} | {"broadcast"})
        choices = sorted(a for o, a in table if o == op) + (["chain"] if op == "broadcast" else [])
        choices += ["double_binary_tree"] if op == "all_reduce" else []
        raise ValueError(
            f"no cost formula for {op!r} with algorithm {algorithm!r}; "
            + (f"choose one of {choices}" if choices else f"ops are {known}")
        )
    a, b = table[(op, algorithm)]
    return AlphaBetaTerms(float(a), float(b))


def collective_time(
    op: str, algorithm: str, nbytes: float, n: int, link: Link, segments: int | None = None
) -> float:
    """Predicted seconds for ``op`` by ``algorithm`` on ``n`` ranks joined by ``link``.

    >>> from dtlab.cost import Link
    >>> round(collective_time("all_reduce", "ring", 1e9, 8, Link(0.0, 100e9)), 6)  # 1.75 GB at 100 GB/s
    0.0175
    """
    return terms(op, algorithm, nbytes, n, segments).time(link)


def crossover_bytes(
    op: str, small_algorithm: str, large_algorithm: str, n: int, link: Link
) -> float | None:
    """The buffer size above which ``large_algorithm`` becomes faster than ``small_algorithm``
    (e.g. recursive doubling → ring), found by bisection on a log scale between 1 B and 1 TiB.
    ``None`` if one is faster across the whole range."""

    def gap(m: float) -> float:
        return collective_time(op, small_algorithm, m, n, link) - collective_time(
            op, large_algorithm, m, n, link
        )

    lo, hi = 1.0, float(1 << 40)
    if (gap(lo) < 0) == (gap(hi) < 0):
        return None
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if (gap(mid) < 0) == (gap(lo) < 0):
            lo = mid
        else:
            hi = mid
    return hi


def bytes_sent_per_rank(op: str, algorithm: str, nbytes: int, n: int) -> list[float]:
    """Bytes each rank sends (rank order, root 0) when the length divides evenly."""
    m, p = float(nbytes), _pow2_floor(n)
    extra, log_p = n - p, p.bit_length() - 1
    ranks = range(n)
    if n == 1:
        return [0.0]
    key = (op, algorithm)
    if key == ("broadcast", "flat"):
        return [(n - 1) * m] + [0.0] * (n - 1)
    if key == ("broadcast", "binomial"):
        return [
            m * sum(1 for k in range(_log2_ceil(n)) if v < 2**k and v + 2**k < n) for v in ranks
        ]
    if key == ("broadcast", "chain"):
        return [m] * (n - 1) + [0.0]
    if op == "reduce" and algorithm in ("flat", "binomial"):
        return [0.0] + [m] * (n - 1)
    if key == ("all_reduce", "naive"):
        return [(n - 1) * m] + [m] * (n - 1)
    if key in (("all_reduce", "ring"), ("all_reduce", "two_shot")):
        return [2 * (n - 1) / n * m] * n
    if key == ("all_reduce", "one_shot"):
        return [(n - 1) * m] * n
    if key == ("all_reduce", "recursive_doubling"):
        return [
            m if r < 2 * extra and r % 2 == 0 else log_p * m + m * (r < 2 * extra) for r in ranks
        ]
    if key == ("all_reduce", "rabenseifner"):
        core = 2 * (p - 1) / p * m
        return [m if r < 2 * extra and r % 2 == 0 else core + m * (r < 2 * extra) for r in ranks]
    if key == ("all_reduce", "binary_tree"):
        return [m * ((r > 0) + sum(c < n for c in (2 * r + 1, 2 * r + 2))) for r in ranks]
    if key == ("all_reduce", "double_binary_tree"):  # half the buffer up and down each tree
        trees = double_binary_trees(n)
        return [m / 2 * sum((t.parent[r] >= 0) + len(t.children[r]) for t in trees) for r in ranks]
    if key == ("reduce_scatter", "recursive_halving"):
        return _recursive_halving_reduce_scatter_bytes(m, n)
    if op in ("reduce_scatter", "all_gather", "all_to_all") and algorithm in ("ring", "pairwise"):
        return [(n - 1) / n * m] * n
    if key == ("all_gather", "recursive_doubling"):
        return _recursive_doubling_all_gather_bytes(m, n)
    if key == ("gather", "flat"):
        return [0.0] + [m / n] * (n - 1)
    if key == ("scatter", "flat"):
        return [(n - 1) / n * m] + [0.0] * (n - 1)
    if key == ("barrier", "dissemination"):
        return [float(_log2_ceil(n))] * n  # one 1-byte token per round
    raise ValueError(f"no byte formula for {op!r} with algorithm {algorithm!r}")


def _recursive_doubling_all_gather_bytes(m: float, n: int) -> list[float]:
    p = _pow2_floor(n)
    extra, chunk = n - p, m / n
    weight = [2 if new < extra else 1 for new in range(p)]  # real chunks each new rank stands for
    sent = []
    for r in range(n):
        if r < 2 * extra and r % 2 == 0:
            sent.append(chunk)  # folds its chunk into r + 1, then only receives
            continue
        new = r // 2 if r < 2 * extra else r - extra
        total = sum(
            sum(weight[(new & ~(2**k - 1)) + i] for i in range(2**k)) * chunk
            for k in range(p.bit_length() - 1)
        )
        sent.append(total + (m if r < 2 * extra else 0.0))
    return sent


def _halving_weights(n: int) -> list[int]:
    """Chunks each of the ``p`` ranks left after the fold speaks for: 2 for the first ``N-p``."""
    p = _pow2_floor(n)
    return [2 if w < n - p else 1 for w in range(p)]


def _recursive_halving_reduce_scatter_bytes(m: float, n: int) -> list[float]:
    p, chunk, weight = _pow2_floor(n), m / n, _halving_weights(n)
    extra = n - p
    sent = []
    for r in range(n):
        if r < 2 * extra and r % 2 == 0:
            sent.append(m)  # hands its whole buffer to r + 1, then only receives its chunk
            continue
        new = r // 2 if r < 2 * extra else r - extra
        total, mask = 0.0, p >> 1
        while mask:  # sends the partner's half of its range: the aligned block of new ^ mask
            block = (new ^ mask) & ~(mask - 1)
            total += sum(weight[block : block + mask]) * chunk
            mask >>= 1
        sent.append(total + (chunk if r < 2 * extra else 0.0))
    return sent


def _recursive_halving_critical_bytes(m: float, n: int) -> float:
    """Bytes on the critical path: the fold, each halving step's largest message, the unfold."""
    p, chunk, weight = _pow2_floor(n), m / n, _halving_weights(n)
    folded = n != p
    halving = sum(
        max(sum(weight[b : b + mask]) for b in range(0, p, mask)) * chunk
        for mask in (p >> (k + 1) for k in range(p.bit_length() - 1))
    )
    return folded * (m + chunk) + halving


def hierarchical_bytes_sent_per_rank(nbytes: int, n: int, ranks_per_node: int) -> float:
    """Every rank's bytes in the hierarchical all-reduce: ``2(g-1)/g·M`` inside the node plus
    ``2(k-1)/k·M/g`` across nodes (``g`` ranks per node, ``k`` nodes)."""
    g, k = ranks_per_node, n // ranks_per_node
    return 2 * (g - 1) / g * nbytes + 2 * (k - 1) / k * nbytes / g


def bytes_sent_by_rank(op: str, algorithm: str, nbytes: int, n: int, rank: int = 0) -> float:
    """One rank's entry of :func:`bytes_sent_per_rank` (handy for quiz keys)."""
    return bytes_sent_per_rank(op, algorithm, nbytes, n)[rank]
