"""FSDP prefetch depth and reshard_after_forward: the same gradients, the gathers they promise,
the memory the formula says, and the prefetch waited for only when its unit runs."""

from __future__ import annotations

import pytest
import torch

from dtlab.parallel.zero import (
    FullyShardedDataParallel,
    all_gathers_per_step,
    forward_peak_gathered_units,
    measure_fsdp_prefetch,
)
from dtlab.parallel.zero.fsdp_lifecycle import UnitState
from dtlab.parallel.zero.prefetch import _stack

SETTINGS = [(0, True), (1, True), (2, True), (3, True), (1, False)]


def _grads_and_states_on_rank(depth: int, reshard: bool) -> dict:
    model = _stack(4, 16)
    fsdp = FullyShardedDataParallel(
        model, units=list(model), prefetch=depth > 0, forward_prefetch=depth,
        backward_prefetch=depth, reshard_after_forward=reshard,
    )  # fmt: skip
    seen = {}

    def watch(module, _args, index=None):
        seen[index] = [m.state for m in fsdp.lifecycle.units]

    for i, block in enumerate(model):
        block.register_forward_pre_hook(lambda m, a, i=i + 1: watch(m, a, i))
    torch.manual_seed(5)
    x = torch.randn(8, 16)
    fsdp(x).square().mean().backward()
    grads = {n: p.grad.clone() for n, p in fsdp.named_parameters()}
    return {"grads": grads, "states_at_forward": seen}


def test_every_prefetch_depth_and_reshard_setting_gives_the_same_gradients(cluster2):
    reference = cluster2.run(_grads_and_states_on_rank, 1, True)
    for depth, reshard in SETTINGS:
        out = cluster2.run(_grads_and_states_on_rank, depth, reshard)
        for ref, got in zip(reference, out, strict=True):
            assert ref["grads"].keys() == got["grads"].keys()
            for name, grad in got["grads"].items():
                assert torch.equal(grad, ref["grads"][name]), (depth, reshard, name)


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_a_unit_starting_forward_has_the_next_depth_units_in_flight(cluster2, depth):
    # The watching pre-hook runs after FSDP's: unit k is gathered and computing, and units
    # k+1 .. k+depth (there are 4, numbered 1..4 after the root) have their gathers in flight.
    out = cluster2.run(_grads_and_states_on_rank, depth, True)
    for rank_out in out:
        assert sorted(rank_out["states_at_forward"]) == [1, 2, 3, 4]
        for index, states in rank_out["states_at_forward"].items():
            in_flight = [k for k, s in enumerate(states) if s is UnitState.PREFETCHING]
            assert states[index] is UnitState.GATHERED_FOR_FORWARD
            assert in_flight == list(range(index + 1, min(index + 1 + depth, 5))), (depth, index)


def test_measured_forward_peak_and_gathers_match_the_depth_and_reshard_formulas(cluster2):
    units = 4
    rows = measure_fsdp_prefetch(
        cluster2, depths=(0, 2), reshard_after_forward=(True, False), units=units, width=16,
        batch=8, steps=2, warmup=1,
    )  # fmt: skip
    ours = [r for r in rows if r.implementation == "dtlab"]
    assert len(ours) == 4 and len(rows) == 8
    for row in ours:
        peak_units = forward_peak_gathered_units(row.depth, units, row.reshard_after_forward)
        assert row.peak_gathered_forward_bytes == peak_units * row.unit_gathered_bytes
        assert row.all_gathers_per_step == all_gathers_per_step(units, row.reshard_after_forward)
        assert row.exposed_ms_per_unit >= 0
    for row in rows:
        if row.implementation == "torch_fsdp2":
            assert row.peak_step_bytes > 0 and row.exposed_ms_per_unit is None


def test_formulas_for_depth_and_reshard():
    assert [forward_peak_gathered_units(d, 4, True) for d in range(6)] == [1, 2, 3, 4, 4, 4]
    assert forward_peak_gathered_units(1, 4, False) == 4
    assert all_gathers_per_step(4, True) == 8 and all_gathers_per_step(4, False) == 4


