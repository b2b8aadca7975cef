"""dtlab.mesh.layout_rules, the one home of layout validity: impossible layouts refused, saying
what to change, with one rule per dimension that the planner and the executor's checks share."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dtlab.mesh import Layout, fit_check, validate_layout
from dtlab.mesh.layout_rules import (
    context_parallel_problems,
    divisors,
    expert_parallel_problems,
    tensor_parallel_problems,
)
from dtlab.models import GPTConfig

SMALL = GPTConfig.small()  # 8 heads, 4 layers, seq 128, d_ff 1024


def test_tp_that_does_not_divide_the_heads_names_the_degrees_that_do():
    with pytest.raises(
        ValueError, match=r"tp=3 does not divide 8 attention heads; choose 1, 2, 4 or 8"
    ):
        validate_layout(SMALL, tp=3)


def test_tp_beyond_the_kv_heads_is_refused_with_both_fixes():
    config = GPTConfig.small(n_kv_heads=2)
    with pytest.raises(
        ValueError,
        match=r"tp=4 exceeds 2 KV heads: .* choose tp = 1 or 2, or n_kv_heads = 4 or 8",
    ):
        validate_layout(config, tp=4)
    validate_layout(config, tp=2)


def test_tp_must_divide_the_mlp_width():
    with pytest.raises(ValueError, match=r"tp=4 does not divide d_ff=90 .*choose 1, 2, 3, 5, 6"):
        validate_layout(GPTConfig.tiny(d_ff=90), tp=4)


def test_pp_beyond_the_layers_is_refused():
    with pytest.raises(ValueError, match=r"pp=5 exceeds n_layers=4: .*choose 1 to 4"):
        validate_layout(SMALL, pp=5)


def test_cp_must_divide_the_sequence_and_zigzag_needs_two_chunks_per_rank():
    with pytest.raises(ValueError, match=r"cp=3 does not divide seq_len=128"):
        validate_layout(SMALL, cp=3)
    validate_layout(SMALL, cp=128)
    with pytest.raises(
        ValueError, match=r"into 2·cp = 256 equal chunks.*choose cp from \[1, 2, 4, 8, 16, 32, 64\]"
    ):
        validate_layout(SMALL, cp=128, cp_style="zigzag")
    validate_layout(SMALL, cp=64, cp_style="zigzag")


def test_ulysses_cp_must_divide_the_heads_each_tp_rank_holds():
    with pytest.raises(ValueError, match=r"Ulysses cp=8 must divide the 4 query and 4 KV heads"):
        validate_layout(SMALL, tp=2, cp=8, cp_style="ulysses")
    validate_layout(SMALL, tp=2, cp=4, cp_style="ulysses")


def test_ep_needs_experts_it_divides():
    with pytest.raises(
        ValueError, match="ep=2 needs a mixture of experts, but the model has no experts"
    ):
        validate_layout(SMALL, ep=2)
    with pytest.raises(
        ValueError, match=r"ep=4 does not divide n_experts=6: .*choose ep from \[1, 2, 3, 6\]"
    ):
        validate_layout(SMALL, ep=4, n_experts=6)
    validate_layout(SMALL, ep=2, n_experts=8)


def test_every_problem_is_listed_at_once():
    with pytest.raises(ValueError, match="does not fit the model") as caught:
        validate_layout(SMALL, tp=3, pp=5, cp=3)
    message = str(caught.value)
    assert "tp=3" in message and "pp=5" in message and "cp=3" in message


def test_a_layout_object_supplies_degrees_and_keywords_override_them():
    """Any object with tp/cp/pp/ep attributes works, e.g. ``dtlab.mesh.Layout`` through
    ``layout.check(world, model_check=fit_check(config))``; missing ones mean 1."""
    with pytest.raises(ValueError, match="tp=3"):
        validate_layout(SMALL, SimpleNamespace(tp=3, dp=2))
    validate_layout(SMALL, SimpleNamespace(tp=3), tp=2)
    validate_layout(SMALL, SimpleNamespace(tp=2, pp=2, cp=2, ep=1, dp=4))
    Layout(dp=4, tp=2).check(8, model_check=fit_check(SMALL))
    with pytest.raises(ValueError, match="tp=16 does not divide 8 attention heads"):
        Layout(tp=16).check(16, model_check=fit_check(SMALL))


def test_degrees_must_be_positive_integers_and_the_cp_style_known():
    with pytest.raises(ValueError, match="whole number"):
        validate_layout(SMALL, tp=0)
    with pytest.raises(ValueError, match="cp_style='striped'"):
        validate_layout(SMALL, cp_style="striped")


def test_sequence_parallel_adds_its_rule_only_when_asked():
    odd = GPTConfig.tiny(seq_len=30)
    validate_layout(odd, tp=4)
    with pytest.raises(ValueError, match="cuts seq_len=30 into tp=4 chunks"):
        validate_layout(odd, tp=4, sequence_parallel=True)


def test_the_vocabulary_need_not_divide_because_tensor_parallel_pads_it():
    validate_layout(GPTConfig.tiny(vocab_size=101), tp=4)


def test_the_planner_and_the_executor_share_one_rule_per_dimension():
    """Where they ask differently it is by an argument, written in the module docstring: the
    planner leaves the KV heads out (Megatron-LM replicates them) and always plans zig-zag."""
    assert tensor_parallel_problems(3, 8) == tensor_parallel_problems(3, 8, 8, 3 * 8)[:1]
    assert tensor_parallel_problems(8, 64, n_kv_heads=None) == []
    assert "exceeds 4 KV heads" in tensor_parallel_problems(8, 64, n_kv_heads=4)[0]
    assert context_parallel_problems(3, 21, "ring") == []
    assert "2·cp = 6" in context_parallel_problems(3, 21, "zigzag")[0]
    assert context_parallel_problems(3, 21, "allgather") == []  # contiguous, as the ring
    (experts,) = expert_parallel_problems(3, 8, dp=6)
    assert "choose ep from [1, 2]" in experts  # divisors of 8 that also divide dp
    assert "does not divide dp=6" in expert_parallel_problems(4, 8, dp=6)[0]


def test_one_divisors_for_every_rule():
    """The mesh package exports the very function the rules, the planner and the layout use."""
    import dtlab.mesh
    import dtlab.mesh.layout
    import dtlab.plan.search

    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert (
        dtlab.mesh.divisors is divisors is dtlab.mesh.layout.divisors is dtlab.plan.search.divisors
    )
