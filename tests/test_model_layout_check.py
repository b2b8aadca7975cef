"""validate_layout / GPTConfig.check_parallel: impossible layouts refused, saying what to change."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dtlab.models import GPTConfig, validate_layout

SMALL = GPTConfig.small()  # 8 heads, 4 layers, seq 128, d_ff 1024


def test_tp_that_does_not_divide_the_heads_names_the_degrees_that_do():
    with pytest.raises(
        ValueError, match=r"tp=3 does not divide 8 attention heads; choose 1, 2, 4 or 8"
    ):
        SMALL.check_parallel(tp=3)


def test_tp_beyond_the_kv_heads_is_refused_with_both_fixes():
    config = GPTConfig.small(n_kv_heads=2)
    with pytest.raises(
        ValueError,
        match=r"tp=4 exceeds 2 KV heads: .* choose tp = 1 or 2, or n_kv_heads = 4 or 8",
    ):
        config.check_parallel(tp=4)
    config.check_parallel(tp=2)


def test_tp_must_divide_the_mlp_width():
    with pytest.raises(ValueError, match=r"tp=4 does not divide d_ff=90 .*choose 1, 2, 3, 5, 6"):
        GPTConfig.tiny(d_ff=90).check_parallel(tp=4)


def test_pp_beyond_the_layers_is_refused():
    with pytest.raises(ValueError, match=r"pp=5 exceeds n_layers=4: .*choose 1 to 4"):
        SMALL.check_parallel(pp=5)


def test_cp_must_divide_the_sequence_and_zigzag_needs_two_chunks_per_rank():
    with pytest.raises(ValueError, match=r"cp=3 does not divide seq_len=128"):
        SMALL.check_parallel(cp=3)
    SMALL.check_parallel(cp=128)
    with pytest.raises(ValueError, match=r"2·cp=256 chunks.*choose cp = 1, 2, 4, 8, 16, 32 or 64"):
        SMALL.check_parallel(cp=128, cp_style="zigzag")
    SMALL.check_parallel(cp=64, cp_style="zigzag")


def test_ulysses_cp_must_divide_the_heads_each_tp_rank_holds():
    with pytest.raises(ValueError, match=r"Ulysses cp=8 must divide the 4 query and 4 KV heads"):
        SMALL.check_parallel(tp=2, cp=8, cp_style="ulysses")
    SMALL.check_parallel(tp=2, cp=4, cp_style="ulysses")


def test_ep_needs_experts_it_divides():
    with pytest.raises(ValueError, match="ep=2 but the model has no experts"):
        SMALL.check_parallel(ep=2)
    with pytest.raises(
        ValueError, match=r"ep=4 does not divide n_experts=6: .*choose 1, 2, 3 or 6"
    ):
        SMALL.check_parallel(ep=4, n_experts=6)
    SMALL.check_parallel(ep=2, n_experts=8)


def test_every_problem_is_listed_at_once():
    with pytest.raises(ValueError, match="does not fit the model") as caught:
        SMALL.check_parallel(tp=3, pp=5, cp=3)
    message = str(caught.value)
    assert "tp=3" in message and "pp=5" in message and "cp=3" in message


def test_a_layout_object_supplies_degrees_and_keywords_override_them():
    """Any object with tp/cp/pp/ep attributes works, e.g. ``dtlab.mesh.Layout`` through
    ``layout.check(world, model_check=config.check_parallel)``; missing ones mean 1."""
    with pytest.raises(ValueError, match="tp=3"):
        validate_layout(SMALL, SimpleNamespace(tp=3, dp=2))
    validate_layout(SMALL, SimpleNamespace(tp=3), tp=2)
    SMALL.check_parallel(SimpleNamespace(tp=2, pp=2, cp=2, ep=1, dp=4))


def test_degrees_must_be_positive_integers_and_the_cp_style_known():
    with pytest.raises(ValueError, match="whole number"):
        SMALL.check_parallel(tp=0)
    with pytest.raises(ValueError, match="cp_style='striped'"):
        SMALL.check_parallel(cp_style="striped")
