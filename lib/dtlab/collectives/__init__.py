"""Every collective built from point-to-point messages, each one counting the bytes it moved.

Call them inside a function run on the Cluster (or under torchrun)::

    from dtlab import collectives as C

    def fn():
        x = torch.arange(10.0) * (dtlab.rank() + 1)
        with C.counting() as moved:
            C.all_reduce(x, algorithm="ring")
        return x, moved.bytes_sent          # 2 (N-1)/N * 40 bytes when N divides 10

``ALGORITHMS[op][name]`` is every schedule by collective, e.g. ``ALGORITHMS["all_reduce"]["ring"]``;
each entry is the public function with ``algorithm=name`` filled in. ``group`` may be ``None``
(every rank), a process group or a list of global ranks; roots are indices *within* the group.
Any world size, any length (chunks cut by the tensor_split rule), any dtype, sum/avg/max/min.

``algorithm="auto"`` (all-reduce, reduce-scatter, all-gather) prices every schedule of the op on
an α-β link model fitted on this machine and runs the cheapest, as NCCL's tuner does
(:mod:`~dtlab.collectives.auto`: :func:`choose_algorithm`, :func:`last_choice`,
:func:`set_link_model`, :func:`fit_link_model`).

Every public collective first checks that its ranks were asked the same thing — lengths,
dtypes, roots, algorithms — with a small *control message* that is not counted in
:func:`comm_stats` (:mod:`~dtlab.collectives.agreement`): ranks that disagree all raise
:class:`CollectiveMismatch`, naming each rank's value, instead of hanging.

:func:`peer_all_reduce` runs the one-shot and two-shot all-reduces of symmetric-memory kernels
and inference engines (:mod:`~dtlab.collectives.peer_memory`); they sit outside ``ALGORITHMS``
and ``auto``, whose one-port link model does not price a step that reaches every peer at once.
:func:`switch_all_reduce` lets one rank play an NVLS/SHARP switch that adds
(:mod:`~dtlab.collectives.in_network`): each GPU sends ``(1 + 1/N)·M``, not the ring's ``2(N-1)/N·M``.
"""

from __future__ import annotations

from functools import partial

from dtlab.collectives.agreement import CollectiveMismatch
from dtlab.collectives.allgather import ALL_GATHERS, all_gather
from dtlab.collectives.allreduce import ALL_REDUCES, all_reduce
from dtlab.collectives.alltoall import all_to_all
from dtlab.collectives.auto import (
    AutoChoice,
    choose_algorithm,
    fit_link_model,
    last_choice,
    link_model,
    set_link_model,
)
from dtlab.collectives.barrier import barrier
from dtlab.collectives.broadcast import broadcast
from dtlab.collectives.gather_scatter import gather, scatter
from dtlab.collectives.hierarchical import hierarchical_all_reduce, node_layout
from dtlab.collectives.in_network import switch_all_reduce
from dtlab.collectives.ops import REDUCE_OPS, chunk_bounds, chunk_sizes
from dtlab.collectives.p2p import (
    CommStats,
    Peers,
    comm_stats,
    counting,
    peers_of,
    traffic_matrix,
)
from dtlab.collectives.peer_memory import peer_all_reduce
from dtlab.collectives.reduce import reduce
from dtlab.collectives.reduce_scatter import REDUCE_SCATTERS, reduce_scatter
from dtlab.collectives.shm_primitives import ShmPeerGone
from dtlab.collectives.simulated import simulate

ALGORITHMS: dict[str, dict[str, partial]] = {
    "broadcast": {a: partial(broadcast, algorithm=a) for a in ("flat", "binomial", "chain")},
    "reduce": {a: partial(reduce, algorithm=a) for a in ("flat", "binomial")},
    "all_reduce": {a: partial(all_reduce, algorithm=a) for a in ALL_REDUCES},
    "reduce_scatter": {a: partial(reduce_scatter, algorithm=a) for a in REDUCE_SCATTERS},
    "all_gather": {a: partial(all_gather, algorithm=a) for a in ALL_GATHERS},
    "all_to_all": {"pairwise": partial(all_to_all, algorithm="pairwise")},
    "gather": {"flat": gather},
    "scatter": {"flat": scatter},
    "barrier": {"dissemination": partial(barrier, algorithm="dissemination")},
}

__all__ = [
    "ALGORITHMS",
    "REDUCE_OPS",
    "AutoChoice",
    "CollectiveMismatch",
    "CommStats",
    "Peers",
    "ShmPeerGone",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "choose_algorithm",
    "chunk_bounds",
    "chunk_sizes",
    "comm_stats",
    "counting",
    "fit_link_model",
    "gather",
    "hierarchical_all_reduce",
    "last_choice",
    "link_model",
    "node_layout",
    "peer_all_reduce",
    "peers_of",
    "reduce",
    "reduce_scatter",
    "scatter",
    "set_link_model",
    "simulate",
    "switch_all_reduce",
    "traffic_matrix",
]
