"""bench recompute at tiny sizes: every variant reported, and the counted ratios make sense."""

from __future__ import annotations

from dtlab.bench import recompute as recompute_bench


def test_recompute_bench_counts_the_extra_forward_and_the_memory_saved(cluster2):
    r = recompute_bench.run(cluster2, model_size="tiny", seq=16, batch=2, steps=1, repeats=1)
    assert set(r.time_vs_plain) >= {"plain", "selective", "full", "torch_full"}
    assert r.flops_vs_plain["plain"] == 1.0
    # Full recomputation re-runs every block's forward: between 1 and 4/3 of the FLOPs (the
    # embedding and LM head are not recomputed); ours and torch's count the same.
    assert 1.2 < r.flops_vs_plain["full"] < 4 / 3
    assert r.flops_vs_plain["full"] == r.flops_vs_plain["torch_full"]
    assert 1.0 < r.flops_vs_plain["selective"] < r.flops_vs_plain["full"]
    assert r.saved_vs_plain["full"] < r.saved_vs_plain["selective"] < 1.0
    assert abs(r.saved_vs_plain["full"] - r.saved_vs_plain["torch_full"]) < 0.01
