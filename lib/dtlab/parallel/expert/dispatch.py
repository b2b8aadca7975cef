"""Expert-parallel dispatch and combine: two all-to-alls around this rank's experts.

``E`` experts over an EP group of ``ep`` ranks, in contiguous blocks: rank ``j`` holds experts
``j·E/ep … (j+1)·E/ep − 1``. On every rank, for one MoE forward (GShard, Lepikhin et al. 2020):

1. **counts** — the kept assignments, sorted by expert, give ``tokens_per_expert`` (E,). An
   all-to-all of it (rank ``j`` gets the block of its experts) tells every rank how many rows
   each source sends it, per local expert: ``(ep−1)·E/ep`` int64 values sent per rank.
2. **dispatch** — ``all_to_all_rows`` of the sorted token rows: ``send_splits[j]`` = rows for
   rank ``j``'s experts, ``recv_splits[s]`` = rows rank ``s`` sends here (from step 1). Bytes
   sent: the rows for other ranks' experts, ``· d · e``.
3. **experts** — the received rows arrive grouped by source rank; a stable sort by local expert
   regroups them for one grouped GEMM (or the loop), and the inverse permutation undoes it.
4. **combine** — the inverse all-to-all (splits swapped) brings each row home, where it is
   weighted by its routing weight and summed per token.

Capacity is per rank: each rank's router has already capped each expert at ``C`` of this rank's
own assignments (``C`` from this rank's tokens, :class:`~dtlab.models.moe.MoEConfig`), so an
expert receives up to ``ep·C`` rows, ``C`` from each source rank.

Backward runs through both all-to-alls by itself (:func:`dtlab.comm.all_to_all_rows` is an
autograd function whose backward is the same exchange with the splits swapped): the combine's
gradient goes out to the experts, the dispatch's comes home. So each rank sends
``2 · (dispatch + combine)`` row bytes per layer and step, plus the counts.
"""

from __future__ import annotations

import torch

from dtlab import trace
from dtlab.comm import Communicator, all_to_all_rows
from dtlab.models.moe import MoEStats, combine_rows, kept_assignments
from dtlab.models.moe_experts import Experts
from dtlab.models.moe_router import Routing


def dispatch_splits(
    tokens_per_expert: torch.Tensor, comm: Communicator
) -> tuple[list[int], list[int], torch.Tensor]:
    """``(send_splits, recv_splits, received_counts)`` for the dispatch all-to-all.

    ``tokens_per_expert`` (E,) counts this rank's rows per global expert. ``received_counts``
    (ep, E/ep) holds, per source rank, the rows it sends to each of this rank's experts: one
    all-to-all of the counts, the exchange that must precede the rows.
    """
    ep = comm.world_size
    if tokens_per_expert.numel() % ep:
        raise ValueError(
            f"{tokens_per_expert.numel()} experts cannot be split over an EP group of {ep}; "
            "choose ep dividing n_experts"
        )
    counts = tokens_per_expert.to(torch.int64).contiguous()
    received = all_to_all_rows(counts.view(ep, -1), comm).view(ep, -1)
    send = counts.view(ep, -1).sum(1).tolist()
    return send, received.sum(1).tolist(), received


class AllToAllDispatch:
    """The :class:`~dtlab.models.moe.MoE` dispatcher of expert parallelism over ``comm``."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm

    def _sent(self) -> int:
        return int(self.comm.comm_stats.bytes_sent)

    def __call__(
        self, x: torch.Tensor, routing: Routing, experts: Experts, stats: MoEStats
    ) -> torch.Tensor:
        comm = self.comm
        token, expert, weight = kept_assignments(routing)
        tokens_per_expert = torch.bincount(expert, minlength=routing.n_experts)
        before = self._sent()
        with trace.span("moe_count_exchange", kind="comm"):
            send, recv, received = dispatch_splits(tokens_per_expert, comm)
        after_counts = self._sent()
        with trace.span("moe_dispatch", kind="comm"):
            rows = all_to_all_rows(x[token], comm, recv, send)
        after_dispatch = self._sent()
        local_expert = torch.arange(experts.n_experts, device=x.device).repeat(comm.world_size)
        local_expert = local_expert.repeat_interleave(received.reshape(-1).to(x.device))
        order = torch.argsort(local_expert, stable=True)
        counts_here = received.sum(0).tolist()
        with trace.span("moe_experts", kind="compute", tokens=int(sum(counts_here))):
            y = experts(rows[order], counts_here)
        y_by_source = y[torch.argsort(order)]
        with trace.span("moe_combine", kind="comm"):
            back = all_to_all_rows(y_by_source, comm, send, recv)
        stats.all_to_all_bytes = {
            "counts": after_counts - before,
            "dispatch": after_dispatch - after_counts,
            "combine": self._sent() - after_dispatch,
        }
        stats.received_per_local_expert = counts_here
        return combine_rows(back, token, weight, x.shape[0])
