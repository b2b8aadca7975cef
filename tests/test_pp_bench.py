"""``dtlab bench pp`` runs our 1F1B and torch's ``Schedule1F1B`` side by side (ratio not asserted)."""

from __future__ import annotations

from dtlab.bench import Spread
from dtlab.bench import pp as pp_bench


def test_pp_bench_reports_our_1f1b_against_torchs_in_one_run(cluster2):
    results = pp_bench.run(cluster2, model_size="tiny", n_micro=2, steps=2, repeats=1)
    by = {r.implementation: r for r in results}
    assert list(by) == list(pp_bench.IMPLEMENTATIONS)
    assert by["torch_1f1b"].vs_torch == Spread(1.0, 1.0, 1.0)
    for r in results:
        assert r.step_s > 0 and len(r.step_s_per_round) == 2
        assert r.vs_torch.low <= r.vs_torch.median <= r.vs_torch.high
