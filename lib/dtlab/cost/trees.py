"""The shapes of the double binary tree: who is whose parent, how deep, how many segments.

Pure arithmetic, shared by the schedule (:mod:`dtlab.collectives.double_tree` walks these trees)
and by the byte formulas of :mod:`dtlab.cost.collectives` (which count their edges), so that the
two can only disagree if the schedule moves bytes the trees do not explain.

**Tree 1** is the *in-order* binary tree on ranks ``0 .. N-1``. Give rank ``r`` the label
``x = r + 1``; the root is the largest power of two ``≤ N``; a label whose lowest set bit is
``b`` has children ``x - b/2`` and ``x + b/2`` (the right one moved down to ``x + b/4``,
``x + b/8``, … while it lies past ``N``). Odd labels — even ranks — are the leaves: about half.

**Tree 2** is tree 1 *mirrored* (rank ``r`` ↔ ``N-1-r``) when ``N`` is even, *shifted by one*
(rank ``r`` ↔ ``r+1 mod N``) when ``N`` is odd. Either way the leaves of one tree are the
interior ranks of the other, so **every rank is interior in at most one tree** and sends at most
two children's worth of data in all. That is what lets two trees, each carrying half the buffer,
run at the full bandwidth of every link with ``log2 N`` latency (Sanders, Speck & Träff, "Two-tree
algorithms for full bandwidth broadcast, reduction and scan", Parallel Computing 2009).

NCCL builds the same pair (``ncclGetDtree`` in ``src/graph/trees.cc``, since NCCL 2.4: mirror
for even, shift for odd), over the *nodes* of a job, with its in-order tree hung below an extra
root, rank 0; for odd ``N`` that rank has a child in both trees. Here the trees span the ranks
alone, so the property holds for every ``N`` (for odd ``N``, rank 0 is a leaf in both).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

TREE_SEGMENT_BYTES = 1 << 20
"""About the size of one pipelined segment of each half, when the caller does not choose.

Every segment adds a step (``α``); fewer, larger ones leave links idle while the pipeline fills
(``h - 1`` steps of ``M/S``). The model's best is ``S* ≈ sqrt((h-1) · M β / α)`` (Sanders et al.
2009): a few segments on CPU ranks over gloo (``α`` near a millisecond), tens on NVLink or
InfiniBand (microseconds). ``algorithm="auto"`` uses the model's best
(:func:`dtlab.cost.tuner.best_segments`); this fixed size is for a call that names the algorithm."""

MAX_TREE_SEGMENTS = 64


@dataclass(frozen=True)
class Tree:
    """A rooted tree on ranks ``0 .. N-1``: ``parent[r]`` (``-1`` at the root), ``children[r]``
    (in the order messages to them are posted) and ``depth[r]`` (the root is at depth 0)."""

    parent: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]
    depth: tuple[int, ...]

    @property
    def root(self) -> int:
        return self.parent.index(-1)

    @property
    def height(self) -> int:
        """Edges on the longest root-to-leaf path."""
        return max(self.depth)

    def is_interior(self, rank: int) -> bool:
        return bool(self.children[rank])


def _label_children(x: int, n: int) -> list[int]:
    bit = x & -x
    half = bit >> 1
    if half == 0:
        return []  # odd labels are leaves
    children = [x - half]
    while half and x + half > n:
        half >>= 1
    if half:
        children.append(x + half)
    return children


@lru_cache(maxsize=256)
def in_order_tree(n: int) -> Tree:
    """Tree 1 of the module docstring, on ``n ≥ 1`` ranks."""
    if n < 1:
        raise ValueError(f"a tree needs at least 1 rank, got n={n}")
    parent, depth = [-1] * n, [0] * n
    children: list[tuple[int, ...]] = [()] * n
    root_label = 1 << (n.bit_length() - 1)
    todo = [root_label]
    while todo:
        x = todo.pop()
        below = _label_children(x, n)
        children[x - 1] = tuple(c - 1 for c in below)
        for c in below:
            parent[c - 1], depth[c - 1] = x - 1, depth[x - 1] + 1
            todo.append(c)
    return Tree(tuple(parent), tuple(children), tuple(depth))


def _relabel(tree: Tree, new_rank: list[int]) -> Tree:
    """The same tree with rank ``r`` renamed ``new_rank[r]``."""
    n = len(new_rank)
    parent, depth = [-1] * n, [0] * n
    children: list[tuple[int, ...]] = [()] * n
    for r in range(n):
        me = new_rank[r]
        parent[me] = -1 if tree.parent[r] < 0 else new_rank[tree.parent[r]]
        children[me] = tuple(new_rank[c] for c in tree.children[r])
        depth[me] = tree.depth[r]
    return Tree(tuple(parent), tuple(children), tuple(depth))


@lru_cache(maxsize=256)
def double_binary_trees(n: int) -> tuple[Tree, Tree]:
    """Tree 1 and its mirrored (even ``n``) or shifted (odd ``n``) twin, tree 2."""
    first = in_order_tree(n)
    if n % 2 == 0:
        second = _relabel(first, [n - 1 - r for r in range(n)])
    else:
        second = _relabel(first, [(r + 1) % n for r in range(n)])
    return first, second


def tree_segments(nbytes: float) -> int:
    """Segments each half of an ``nbytes`` buffer is pipelined in: about 1 MiB each, at least 1,
    at most 64. The same on every rank (it depends on nothing but the call)."""
    return max(1, min(MAX_TREE_SEGMENTS, int(nbytes) // 2 // TREE_SEGMENT_BYTES))
