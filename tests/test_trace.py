"""dtlab.trace: recording, merging, idle filling, overlap accounting, Chrome export, clocks."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import dtlab
from dtlab import trace
from dtlab.trace import Span, Trace
from dtlab.trace.chrome import nesting_rows

MS = 1_000_000  # nanoseconds


def spans_of(trace_: Trace) -> list[tuple]:
    return [(s.rank, s.name, s.kind, s.start_ns, s.end_ns) for s in trace_.spans]


def test_spans_from_every_rank_merge_into_one_start_ordered_trace():
    rank0 = [
        Span(0, "b", "comm", 5 * MS, 6 * MS).to_dict(),
        Span(0, "a", "compute", 0, MS).to_dict(),
    ]
    rank1 = [Span(1, "c", "compute", 2 * MS, 4 * MS, labels={"step": 1}).to_dict()]
    merged = Trace.from_rank_spans([rank0, rank1])
    assert [s.name for s in merged] == ["a", "c", "b"]
    assert merged.ranks == [0, 1]
    assert [s.name for s in merged.by_rank()[0]] == ["a", "b"]
    assert (merged.start_ns, merged.end_ns, merged.origin_ns) == (0, 6 * MS, 0)
    assert merged.spans[1].labels == {"step": 1}


def test_recorder_collects_spans_only_between_begin_and_end_call():
    with trace.span("before", kind="compute"):
        pass
    trace.begin_call(3)
    with trace.span("fwd", kind="compute", step=7), trace.span("ar", kind="comm", nbytes=64):
        pass
    with pytest.raises(RuntimeError), trace.span("boom", kind="other"):
        raise RuntimeError("the span still closes")
    recorded = trace.end_call()
    assert [(d["rank"], d["name"], d["kind"], d["nbytes"]) for d in recorded] == [
        (3, "ar", "comm", 64),
        (3, "fwd", "compute", 0),
        (3, "boom", "other", 0),
    ]
    assert recorded[1]["labels"] == {"step": 7}
    assert all(d["start_ns"] <= d["end_ns"] for d in recorded)
    assert trace.end_call() == []


def test_unknown_span_kind_is_refused_with_the_list_of_kinds():
    with pytest.raises(ValueError, match="not one of"), trace.span("x", kind="network"):
        pass


def test_clock_offset_moves_spans_onto_rank_zeros_clock():
    try:
        trace.set_clock_offset(5_000 * MS)
        assert abs(time.perf_counter_ns() - 5_000 * MS - trace.now_ns()) < 1_000 * MS
    finally:
        trace.set_clock_offset(0)


def test_cuda_span_on_cpu_records_an_ordinary_span():
    with trace.cuda_span("not recording", kind="comm"):
        pass
    trace.begin_call(1)
    with trace.cuda_span("ar", kind="comm", nbytes=8, bucket=2):
        pass
    recorded = trace.end_call()
    assert [(d["rank"], d["name"], d["kind"], d["nbytes"], d["labels"]) for d in recorded] == [
        (1, "ar", "comm", 8, {"bucket": 2})
    ]


class _FakeCudaEvent:
    """Stands in for torch.cuda.Event: each record() reads the next time off a fake device clock."""

    device_times_ms: list[float] = []

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.ms = None

    def record(self, stream=None):
        self.ms = self.device_times_ms.pop(0)

    def elapsed_time(self, other: _FakeCudaEvent) -> float:
        return other.ms - self.ms


def test_cuda_span_places_device_event_times_after_the_host_anchor(monkeypatch):
    from dtlab.trace import recorder

    # The device clock reads 100 ms when the anchor is recorded and the host clock 42 ms, so the
    # events at 103 and 110 ms on the device are at 45 and 52 ms on the host's clock.
    _FakeCudaEvent.device_times_ms = [100.0, 103.0, 110.0, 111.0, 112.5]
    monkeypatch.setattr(torch.cuda, "Event", _FakeCudaEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(recorder, "now_ns", lambda: 42 * MS)
    stream = SimpleNamespace(device=SimpleNamespace(index=0))
    trace.begin_call(0)
    with trace.cuda_span("ar", kind="comm", nbytes=8, stream=stream, bucket=1):
        pass
    with trace.cuda_span("mm", kind="compute", stream=stream):  # same anchor, no new one
        pass
    recorded = trace.end_call()
    assert [
        (d["name"], d["start_ns"], d["end_ns"], d["nbytes"], d["labels"]) for d in recorded
    ] == [
        ("ar", 45 * MS, 52 * MS, 8, {"bucket": 1}),
        ("mm", 53 * MS, 54_500_000, 0, {}),
    ]
    assert _FakeCudaEvent.device_times_ms == []


def test_total_seconds_counts_nested_and_concurrent_spans_once():
    t = Trace(
        [
            Span(0, "forward", "compute", 0, 10 * MS),
            Span(0, "matmul", "compute", 2 * MS, 4 * MS),  # nested: adds nothing
            Span(0, "ar", "comm", 8 * MS, 12 * MS),
            Span(1, "forward", "compute", 0, 3 * MS),
        ]
    )
    assert t.total_seconds("compute") == pytest.approx(0.013)
    assert t.total_seconds("compute", rank=0) == pytest.approx(0.010)
    assert t.total_seconds(rank=0) == pytest.approx(0.012)  # union over kinds
    assert t.total_seconds(["compute", "comm"]) == pytest.approx(0.015)


def test_bytes_moved_sums_comm_spans_per_rank_and_overall():
    t = Trace(
        [
            Span(0, "rs", "comm", 0, MS, nbytes=100),
            Span(0, "ag", "comm", MS, 2 * MS, nbytes=50),
            Span(1, "rs", "comm", 0, MS, nbytes=100),
            Span(1, "h2d", "memcpy", 0, MS, nbytes=999),
        ]
    )
    assert t.bytes_moved() == 250
    assert t.bytes_moved(rank=0) == 150
    assert t.bytes_moved(rank=1, kind="memcpy") == 999


def test_idle_gaps_fill_each_rank_from_the_runs_first_start_to_its_last_end():
    t = Trace(
        [
            Span(0, "fwd", "compute", 0, 4 * MS),
            Span(0, "ar", "comm", 6 * MS, 10 * MS),
            Span(1, "fwd", "compute", 1 * MS, 8 * MS),  # the slow rank
            Span(1, "ar", "comm", 8 * MS, 10 * MS),
        ]
    )
    gaps = [(s.rank, s.kind, s.start_ns, s.end_ns) for s in t.idle_gaps()]
    assert gaps == [(0, "idle", 4 * MS, 6 * MS), (1, "idle", 0, 1 * MS)]
    assert t.with_idle().total_seconds("idle") == pytest.approx(0.003)
    assert len(t.with_idle()) == 6
    assert t.idle_gaps(min_gap_ns=2 * MS) == [Span(0, "idle", "idle", 4 * MS, 6 * MS)]


def test_idle_gap_at_the_end_shows_a_fast_rank_waiting():
    t = Trace([Span(0, "step", "compute", 0, 2 * MS), Span(1, "step", "compute", 0, 5 * MS)])
    assert [(s.rank, s.start_ns, s.end_ns) for s in t.idle_gaps()] == [(0, 2 * MS, 5 * MS)]


def test_hidden_fraction_is_comm_time_under_compute_on_the_same_rank():
    t = Trace(
        [
            # rank 0: comm [8, 14] ms, compute [0, 10] and [12, 20] ms -> 4 of 6 ms hidden
            Span(0, "backward", "compute", 0, 10 * MS),
            Span(0, "matmul", "compute", 1 * MS, 3 * MS),
            Span(0, "step", "compute", 12 * MS, 20 * MS),
            Span(0, "bucket0", "comm", 8 * MS, 13 * MS),
            Span(0, "bucket1", "comm", 9 * MS, 14 * MS),
            # rank 1: comm [10, 14] right after compute [0, 10] -> nothing hidden
            Span(1, "backward", "compute", 0, 10 * MS),
            Span(1, "bucket0", "comm", 10 * MS, 14 * MS),
            # rank 1's compute overlapping rank 0's comm must not count
        ]
    )
    assert t.hidden_fraction(rank=0) == pytest.approx(4 / 6)
    assert t.hidden_fraction(rank=1) == 0.0
    assert t.hidden_fraction() == pytest.approx(4 / 10)
    assert t.hidden_fraction(compute_kind=["compute", "optimizer"]) == pytest.approx(4 / 10)
    assert Trace([Span(0, "fwd", "compute", 0, MS)]).hidden_fraction() == 0.0


def test_filter_matches_kind_name_rank_and_labels():
    t = Trace(
        [
            Span(0, "ar", "comm", 0, MS, labels={"step": 1}),
            Span(0, "ar", "comm", MS, 2 * MS, labels={"step": 2}),
            Span(1, "fwd", "compute", 0, MS, labels={"step": 1}),
        ]
    )
    assert len(t.filter(kind="comm")) == 2
    assert len(t.filter(kind=["comm", "compute"], step=1)) == 2
    assert len(t.filter(name="fwd", rank=1)) == 1
    assert len(t.filter(rank=[0], step=2)) == 1
    assert t.filter(kind="idle").spans == []
    assert t.filter(kind="comm", rank=0).end_ns == t.end_ns  # keeps the run's bounds


def test_window_clips_spans_and_keeps_times_relative_to_the_full_run():
    t = Trace([Span(0, "a", "compute", 0, 4 * MS), Span(0, "b", "comm", 5 * MS, 9 * MS)])
    w = t.window(3, 6)
    assert spans_of(w) == [(0, "a", "compute", 3 * MS, 4 * MS), (0, "b", "comm", 5 * MS, 6 * MS)]
    assert (w.start_ns, w.end_ns, w.origin_ns) == (3 * MS, 6 * MS, 0)
    assert w.rows()[0]["start_ms"] == 3.0
    assert [s.start_ns for s in w.idle_gaps()] == [4 * MS]
    with pytest.raises(ValueError, match="before it starts"):
        t.window(6, 3)


def test_rows_are_flat_dicts_in_milliseconds_with_labels_as_columns():
    t = Trace(
        [
            Span(0, "a", "compute", 2 * MS, 3 * MS),
            Span(1, "b", "comm", 2 * MS, 5 * MS, 16, {"step": 4, "kind": "ring"}),
        ],
        start_ns=0,
    )
    assert t.rows()[1] == {
        "rank": 1,
        "name": "b",
        "kind": "comm",
        "start_ms": 2.0,
        "end_ms": 5.0,
        "duration_ms": 3.0,
        "nbytes": 16,
        "step": 4,
        "label_kind": "ring",
    }


def test_chrome_json_has_complete_events_in_microseconds_one_process_per_rank(tmp_path):
    t = Trace(
        [
            Span(0, "fwd", "compute", 1_000 * MS, 1_002 * MS),
            Span(
                0, "ar", "comm", 1_001 * MS, 1_004 * MS, 4096, {"bucket": 0, "dtype": torch.float32}
            ),
            Span(1, "fwd", "compute", 1_000 * MS, 1_003 * MS),
        ]
    )
    doc = t.to_chrome(tmp_path / "trace.json")
    assert json.loads((tmp_path / "trace.json").read_text()) == doc
    assert doc["displayTimeUnit"] == "ms"
    complete = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {tuple(sorted(e)) for e in complete} == {
        ("args", "cat", "dur", "name", "ph", "pid", "tid", "ts")
    }
    ar = next(e for e in complete if e["name"] == "ar")
    assert (ar["ts"], ar["dur"], ar["pid"], ar["cat"]) == (1_000.0, 3_000.0, 0, "comm")
    assert ar["args"] == {"nbytes": 4096, "bucket": 0, "dtype": "torch.float32"}
    assert sorted(e["pid"] for e in complete) == [0, 0, 1]
    tids = {(e["pid"], e["cat"]): e["tid"] for e in complete}
    assert tids[(0, "compute")] == tids[(1, "compute")] != tids[(0, "comm")]
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e["name"] == "thread_name"
    }
    assert threads[(0, tids[(0, "comm")])] == "comm"


def test_chrome_rows_keep_nested_spans_together_and_split_partial_overlaps():
    outer, inner = Span(0, "fwd", "compute", 0, 10), Span(0, "mm", "compute", 2, 4)
    crossing = Span(0, "other", "compute", 8, 12)
    assert nesting_rows([outer, inner, crossing]) == [0, 0, 1]
    later = Span(0, "after", "compute", 12, 13)
    assert nesting_rows([outer, inner, crossing, later]) == [0, 0, 1, 0]


def test_calibrate_clock_gives_offset_zero_to_ranks_sharing_a_host(cluster2):
    assert list(cluster2.run(lambda: dtlab.trace.calibrate_clock(rounds=2))) == [0, 0]


def _compute_then_all_reduce():
    with dtlab.trace.span("fill", kind="compute"):
        t = torch.full((256,), float(dtlab.rank()))
    with dtlab.trace.span("all_reduce", kind="comm", nbytes=t.numel() * t.element_size()):
        dist.all_reduce(t)
    return t[0].item()


def test_cluster_run_returns_both_ranks_spans_on_one_clock(cluster2):
    res = cluster2.run(_compute_then_all_reduce)
    assert list(res) == [1.0, 1.0]
    tr = res.trace
    assert tr.ranks == [0, 1]
    comm = tr.filter(kind="comm").spans
    assert sorted((s.rank, s.nbytes) for s in comm) == [(0, 1024), (1, 1024)]
    assert tr.bytes_moved() == 2048
    assert len(tr.filter(kind="compute")) == 2
    # Neither rank can finish an all-reduce before the other has started it, so on an aligned
    # clock the two comm spans must overlap.
    assert max(s.start_ns for s in comm) <= min(s.end_ns for s in comm)


def test_labels_belong_to_their_thread_and_never_outlive_their_block():
    import threading

    inside = threading.Barrier(2)

    def labelled(name: str) -> None:
        with trace.labels(rank_thread=name):
            inside.wait()  # both threads are inside their blocks at once
            assert trace.current_labels() == {"rank_thread": name}
            inside.wait()

    threads = [threading.Thread(target=labelled, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert trace.current_labels() == {}  # interleaved exits left nothing behind


def test_cropped_draws_a_filtered_step_from_its_own_start():
    t = Trace(
        [
            Span(0, "a", "compute", 0, MS, labels={"step": 0}),
            Span(0, "b", "compute", 5 * MS, 6 * MS, labels={"step": 1}),
            Span(1, "c", "comm", 5 * MS, 7 * MS, labels={"step": 1}),
        ]
    )
    step1 = t.filter(step=1)
    assert (step1.start_ns, step1.origin_ns) == (0, 0)  # filter keeps the run's bounds
    alone = step1.cropped()
    assert (alone.start_ns, alone.end_ns, alone.origin_ns) == (5 * MS, 7 * MS, 5 * MS)
    idle = [s for s in alone.with_idle().spans if s.kind == "idle"]
    assert [(s.rank, s.start_ns, s.end_ns) for s in idle] == [(0, 6 * MS, 7 * MS)]
