"""The communication layer's autograd functions give the gradients of the global computation.

Each function is checked the way a distributed layer uses it. Rank r holds ``X[r]`` and weights
its output ``y_r`` with ``W[r]``; the loss is ``L = Σ_r <W[r], y_r>`` (for Megatron's ``g``,
whose output is replicated and consumed by replicated code, one copy ``<W, y>``). One process
computes ``dL/dX`` on the global tensors with plain torch ops; the distributed backward must give
each rank its slice of it. Forward and backward must each move the bytes of the collective they
state, counted from real messages.
"""

from __future__ import annotations

import pytest
import torch

import dtlab
from dtlab.comm import (
    Communicator,
    all_to_all_rows,
    copy_to_group,
    gather_along,
    reduce_from_group,
    reduce_scatter_along,
)

SHAPE = (2, 8, 3)  # (batch, sequence, hidden): the sequence dim splits over 2 or 4 ranks


def _global(n: int, seed: int) -> torch.Tensor:
    return torch.randn(
        n, *SHAPE, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )


def _reference(op: str, xs: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """dL/dX for every rank, computed in one process."""
    xs = xs.clone().requires_grad_()
    n = len(xs)
    if op == "copy":  # y_r = x (x replicated: rank 0's copy is the leaf)
        loss = sum((ws[r] * xs[0]).sum() for r in range(n))
    elif op == "reduce":  # y = Σ X_s, one replicated copy of the loss
        loss = (ws[0] * xs.sum(0)).sum()
    elif op == "gather":  # y_r = cat_s X_s along the sequence
        full = torch.cat(list(xs), dim=1)
        loss = sum((ws[r].repeat(1, n, 1) * full).sum() for r in range(n))
    elif op == "reduce_scatter":  # y_r = (Σ_s X_s)[sequence slice r]
        total = xs.sum(0)
        chunk = SHAPE[1] // n
        loss = sum(
            (ws[r][:, :chunk] * total[:, r * chunk : (r + 1) * chunk]).sum() for r in range(n)
        )
    loss.backward()
    return xs.grad


def _distributed(op: str, collectives: str) -> dict:
    rank, n = dtlab.rank(), dtlab.world_size()
    comm = Communicator(collectives=collectives)
    xs, ws = _global(n, 0), _global(n, 1)
    x = (xs[0] if op == "copy" else xs[rank]).clone().requires_grad_()
    w = ws[0] if op == "reduce" else ws[rank]
    forward = {
        "copy": lambda t: copy_to_group(t, comm),
        "reduce": lambda t: reduce_from_group(t, comm),
        "gather": lambda t: gather_along(t, 1, comm),
        "reduce_scatter": lambda t: reduce_scatter_along(t, 1, comm),
    }[op]
    y = forward(x)
    sent_forward = comm.comm_stats.bytes_sent
    if op == "gather":
        w = w.repeat(1, n, 1)
    elif op == "reduce_scatter":
        w = w[:, : SHAPE[1] // n]
    (w * y).sum().backward()
    want = _reference(op, xs, ws)[0 if op == "copy" else rank]
    return {
        "grad_error": (x.grad - want).abs().max().item(),
        "sent": (sent_forward, comm.comm_stats.bytes_sent - sent_forward),
        "counted": comm.comm_stats.counted,
    }


def _every_op() -> dict:
    return {
        (op, via): _distributed(op, via)
        for op in ("copy", "reduce", "gather", "reduce_scatter")
        for via in ("dtlab", "torch")
    }


@pytest.mark.parametrize("world", [2, 4])
def test_megatron_and_sequence_parallel_functions_give_global_gradients_and_move_stated_bytes(
    world, request
):
    cluster = request.getfixturevalue(f"cluster{world}")
    m = 8 * torch.Size(SHAPE).numel()  # bytes of one rank's fp64 tensor
    ring = 2 * (world - 1) / world * m  # all-reduce of M bytes
    half = (world - 1) * m  # all-gather / reduce-scatter of the N·M-byte full tensor
    partial = (world - 1) / world * m  # reduce-scatter of one rank's M-byte input
    stated = {
        "copy": (0, ring),  # f: identity forward, all-reduce backward
        "reduce": (ring, 0),  # g: all-reduce forward, identity backward
        "gather": (half, half),  # all-gather forward, reduce-scatter backward
        "reduce_scatter": (partial, partial),  # reduce-scatter forward, all-gather backward
    }
    for per_rank in cluster.run(_every_op):
        for (op, via), r in per_rank.items():
            assert r["grad_error"] < 1e-12, (op, via, r)
            assert r["counted"] == (via == "dtlab")
            assert r["sent"] == stated[op], (op, via, r["sent"], stated[op])


def _all_to_all_uneven() -> dict:
    rank, n = dtlab.rank(), dtlab.world_size()
    comm = Communicator(collectives="dtlab")
    # rank r sends (r + 2j) % 3 + 1 rows to rank j (not symmetric: what r sends j differs from
    # what j sends r, so swapped splits would show); every rank can work out every count
    counts = [[(r + 2 * j) % 3 + 1 for j in range(n)] for r in range(n)]
    rows = [torch.arange(sum(c) * 2, dtype=torch.float64).view(-1, 2) + 100 * r
            for r, c in enumerate(counts)]  # fmt: skip
    x = rows[rank].clone().requires_grad_()
    received = [counts[s][rank] for s in range(n)]
    y = all_to_all_rows(x, comm, output_splits=received, input_splits=counts[rank])
    expected = torch.cat([
        rows[s][sum(counts[s][:rank]) : sum(counts[s][: rank + 1])] for s in range(n)
    ])  # fmt: skip
    weights = torch.arange(y.numel(), dtype=torch.float64).view_as(y) + rank
    (weights * y).sum().backward()
    # Row i of x went to rank j; its gradient is the weight rank j gave it.
    want = torch.empty_like(x)
    for j in range(n):
        start_in_x = sum(counts[rank][:j])
        start_at_j = sum(counts[s][j] for s in range(rank))
        k = counts[rank][j]
        w_j = torch.arange(sum(counts[s][j] for s in range(n)) * 2, dtype=torch.float64)
        w_j = w_j.view(-1, 2) + j
        want[start_in_x : start_in_x + k] = w_j[start_at_j : start_at_j + k]
    return {"forward": torch.equal(y, expected), "backward": torch.equal(x.grad, want)}


def test_all_to_all_rows_with_uneven_splits_sends_gradients_home(cluster4):
    for r in cluster4.run(_all_to_all_uneven):
        assert r == {"forward": True, "backward": True}


def _spans_carry_the_group() -> list[dict]:
    from dtlab.mesh import Mesh

    mesh = Mesh(dp=2, tp=2)
    comm = Communicator.along(mesh, "tp", collectives="torch")
    with dtlab.trace.labels(micro_batch=3, phase="F"):
        y = reduce_from_group(torch.ones(4) * (mesh.tp_rank + 1), comm)
    return [y.tolist(), mesh.tp_ranks]


def test_spans_carry_group_micro_batch_and_phase_and_only_the_tp_peers_take_part(cluster4):
    run = cluster4.run(_spans_carry_the_group)
    for values, _tp_ranks in run:
        assert values == [3.0] * 4  # 1 + 2 over the two tp peers, not 1 + 2 + 1 + 2
    spans = run.trace.filter(kind="comm", group="tp").spans
    assert spans and all(s.labels["micro_batch"] == 3 and s.labels["phase"] == "F" for s in spans)


# -- non-blocking point to point, control messages, the refused overlap, groups ---------------
def _ring_step(collectives: str) -> dict:
    comm = Communicator(collectives=collectives, dim="cp")
    n, rank = comm.world_size, comm.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    outgoing = [torch.full((5,), float(rank)), torch.full((3,), 10.0 + rank)]
    incoming = [torch.empty(5), torch.empty(3)]
    pending = comm.start_exchange(
        [(right, t) for t in outgoing], [(left, t) for t in incoming], name="step", op="ring"
    )
    computed = torch.ones(64, 64) @ torch.ones(64, 64)  # runs while the messages travel
    pending.wait()
    pending.wait()  # idempotent
    single = torch.empty(2)
    send = comm.isend(torch.full((2,), float(rank)), right, name="one")
    recv = comm.irecv(single, left, name="one_back")
    send.wait()
    recv.wait()
    return {
        "received": [t.tolist() for t in incoming],
        "single": single.tolist(),
        "left": left,
        "by_op": dict(comm.comm_stats.bytes_by_op),
        "sent": comm.comm_stats.bytes_sent,
        "received_bytes": comm.comm_stats.bytes_received,
        "messages": (comm.comm_stats.messages_sent, comm.comm_stats.messages_received),
        "computed": computed[0, 0].item(),
    }


@pytest.mark.parametrize("collectives", ["dtlab", "torch"])
def test_posted_messages_arrive_are_counted_and_drawn_with_their_exposed_wait(
    collectives, cluster2
):
    run = cluster2.run(_ring_step, collectives)
    for r in run:
        left = r["left"]
        assert r["received"] == [[float(left)] * 5, [10.0 + left] * 3]
        assert r["single"] == [float(left)] * 2
        # counted from the posted messages on either path: 8 + 2 floats out, as many in
        assert r["by_op"] == {"ring_send": 32, "ring_recv": 0, "send": 8, "recv": 0}
        assert (r["sent"], r["received_bytes"], r["messages"]) == (40, 40, (3, 3))
    spans = run.trace.spans
    for rank in (0, 1):
        step = [s for s in spans if s.rank == rank and s.name == "step"]
        assert len(step) == 1 and step[0].kind == "comm" and step[0].nbytes == 32
        assert step[0].labels["to"] == [[1 - rank, 32]] and step[0].labels["group"] == "cp"
        assert [s.kind for s in spans if s.rank == rank and s.name == "wait:step"] == ["idle"]
    assert dtlab.collectives.traffic_matrix(spans, 2) == [[0, 40], [40, 0]]


def _parameter_server() -> list[int]:
    comm = Communicator(dim="ps")
    if comm.rank != 0:
        comm.send(torch.full((3,), float(comm.rank)), 0)
        return []
    senders = []
    for _ in range(comm.world_size - 1):
        got = torch.empty(3)
        sender = comm.recv(got)  # from whoever sends first
        assert got.tolist() == [float(sender)] * 3
        senders.append(sender)
    try:
        Communicator(collectives="dtlab").recv(torch.empty(1))
    except ValueError as error:
        assert "source=None" in str(error)
    else:
        raise AssertionError("the counted path must refuse a receive from any rank")
    return sorted(senders)


def test_a_receive_from_any_rank_returns_the_sender(cluster4):
    assert cluster4.run(_parameter_server)[0] == [1, 2, 3]


def _control_report() -> dict:
    from dtlab.mesh import Mesh

    mesh = Mesh(dp=2, tp=2)
    comm = Communicator.along(mesh, "dp", collectives="dtlab")
    loss = torch.tensor([float(dtlab.rank())], dtype=torch.float64)
    comm.all_reduce_control(loss, name="loss")
    flags = torch.tensor([dtlab.rank() % 2, 1], dtype=torch.int32)
    comm.all_reduce_control(flags, name="unused_parameters", op="max")
    return {
        "loss": loss.item(),
        "flags": flags.tolist(),
        "dp_ranks": mesh.dp_ranks,
        "stats": (comm.comm_stats.calls, comm.comm_stats.bytes_sent, comm.comm_stats.messages_sent),
    }


def test_scalar_reports_are_uncounted_control_messages_drawn_with_their_group(cluster4):
    run = cluster4.run(_control_report)
    for r in run:
        assert r["loss"] == float(sum(r["dp_ranks"]))
        assert r["flags"] == [max(q % 2 for q in r["dp_ranks"]), 1]
        assert r["stats"] == (0, 0, 0)  # payload bytes stay the payload's
    controls = [s for s in run.trace.spans if s.labels.get("control")]
    assert {s.name for s in controls} == {"loss (control)", "unused_parameters (control)"}
    assert all(s.kind == "other" and s.labels["group"] == "dp" for s in controls)
    assert len(controls) == 2 * 4
    assert not [s for s in run.trace.spans if s.kind == "comm"]


def _asynchronous(collectives: str) -> dict:
    import warnings

    comm = Communicator(collectives=collectives, dim="dp")
    x = torch.ones(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = comm.all_reduce(x, name="prefetch", async_op=True)
        second = comm.all_gather(torch.empty(8 * comm.world_size), x, async_op=True)
    first.wait()
    second.wait()
    return {
        "overlaps": comm.overlaps,
        "overlapped": (first.overlapped, second.overlapped),
        "warnings": [(w.category.__name__, str(w.message)) for w in caught],
        "value": x.tolist(),
    }


def test_both_paths_overlap_on_gloo_without_a_warning(cluster2):
    # The counted path queues an asynchronous collective on its background stream
    # (dtlab.comm.background; tests/test_comm_async.py proves the overlap by ordering).
    counted, real = cluster2.run(_asynchronous, "dtlab")[0], cluster2.run(_asynchronous, "torch")[0]
    assert counted["value"] == real["value"] == [2.0] * 8
    assert (counted["overlaps"], counted["overlapped"]) == (True, (True, True))
    assert (real["overlaps"], real["overlapped"]) == (True, (True, True))
    assert counted["warnings"] == real["warnings"] == []


def _among() -> dict:
    pairs = [[0, 3], [1, 2]]
    comm = Communicator.among(pairs, collectives="dtlab", dim="embedding")
    again = Communicator.among(pairs, dim="embedding")  # cached: the same group
    x = torch.tensor([float(dtlab.rank())])
    comm.all_reduce(x)
    none = Communicator.among([[0, 1]])
    return {
        "ranks": comm.ranks,
        "sum": x.item(),
        "same_group": again.group is comm.group,
        "outside": none is None,
    }


def test_groups_over_rank_lists_come_from_the_layer_once(cluster4):
    for rank, r in enumerate(cluster4.run(_among)):
        pair = [0, 3] if rank in (0, 3) else [1, 2]
        assert r["ranks"] == pair and r["sum"] == float(sum(pair)) and r["same_group"]
        assert r["outside"] == (rank not in (0, 1))
