"""``dtlab bench overlap``: the PP × DP rows come from one run with both modes, each beside the
model given the measured all-reduce (times not asserted); the table prints every row."""

from __future__ import annotations

import pytest

from dtlab.bench import overlap as overlap_bench


def test_dp_pp_rows_pair_both_modes_with_the_model(cluster4):
    rows = overlap_bench.dp_pp_rows(cluster4, steps=1, width=128, stage_s=0.005)
    assert [(r["mechanism"], r["technique_on"]) for r in rows] == [
        ("dp_sync_pp 1f1b", False),
        ("dp_sync_pp 1f1b", True),
        ("dp_sync_pp interleaved_1f1b", False),
        ("dp_sync_pp interleaved_1f1b", True),
    ]
    for r in rows:
        assert r["exposed_ms"] >= 0 and r["reduce_ms"] > 0 and r["model_exposed_ms"] >= 0
    interleaved = {r["technique_on"]: r for r in rows[2:]}
    assert interleaved[True]["model_exposed_ms"] < interleaved[False]["model_exposed_ms"]
    table = overlap_bench.format_rows(rows)
    assert table.count("dp_sync_pp") == 4 and "technique on" in table


def test_unknown_mechanisms_are_named():
    with pytest.raises(ValueError, match="choose from"):
        overlap_bench.run(("tp", "nccl"))


def test_moe_rows_pair_the_sequential_and_overlapped_schedules(cluster2):
    rows = overlap_bench.moe_rows(cluster2, tokens=64, rounds=1)
    assert [r["technique_on"] for r in rows] == [False, True]
    assert all(r["equal"] and r["exposed_ms"] >= 0 for r in rows)
    assert rows[0]["on_over_off"] == rows[1]["on_over_off"]
    assert "moe_two_microbatch" in overlap_bench.format_rows(rows)
