"""Expert-parallel dispatch and combine: two all-to-alls around this rank's experts.

``E`` experts over an EP group of ``ep`` ranks, in contiguous blocks: rank ``j`` holds experts
``j·E/ep … (j+1)·E/ep − 1``. On every rank, for one MoE forward (GShard, Lepikhin et al. 2020):

1. **counts** — the kept assignments, sorted by expert, give ``tokens_per_expert`` (E,). One
   message to each rank carries the counts of that rank's experts behind a header every rank
   checks (:meth:`~dtlab.parallel.expert.exchange.TokenExchange.exchange_counts`: the count
   exchange *is* the call's agreement): ``(ep−1)·(H + E/ep)`` int64 values sent per rank.
2. **dispatch** — the sorted token rows, ``send_splits[j]`` = rows for rank ``j``'s experts,
   ``recv_splits[s]`` = rows rank ``s`` sends here (from step 1), in one call — one
   ``all_to_all_single`` over torch's collectives, every message posted at once over dtlab's
   counted ones — into a receive buffer kept across steps. Bytes sent: the rows for other ranks' experts,
   ``· d · e``.
3. **experts** — the received rows arrive grouped by source rank; a stable sort by local expert
   regroups them for one grouped GEMM (or the loop), and the inverse permutation undoes it.
4. **combine** — the inverse exchange (splits swapped) brings each row home, where it is
   weighted by its routing weight and summed per token.

Capacity is per rank: each rank's router has already capped each expert at ``C`` of this rank's
own assignments (``C`` from this rank's tokens, :class:`~dtlab.models.moe.MoEConfig`), so an
expert receives up to ``ep·C`` rows, ``C`` from each source rank.

Backward runs through both exchanges by itself
(:func:`~dtlab.parallel.expert.exchange.exchange_rows` is an autograd function whose backward
is the same exchange with the splits swapped): the combine's gradient goes out to the experts,
the dispatch's comes home. So each rank sends ``2 · (dispatch + combine)`` row bytes per layer
and step, plus the counts.

:func:`dispatch_splits` is the textbook count exchange (an all-to-all of the bare counts, what
the lab's exercise writes); the dispatcher uses the exchange's header-carrying message instead.
"""

from __future__ import annotations

import torch

from dtlab import trace
from dtlab.comm import Communicator, all_to_all_rows
from dtlab.models.moe import MoEStats, combine_rows, kept_assignments
from dtlab.models.moe_experts import Experts
from dtlab.models.moe_router import Routing
from dtlab.parallel.expert.exchange import Splits, TokenExchange, exchange_rows


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
        self.exchange = TokenExchange(comm)

    def route_rows(
        self, x: torch.Tensor, routing: Routing
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Splits]:
        """``(token, weight, rows, splits)``: the kept assignments sorted by expert, their rows of
        ``x``, and the splits from the count exchange (step 1)."""
        token, expert, weight = kept_assignments(routing)
        tokens_per_expert = torch.bincount(expert, minlength=routing.n_experts)
        splits = self.exchange.exchange_counts(tokens_per_expert, x.shape[-1], x.dtype)
        return token, weight, x[token], splits

    def local_order(self, splits: Splits, device: torch.device) -> tuple[torch.Tensor, list[int]]:
        """The permutation from source-rank order to local-expert order, and rows per expert."""
        per = splits.received.shape[1]
        local_expert = torch.arange(per, device=device).repeat(self.comm.world_size)
        local_expert = local_expert.repeat_interleave(splits.received.reshape(-1).to(device))
        return torch.argsort(local_expert, stable=True), splits.received.sum(0).tolist()

    def _sent(self) -> int:
        return int(self.comm.comm_stats.bytes_sent)

    def __call__(
        self, x: torch.Tensor, routing: Routing, experts: Experts, stats: MoEStats
    ) -> torch.Tensor:
        before = self._sent()
        token, weight, rows, splits = self.route_rows(x, routing)
        after_counts = self._sent()
        with trace.span("moe_dispatch", kind="comm"):
            arrived = exchange_rows(rows, self.exchange, splits.send, splits.recv, "dispatch")
        after_dispatch = self._sent()
        order, counts_here = self.local_order(splits, x.device)
        with trace.span("moe_experts", kind="compute", tokens=int(sum(counts_here))):
            y = experts(arrived[order], counts_here)
        y_by_source = y[torch.argsort(order)]
        with trace.span("moe_combine", kind="comm"):
            back = exchange_rows(y_by_source, self.exchange, splits.recv, splits.send, "combine")
        stats.all_to_all_bytes = {
            "counts": after_counts - before,
            "dispatch": after_dispatch - after_counts,
            "combine": self._sent() - after_dispatch,
        }
        stats.received_per_local_expert = counts_here
        return combine_rows(back, token, weight, x.shape[0])
