"""The sync counter finds every planted host read and nothing else, on the timeline; the
profile reader finds the planted syncs of a GPU trace and none of the decoys."""

from __future__ import annotations

import torch

from dtlab.perf.sample_trace import gpu_idle_us, planted_profile
from dtlab.perf.syncs import SyncCounter, host_syncs_in_profile


def _step(w: torch.Tensor, plant: bool) -> None:
    loss = (w * 2.0).square().sum()
    if plant:
        loss.item()  # reading the loss
        torch.tensor([3, 5]).tolist()  # MoE split sizes
        (w > 0).nonzero()  # data-dependent shape
        print(loss)  # printing the loss
    loss.backward()
    with torch.no_grad():
        w -= 0.1 * w.grad
    w.grad = None


def test_every_planted_sync_is_found_in_order_and_nothing_else():
    w = torch.randn(8, requires_grad=True)
    with SyncCounter() as syncs:
        _step(w, plant=True)
    assert [s.call for s in syncs.found] == ["item", "tolist", "nonzero", "repr"]
    assert all(s.where.startswith("test_perf_syncs.py:") for s in syncs.found)
    assert all(s.end_ns >= s.start_ns for s in syncs.found)


def test_a_step_without_host_reads_has_no_syncs():
    w = torch.randn(8, requires_grad=True)
    with SyncCounter() as syncs:
        for _ in range(3):
            _step(w, plant=False)
    assert syncs.found == []


def test_masks_branches_and_formatting_are_syncs_but_shape_reads_are_not():
    x = torch.randn(16)
    with SyncCounter() as syncs:
        x[x > 0]  # boolean mask
        if x.sum() > 0:  # branch on a value
            pass
        f"{x.mean():.2f}"
        x.shape[0] + x.numel()  # metadata: no read of the data
        torch.repeat_interleave(x, 2)  # static repeats: shape known
    assert [s.call for s in syncs.found] == ["getitem", "bool", "format"]


def test_each_sync_is_a_span_with_its_reason():
    with SyncCounter() as syncs:
        torch.ones(3).sum().item()
    (span,) = syncs.spans
    assert span.name == "sync:item" and span.kind == "other" and span.labels["reason"]


def test_tensors_on_another_device_are_not_counted():
    with SyncCounter(device="meta") as syncs:
        torch.ones(3).sum().item()
    assert syncs.found == []


def test_the_profile_reader_finds_exactly_the_planted_syncs():
    for seed in range(12):
        events, planted = planted_profile(seed, n_syncs=2 + seed % 5)
        assert host_syncs_in_profile(events) == planted


def test_decoys_do_not_block_and_syncs_leave_the_gpu_idle():
    events, planted = planted_profile(0)
    names = {events[i]["name"] for i in planted}
    assert names == {"aten::item", "aten::nonzero", "aten::_to_copy", "torch.cuda.synchronize"}
    decoys = [i for i, e in enumerate(events) if e["name"].startswith(("aten::copy_", "record_"))]
    assert len(decoys) == 3 and not set(decoys) & set(host_syncs_in_profile(events))
    no_syncs, _ = planted_profile(0, n_syncs=0)
    assert gpu_idle_us(events) > gpu_idle_us(no_syncs)


def test_short_kernels_make_the_provided_trace_launch_bound():
    from dtlab.perf.sample_trace import summarise

    busy = summarise(planted_profile(7, n_ops=60, n_syncs=1)[0])
    launch_bound, planted = planted_profile(7, n_ops=60, n_syncs=1, kernel_us=(2, 9))
    short = summarise(launch_bound)
    assert short["mean_kernel_us"] < short["mean_host_us_per_op"]
    assert short["device_busy_share"] < busy["device_busy_share"]
    assert host_syncs_in_profile(launch_bound) == planted
