"""Lab 11's graders: right answers pass, wrong ones fail with a useful message, shortcuts are
refused."""

from __future__ import annotations

from dtlab.quiz import check_exercise

PARTIAL = ("attn_norm", "mlp_norm", "final_norm", "out_proj.bias", "fc_out.bias", "pos_embed")


def reduction_groups(name, degrees, data_parallel, sequence_parallel):
    groups = {d for d in ("dp", "cp") if degrees.get(d, 1) > 1}
    if sequence_parallel and degrees.get("tp", 1) > 1 and any(p in name for p in PARTIAL):
        groups.add("tp")
    if degrees.get("pp", 1) > 1 and name in ("embed.weight", "lm_head.weight"):
        groups.add("pp")  # the tied embedding: summed over the first and last stage
    return groups


def forgets_sequence_parallel(name, degrees, data_parallel, sequence_parallel):
    return {d for d in ("dp", "cp") if degrees.get(d, 1) > 1} | (
        {"pp"} if degrees.get("pp", 1) > 1 and name in ("embed.weight", "lm_head.weight") else set()
    )


def asks_the_library(name, degrees, data_parallel, sequence_parallel):
    from dtlab.parallel.compose import place_parameters

    return set(place_parameters([name], degrees)[name].reduced_over)


def test_reduction_groups_right_answer_passes(cluster4):
    result = check_exercise("system_design.reduction_groups", reduction_groups, cluster4)
    assert result.passed, result.message


def test_reduction_groups_that_forget_sequence_parallel_partial_sums_fail(cluster4):
    result = check_exercise("system_design.reduction_groups", forgets_sequence_parallel, cluster4)
    assert not result.passed and "'tp'" in result.message


def test_reduction_groups_from_the_library_are_refused(cluster4):
    result = check_exercise("system_design.reduction_groups", asks_the_library, cluster4)
    assert not result.passed and "place_parameters" in result.message


def pick_layout(req):
    from dtlab.plan import ParallelPlan, plan_problems
    from dtlab.plan.layout_cost import (
        activation_bytes_per_gpu,
        pipeline_bubble,
        state_bytes_per_gpu,
    )

    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8, 16):
            for zero in (1, 2, 3):
                if req.n_gpus % (tp * pp):
                    continue
                plan = ParallelPlan(req.n_gpus // (tp * pp), tp, pp, zero)
                if not plan_problems(req, plan):
                    gb = state_bytes_per_gpu(req.params, plan) + activation_bytes_per_gpu(req, plan)
                    return plan, {"gb_per_gpu": gb / 1e9, "bubble": pipeline_bubble(req, plan)}
    raise AssertionError("no plan")


def test_pick_layout_right_answer_passes(cluster2):
    result = check_exercise("system_design.pick_layout", pick_layout, cluster2)
    assert result.passed, result.message


def test_pick_layout_with_a_wrong_memory_claim_fails():
    def overclaims(req):
        plan, claims = pick_layout(req)
        return plan, {**claims, "gb_per_gpu": claims["gb_per_gpu"] * 2}

    result = check_exercise("system_design.pick_layout", overclaims, None)
    assert not result.passed and "gb_per_gpu" in result.message


def test_pick_layout_that_does_not_fit_fails_with_the_reason():
    from dtlab.plan import ParallelPlan

    def too_small(req):
        return ParallelPlan(req.n_gpus, 1, 1, 1), {"gb_per_gpu": 1.0, "bubble": 0.0}

    result = check_exercise("system_design.pick_layout", too_small, None)
    assert not result.passed and "GB per GPU" in result.message


def test_pick_layout_through_the_planner_search_is_refused():
    from dtlab.plan import first_plan_that_fits
    from dtlab.plan.layout_cost import (
        activation_bytes_per_gpu,
        pipeline_bubble,
        state_bytes_per_gpu,
    )

    def searches(req):
        plan = first_plan_that_fits(req)
        gb = state_bytes_per_gpu(req.params, plan) + activation_bytes_per_gpu(req, plan)
        return plan, {"gb_per_gpu": gb / 1e9, "bubble": pipeline_bubble(req, plan)}

    result = check_exercise("system_design.pick_layout", searches, None)
    assert not result.passed and "first_plan_that_fits" in result.message
