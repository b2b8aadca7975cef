"""MoE dispatch and combine behind compute: two micro-batches, one's all-to-alls under the other's
attention or experts (the idea DeepSeek-V3's DualPipe builds its schedule on, §3.2.1).

One MoE block's forward per micro-batch is ``attention → route → dispatch → experts → combine``.
Run one micro-batch after the other and every all-to-all is exposed: the rank has nothing to do
while its rows travel. With two micro-batches A and B in flight, each transfer has the other's
compute to hide under (``start_rows`` posts the messages and returns; ``wait`` comes later)::

    attention(A); counts(A); start dispatch(A)
    attention(B)                    ← hides A's dispatch
    wait dispatch(A); counts(B); start dispatch(B)
    experts(A); start combine(A)    ← experts(A) hides B's dispatch
    wait dispatch(B); experts(B)    ← hides A's combine
    wait combine(A); start combine(B)
    weigh and sum A's rows          ← hides (part of) B's combine
    wait combine(B); weigh and sum B's rows

The count exchanges stay blocking (a receiver needs them to size its buffers): the small part
that no schedule hides. Messages between two ranks match in posting order, so every rank posts
in the same order; each micro-batch has its own receive buffers (``trace.labels(micro_batch=)``,
:mod:`.exchange`). Both schedules give bit-identical outputs.

*Exposed* all-to-all time, measured on each rank's clock: the time spent in the (blocking) count
exchanges, posting, and blocked in ``wait`` — the part of the transfers no compute covered.
Sequentially it is the whole exchange. This runs on gloo over dtlab's counted messages, which really are asynchronous there;
NCCL's point-to-point here is one blocking step (:class:`dtlab.collectives.transport.TorchTransport`).

:func:`measure_two_microbatch_overlap` runs both schedules interleaved on a cluster and reports
the exposed time of each, the step time of each, and whether the outputs were equal.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from dtlab import trace


@dataclass(frozen=True)
class TwoMicrobatchOverlap:
    """Exposed all-to-all and step time per schedule (medians over rounds, slowest rank)."""

    exposed_s: dict[str, float]  # "sequential", "overlapped": counts + posting + blocked in wait
    step_s: dict[str, float]
    equal: bool  # overlapped outputs == sequential outputs, bit for bit, on every rank
    bytes_per_rank: list[int]  # counted exchange bytes of one schedule, per rank

    @property
    def hidden_share(self) -> float:
        """The share of the sequential schedule's exposed all-to-all time that overlap hid."""
        return 1 - self.exposed_s["overlapped"] / self.exposed_s["sequential"]


