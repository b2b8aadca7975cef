"""The communication layer every parallel wrapper and layer stands on.

* :mod:`~dtlab.comm.communicator` — :class:`Communicator`: a collective over one group (a mesh
  dimension) on torch's backend or dtlab's counted rings; blocking and non-blocking
  point-to-point; scalar reports as uncounted control messages. Spans carry the group,
  micro-batch and phase; bytes go to its :class:`~dtlab.collectives.stats.CommStats`.
* :mod:`~dtlab.comm.point_to_point` — :class:`~dtlab.comm.point_to_point.PointToPoint`, the
  communicator's base class: its ``send``/``recv``/``start_exchange``/``isend``/``irecv``.
* :mod:`~dtlab.comm.messages` — point to point behind the communicator's ``send``/``recv``
  and ``start_exchange``: who sends what to whom, counted from the messages.
* :mod:`~dtlab.comm.volumes` — the ring convention's bytes per collective (what the torch path
  records, since it cannot see inside gloo's or NCCL's algorithms) and a tensor's byte size.
* :mod:`~dtlab.comm.pending` — the handles of communication in flight (``wait()``);
  :class:`OverlapRefused`, warned only where the counted path cannot overlap (NCCL).
* :mod:`~dtlab.comm.background` — the background stream: a worker thread and a message tag
  per set of ranks, so ``async_op=True`` on ``collectives="dtlab"`` overlaps
  compute, counted and bit-identical to the blocking call.
* :mod:`~dtlab.comm.groups` — process groups over rank lists that are not a mesh dimension
  (HSDP's shard and replica groups, the pipeline's embedding group).
* :mod:`~dtlab.comm.autograd` — the same collectives as autograd functions: Megatron's
  conjugate ``f``/``g``, all-gather / reduce-scatter along a tensor dimension (sequence
  parallel), all-to-all with variable splits (MoE, Ulysses).

Nothing in :mod:`dtlab.parallel` calls ``torch.distributed`` to move a byte or build a group;
it comes here (``tests/test_comm_layer_rule.py`` holds that).
"""

from dtlab.comm.autograd import (
    all_to_all_rows,
    copy_to_group,
    gather_along,
    gather_slices_along,
    reduce_from_group,
    reduce_scatter_along,
    slice_along,
)
from dtlab.comm.background import QueuedCollective
from dtlab.comm.communicator import Communicator
from dtlab.comm.groups import group_containing
from dtlab.comm.pending import Finished, OverlapRefused, PendingCollective, PendingMessages
from dtlab.comm.volumes import nbytes, ring_bytes_sent

__all__ = [
    "Communicator",
    "Finished",
    "OverlapRefused",
    "PendingCollective",
    "PendingMessages",
    "QueuedCollective",
    "all_to_all_rows",
    "copy_to_group",
    "gather_along",
    "gather_slices_along",
    "group_containing",
    "nbytes",
    "reduce_from_group",
    "reduce_scatter_along",
    "slice_along",
    "ring_bytes_sent",
]
