"""TP backward overlap and async TP: the same numbers as plain TP, and the overlap they claim.

An overlap is asserted by the order of the spans on each rank — the wait of a collective is
recorded after the compute that hides it, and the collective was launched before that compute
began — never by wall-clock time.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab.comm import Communicator, OverlapRefused, gather_along, reduce_scatter_along
from dtlab.parallel.tensor import (
    ColumnParallelLinear,
    all_gather_matmul,
    column_parallel_linear,
    matmul_reduce_scatter,
    measure_async_tp,
    measure_tp_backward_overlap,
)


def _column_grads_on_rank(sequence_parallel: bool, collectives: str = "torch") -> dict:
    comm = Communicator(None, collectives, "tp")
    torch.manual_seed(0)
    column = ColumnParallelLinear.from_linear(
        nn.Linear(64, 128), comm, sequence_parallel=sequence_parallel
    )
    torch.manual_seed(1)
    x0 = torch.randn(3, 16 // comm.world_size if sequence_parallel else 16, 64)
    results = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for mode in ("plain", False, True):
            x = x0.clone().requires_grad_(True)
            if mode == "plain":
                y = column(x)
            else:
                y = column_parallel_linear(
                    x, column.weight, column.bias, comm,
                    sequence_parallel=sequence_parallel, backward_overlap=mode,
                )  # fmt: skip
            (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
            results[mode] = [y.detach(), x.grad, column.weight.grad, column.bias.grad]
            column.weight.grad = column.bias.grad = None
    refused = any(issubclass(w.category, OverlapRefused) for w in caught)
    same = {
        str(mode): all(
            torch.equal(a, b) for a, b in zip(results["plain"], results[mode], strict=True)
        )
        for mode in (False, True)
    }
    return {"same": same, "refused": refused}


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_backward_overlap_gradients_are_bit_identical_to_the_plain_column_layer(
    cluster2, sequence_parallel
):
    for out in cluster2.run(_column_grads_on_rank, sequence_parallel):
        assert out["same"] == {"False": True, "True": True}


def test_backward_overlap_on_counted_path_is_equal_and_overlaps_without_a_warning(cluster2):
    for out in cluster2.run(_column_grads_on_rank, True, "dtlab"):
        assert out["same"] == {"False": True, "True": True}
        assert not out["refused"]  # queued on the background stream (dtlab.comm.background)


def test_column_layer_refuses_backward_overlap_without_owning_the_region_entry(cluster2):
    def build():
        comm = Communicator(None, "torch", "tp")
        with pytest.raises(ValueError, match="enters_region=True"):
            ColumnParallelLinear.from_linear(
                nn.Linear(8, 8), comm, enters_region=False, backward_overlap=True
            )
        return True

    assert all(cluster2.run(build))


def _spans_of(trace, rank: int, **labels) -> list:
    return sorted(trace.filter(rank=rank, **labels).spans, key=lambda s: s.start_ns)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_input_grad_collective_is_waited_after_wgrad_only_when_overlapped(
    cluster2, sequence_parallel
):
    from dtlab.parallel.tensor import overlap

    out = cluster2.run(
        overlap._backward_overlap_rank, 2, 2, 16, 32, 64, sequence_parallel, 1, "torch"
    )
    name = "tp.input_grad_reduce_scatter" if sequence_parallel else "tp.input_grad_all_reduce"
    for rank in out.trace.ranks:
        for on in (False, True):
            spans = _spans_of(out.trace, rank, technique_on=on, phase="backward")
            wgrads = [s for s in spans if s.name == "tp.wgrad"]
            launches = [s for s in spans if s.name == name and s.kind == "comm"]
            waits = [s for s in spans if s.name == f"wait:{name}"]
            assert len(wgrads) == len(launches) == len(waits) == 2  # one per layer
            for wgrad, launch, wait in zip(wgrads, launches, waits, strict=True):
                assert launch.start_ns <= wgrad.start_ns
                if on:  # waited after wgrad: the transfer had the GEMM to hide under
                    assert wait.start_ns >= wgrad.end_ns
                else:  # waited at once: wgrad starts only when the reduction is done
                    assert wait.end_ns <= wgrad.start_ns


def test_sequence_parallel_regather_of_the_input_is_waited_after_dgrad(cluster2):
    from dtlab.parallel.tensor import overlap

    out = cluster2.run(overlap._backward_overlap_rank, 2, 2, 16, 32, 64, True, 1, "torch")
    for rank in out.trace.ranks:
        spans = _spans_of(out.trace, rank, technique_on=True, phase="backward")
        dgrads = [s for s in spans if s.name == "tp.dgrad"]
        gathers = [s for s in spans if s.name == "tp.regather_input" and s.kind == "comm"]
        waits = [s for s in spans if s.name == "wait:tp.regather_input"]
        assert len(dgrads) == len(gathers) == len(waits) == 2
        for dgrad, gather, wait in zip(dgrads, gathers, waits, strict=True):
            assert gather.start_ns <= dgrad.start_ns and wait.start_ns >= dgrad.end_ns


def _async_tp_on_rank(seq: int, collectives: str) -> dict:
    comm = Communicator(None, collectives, "tp")
    t = comm.world_size
    torch.manual_seed(0)
    w_in = torch.randn(8 * t, 16).chunk(t, 0)[comm.rank].contiguous()
    w_out = torch.randn(16, 8 * t).chunk(t, 1)[comm.rank].contiguous()
    x = torch.randn(2, seq, 16).chunk(t, 1)[comm.rank].contiguous()
    comm.comm_stats.reset()
    h = all_gather_matmul(x, w_in, comm)
    y = matmul_reduce_scatter(h, w_out, comm)
    chunked = comm.comm_stats.bytes_sent
    plain_h = F.linear(gather_along(x, 1, comm), w_in)
    plain_y = reduce_scatter_along(F.linear(plain_h, w_out), 1, comm)
    return {
        "gather_equal": torch.equal(h, plain_h),
        "scatter_gap": (y - plain_y).abs().max().item(),
        "bytes_sent": chunked,
        "chunk_bytes": x.numel() * x.element_size(),  # x's shard and y are (b, s/t, 16) fp32
    }


@pytest.mark.parametrize("world", ["cluster2", "cluster3"])
def test_async_tp_equals_plain_sequence_parallel_and_moves_the_ring_bytes(request, world):
    cluster = request.getfixturevalue(world)
    t = int(world[-1])
    for out in cluster.run(_async_tp_on_rank, 6 * t, "dtlab"):
        assert out["gather_equal"]  # row blocks of the same product
        assert out["scatter_gap"] <= 1e-5  # the same partials added in ring order
        # each ring passes t-1 chunks of 1/t: (t-1)/t of the full tensor, as the collectives
        assert out["bytes_sent"] == 2 * (t - 1) * out["chunk_bytes"]


def test_async_tp_waits_for_each_chunk_after_the_gemm_it_hides_under(cluster2):
    out = cluster2.run(_async_tp_on_rank, 8, "torch")
    for rank in out.trace.ranks:
        spans = _spans_of(out.trace, rank)
        for name in ("async_tp.all_gather", "async_tp.reduce_scatter"):
            transfers = [s for s in spans if s.name == name and s.kind == "comm"]
            waits = [s for s in spans if s.name == f"wait:{name}"]
            assert len(transfers) == len(waits) == 1  # t - 1 chunks on 2 ranks
            gemms = [s for s in spans if s.name == "async_tp.gemm"]
            for transfer, wait in zip(transfers, waits, strict=True):
                hiding = [g for g in gemms if transfer.start_ns <= g.start_ns < wait.start_ns]
                assert hiding, f"no GEMM ran between posting {name} and waiting for it"
                assert all(g.end_ns <= wait.start_ns for g in hiding)


@pytest.mark.parametrize("collectives", ["torch", "dtlab"])
def test_measure_tp_backward_overlap_reports_both_sides_from_the_trace(cluster2, collectives):
    m = measure_tp_backward_overlap(
        cluster2, layers=2, batch=2, seq=16, d_model=32, d_ff=64, steps=2, warmup=1,
        collectives=collectives,
    )  # fmt: skip
    assert m.equal and m.world_size == 2 and m.mechanism == "tp_backward_overlap"
    for side in (m.off, m.on):
        assert side.comm_ms > 0 and side.compute_ms > 0
        assert side.exposed_ms >= 0 and 0 <= side.hidden_share <= 1
    assert m.off.technique_on is False and m.on.technique_on is True
    assert m.detail["forward_exposed_ms"] > 0  # the row layer's all-reduce: exposed either way
    assert [r["technique_on"] for r in m.rows()] == [False, True]


@pytest.mark.parametrize("collectives", ["torch", "dtlab"])
def test_measure_async_tp_reports_equal_outputs_and_chunk_gemms(cluster2, collectives):
    m = measure_async_tp(
        cluster2, batch=2, seq=16, d_model=32, d_ff=64, steps=2, warmup=1, collectives=collectives
    )
    assert m.equal and m.detail["max_abs_diff"] <= 1e-5
    assert m.off.exposed_ms == pytest.approx(
        m.off.comm_ms
    )  # blocking collectives: all of it exposed
    assert m.on.compute_ms > 0 and m.on.comm_ms > 0


def test_async_tp_overlaps_on_the_counted_path_too(cluster2):
    # posted point-to-point messages progress on gloo's threads: counted and overlapped at once
    out = cluster2.run(_async_tp_on_rank, 8, "dtlab")
    for rank in out.trace.ranks:
        spans = _spans_of(out.trace, rank)
        transfer = next(s for s in spans if s.name == "async_tp.all_gather" and s.kind == "comm")
        wait = next(s for s in spans if s.name == "wait:async_tp.all_gather")
        gemm = next(s for s in spans if s.name == "async_tp.gemm")
        assert transfer.start_ns <= gemm.start_ns and gemm.end_ns <= wait.start_ns


def test_measurements_refuse_the_counted_path_only_on_nccl():
    from types import SimpleNamespace

    nccl = SimpleNamespace(backend="nccl")  # refused before anything runs
    with pytest.raises(ValueError, match="inside its launch"):
        measure_tp_backward_overlap(nccl, collectives="dtlab")
    with pytest.raises(ValueError, match="inside its launch"):
        measure_async_tp(nccl, collectives="dtlab")
    with pytest.raises(ValueError, match="pass 'torch' or 'dtlab'"):
        measure_async_tp(nccl, collectives="nccl")


def test_counted_path_waits_after_wgrad_and_reads_blocking_rings_as_the_collective(cluster2):
    from dtlab.parallel.tensor import overlap

    out = cluster2.run(overlap._backward_overlap_rank, 2, 2, 16, 32, 64, False, 1, "dtlab")
    named = overlap._with_blocking_named(out.trace, "dtlab")
    name = "tp.input_grad_all_reduce"
    for rank in out.trace.ranks:
        for on in (False, True):
            spans = _spans_of(out.trace, rank, technique_on=on, phase="backward")
            wgrads = [s for s in spans if s.name == "tp.wgrad"]
            launches = [s for s in spans if s.name == name and s.kind == "comm"]
            waits = [s for s in spans if s.name == f"wait:{name}"]
            assert len(wgrads) == len(launches) == len(waits) == 2  # one per layer
            assert all(s.labels.get("stream") == "background" for s in launches)
            for wgrad, wait in zip(wgrads, waits, strict=True):
                assert wait.start_ns >= wgrad.end_ns if on else wait.end_ns <= wgrad.start_ns
        # the row layer's blocking forward all-reduce: ring steps + check, on the main thread
        forward = _spans_of(out.trace, rank, phase="forward")
        rings = [s for s in forward if s.name.startswith("all_reduce")]
        assert rings and all(s.labels.get("stream") != "background" for s in rings)
        assert not [s for s in forward if s.name == "tp.all_reduce"]
        read = [s for s in _spans_of(named, rank, phase="forward") if s.name == "tp.all_reduce"]
        assert len(read) == len(rings) and all(s.kind == "comm" for s in read)


def _gpt_grads_on_rank(sequence_parallel: bool) -> dict:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.parallel.tensor import parallelize_gpt

    config = GPTConfig.tiny(seq_len=16, d_model=32)
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=2, seed=3)[0]
    grads = {}
    for overlap in (False, True):
        tp = parallelize_gpt(
            GPT(config, seed=0), Mesh(tp=2), sequence_parallel, backward_overlap=overlap
        )
        tp.loss(tp.model(tokens), targets).backward()
        tp.finish_gradients()
        grads[overlap] = {n: p.grad.clone() for n, p in tp.model.named_parameters()}
    return {
        "same_names": grads[False].keys() == grads[True].keys(),
        "unequal": [n for n in grads[False] if not torch.equal(grads[False][n], grads[True][n])],
    }


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_parallelize_gpt_with_backward_overlap_gives_bit_identical_gradients(
    cluster2, sequence_parallel
):
    for out in cluster2.run(_gpt_grads_on_rank, sequence_parallel):
        assert out["same_names"] and out["unequal"] == []