def test_deeper_prefetch_helps_only_where_the_link_idles_at_depth_one():
    """The gathers share one link in order: with equal units whose gather outlasts the compute,
    depth 1 keeps the link busy and deeper prefetch exposes exactly as much; with a big unit
    after small ones, depth 2 starts its gather under earlier compute and exposes less."""
    from dtlab.parallel.zero.prefetch import prefetch_timeline

    equal = [prefetch_timeline([3.0] * 8, [2.0] * 8, d) for d in range(4)]
    assert equal == [24.0, 10.0, 10.0, 10.0]  # depth ≥ 1: first gather + 7 × (3 − 2)
    assert [prefetch_timeline([1.0] * 8, [2.0] * 8, d) for d in (1, 2)] == [1.0, 1.0]
    uneven = [prefetch_timeline([1, 1, 1, 6] * 2, [3] * 8, d) for d in range(4)]
    assert uneven[2] < uneven[1] < uneven[0] and uneven[3] == uneven[2]


def _spans_on_rank(depth: int) -> bool:
    model = _stack(3, 16)
    fsdp = FullyShardedDataParallel(
        model, units=list(model), forward_prefetch=depth, backward_prefetch=depth
    )
    fsdp(torch.randn(4, 16)).sum().backward()
    return True


def test_a_prefetched_gather_is_waited_for_after_the_previous_unit_computed(cluster2):
    out = cluster2.run(_spans_on_rank, 1)
    for rank in out.trace.ranks:
        spans = sorted(out.trace.filter(rank=rank).spans, key=lambda s: s.start_ns)
        blocks = [s for s in spans if s.name == "block.forward"]
        # unit 2's gather is launched when unit 1 starts and waited when unit 2 starts
        gather = next(s for s in spans if s.name == "unit[2].all_gather" and s.kind == "comm")
        wait = next(s for s in spans if s.name == "wait:unit[2].all_gather")
        assert gather.start_ns <= blocks[0].start_ns and wait.start_ns >= blocks[0].end_ns


