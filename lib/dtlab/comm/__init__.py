"""The communication layer every parallel wrapper and layer stands on.

* :mod:`~dtlab.comm.communicator` — :class:`Communicator`: a collective over one group (a mesh
  dimension) on torch's backend or dtlab's counted rings; spans carry the group, micro-batch and
  phase; bytes go to its :class:`~dtlab.collectives.stats.CommStats`.
* :mod:`~dtlab.comm.autograd` — the same collectives as autograd functions: Megatron's
  conjugate ``f``/``g``, all-gather / reduce-scatter along a tensor dimension (sequence
  parallel), all-to-all with variable splits (MoE, Ulysses).
"""

from dtlab.comm.autograd import (
    all_to_all_rows,
    copy_to_group,
    gather_along,
    reduce_from_group,
    reduce_scatter_along,
)
from dtlab.comm.communicator import Communicator, PendingCollective, nbytes, ring_bytes_sent

__all__ = [
    "Communicator",
    "PendingCollective",
    "all_to_all_rows",
    "copy_to_group",
    "gather_along",
    "nbytes",
    "reduce_from_group",
    "reduce_scatter_along",
    "ring_bytes_sent",
]
