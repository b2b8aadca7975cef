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


def test_the_fabric_starts_chosen_and_switching_it_replans():
    planner = PlannerWidget("70B on 2048 H100")
    assert planner.fabric.value == "one NIC per GPU"  # a value, so the dropdown is not blank
    assert planner.fabric.label == "one NIC per GPU"
    per_gpu = {plan: t.step_s for _, plan, _, t in planner.rows}
    planner.fabric.value = "one NIC per node"
    per_node = {plan: t.step_s for _, plan, _, t in planner.rows}
    shared = per_gpu.keys() & per_node.keys()
    assert shared and all(per_node[p] >= per_gpu[p] for p in shared)
    assert any(per_node[p] > per_gpu[p] for p in shared)


def test_the_title_follows_the_edited_gpu_count():
    planner = PlannerWidget("7B on 64 H100")
    planner.gpus.value = 128
    title = planner.figure.layout.title.text
    assert "128" in title and " 64 " not in title


def test_ruled_out_reasons_are_shown_with_real_numbers():
    planner = PlannerWidget("70B on 2048 H100")
    assert planner.reasons
    assert all(
        any(ch.isdigit() for ch in reason.split("e.g.:", 1)[1]) for reason in planner.reasons
    )
    assert not any(" N " in reason.split("e.g.:", 1)[1] for reason in planner.reasons)


def test_the_ranked_layouts_are_an_html_table_that_does_not_wrap():
    planner = PlannerWidget("70B on 2048 H100")
    table = planner.table_html
    assert table.count("<tr>") == len(planner.rows) + 1  # the header and one row per layout
    assert "white-space:nowrap" in table and "<th>layout</th>" in table
    assert all(plan.describe() in table for _, plan, _, _ in planner.rows)