class _Checkpointed(torch.nn.Module):
    """The blocks of :func:`_stack`, each re-run in backward (activation checkpointing)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = _stack(3, 16)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return x


def _kept_units_on_rank() -> dict:
    out = {}
    for reshard in (True, False):
        model = _Checkpointed()
        fsdp = FullyShardedDataParallel(
            model, units=list(model.blocks), reshard_after_forward=reshard
        )
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
        fsdp(x)  # a training forward never backwarded: the next one carries on
        loss = fsdp(x).square().mean()
        out[f"states_{reshard}"] = [m.state.name for m in fsdp.lifecycle.units[1:]]
        loss.backward()
        out[reshard] = {n: p.grad.clone() for n, p in fsdp.named_parameters()}
    out["same"] = all(torch.equal(out[True][n], out[False][n]) for n in out[True])
    return {k: v for k, v in out.items() if not isinstance(k, bool)}


def test_without_reshard_units_stay_gathered_until_a_checkpointed_backward_with_same_grads(
    cluster2,
):
    for out in cluster2.run(_kept_units_on_rank):
        assert out["same"]
        assert out["states_False"] == ["KEPT_FOR_BACKWARD"] * 3
        assert out["states_True"] == ["SHARDED"] * 3


def _trained_like_fsdp2_on_rank(depth: int, reshard: bool) -> float:
    import dtlab
    from dtlab.parallel.data.equivalence import max_abs_difference
    from dtlab.parallel.zero import gather_full_parameters
    from dtlab.parallel.zero.prefetch import _fsdp2

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(3))
    mine = x.chunk(dtlab.world_size())[dtlab.rank()]
    ours = _stack(3, 16)
    fsdp = FullyShardedDataParallel(
        ours, units=list(ours), forward_prefetch=depth, backward_prefetch=depth,
        reshard_after_forward=reshard,
    )  # fmt: skip
    theirs = _fsdp2(_stack(3, 16), depth, reshard)
    for model, forward in ((fsdp, fsdp), (theirs, theirs)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            forward(mine).square().mean().backward()
            opt.step()
    ours_full = gather_full_parameters(fsdp)
    theirs_full = {n: p.full_tensor().detach() for n, p in theirs.named_parameters()}
    return max_abs_difference(ours_full, theirs_full)


@pytest.mark.parametrize(("depth", "reshard"), [(2, True), (1, False)])
def test_prefetch_depth_and_reshard_train_like_fsdp2_with_the_same_settings(
    cluster2, depth, reshard
):
    from dtlab.parallel.data.equivalence import FP32_STEP_TOLERANCE

    for gap in cluster2.run(_trained_like_fsdp2_on_rank, depth, reshard):
        assert gap < FP32_STEP_TOLERANCE


def _span(name, kind, start, end, **labels):
    from dtlab.trace.recorder import Span

    return Span(rank=0, name=name, kind=kind, start_ns=start, end_ns=end, labels=labels)


def test_exposed_gather_counts_blocking_ring_steps_and_waits_but_not_the_background_stream():
    from dtlab.parallel.zero.prefetch_spans import exposed_gather_ns, gathers_in

    spans = [
        _span("all_gather check (control)", "other", 0, 5, control=True),  # blocking: main thread
        _span("all_gather.ring", "comm", 5, 15, comm_step=0),
        _span("all_gather.ring", "comm", 15, 35, comm_step=1),
        _span("unit[2].all_gather", "comm", 40, 90, async_op=True, stream="background"),
        _span("all_gather.ring", "comm", 41, 89, comm_step=0, stream="background"),
        _span("block.forward", "compute", 40, 80),
        _span("wait:unit[2].all_gather", "idle", 80, 90),
        _span("wait:unit[2].grad_rs", "idle", 100, 200),  # a gradient's wait: not a gather
        _span("unit[3].all_gather", "comm", 200, 260),  # torch's path, blocking: all exposed
    ]
    assert exposed_gather_ns(spans) == 5 + 10 + 20 + 10 + 60
    assert gathers_in(spans) == 3  # the blocking ring (its step 0), unit[2] and unit[3]


def test_counted_path_prefetch_overlaps_and_depth_zero_exposes_its_ring_steps(cluster2):
    units = 3
    rows = measure_fsdp_prefetch(
        cluster2, depths=(0, 1), reshard_after_forward=(True,), units=units, width=256,
        batch=128, steps=4, warmup=1, collectives="dtlab",
    )  # fmt: skip
    ours = {r.depth: r for r in rows if r.implementation == "dtlab"}
    # overlapped: a prefetched ring ran on the background stream while the rank computed a
    # block (ordering of spans; blocks of a few ms outlast the worker's wake-up)
    assert ours[1].overlapped is True and ours[0].overlapped is False
    for row in ours.values():
        # counted from the spans: at depth 0 no span carries a unit's name, only ring steps
        assert row.all_gathers_per_step == all_gathers_per_step(units, True)
        assert row.exposed_ms_per_unit > 0
    assert all(r.overlapped is None for r in rows if r.implementation == "torch_fsdp2")


def _counted_spans_on_rank(depth: int) -> None:
    from dtlab import trace

    model = _stack(3, 16)
    fsdp = FullyShardedDataParallel(
        model, units=list(model), prefetch=depth > 0, forward_prefetch=depth,
        backward_prefetch=depth, collectives="dtlab",
    )  # fmt: skip
    with trace.labels(step=0):
        fsdp(torch.randn(4, 16)).sum().backward()


@pytest.mark.parametrize("depth", [0, 1])
def test_counted_path_exposed_accounting_is_the_main_threads_gather_time(cluster2, depth):
    from dtlab.parallel.zero.prefetch_spans import exposed_gather_ns

    tr = cluster2.run(_counted_spans_on_rank, depth).trace.filter(step=0)
    for rank in tr.ranks:
        spans = tr.filter(rank=rank).spans
        on_main = [s for s in spans if s.labels.get("stream") != "background"]
        ring = [s for s in on_main if s.name.startswith("all_gather")]
        waits = [s for s in on_main if s.name.startswith("wait:") and "all_gather" in s.name]
        assert not any(s.name.startswith("unit[") for s in on_main if s.kind == "comm")
        blocking_rings = sum(s.labels.get("comm_step") == 0 for s in ring if s.kind == "comm")
        # depth 0: all 6 gathers (3 units, forward and backward) block on the main thread;
        # depth 1: only the first forward unit's does, the other 5 are waited for
        assert (blocking_rings, len(waits)) == ((6, 0) if depth == 0 else (1, 5))
        assert exposed_gather_ns(spans) == sum(s.end_ns - s.start_ns for s in ring + waits) > 0
