"""The planner widget: presets load, edits re-plan, the chart follows the chart rules."""

from dtlab.plan import first_plan_that_fits, plan_problems
from dtlab.viz import chart_problems
from dtlab.viz.planner import PlannerWidget, rank_layouts


def test_a_preset_is_ranked_fastest_first_with_its_first_fit_and_a_readable_chart():
    planner = PlannerWidget("70B on 2048 H100")
    job = planner.job
    steps = [t.step_s for label, _, _, t in planner.rows if not label.startswith("first")]
    assert steps == sorted(steps) and len(steps) == planner.limit
    assert any(plan == first_plan_that_fits(job) for _, plan, _, _ in planner.rows)
    assert all(not plan_problems(job, plan) for _, plan, _, _ in planner.rows)
    assert chart_problems(planner.figure) == []
    assert sum(planner.rejected.values()) > 0


def test_editing_the_gpus_replans_and_an_impossible_job_shows_only_reasons():
    planner = PlannerWidget("7B on 64 H100")
    before = planner.rows
    planner.gpus.value = 128
    assert planner.job.n_gpus == 128 and planner.rows != before
    assert all(plan.world_size == 128 for _, plan, _, _ in planner.rows)
    planner.gpus.value = 1  # one GPU cannot hold 7B with Adam (112 GB): nothing fits
    assert planner.rows == [] and planner.figure is None
    assert any("GB per GPU" in reason for reason in planner.rejected)


def test_reasons_are_counted_without_their_numbers():
    from dtlab.plan.large_jobs import DEEPSEEK_V3

    rows, rejected = rank_layouts(DEEPSEEK_V3, limit=2)
    assert rows and all(plan.ep > 1 for _, plan, _, _ in rows)  # the experts need EP to fit
    assert not any(ch.isdigit() for reason in rejected for ch in reason.replace("N", ""))
