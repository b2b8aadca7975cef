"""The bubble of the pipeline step the ranks executed is within 5 points of the planner's.

Real ranks run one composed training step per case (1F1B and GPipe; pp = 2 beside dp = 2, and
pp = 4; m = 4 and 8) with every action on the trace. From the trace alone,
:func:`dtlab.parallel.pipeline.executed_bubble.executed_bubble` reads back the order each rank ran
its forwards, backwards, sends and receives, and replays it with the real cross-rank dependencies
on a **logical clock** (forward 1, backward 2, messages 0) — tests never assert timings, so the
wall-clock idle share is computed beside it as information only (a benchmark's figure). The
replayed idle share ``1 − busy/(p·makespan)`` must be within 5 points of
:func:`dtlab.cost.bubble.bubble_fraction_of_total` = ``(p−1)/(m+p−1)``; a serialised order (one
micro-batch through the whole pipeline, forward and backward, before the next starts), built as
a trace by hand, must fail that check.
"""

from __future__ import annotations

import pytest

from dtlab.trace import Span, Trace

CASES = [  # (degrees, schedule, m)
    (degrees, schedule, m)
    for degrees in ({"pp": 2, "dp": 2}, {"pp": 4})
    for schedule in ("1f1b", "gpipe")
    for m in (4, 8)
]


def run_every_case() -> None:
    """On one rank: one traced training step of a tiny composed GPT per case."""
    from dtlab import trace
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.parallel.compose import compose_gpt
    from dtlab.parallel.pipeline import SCHEDULES

    config = GPTConfig.tiny(seq_len=8, d_model=16, n_heads=2, n_layers=4, vocab_size=32)
    for index, (degrees, schedule, m) in enumerate(CASES):
        mesh = Mesh(**degrees)
        tokens, targets = SyntheticTokens(config, 1, mesh.dp_size * m, seed=3)[0]
        composed = compose_gpt(
            GPT(config, seed=0), mesh, schedule=SCHEDULES[schedule](mesh.pp_size, m)
        )
        with trace.labels(case=index):
            composed.train_step(tokens, targets)


@pytest.fixture(scope="module")
def traced(cluster4) -> Trace:
    return cluster4.run(run_every_case).trace


def _pipelines(degrees: dict) -> list[list[int]]:
    from dtlab.mesh import Layout

    return Layout(**degrees).groups("pp")


def test_the_executed_order_has_the_predicted_bubble_within_5_points(traced):
    from dtlab.cost.bubble import bubble_fraction_of_total
    from dtlab.parallel.pipeline import SCHEDULES
    from dtlab.parallel.pipeline.executed_bubble import executed_bubble

    for index, (degrees, schedule, m) in enumerate(CASES):
        step = traced.filter(case=index)
        for ranks in _pipelines(degrees):
            replayed = executed_bubble(step, ranks, m)
            p = len(ranks)
            predicted = bubble_fraction_of_total(p, m)
            assert abs(replayed.bubble_fraction_of_total - predicted) <= 0.05, (index, ranks)
            # what ran is the planned schedule, its real messages part of the replay
            assert replayed.schedule.has_communication
            assert replayed.schedule.compute_only().actions == SCHEDULES[schedule](p, m).actions


def _serialised_trace(p: int, m: int) -> Trace:
    """One micro-batch forward through every stage and back before the next starts."""
    spans, clock = [], 0

    def run(rank: int, name: str, cost: int) -> None:
        nonlocal clock
        spans.append(Span(rank, name, "compute", clock, clock + cost))
        clock += cost

    for mb in range(m):
        for stage in range(p):
            run(stage, f"{stage}F{mb}", 1)
        for stage in reversed(range(p)):
            run(stage, f"{stage}B{mb}", 2)
    return Trace(spans, start_ns=0, end_ns=clock)


@pytest.mark.parametrize("p", [2, 4])
def test_a_serialised_execution_fails_the_bubble_check(p):
    from dtlab.cost.bubble import bubble_fraction_of_total
    from dtlab.parallel.pipeline.executed_bubble import executed_bubble, wall_clock_bubble

    m = 8
    replayed = executed_bubble(_serialised_trace(p, m), list(range(p)), m)
    assert replayed.bubble_fraction_of_total == pytest.approx(1 - 1 / p)  # one rank at a time
    assert abs(replayed.bubble_fraction_of_total - bubble_fraction_of_total(p, m)) > 0.05
    # The hand-built trace's timestamps tell the same story on the wall clock.
    assert wall_clock_bubble(_serialised_trace(p, m), range(p)) == pytest.approx(1 - 1 / p)


def test_a_trace_that_is_not_one_whole_step_is_refused(traced):
    from dtlab.parallel.pipeline.executed_bubble import executed_schedule

    with pytest.raises(ValueError, match="stage order"):
        executed_schedule(traced.filter(case=0), [2, 0], 4)  # a pipeline's ranks reversed
    with pytest.raises(ValueError, match="m=8"):
        executed_schedule(traced.filter(case=0), [0, 2], 8)  # case 0 ran m = 4


def test_the_lab_report_puts_predictions_beside_measurements(cluster4, capsys):
    from dtlab.bench.planner_vs_cluster import planner_vs_cluster
    from dtlab.models import GPTConfig

    config = GPTConfig.tiny(seq_len=8, d_model=16, n_heads=2, n_layers=4, vocab_size=32)
    report = planner_vs_cluster(cluster4, config, {"pp": 2, "dp": 2}, n_micro=4, global_batch=8)
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3]
    for row in report["ranks"]:
        assert abs(row["measured_over_predicted"] - 1) <= 0.05, row
    assert [p["ranks"] for p in report["pipelines"]] == [[0, 2], [1, 3]]
    for row in report["pipelines"]:
        assert abs(row["executed_logical"] - row["predicted"]) <= 0.05, row
        assert 0 <= row["wall_clock"] < 1  # a timing: reported, never compared
    assert "executed (logical clock)" in capsys.readouterr().out


def test_bad_requests_are_refused_with_what_to_change(cluster4):
    from dtlab.bench.planner_vs_cluster import planner_vs_cluster
    from dtlab.models import GPTConfig
    from dtlab.plan.predict_bubble import predicted_bubble

    with pytest.raises(ValueError, match="choose '1f1b'"):
        predicted_bubble(2, 4, "zb_h1")
    with pytest.raises(ValueError, match=r"dtlab.Cluster\(8\)"):
        planner_vs_cluster(cluster4, GPTConfig.tiny(), {"pp": 2, "tp": 2, "dp": 2})
