"""The tensor-parallel benchmark runs both implementations interleaved and reports a ratio.

Only its shape is checked (wall-clock times are never asserted): both implementations measured
in every round, ratios relative to DTensor's.
"""

from __future__ import annotations

from dtlab.bench import tp as tp_bench


def test_tp_bench_reports_our_step_time_as_a_ratio_to_dtensor(cluster2):
    results = tp_bench.run(cluster2, model_size="tiny", steps=2, repeats=1, sequence_parallel=True)
    by = {r.implementation: r for r in results}
    assert list(by) == list(tp_bench.IMPLEMENTATIONS)
    assert by["torch_dtensor_tp"].vs_dtensor.median == 1.0
    for r in results:
        assert len(r.step_s_per_round) == 2 and r.step_s > 0 and r.vs_dtensor.median > 0
