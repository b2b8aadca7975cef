"""What tensor parallelism exposes, measured on real ranks: one call per technique.

* :func:`measure_tp_backward_overlap` — a stack of column → GELU → row MLP layers, forward and
  backward, once with the input-gradient collective waited for at once and once waited for after
  wgrad (:mod:`.backward_overlap`), the two interleaved step by step on the same ranks.
* :func:`measure_async_tp` — sequence parallelism's forward pair (all-gather → column GEMM,
  row GEMM → reduce-scatter), plain and chunked per peer (:mod:`.async_tp`).

Each returns an :class:`OverlapMeasurement`: for the technique off and on, the communication time
per layer (``comm_ms``: launch to completion, the ``comm`` spans) and the part of it a rank sat
waiting (``exposed_ms``: the ``wait:…`` idle spans of an asynchronous collective, or the whole span
of a blocking one), read from the trace of the run — measured, not modelled. Times are medians
over the measured steps of the mean over ranks and layers; the first ``warmup`` steps are dropped.
On gloo the "transfer" is memory copies through the loopback and the ranks share the CPU cores
with the compute they hide behind, so the hidden share here is a lower bound of a GPU's.

Both run on either collectives path. On ``collectives="dtlab"`` (every byte counted) an
asynchronous collective runs on the ranks' background stream (:mod:`dtlab.comm.background`, gloo)
and draws the same ``comm`` span and ``wait:…`` span as on torch's path (its ``comm`` span starts
when the worker starts it, not at the launch); a *blocking* one draws no span under its own name,
only its ring's steps and agreement check on the calling thread (``all_reduce.ring …``,
``all_reduce check (control)``). Those are read as the collective ``tp.<op>`` (their intervals:
the time the rank spent in the call, less the few microseconds of Python between steps), so both
paths report the same fields. On NCCL the counted path runs an asynchronous collective inside its
launch (:class:`~dtlab.comm.OverlapRefused`): there is no wait to read, and the measurement
refuses it. (Async TP's point-to-point chunks overlap on either path.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab import trace
from dtlab.comm import Communicator, gather_along, reduce_scatter_along
from dtlab.parallel.tensor.async_tp import all_gather_matmul, matmul_reduce_scatter
from dtlab.parallel.tensor.backward_overlap import (
    INPUT_GRAD_NAMES,
    REGATHER_NAME,
    column_parallel_linear,
)
from dtlab.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear
from dtlab.parallel.tensor.overlap_spans import (
    _check_collectives,
    _exposed_per_step,
    _names,
    _per_step,
    _with_blocking_named,
)


@dataclass
class ExposedComm:
    """One side of a measurement: per layer, in milliseconds, from the trace."""

    technique_on: bool
    comm_ms: float  # the collectives the technique targets, launch to completion
    exposed_ms: float  # the part of comm_ms no compute of the same rank covered
    wait_ms: float  # the time blocked in wait() (a blocking collective: all of it)
    compute_ms: float  # the compute the technique hides them behind (wgrad, or the GEMMs)

    @property
    def hidden_share(self) -> float:
        """``1 − exposed/comm``: the share of the communication that ran under compute."""
        return max(0.0, 1.0 - self.exposed_ms / self.comm_ms) if self.comm_ms > 0 else 0.0


@dataclass
class OverlapMeasurement:
    """A technique off and on, measured on the same ranks in one interleaved run."""

    mechanism: str
    off: ExposedComm
    on: ExposedComm
    equal: bool  # the results with and without the technique compared on every rank
    world_size: int
    detail: dict  # what else was exposed (e.g. the forward collectives), per layer in ms

    def rows(self) -> list[dict]:
        """One row per side, for a table: mechanism, technique on/off, times, hidden share."""
        return [
            {"mechanism": self.mechanism, **asdict(side), "hidden_share": side.hidden_share}
            for side in (self.off, self.on)
        ]


def _mlp_stack(comm: Communicator, layers: int, d_model: int, d_ff: int, sp: bool):
    torch.manual_seed(0)  # the same full layers on every rank; each keeps its shard
    return [
        (
            ColumnParallelLinear.from_linear(nn.Linear(d_model, d_ff), comm),
            RowParallelLinear.from_linear(nn.Linear(d_ff, d_model), comm, sequence_parallel=sp),
        )
        for _ in range(layers)
    ]


def _backward_overlap_rank(layers, batch, seq, d_model, d_ff, sp, steps, collectives):
    comm = Communicator(None, collectives, "tp")
    stack = _mlp_stack(comm, layers, d_model, d_ff, sp)
    torch.manual_seed(1)
    tokens = seq // comm.world_size if sp else seq
    x0 = torch.randn(batch, tokens, d_model)
    grads = {}
    for step in range(steps):
        for on in (False, True):  # interleaved: both sides see the same machine state
            x = x0.clone().requires_grad_(True)
            with trace.labels(step=step, technique_on=on):
                with trace.labels(phase="forward"):
                    h = x
                    for column, row in stack:
                        h = column_parallel_linear(
                            h, column.weight, column.bias, comm,
                            sequence_parallel=sp, backward_overlap=on,
                        )  # fmt: skip
                        h = row(F.gelu(h))
                with trace.labels(phase="backward"):
                    h.sum().backward()
            params = [p for pair in stack for module in pair for p in module.parameters()]
            grads[on] = [x.grad] + [p.grad for p in params]
            for p in params:
                p.grad = None
    return all(torch.equal(a, b) for a, b in zip(grads[False], grads[True], strict=True))


def measure_tp_backward_overlap(
    cluster,
    *,
    layers: int = 4,
    batch: int = 4,
    seq: int = 64,
    d_model: int = 256,
    d_ff: int = 1024,
    sequence_parallel: bool = False,
    steps: int = 4,
    warmup: int = 1,
    collectives: str = "torch",
) -> OverlapMeasurement:
    """Exposed input-gradient communication per layer with and without backward overlap.

    ``comm_ms`` / ``exposed_ms``: the column layer's input-gradient all-reduce (with
    ``sequence_parallel``: its reduce-scatter, plus the re-gather of the input) per layer;
    ``compute_ms``: the wgrad (and, with SP, dgrad) GEMMs hiding them. ``detail`` holds what
    stays exposed either way: ``forward_exposed_ms`` (the row layer's all-reduce, or SP's
    all-gather and reduce-scatter) and, with SP, ``backward_output_grad_gather_ms`` (the
    all-gather of ``dL/dY`` before the row layer's dgrad). ``equal``: the gradients of the input
    and of every weight were bit-identical with and without, on every rank.
    """
    if steps <= warmup:
        raise ValueError(f"steps={steps} leaves nothing after warmup={warmup}; raise steps")
    _check_collectives(cluster, collectives)
    out = cluster.run(
        _backward_overlap_rank,
        layers, batch, seq, d_model, d_ff, sequence_parallel, steps, collectives,
    )  # fmt: skip
    tr, measured = _with_blocking_named(out.trace, collectives), list(range(warmup, steps))
    targets = (*INPUT_GRAD_NAMES, REGATHER_NAME)
    waits = tuple(f"wait:{n}" for n in targets)
    hiding = ("tp.wgrad", "tp.dgrad") if sequence_parallel else ("tp.wgrad",)
    sides = {}
    for on in (False, True):
        common = {"technique_on": on}
        sides[on] = ExposedComm(
            technique_on=on,
            comm_ms=_per_step(tr, measured, layers, kind="comm", names=targets, **common),
            exposed_ms=_exposed_per_step(tr, measured, layers, names=targets, **common),
            wait_ms=_per_step(tr, measured, layers, kind="idle", names=waits, **common),
            compute_ms=_per_step(tr, measured, layers, kind="compute", names=hiding, **common),
        )
    forward = _names("tp.", tr, "comm") - set(targets)
    detail = {
        "forward_exposed_ms": _per_step(
            tr, measured, layers, kind="comm", names=forward, phase="forward"
        ),
        "backward_output_grad_gather_ms": _per_step(
            tr, measured, layers, kind="comm", names=forward, phase="backward"
        ),
        "sequence_parallel": sequence_parallel,
        "collectives": collectives,
    }
    return OverlapMeasurement(
        "tp_backward_overlap", sides[False], sides[True], all(out), len(tr.ranks), detail
    )


def _async_tp_rank(batch, seq, d_model, d_ff, steps, collectives):
    comm = Communicator(None, collectives, "tp")
    t = comm.world_size
    torch.manual_seed(0)
    w_in = nn.Linear(d_model, d_ff, bias=False).weight.detach().chunk(t, 0)[comm.rank]
    w_out = nn.Linear(d_ff, d_model, bias=False).weight.detach().chunk(t, 1)[comm.rank]
    torch.manual_seed(1)
    x = torch.randn(batch, seq, d_model).chunk(t, 1)[comm.rank].contiguous()
    results = {}
    for step in range(steps):
        for on in (False, True):
            with trace.labels(step=step, technique_on=on):
                if on:
                    h = F.gelu(all_gather_matmul(x, w_in, comm))
                    y = matmul_reduce_scatter(h, w_out, comm)
                else:
                    full = gather_along(x, 1, comm)
                    with trace.span("tp.gemm", kind="compute"):
                        h = F.gelu(F.linear(full, w_in))
                    with trace.span("tp.gemm", kind="compute"):
                        partial = F.linear(h, w_out)
                    y = reduce_scatter_along(partial, 1, comm)
            results[on] = y
    return (results[False] - results[True]).abs().max().item()


def measure_async_tp(
    cluster,
    *,
    batch: int = 4,
    seq: int = 64,
    d_model: int = 256,
    d_ff: int = 1024,
    steps: int = 4,
    warmup: int = 1,
    collectives: str = "torch",
    tolerance: float = 1e-5,
) -> OverlapMeasurement:
    """Exposed forward communication of one sequence-parallel MLP, plain and async TP.

    ``comm_ms``: the all-gather and reduce-scatter (plain: two blocking collectives, all of it
    exposed; async: ``2(t−1)`` chunk transfers); ``exposed_ms``: the part waited for;
    ``compute_ms``: the GEMMs (``t`` smaller ones per matmul with async TP — their sum against
    the one big GEMM is the cost of chunking). ``equal``: the outputs agree to ``tolerance``
    (the reduce-scatter adds in ring order); ``detail['max_abs_diff']`` is the largest gap.
    """
    if steps <= warmup:
        raise ValueError(f"steps={steps} leaves nothing after warmup={warmup}; raise steps")
    _check_collectives(cluster, collectives)
    out = cluster.run(_async_tp_rank, batch, seq, d_model, d_ff, steps, collectives)
    tr, measured = _with_blocking_named(out.trace, collectives), list(range(warmup, steps))
    plain_comm = ("tp.all_gather", "tp.reduce_scatter")
    chunk_comm = ("async_tp.all_gather", "async_tp.reduce_scatter")
    off = ExposedComm(
        False,
        comm_ms=_per_step(tr, measured, 1, kind="comm", names=plain_comm, technique_on=False),
        exposed_ms=_exposed_per_step(tr, measured, 1, names=plain_comm, technique_on=False),
        wait_ms=_per_step(tr, measured, 1, kind="comm", names=plain_comm, technique_on=False),
        compute_ms=_per_step(tr, measured, 1, kind="compute", names="tp.gemm", technique_on=False),
    )
    on = ExposedComm(
        True,
        comm_ms=_per_step(tr, measured, 1, kind="comm", names=chunk_comm, technique_on=True),
        exposed_ms=_exposed_per_step(tr, measured, 1, names=chunk_comm, technique_on=True),
        wait_ms=_per_step(
            tr,
            measured,
            1,
            kind="idle",
            names=[f"wait:{n}" for n in chunk_comm],
            technique_on=True,
        ),  # fmt: skip
        compute_ms=_per_step(
            tr, measured, 1, kind="compute", names="async_tp.gemm", technique_on=True
        ),
    )
    gap = max(out)
    detail = {"max_abs_diff": gap, "collectives": collectives, "tolerance": tolerance}
    return OverlapMeasurement("async_tp", off, on, gap <= tolerance, len(tr.ranks), detail)


def tp_overlap_figures(cluster, *, fast: bool = True, collectives: str = "torch") -> list[dict]:
    """The rows ``dtlab bench overlap`` prints for tensor parallelism, from one run each:
    backward overlap (TP, and TP + SP) and async TP, each off and on. Every row:
    ``mechanism, implementation ("dtlab"), technique_on, comm_ms, exposed_ms, wait_ms,
    compute_ms, hidden_share, equal, world_size``. torch has no CPU counterpart to set beside
    them (its async TP is GPU-only: :mod:`.async_tp`)."""
    size = dict(batch=2, seq=32, d_model=128, d_ff=512) if fast else {}
    runs = [
        measure_tp_backward_overlap(cluster, collectives=collectives, **size),
        measure_tp_backward_overlap(
            cluster, sequence_parallel=True, collectives=collectives, **size
        ),
        measure_async_tp(cluster, collectives=collectives, **size),
    ]
    rows = []
    for run, name in zip(
        runs, ("tp_backward_overlap", "tp_sp_backward_overlap", "async_tp"), strict=True
    ):
        for row in run.rows():
            row.update(
                mechanism=name, implementation="dtlab", equal=run.equal,
                world_size=run.world_size,
            )  # fmt: skip
            rows.append(row)
    return rows
