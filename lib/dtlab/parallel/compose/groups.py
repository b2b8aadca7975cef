"""The process groups a composed step reduces over, and the one flat all-reduce it uses.

HSDP splits every data-parallel group in two: blocks of ``shard`` consecutive dp ranks (one
node) that FSDP shards inside, and the groups of ranks at the same place in each block (the
replicas across nodes), whose shard gradients are averaged with one more all-reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dtlab.comm import Communicator, group_containing
from dtlab.mesh import Mesh, divisors


def average_flat(
    grads: list[torch.Tensor], comm: Communicator, name: str, divide_by: int | None = None
) -> None:
    """Sum ``grads`` over ``comm`` with one all-reduce of their concatenation, then divide by
    ``divide_by`` (default: the group's size — an average)."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if comm.world_size > 1:
        comm.all_reduce(flat, name=name)
    flat /= divide_by or comm.world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def hsdp_groups(mesh: Mesh, shard: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Split every dp group into blocks of ``shard`` consecutive ranks (FSDP inside a block:
    one node) and the groups of ranks at the same place in each block (replicas across
    nodes). The rank lists are the mesh's dp groups cut up; the groups are made by the
    communication layer (:func:`~dtlab.comm.group_containing`), every one on every rank in the
    same order."""
    dp = mesh.dp_size
    if shard < 1 or dp % shard:
        raise ValueError(f"hsdp_shard={shard} must divide dp={dp}; choose from {divisors(dp)}")
    shard_groups, replica_groups = [], []
    for ranks in mesh.layout.groups("dp"):
        blocks = [ranks[i : i + shard] for i in range(0, dp, shard)]
        shard_groups += blocks
        replica_groups += [[b[i] for b in blocks] for i in range(shard)]
    return group_containing(shard_groups), group_containing(replica_groups)


def node_share_of_dp(mesh: Mesh) -> int:
    """HSDP's default shard group: the dp ranks that share a node (all of dp on one node)."""
    inside = len({mesh.node_of(r) for r in mesh.dp_ranks})
    return mesh.dp_size // inside if mesh.dp_size % inside == 0 else mesh.dp_size
