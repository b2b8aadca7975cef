"""The token exchange of expert parallelism: one count message that is also the call's agreement,
then each payload posted in one call into buffers kept across steps.

This is the hop between the MoE dispatcher (:mod:`.dispatch`) and the wire
(:class:`~dtlab.comm.Communicator`). Per MoE forward, on each of the ``ep`` ranks of the group:

1. **counts** (:meth:`TokenExchange.exchange_counts`) — rank ``i`` sends rank ``j`` one int64
   message: a header of ``COUNT_HEADER_WORDS`` words, *(call number, experts E, row width,
   dtype)*, then the rows it routes to each of ``j``'s ``E/ep`` experts. Every rank receives every
   other rank's header, so every rank can compare all of them: a rank that calls with another
   width, dtype, expert count, or one call ahead makes **every** rank raise
   :class:`~dtlab.collectives.CollectiveMismatch` naming each rank's value — the agreement a
   generic all-to-all buys with a control all-gather before each payload, folded here into the
   message the dispatch needs anyway. Bytes sent per rank: ``(ep−1)·(H + E/ep)·8``
   (:func:`dtlab.cost.moe.dispatch_bytes_from_counts`). The receive buffer must be as long as
   the message, so the expert count alone is agreed once, on the first call, by a control
   all-gather (a gloo receive shorter than its message aborts the process).
2. **dispatch** and **combine** (:meth:`TokenExchange.exchange_rows`) — the payload moves in
   one call (not ``ep−1`` pairwise steps), landing in a receive buffer kept per (purpose,
   micro-batch) and grown when a step needs more rows: a fresh receive tensor per step would
   cost its allocation and its release inside the exchange.

Transport, one of two (the :class:`~dtlab.comm.Communicator`'s ``collectives=``):

``"torch"``
    each of the three is **one** ``all_to_all_single``: the counts with their headers, one row
    of the ``(ep, H + E/ep)`` message to each rank (even splits: gloo's ``alltoall``), then the
    rows with the splits from the counts (``alltoallv``). The same calls one writes with torch alone, plus a
    4-word header per peer and a comparison of ``ep`` headers: ``dtlab bench moe`` times it
    against the bare, unchecked calls into fresh tensors (goal ≤ 1.10×). Bytes are recorded
    from the splits (``comm_stats.counted`` is ``False``; an all-to-all's bytes are its splits).
``"dtlab"``
    every message is posted per peer with :meth:`~dtlab.comm.Communicator.start_exchange`
    (``isend``/``irecv``, each byte counted from the messages, and asynchronous on gloo, so
    :meth:`TokenExchange.start_rows` can hide a payload behind compute). Counting per message
    has a price: ``2(ep−1)`` posted messages per exchange where ``all_to_all_single`` is one
    call, slower on gloo (``dtlab bench moe`` prints the ratio); accounting and the labs use it.

Buffer lifetime, the rule a reader of the returned rows must know: a forward result is a view of
the buffer of its purpose and micro-batch (``trace.labels(micro_batch=...)``; 0 outside one) and
is overwritten by the next exchange of that purpose and micro-batch. Each overwrite bumps the
buffer's autograd version, so a graph that saved a stale view raises in backward (autograd's
in-place check) instead of using wrong values. Backward's exchanges get fresh tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.graph import increment_version

from dtlab import trace
from dtlab.collectives.agreement import CollectiveMismatch
from dtlab.comm import Communicator, PendingMessages
from dtlab.cost.moe import COUNT_HEADER_WORDS

_FIELDS = ("call number", "experts", "row width", "dtype")
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64)


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else 100 + dtype.itemsize


def _dtype_name(code: int) -> str:
    return str(_DTYPES[code]).removeprefix("torch.") if code < 100 else f"{code - 100}-byte"


@dataclass(frozen=True)
class Splits:
    """Rows per rank of one dispatch: ``send[j]`` to rank ``j``, ``recv[s]`` from rank ``s``;
    ``received`` (ep, E/ep) the rows each source routes to each local expert."""

    send: list[int]
    recv: list[int]
    received: torch.Tensor


def _offsets(splits: list[int]) -> list[int]:
    bounds = [0]
    for count in splits:
        bounds.append(bounds[-1] + count)
    return bounds


class TokenExchange:
    """One EP group's count, dispatch and combine messages, with buffers kept across steps."""

    def __init__(self, comm: Communicator, name: str = "moe") -> None:
        self.comm, self.name = comm, name
        self.calls = 0  # count exchanges so far: the header's call number
        self._experts: int | None = None  # agreed on the first call
        self._buffers: dict[tuple, torch.Tensor] = {}

    # -- 1. counts: the message that is also the agreement ------------------------------------
    def exchange_counts(
        self, tokens_per_expert: torch.Tensor, width: int, dtype: torch.dtype
    ) -> Splits:
        """Send every rank the rows routed to its experts, behind a header every rank checks."""
        ep = self.comm.world_size
        n_experts = tokens_per_expert.numel()
        if n_experts % ep:
            raise ValueError(
                f"{n_experts} experts cannot be split over an EP group of {ep}; choose ep "
                "dividing n_experts"
            )
        if self._experts is None:
            self._agree_on_experts(n_experts, tokens_per_expert.device)
        per, h = n_experts // ep, COUNT_HEADER_WORDS
        message = self._buffer("count_send", (ep, h + per), torch.int64, tokens_per_expert.device)
        header = (self.calls, n_experts, width, _dtype_code(dtype))
        message[:, :h] = torch.tensor(header, dtype=torch.int64)
        message[:, h:] = tokens_per_expert.view(ep, per)
        got = self._buffer("count_recv", (ep, h + per), torch.int64, tokens_per_expert.device)
        self.calls += 1
        with trace.span(f"{self.name}_count_exchange", kind="comm"):
            self._move(message, got, None, None, "counts")  # one row to each rank
            table = got.tolist()  # the host waits here for every rank's counts
        self._check_headers([tuple(row[:h]) for row in table])
        received = got[:, h:].clone()
        send = message[:, h:].sum(1).tolist()
        return Splits(send, [sum(row[h:]) for row in table], received)

    def _agree_on_experts(self, n_experts: int, device: torch.device) -> None:
        ep = self.comm.world_size
        everyone = torch.empty(ep, dtype=torch.int64, device=device)
        mine = torch.tensor([n_experts], dtype=torch.int64, device=device)
        self.comm.all_gather_control(everyone, mine, name=f"{self.name} experts check")
        values = everyone.tolist()
        if len(set(values)) > 1:
            raise CollectiveMismatch(
                f"{self.name} exchange on the {self.comm.dim} group: the ranks disagree on the "
                f"number of experts — {self._per_rank(values)}. Every EP rank must route over the "
                "same experts: build the same MoEConfig on every rank."
            )
        self._experts = n_experts

    def _per_rank(self, values: list) -> str:
        return ", ".join(f"rank {self.comm.ranks[i]}: {v}" for i, v in enumerate(values))

    def _check_headers(self, headers: list[tuple[int, ...]]) -> None:
        if len(set(headers)) == 1:
            return
        wrong = []
        for f, field_name in enumerate(_FIELDS):
            values = [h[f] for h in headers]
            if len(set(values)) > 1:
                shown = [_dtype_name(v) for v in values] if field_name == "dtype" else values
                wrong.append(f"{field_name}: {self._per_rank(shown)}")
        raise CollectiveMismatch(
            f"{self.name} dispatch on the {self.comm.dim} group: the ranks disagree — "
            + "; ".join(wrong)
            + ". Every EP rank must dispatch the same MoE layer, in the same order, with rows of "
            "the same width and dtype (a rank that runs an extra forward is one call ahead)."
        )

    # -- 2. the payload: every message posted at once, into kept buffers ----------------------
    def exchange_rows(
        self, rows: torch.Tensor, send: list[int], recv: list[int], purpose: str
    ) -> torch.Tensor:
        """Rows ``send[j]`` of ``rows`` to rank ``j``; returns the ``sum(recv)`` rows received,
        in source-rank order: a view of this purpose's kept buffer (module docstring)."""
        out = self._result(purpose, sum(recv), rows)
        self._move(rows, out, send, recv, purpose)
        return out

    def start_rows(
        self, rows: torch.Tensor, send: list[int], recv: list[int], purpose: str
    ) -> tuple[torch.Tensor, PendingMessages]:
        """Post the payload and return ``(out, handle)`` at once; ``out`` is valid after
        ``handle.wait()``. Asynchronous over ``isend``/``irecv`` on gloo on either path, so
        compute between the two calls hides the transfer (:mod:`.overlap`)."""
        out = self._result(purpose, sum(recv), rows)
        return out, self._post(rows.contiguous(), out, send, recv, purpose)

    def _result(self, purpose: str, n_rows: int, like: torch.Tensor) -> torch.Tensor:
        slot = trace.current_labels().get("micro_batch", 0)
        shape = (n_rows, *like.shape[1:])
        out = self._buffer((purpose, slot), shape, like.dtype, like.device)
        increment_version(out)  # a graph still holding the last step's view now raises
        return out

    def _buffer(self, key, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
        numel = 1
        for size in shape:
            numel *= size
        key = (key, dtype, device, tuple(shape[1:]))
        held = self._buffers.get(key)
        if held is None or held.numel() < numel:
            held = torch.empty(max(numel, 1), dtype=dtype, device=device)
            self._buffers[key] = held
        return held[:numel].view(shape)

    def _move(self, rows, out, send: list[int] | None, recv: list[int] | None, purpose: str):
        """One blocking exchange; ``None`` splits: one equal share per rank (gloo's ``alltoall``
        rather than ``alltoallv`` on the torch path)."""
        if self.comm.via == "torch":  # all_to_all_single, blocking
            self.comm.all_to_all(out, rows.contiguous(), recv, send, f"{self.name}_{purpose}")
            return
        even = [len(rows) // self.comm.world_size] * self.comm.world_size
        self._post(rows.contiguous(), out, send or even, recv or even, purpose).wait()

    def _post(self, rows, out, send: list[int], recv: list[int], purpose: str):
        """Post every row message at once (:meth:`~dtlab.comm.Communicator.start_exchange`:
        counted from the messages, drawn as one ``comm`` span and a ``wait:`` idle span)."""
        comm, me, at, into = self.comm, self.comm.rank, _offsets(send), _offsets(recv)
        others = [j for j in range(comm.world_size) if j != me]
        handle = comm.start_exchange(
            sends=[(j, rows[at[j] : at[j + 1]]) for j in others],
            recvs=[(j, out[into[j] : into[j + 1]]) for j in others],
            name=f"{self.name}_{purpose}",
            op=f"{self.name}_{purpose}",
        )
        out[into[me] : into[me + 1]] = rows[at[me] : at[me + 1]]  # my own rows never travel
        return handle


class _ExchangeRows(torch.autograd.Function):
    """Forward: the payload into the kept buffer. Backward: the same messages reversed, into a
    fresh tensor (a gradient may be kept, e.g. as a leaf's ``.grad``)."""

    @staticmethod
    def forward(ctx, rows, exchange: TokenExchange, send, recv, purpose):
        ctx.exchange, ctx.splits, ctx.purpose = exchange, (send, recv), purpose
        return exchange.exchange_rows(rows, send, recv, purpose)

    @staticmethod
    def backward(ctx, grad):
        send, recv = ctx.splits
        exchange = ctx.exchange
        out = grad.new_empty((sum(send), *grad.shape[1:]))
        exchange._move(grad.contiguous(), out, recv, send, f"{ctx.purpose}_grad")
        return out, None, None, None, None


def exchange_rows(
    rows: torch.Tensor, exchange: TokenExchange, send: list[int], recv: list[int], purpose: str
) -> torch.Tensor:
    """:meth:`TokenExchange.exchange_rows` with autograd: backward sends each gradient row home."""
    return _ExchangeRows.apply(rows, exchange, send, recv, purpose)
