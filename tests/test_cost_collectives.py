"""The alpha-beta model of every collective, the α/β fit, the two-tier model, the benchmark's
bookkeeping and the lab-01 graders."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from dtlab import collectives as C
from dtlab.bench.collectives import BenchRecord, measured_crossover, run_sweep, summarize
from dtlab.cost import (
    Link,
    TwoTierCluster,
    collective_time,
    crossover_bytes,
    fit_alpha_beta,
    hierarchical_all_reduce_time,
    hierarchical_speedup,
    ring_allreduce_time,
)
from dtlab.cost.collectives import AlphaBetaTerms, terms
from dtlab.quiz.exercises import check_exercise

LINK = Link(alpha_s=20e-6, bandwidth_bytes_per_s=10e9)


def test_ring_all_reduce_time_matches_the_base_formula():
    for n in (2, 3, 8, 64):
        for m in (1e3, 1e6, 1e9):
            assert collective_time("all_reduce", "ring", m, n, LINK) == pytest.approx(
                ring_allreduce_time(m, n, LINK)
            )


def test_all_reduce_costs_reduce_scatter_plus_all_gather():
    for n in (2, 4, 7):
        rs = collective_time("reduce_scatter", "ring", 1e8, n, LINK)
        ag = collective_time("all_gather", "ring", 1e8, n, LINK)
        assert collective_time("all_reduce", "ring", 1e8, n, LINK) == pytest.approx(rs + ag)


def test_textbook_terms_for_power_of_two_worlds():
    m, n = 1e6, 8
    T = AlphaBetaTerms
    assert terms("all_reduce", "recursive_doubling", m, n) == T(3, 3 * m)
    assert terms("all_reduce", "rabenseifner", m, n) == T(6, 2 * 7 / 8 * m)
    assert terms("broadcast", "binomial", m, n) == T(3, 3 * m)
    assert terms("barrier", "dissemination", 0, 5) == T(3, 0)
    assert terms("broadcast", "chain", m, n, segments=4) == T(10, 10 / 4 * m)


def test_every_registered_algorithm_has_a_cost_and_one_rank_is_free():
    for op, algorithms in C.ALGORITHMS.items():
        for name in algorithms:
            assert collective_time(op, name, 1e6, 4, LINK) > 0
            assert collective_time(op, name, 1e6, 1, LINK) == 0


def test_unknown_algorithm_names_the_choices():
    with pytest.raises(ValueError, match="choose one of"):
        collective_time("all_reduce", "butterfly", 1e6, 4, LINK)


def test_crossover_is_where_the_two_times_meet():
    size = crossover_bytes("all_reduce", "recursive_doubling", "ring", 8, LINK)
    # 3α + 3Mβ = 14α + 1.75Mβ  →  M = 11α / (1.25β)
    assert size == pytest.approx(11 * LINK.alpha_s / (1.25 / LINK.bandwidth_bytes_per_s), rel=1e-9)
    assert crossover_bytes("all_reduce", "recursive_doubling", "ring", 2, LINK) is None


def test_fit_recovers_alpha_and_beta_from_model_times():
    sizes = [1024 * 4**k for k in range(8)]
    times = [collective_time("all_reduce", "ring", m, 4, LINK) for m in sizes]
    fitted = fit_alpha_beta(sizes, times, "all_reduce", "ring", 4)
    assert fitted.alpha_s == pytest.approx(LINK.alpha_s, rel=1e-6)
    assert fitted.bandwidth_bytes_per_s == pytest.approx(LINK.bandwidth_bytes_per_s, rel=1e-6)


def test_fit_keeps_alpha_non_negative():
    sizes = [1e3, 1e6, 1e9]
    fitted = fit_alpha_beta(
        sizes, [m / 1e9 * 0.9 for m in sizes[:1]] + [m / 1e9 for m in sizes[1:]]
    )
    assert fitted.alpha_s >= 0


def test_hierarchical_all_reduce_time_is_its_three_phases_on_rails():
    cluster = TwoTierCluster(nodes=4, gpus_per_node=8)  # one NIC per GPU
    m = 1 << 30
    g, k = 8, 4
    inside = 2 * (g - 1) * (cluster.intra.alpha_s + m / g / cluster.intra.bandwidth_bytes_per_s)
    across = (
        2 * (k - 1) * cluster.inter.alpha_s
        + 2 * (k - 1) / k * m / g / cluster.inter.bandwidth_bytes_per_s
    )
    assert hierarchical_all_reduce_time(m, cluster) == pytest.approx(inside + across)
    # On a rail-optimised fabric the flat ring (one ring per NIC) is not beaten on bandwidth...
    assert hierarchical_speedup(m, cluster) < 1
    # ...only on latency, for small messages
    assert hierarchical_speedup(16 * 1024, cluster) > 4


def _record(algorithm: str, nbytes: int, seconds: float, n: int = 4) -> BenchRecord:
    return BenchRecord("all_reduce", algorithm, n, "gloo", nbytes, seconds, 0.0, 0.0, 3)


def test_summary_fits_the_link_and_finds_the_crossover():
    sizes = [1024 * 4**k for k in range(8)]
    records = [
        _record(a, m, collective_time("all_reduce", "ring" if a == "torch" else a, m, 4, LINK))
        for a in ("ring", "recursive_doubling", "torch")
        for m in sizes
    ]
    entry = summarize(records)[4]
    assert entry["fitted_alpha_us"] == pytest.approx(20.0, rel=1e-6)
    predicted = entry["crossover"]["recursive_doubling"]["predicted_bytes"]
    measured = entry["crossover"]["recursive_doubling"]["measured_bytes"]
    assert predicted == pytest.approx(
        crossover_bytes("all_reduce", "recursive_doubling", "ring", 4, LINK)
    )
    assert measured / 4 < predicted < measured * 4  # measured is pinned to the sweep's grid
    assert entry["ring_vs_builtin"] == {s: pytest.approx(1.0) for s in sizes if s >= 16 << 20}
    assert measured_crossover(records, "ring", "recursive_doubling") is not None


def test_summary_reports_the_check_cost_and_iteration_paired_ratios():
    """The agreement check is a measured line of its own, left out of the fit, and the ring's
    ratio to the built-in comes with its range over iterations that ran back to back."""
    from dtlab.bench.collectives import CHECK

    m = 16 << 20
    ring = BenchRecord(
        "all_reduce", "ring", 2, "gloo", m, 0.010, 0, 0, 3, 0.009, [0.010, 0.009, 0.020]
    )
    torch_ = BenchRecord(
        "all_reduce", "torch", 2, "gloo", m, 0.012, 0, 0, 3, 0.010, [0.012, 0.010, 0.010]
    )
    check = BenchRecord("all_reduce", CHECK, 2, "gloo", m, 0.0004, 0, 0, 3, 0.0003, [4e-4] * 3)
    tree = BenchRecord("all_reduce", "binary_tree", 2, "gloo", m, 0.030, 0, 0, 3)
    entry = summarize([ring, torch_, check, tree])[2]
    paired = entry["ring_vs_builtin_paired"][m]
    assert paired == {
        "median": pytest.approx(10 / 9),
        "min": pytest.approx(0.5),
        "max": pytest.approx(1.2),
    }
    assert entry["check_ms"] == {m: pytest.approx(0.4)}
    assert entry["check_share"] == {m: pytest.approx(0.04)}
    assert entry["ring_vs_builtin"][m] == pytest.approx(1.2)


def test_bandwidth_curve_draws_measured_and_model_lines():
    from dtlab.viz import bandwidth_curve

    records = [_record(a, m, 1e-3 + m / 1e9) for a in ("ring", "torch") for m in (1024, 1 << 20)]
    fig = bandwidth_curve(records, summarize(records))
    assert [t.name for t in fig.data] == ["ring", "ring (model)", "torch", "torch (model)"]
    assert fig.layout.xaxis.type == "log"


def test_sweep_measures_ours_and_the_builtin_in_one_run(cluster2):
    records = run_sweep(
        cluster2, sizes=[1024, 4096], algorithms=["ring", "binary_tree"], iters=1, warmup=0
    )
    assert {(r.algorithm, r.nbytes) for r in records} == {
        (a, s) for a in ("ring", "binary_tree", "torch") for s in (1024, 4096)
    }
    assert all(r.seconds > 0 and math.isclose(r.busbw_gbps, r.algbw_gbps) for r in records)


# --- graders: the lab's reference solutions pass, wrong ones fail with a useful message --------


def _lab_solution(exercise_id: str):
    """The lab 01 solution of ``exercise_id``: a ring built from point-to-point messages."""
    from pathlib import Path

    from dtlab.workshop.exercises import list_exercises, load_exercise_function
    from dtlab.workshop.source import read_lab_source

    source = read_lab_source(Path(__file__).resolve().parents[1] / "solutions/01_collectives.py")
    exercise = next(e for e in list_exercises(source) if e.exercise_id == exercise_id)
    return load_exercise_function(exercise, "solution")


def _calls_the_builtin(tensor: torch.Tensor) -> None:
    dist.all_reduce(tensor)


def test_ring_exercises_pass_a_correct_solution_and_fail_wrong_ones(cluster3):
    ring = _lab_solution("collectives.ring_all_reduce")

    def off_by_one_ring(tensor: torch.Tensor) -> torch.Tensor:
        out = ring(tensor)
        if dist.get_rank() == 1 and out.numel() > 3:
            out[3] += 1
        return out

    assert check_exercise("collectives.ring_all_reduce", ring, cluster3, record=False)
    gather = _lab_solution("collectives.ring_all_gather")
    assert check_exercise("collectives.ring_all_gather", gather, cluster3, record=False)
    wrong = check_exercise("collectives.ring_all_reduce", off_by_one_ring, cluster3, record=False)
    assert not wrong and "index 3" in wrong.message
    cheat = check_exercise(
        "collectives.ring_all_reduce", _calls_the_builtin, cluster3, record=False
    )
    assert not cheat and "dist.all_reduce is not allowed" in cheat.message


def test_cost_exercise_accepts_the_formula_and_rejects_a_slip():
    def right(nbytes, n, alpha_s, bandwidth):
        return 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * nbytes / bandwidth

    def forgot_the_two(nbytes, n, alpha_s, bandwidth):
        return (n - 1) * alpha_s + (n - 1) / n * nbytes / bandwidth

    assert check_exercise("collectives.ring_time", right, cluster=object(), record=False)
    slip = check_exercise("collectives.ring_time", forgot_the_two, cluster=object(), record=False)
    assert not slip and "2(N-1)" in slip.message
