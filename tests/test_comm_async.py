"""Asynchronous collectives on dtlab's counted path run on a background stream: equal to the
blocking call bit for bit, counted the same, really in flight while the caller computes (proved by
ordering, never by the clock), checked for agreement, and gone cleanly at teardown."""

from __future__ import annotations

import warnings

import pytest
import torch

import dtlab
from dtlab.collectives import counting
from dtlab.collectives.agreement import CollectiveMismatch
from dtlab.comm import Communicator


def _inputs(world: int, rank: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(100 + rank)  # different data per rank, so a wrong sum shows
    return {
        "all_reduce": torch.randn(10 * world + 1),  # not divisible: the uneven chunks too
        "shard": torch.randn(6),
        "full": torch.randn(6 * world),
    }


def _run_all(comm: Communicator, data: dict, async_op: bool) -> dict:
    reduced = data["all_reduce"].clone()
    gathered = torch.empty(6 * comm.world_size)
    scattered = torch.empty(6)
    handles = [
        comm.all_reduce(reduced, name="ar", async_op=async_op),
        comm.all_gather(gathered, data["shard"], name="ag", async_op=async_op),
        comm.reduce_scatter(scattered, data["full"], name="rs", async_op=async_op),
    ]
    overlapped = [h.overlapped for h in handles if h is not None]
    for handle in handles:
        if handle is not None:
            handle.wait()
    return {"all_reduce": reduced, "all_gather": gathered, "reduce_scatter": scattered,
            "overlapped": overlapped}  # fmt: skip


def _async_against_blocking() -> dict:
    comm = Communicator(collectives="dtlab", dim="dp")
    data = _inputs(comm.world_size, comm.rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        blocking = _run_all(comm, data, async_op=False)
        counted_blocking = comm.comm_stats.snapshot()
        comm.comm_stats.reset()
        with counting() as process:
            queued = _run_all(comm, data, async_op=True)
    return {
        "equal": {k: torch.equal(blocking[k], queued[k]) for k in ("all_reduce", "all_gather",
                                                                    "reduce_scatter")},
        "overlapped": queued["overlapped"],
        "overlaps": comm.overlaps,
        "stats": (counted_blocking.as_dict(), comm.comm_stats.as_dict()),
        "process_bytes": process.bytes_sent,
        "warnings": [w.category.__name__ for w in caught],
    }  # fmt: skip


@pytest.mark.parametrize("world", [2, 3])
def test_async_all_reduce_all_gather_reduce_scatter_equal_the_blocking_call_bit_for_bit(
    world, cluster2, cluster3
):
    cluster = {2: cluster2, 3: cluster3}[world]
    for out in cluster.run(_async_against_blocking):
        assert out["equal"] == {"all_reduce": True, "all_gather": True, "reduce_scatter": True}
        assert out["overlapped"] == [True, True, True] and out["overlaps"]
        blocking, queued = out["stats"]
        assert blocking == queued  # every message and byte counted, once, on either path
        assert out["process_bytes"] == blocking["bytes_sent"] > 0
        assert out["warnings"] == []  # no OverlapRefused: it did overlap


def _foreground_and_background_at_once() -> tuple[list[float], list[float]]:
    comm = Communicator(collectives="dtlab", dim="dp")
    queued, blocking, handles = [], [], []
    for i in range(6):  # blocking rings on the main thread while the stream's are in flight
        b = torch.full((1000,), float(i + comm.rank))
        handles.append(comm.all_reduce(b, name=f"bg{i}", async_op=True))
        f = torch.full((777,), float(10 * i + comm.rank))
        comm.all_reduce(f, name=f"fg{i}")
        queued.append(b)
        blocking.append(f)
    for handle in handles:
        handle.wait()
    return [float(b.min()) for b in queued] + [float(b.max()) for b in queued], [
        float(f.min()) for f in blocking
    ] + [float(f.max()) for f in blocking]


def test_the_streams_messages_never_match_the_main_threads_on_the_same_ranks(cluster3):
    n = 3
    base = sum(range(n))
    for queued, blocking in cluster3.run(_foreground_and_background_at_once):
        assert queued == [n * i + base for i in range(6)] * 2
        assert blocking == [n * 10 * i + base for i in range(6)] * 2


def _compute_while_in_flight() -> dict:
    from dtlab import trace

    comm = Communicator(collectives="dtlab", dim="dp")
    x = torch.full((1 << 16,), float(comm.rank + 1))
    go = torch.zeros(1)
    with counting() as during:
        if comm.rank == 0:
            with trace.span("launch", kind="other"):
                handle = comm.all_reduce(x, name="bg_all_reduce", async_op=True)
            # Compute until the worker has picked the collective up, so the compute span is open
            # when the background span opens. The collective cannot finish before this compute
            # ends: rank 1 only joins it after rank 0's "computed" message below. A collective
            # that ran inside its launch would never return from it (rank 1 is not there yet).
            with trace.span("main_compute", kind="compute"):
                a = torch.randn(64, 64)
                while not handle.item.started.is_set():
                    a = torch.tanh(a @ a.T)
            comm.send(go, 1, name="computed")
        else:
            comm.recv(go, 0, name="computed")
            handle = comm.all_reduce(x, name="bg_all_reduce", async_op=True)
    handle.wait()
    return {"value": x[:3].tolist(), "during": during.bytes_sent}


def test_compute_on_the_main_thread_runs_while_the_background_collective_is_open(cluster2):
    run = cluster2.run(_compute_while_in_flight)
    for out in run:
        assert out["value"] == [3.0] * 3
    assert run[0]["during"] == 4  # only the 1-element "computed" message: no background bytes
    tr = run.trace.filter(rank=0)

    def only(name: str, kind: str):
        [span] = [s for s in tr.spans if s.name == name and s.kind == kind]
        return span

    launch, compute = only("launch", "other"), only("main_compute", "compute")
    background, wait = only("bg_all_reduce", "comm"), only("wait:bg_all_reduce", "idle")
    assert background.labels["stream"] == "background" and background.labels["group"] == "dp"
    assert launch.end_ns <= compute.start_ns  # the launch returned before the compute began
    assert background.start_ns <= compute.end_ns  # the background span opened during compute
    assert compute.end_ns <= background.end_ns <= wait.end_ns  # ...and closed after it
    steps = [s for s in tr.spans if s.name.startswith("all_reduce.") and "comm_step" in s.labels]
    assert steps and all(s.labels.get("stream") == "background" for s in steps)
    assert all(background.start_ns <= s.start_ns <= s.end_ns <= background.end_ns for s in steps)


def _mismatched_then_fine() -> dict:
    comm = Communicator(collectives="dtlab", dim="dp")
    handle = comm.all_reduce(torch.ones(8 + comm.rank), name="bad", async_op=True)
    try:
        handle.wait()
        message = None
    except CollectiveMismatch as exc:
        message = str(exc)
    x = torch.ones(5)
    comm.all_reduce(x, name="good", async_op=True).wait()  # the stream goes on after an error
    return {"message": message, "after": x.tolist()}


def test_a_mismatch_on_the_async_path_raises_on_every_rank_naming_each_ranks_value(cluster2):
    for out in cluster2.run(_mismatched_then_fine):
        assert out["message"] is not None
        assert "number of elements" in out["message"]
        assert "rank 0: 8; rank 1: 9" in out["message"]
        assert out["after"] == [2.0] * 5


def _fsdp_grads(collectives: str, depth: int) -> dict:
    from dtlab.parallel.zero import FullyShardedDataParallel
    from dtlab.parallel.zero.prefetch import _stack

    model = _stack(4, 16)
    fsdp = FullyShardedDataParallel(
        model, units=list(model), prefetch=depth > 0, forward_prefetch=depth,
        backward_prefetch=depth, collectives=collectives,
    )  # fmt: skip
    torch.manual_seed(5)
    x = torch.randn(8, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fsdp(x).square().mean().backward()
        probe = fsdp.units[1].launch_gather(async_op=True)
        overlapped = probe.overlapped
        probe.wait()
        fsdp.units[1].free()
    return {
        "grads": {n: p.grad.clone() for n, p in fsdp.named_parameters()},
        "overlapped": overlapped,
        "warnings": [w.category.__name__ for w in caught],
    }


def test_fsdp_prefetch_on_the_counted_path_overlaps_and_gives_the_same_gradients(cluster2):
    reference = cluster2.run(_fsdp_grads, "torch", 0)
    run = cluster2.run(_fsdp_grads, "dtlab", 1)
    for ref, got in zip(reference, run, strict=True):
        assert got["overlapped"] is True and got["warnings"] == []
        for name, grad in got["grads"].items():
            assert torch.allclose(grad, ref["grads"][name], rtol=1e-5, atol=1e-7), name
    waits = {s.name for s in run.trace.spans if s.kind == "idle" and s.name.startswith("wait:")}
    assert {f"wait:unit[{k}].all_gather" for k in (2, 3, 4)} <= waits  # prefetched, waited
    background = [s for s in run.trace.spans if s.labels.get("stream") == "background"]
    assert any(s.name.endswith(".all_gather") for s in background)


def test_fsdp_prefetch_on_the_counted_path_equals_its_blocking_run_bit_for_bit(cluster2):
    blocking = cluster2.run(_fsdp_grads, "dtlab", 0)
    prefetched = cluster2.run(_fsdp_grads, "dtlab", 2)
    for a, b in zip(blocking, prefetched, strict=True):
        assert all(torch.equal(a["grads"][n], b["grads"][n]) for n in a["grads"])


def _leave_some_in_flight(wait: bool) -> float:
    comm = Communicator(collectives="dtlab", dim="dp")
    x = torch.ones(1 << 12)
    handles = [comm.all_reduce(x, name=f"ar{i}", async_op=True) for i in range(3)]
    if wait:
        for handle in handles:
            handle.wait()
    return float(x[0])


def test_the_background_stream_leaves_nothing_in_flight_at_teardown():
    cluster = dtlab.Cluster(2, device="cpu", timeout=120)
    try:
        assert list(cluster.run(_leave_some_in_flight, True)) == [8.0, 8.0]
        cluster.run(_leave_some_in_flight, False)  # never waited: runs on, in order
        assert list(cluster.run(_leave_some_in_flight, True)) == [8.0, 8.0]
    finally:
        cluster.close()  # barrier + destroy_process_group: must neither hang nor abort
    assert cluster.closed
