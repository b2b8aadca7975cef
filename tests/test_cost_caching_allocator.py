"""The caching-allocator model: reserved ≥ allocated, best fit and splits, merges only inside a
segment, free segments released before an OOM, and the fragmentation that expandable segments avoid."""

from __future__ import annotations

import pytest

from dtlab.cost.caching_allocator import CachingAllocator, MiB, fragmentation_demo, segment_size


def test_segment_sizes_follow_the_small_medium_large_rule():
    assert segment_size(512) == 2 * MiB
    assert segment_size(5 * MiB) == 20 * MiB
    assert segment_size(33 * MiB) == 34 * MiB


def test_a_freed_block_is_cached_and_reused_best_fit_with_a_split():
    a = CachingAllocator(1024 * MiB)
    h = a.malloc(100 * MiB)
    a.free(h)
    assert a.allocated == 0 and a.reserved == 100 * MiB  # cached, not returned
    a.malloc(60 * MiB)
    assert a.reserved == 100 * MiB and a.allocated == 60 * MiB
    assert a.largest_free_block == 40 * MiB  # the split remainder


def test_free_blocks_merge_only_inside_their_segment():
    a = CachingAllocator(1024 * MiB)
    x, y = a.malloc(50 * MiB), a.malloc(50 * MiB)  # two segments
    a.free(x)
    a.free(y)
    assert a.largest_free_block == 50 * MiB and a.reserved == 100 * MiB
    a.malloc(80 * MiB)  # fits neither: a third segment
    assert a.reserved == 180 * MiB


def test_fully_free_segments_are_released_before_reporting_oom():
    a = CachingAllocator(200 * MiB)
    a.free(a.malloc(150 * MiB))
    a.malloc(180 * MiB)  # 150 cached + 180 > 200: release the free segment, then fit
    assert a.reserved == 180 * MiB


def test_fragmentation_ooms_with_room_on_the_device_and_expandable_segments_fit():
    stranded = fragmentation_demo(1024, expandable_segments=False)
    assert not stranded["request_fits"]
    assert stranded["device_free_mib"] > 200 and stranded["cached_mib"] == 300
    assert "300.0 MiB reserved but unallocated" in stranded["error"]
    grown = fragmentation_demo(1024, expandable_segments=True)
    assert grown["request_fits"] and grown["reserved_mib"] < stranded["reserved_mib"]


def test_bad_sizes_say_so():
    with pytest.raises(ValueError, match="must be > 0"):
        CachingAllocator(MiB).malloc(0)


def test_replaying_the_demo_as_a_trace_reproduces_its_fragmentation():
    from dtlab.cost.caching_allocator import fragmentation_demo_trace, replay

    alloc, peaks = replay(fragmentation_demo_trace(6), 1024 * MiB)
    demo = fragmentation_demo(1024, steps=6)
    assert alloc.reserved / MiB == demo["reserved_mib"] == 900
    assert (alloc.reserved - alloc.allocated) / MiB == demo["cached_mib"] == 300
    assert alloc.largest_free_block / MiB == demo["largest_free_mib"] == 50
    assert peaks["overhead"] == peaks["peak_reserved"] - peaks["peak_allocated"] > 0
    with pytest.raises(MemoryError, match="reserved but unallocated"):
        alloc.malloc(200 * MiB)


def test_segment_layout_lists_blocks_in_address_order():
    from dtlab.cost.caching_allocator import segment_layout

    a = CachingAllocator(1024 * MiB)
    h = a.malloc(100 * MiB)
    a.free(h)
    a.malloc(30 * MiB)
    assert segment_layout(a) == [[(30 * MiB, True), (70 * MiB, False)]]


def test_a_trace_event_of_unknown_kind_says_which_kinds_exist():
    from dtlab.cost.caching_allocator import replay

    with pytest.raises(ValueError, match="'alloc' or 'free'"):
        replay([("malloc", 0, 10)], MiB)


def test_replay_keeps_the_layout_at_the_moment_the_most_was_in_use():
    from dtlab.cost.caching_allocator import replay

    trace = [("alloc", 0, 30 * MiB), ("alloc", 1, 40 * MiB), ("free", 0), ("free", 1)]
    _, peaks = replay(trace, 1024 * MiB)
    assert peaks["peak_allocated"] == 70 * MiB
    assert peaks["layout_at_peak"] == [[(30 * MiB, True)], [(40 * MiB, True)]]
