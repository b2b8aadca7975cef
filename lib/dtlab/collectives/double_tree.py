"""NCCL's double binary tree all-reduce: two trees, each reducing and broadcasting half the buffer.

One binary tree (``binary_tree`` in :mod:`~dtlab.collectives.allreduce`) reaches every rank in
``log2 N`` steps, but half its ranks are leaves: they send their buffer up once and otherwise
idle, while an interior rank pushes ``2 M`` down to its two children. Sanders, Speck & Träff
("Two-tree algorithms for full bandwidth broadcast, reduction and scan", Parallel Computing 2009)
run *two* trees at once, each carrying half of the buffer, built so that a rank's leaf tree and
its interior tree are different ones (:mod:`dtlab.cost.trees`). NCCL adopted it in 2.4 as its
"tree" algorithm, the one it picks for small and mid-size all-reduces across many nodes.

Who sends what to whom (``M`` bytes, halves ``M/2`` cut by the tensor_split rule, each half in
``S`` segments, :func:`~dtlab.cost.trees.tree_segments`; ``h`` the trees' height):

1. **reduce**, ``h + S - 1`` steps: in tree ``i`` a rank at depth ``d`` sends segment ``k`` of
   half ``i`` — its own values plus its children's — to its parent at step ``k + h - d``, and
   adds in its children's segment ``k`` the step before. The roots then hold the reduced halves.
2. **broadcast**, ``h + S - 1`` steps: the root of tree ``i`` sends segment ``k`` of half ``i``
   down at step ``k``; a rank at depth ``d`` receives it at step ``k + d - 1`` and passes it on.

Both trees move in the same steps, so in a step a rank sends at most two segments (up in both
trees, or down to the two children of its one interior tree): ``M/S`` bytes.

* bytes sent by rank ``r``: ``M/2 · Σ_trees (1 if r is not the root + its number of children)``
  — at most ``2 M`` (interior in one tree: up and two down; leaf in the other: up), versus ``3 M``
  for the single tree's interior ranks;
* alpha-beta time: ``2 (h + S - 1) (α + M/S · β)`` (``M/(2S)`` instead of ``M/S`` for ``N = 2``):
  ``log N`` latencies for small buffers, and as ``S`` grows the bandwidth term tends to ``2 M β``,
  the ring's ``2 (N-1)/N · M β`` at large ``N`` — "logarithmic latency at full bandwidth".
"""

from __future__ import annotations

import torch

from dtlab.collectives.ops import chunk_bounds, combine_, finish_
from dtlab.collectives.p2p import Peers
from dtlab.cost.trees import double_binary_trees, tree_segments


def all_reduce_double_binary_tree_(
    flat: torch.Tensor,
    op: str,
    peers: Peers,
    *,
    segments: int | None = None,
    name: str = "all_reduce.double_binary_tree",
) -> None:
    """All-reduce ``flat`` (1-D, contiguous) in place: half ``i`` up and down tree ``i``.

    ``segments`` (per half) defaults to :func:`~dtlab.cost.trees.tree_segments` of the buffer.
    """
    n, r = peers.size, peers.rank
    trees = double_binary_trees(n)
    height = trees[0].height  # both trees have the same shape
    if segments is None:
        segments = tree_segments(flat.numel() * flat.element_size())
    halves = chunk_bounds(flat.numel(), 2)
    # pieces[i][k]: segment k of half i, as a slice of flat
    pieces = [
        [slice(lo + a, lo + b) for a, b in chunk_bounds(hi - lo, segments)] for lo, hi in halves
    ]
    # A rank is interior in one tree at most, so at most two children's segments land per step.
    fan_in = max(1, sum(len(tree.children[r]) for tree in trees))
    inbox = flat.new_empty((fan_in, pieces[0][0].stop - pieces[0][0].start))
    steps = height + segments - 1

    for t in range(steps):  # reduce: segment k leaves depth d at step k + h - d
        sends, recvs, folds = [], [], []
        for tree, half in zip(trees, pieces, strict=True):
            d = tree.depth[r]
            k = t - (height - d)
            if tree.parent[r] >= 0 and 0 <= k < segments:
                sends.append((tree.parent[r], flat[half[k]]))
            k = t - (height - d - 1)
            if 0 <= k < segments:
                for child in tree.children[r]:
                    box = inbox[len(folds), : half[k].stop - half[k].start]
                    recvs.append((child, box))
                    folds.append((half[k], box))
        peers.exchange(sends, recvs, name=name + " reduce", step=t)
        for where, box in folds:
            combine_(flat[where], box, op)

    for tree, (lo, hi) in zip(trees, halves, strict=True):
        if tree.parent[r] < 0:
            finish_(flat[lo:hi], op, n)

    for t in range(steps):  # broadcast: segment k reaches depth d at step k + d - 1
        sends, recvs = [], []
        for tree, half in zip(trees, pieces, strict=True):
            d = tree.depth[r]
            k = t - d
            if 0 <= k < segments:
                sends += [(child, flat[half[k]]) for child in tree.children[r]]
            k = t - (d - 1)
            if tree.parent[r] >= 0 and 0 <= k < segments:
                recvs.append((tree.parent[r], flat[half[k]]))
        peers.exchange(sends, recvs, name=name + " broadcast", step=steps + t)