class _Parts:
    """One rank's MoE block: attention weights, router, its experts, and the exchange."""

    def __init__(self, dim: int, n_experts: int, top_k: int, exchange) -> None:
        g = torch.Generator().manual_seed(0)
        self.w_qkv = torch.randn(dim, 3 * dim, generator=g) / dim**0.5
        self.router = torch.randn(n_experts, dim, generator=g)
        per = n_experts // exchange.comm.world_size
        first = exchange.comm.rank * per
        w_in = torch.randn(n_experts, dim, 4 * dim, generator=g) / dim**0.5
        w_out = torch.randn(n_experts, 4 * dim, dim, generator=g) / (4 * dim) ** 0.5
        self.w_in, self.w_out = w_in[first : first + per], w_out[first : first + per]
        self.n_experts, self.top_k, self.exchange = n_experts, top_k, exchange
        self.exposed = 0.0

    def attention(self, x: torch.Tensor, micro_batch: int) -> torch.Tensor:
        with trace.span("attention", kind="compute", micro_batch=micro_batch):
            q, k, v = (x @ self.w_qkv).chunk(3, -1)
            scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
            return x + scores.softmax(-1) @ v

    def route(self, h: torch.Tensor, micro_batch: int) -> dict:
        from dtlab.models.moe_router import route

        flat = h.reshape(-1, h.shape[-1])
        routing = route(flat, self.router, self.top_k)
        token = torch.arange(len(flat)).repeat_interleave(self.top_k)
        expert = routing.expert_index.reshape(-1)
        order = torch.argsort(expert, stable=True)
        with trace.labels(micro_batch=micro_batch):
            started = time.perf_counter()
            splits = self.exchange.exchange_counts(
                torch.bincount(expert, minlength=self.n_experts), flat.shape[1], flat.dtype
            )
            self.exposed += time.perf_counter() - started
        weight = routing.weight.reshape(-1)[order]
        return {"flat": flat, "token": token[order], "weight": weight, "splits": splits}

    def start(self, rows: torch.Tensor, send, recv, purpose: str, micro_batch: int):
        with trace.labels(micro_batch=micro_batch):
            started = time.perf_counter()
            out, handle = self.exchange.start_rows(rows, send, recv, purpose)
            self.exposed += time.perf_counter() - started
        return out, handle

    def wait(self, handle, micro_batch: int) -> None:
        with trace.labels(micro_batch=micro_batch):
            started = time.perf_counter()
            handle.wait()
            self.exposed += time.perf_counter() - started

    def experts(self, arrived: torch.Tensor, splits, micro_batch: int) -> torch.Tensor:
        per = self.w_in.shape[0]
        local = torch.arange(per).repeat(self.exchange.comm.world_size)
        local = local.repeat_interleave(splits.received.reshape(-1))
        order = torch.argsort(local, stable=True)
        rows, counts = arrived[order], splits.received.sum(0).tolist()
        with trace.span("moe_experts", kind="compute", micro_batch=micro_batch):
            outs, at = [], 0
            for e, n in enumerate(counts):
                hidden = torch.nn.functional.gelu(rows[at : at + n] @ self.w_in[e])
                outs.append(hidden @ self.w_out[e])
                at += n
            y = torch.cat(outs) if outs else rows
        return y[torch.argsort(order)].contiguous()

    @staticmethod
    def combine(state: dict, back: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(state["flat"])
        return out.index_add(0, state["token"], back * state["weight"][:, None])


def sequential(parts: _Parts, batches: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each micro-batch's block forward start to finish, every all-to-all waited at once."""
    outs = []
    for i, x in enumerate(batches):
        s = parts.route(parts.attention(x, i), i)
        sp = s["splits"]
        arrived, h = parts.start(s["flat"][s["token"]], sp.send, sp.recv, "dispatch", i)
        parts.wait(h, i)
        y = parts.experts(arrived, sp, i)
        back, h = parts.start(y, sp.recv, sp.send, "combine", i)
        parts.wait(h, i)
        outs.append(parts.combine(s, back))
    return outs


def overlapped(parts: _Parts, batches: list[torch.Tensor]) -> list[torch.Tensor]:
    """Two micro-batches, each all-to-all hidden under the other's compute (module docstring)."""
    a, b = batches
    sa = parts.route(parts.attention(a, 0), 0)
    da, ha = parts.start(sa["flat"][sa["token"]], sa["splits"].send, sa["splits"].recv, "dispatch", 0)  # fmt: skip
    hb_in = parts.attention(b, 1)  # hides A's dispatch
    parts.wait(ha, 0)
    sb = parts.route(hb_in, 1)
    db, hb = parts.start(sb["flat"][sb["token"]], sb["splits"].send, sb["splits"].recv, "dispatch", 1)  # fmt: skip
    ya = parts.experts(da, sa["splits"], 0)  # hides B's dispatch
    ca, hca = parts.start(ya, sa["splits"].recv, sa["splits"].send, "combine", 0)
    parts.wait(hb, 1)
    yb = parts.experts(db, sb["splits"], 1)  # hides A's combine
    parts.wait(hca, 0)
    cb, hcb = parts.start(yb, sb["splits"].recv, sb["splits"].send, "combine", 1)
    out_a = parts.combine(sa, ca)  # hides part of B's combine
    parts.wait(hcb, 1)
    return [out_a, parts.combine(sb, cb)]


SCHEDULES = {"sequential": sequential, "overlapped": overlapped}


def _on_rank(tokens: int, dim: int, n_experts: int, top_k: int, rounds: int) -> dict:
    from dtlab.comm import Communicator
    from dtlab.parallel.expert.exchange import TokenExchange

    comm = Communicator(None, collectives="dtlab", dim="ep")
    rank = comm.rank
    parts = _Parts(dim, n_experts, top_k, TokenExchange(comm))
    g = torch.Generator().manual_seed(1 + rank)
    batches = [torch.randn(2, tokens // 2, dim, generator=g) for _ in range(2)]
    exposed = {name: [] for name in SCHEDULES}
    step = {name: [] for name in SCHEDULES}
    outs, sent = {}, {}
    for r in range(rounds + 1):  # round 0 warms up
        for name in list(SCHEDULES)[r % 2 :] + list(SCHEDULES)[: r % 2]:
            comm.all_reduce_control(torch.zeros(1), name="round start")  # all ranks start together
            parts.exposed, before = 0.0, comm.comm_stats.bytes_sent
            started = time.perf_counter()
            with trace.labels(schedule=name, round=r):
                outs[name] = SCHEDULES[name](parts, batches)
            if r:
                step[name].append(time.perf_counter() - started)
                exposed[name].append(parts.exposed)
            sent[name] = comm.comm_stats.bytes_sent - before
    equal = all(
        torch.equal(p, q) for p, q in zip(outs["sequential"], outs["overlapped"], strict=True)
    )
    return {"exposed": exposed, "step": step, "equal": equal, "sent": sent}


def measure_two_microbatch_overlap(
    cluster,
    tokens: int = 512,
    dim: int = 64,
    n_experts: int | None = None,
    top_k: int = 2,
    rounds: int = 5,
) -> TwoMicrobatchOverlap:
    """Run one MoE block's forward on two micro-batches of ``tokens`` tokens each per rank (width
    ``dim``; ``n_experts`` defaults to two per rank, top-``top_k``), sequentially and overlapped,
    interleaved for ``rounds`` rounds on ``cluster``; exposed all-to-all time per schedule
    (median over rounds of the slowest rank's), step time, and the outputs' equality."""
    n_experts = n_experts or 2 * cluster.world_size
    if n_experts % cluster.world_size:
        raise ValueError(
            f"n_experts={n_experts} must be a multiple of the {cluster.world_size} ranks"
        )
    if tokens % 2:
        raise ValueError(f"tokens={tokens} must be even: each micro-batch holds two sequences")
    out = cluster.run(_on_rank, tokens, dim, n_experts, top_k, rounds)

    def slowest(key: str, name: str) -> float:
        per_round = zip(*(r[key][name] for r in out), strict=True)
        return statistics.median(max(values) for values in per_round)

    if any(r["sent"]["sequential"] != r["sent"]["overlapped"] for r in out):
        raise AssertionError("the two schedules moved different bytes")
    return TwoMicrobatchOverlap(
        exposed_s={name: slowest("exposed", name) for name in SCHEDULES},
        step_s={name: slowest("step", name) for name in SCHEDULES},
        equal=all(r["equal"] for r in out),
        bytes_per_rank=[int(r["sent"]["overlapped"]) for r in out],
    )
