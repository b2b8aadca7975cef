"""Process groups over rank lists that are not a mesh dimension: built here, once, in one order.

The :class:`~dtlab.mesh.Mesh` makes one group per dimension (``dp``, ``tp``, ``pp``, ...). A few
mechanisms need groups *across* those: HSDP splits each dp group into a shard block (one node)
and the replicas of each shard across blocks; a pipeline with tied embeddings sums the tied
gradient over its first and last stage only (Megatron's "embedding group"). Their rank lists are
arithmetic on the mesh's layout; the groups themselves are made here, so no parallel family
calls ``torch.distributed`` to build one.

``torch.distributed.new_group`` is collective over the *whole* world: every rank must create
every group, in the same order, members or not. :func:`group_containing` therefore takes *all*
the groups of one kind (disjoint rank lists, the same on every rank) and returns the one holding
this rank. Groups are cached per process (:func:`dtlab.runtime.context.cached_groups`): a warm
Cluster rebuilding them for every run would leak gloo's connections and threads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist

from dtlab.runtime.context import cached_groups


def group_containing(rank_lists: Sequence[Sequence[int]]) -> dist.ProcessGroup | None:
    """This rank's group among ``rank_lists`` (disjoint lists of global ranks), or ``None`` if
    no list holds it. Every rank must call it with the same lists in the same order."""
    lists = tuple(tuple(int(r) for r in ranks) for ranks in rank_lists)
    seen: set[int] = set()
    for ranks in lists:
        if seen & set(ranks):
            raise ValueError(
                f"groups {[list(r) for r in lists]} overlap; each rank may be in one of them"
            )
        seen |= set(ranks)

    def build() -> dist.ProcessGroup | None:
        mine, _ = dist.new_subgroups_by_enumeration([list(ranks) for ranks in lists])
        return mine

    return cached_groups(("group_containing", lists), build)
