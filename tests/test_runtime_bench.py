"""``dtlab bench runtime`` measures a real baseline in the same run; no timing is asserted."""

from __future__ import annotations

import json

from dtlab.bench import runtime


def test_runtime_bench_reports_a_spawn_baseline_beside_the_warm_cluster(tmp_path, capsys):
    out = tmp_path / "runtime.json"
    args = ["--world-size", "2", "--repeats", "2", "--warm-calls", "2", "--json", str(out)]
    assert runtime.main(args) == 0
    printed = capsys.readouterr().out
    assert "baseline: torch.multiprocessing.spawn per call" in printed
    assert "baseline / warm run" in printed
    result = json.loads(out.read_text())
    baseline, warm = result["baseline_spawn_per_call_s"], result["warm_run_s"]
    for spread in (baseline, warm, result["warm_allreduce_run_s"], result["cold_start_s"]):
        assert 0 < spread["low"] <= spread["median"] <= spread["high"]
    ratio = result["baseline_over_warm_run"]
    # Each repeat's ratio divides that repeat's two timings, so it lies within their ranges.
    assert baseline["low"] / warm["high"] <= ratio["low"] <= ratio["high"]
    assert ratio["high"] <= baseline["high"] / warm["low"]
