"""The allocation recorder writes down real allocations and frees; fed to the simulated caching
allocator, varying shapes reserve more than they use, and expandable segments do not."""

from __future__ import annotations

from dtlab.cost.caching_allocator import MiB, replay, segment_layout
from dtlab.perf.charts import segments_chart
from dtlab.perf.memory import AllocationRecorder, record_varying_shapes


def test_the_recorder_sees_each_new_storage_and_its_free():
    import torch

    with AllocationRecorder() as rec:
        a = torch.ones(1000)  # 4000 B
        b = a * 2  # 4000 B
        view = b.view(10, 100)  # no new storage
        del b, view
    allocs = [e for e in rec.events if e[0] == "alloc"]
    frees = [e for e in rec.events if e[0] == "free"]
    assert [e[2] for e in allocs] == [4000, 4000] and frees == [("free", allocs[1][1])]
    del a


def test_varying_shapes_fragment_the_cache_and_expandable_segments_do_not():
    events = record_varying_shapes([256, 192, 320, 128, 384], width=4096, layers=3)
    _, fixed = replay(events, 1 << 40)
    _, grown = replay(events, 1 << 40, expandable_segments=True)
    assert fixed["overhead"] > 2 * MiB
    assert grown["peak_reserved"] < fixed["peak_reserved"]
    assert grown["overhead"] < fixed["overhead"]


def test_the_chart_has_one_row_per_segment_and_says_which_blocks_are_cached():
    trace = [("alloc", 0, 3 * MiB), ("alloc", 1, 12 * MiB), ("alloc", 2, 30 * MiB), ("free", 1)]
    alloc, _ = replay(trace, 1 << 30)
    layout = segment_layout(alloc)
    # 3 MiB opens a 20 MiB segment; 12 MiB is split from its free 17; 30 MiB needs its own.
    assert layout == [[(3 * MiB, True), (17 * MiB, False)], [(30 * MiB, True)]]
    fig = segments_chart(layout, "simulated caching allocator")
    names = {trace.name for trace in fig.data}
    assert names == {"in use (allocated)", "cached (reserved, free)"}
