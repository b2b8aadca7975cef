"""ZB-V and interleaved zero bubble: torch's orders, torch's validator, the bubble formula, the
activation memory per rank, and the single-process GPT's gradients on real ranks."""

from __future__ import annotations

import pytest
import torch

from dtlab.parallel.pipeline import (
    Costs,
    Schedule,
    interleaved_1f1b,
    interleaved_zero_bubble,
    one_f_one_b,
    simulate,
    torch_schedule,
    torch_validate,
    validate,
    with_communication,
    zb_h1,
    zbv,
    zero_bubble_idle,
)

SIZES = [(p, m) for p in (1, 2, 3, 4, 5) for m in range(1, 4 * p + 2)]


def test_zbv_is_torchs_schedule_zbv_zero_bubble_action_for_action():
    for p, m in SIZES:
        ours = zbv(p, m)
        theirs = torch_schedule("ZBVZeroBubble", p, m)
        assert ours.stage_ranks == theirs.stage_ranks, (p, m)
        assert ours.actions == theirs.actions, (p, m)


@pytest.mark.parametrize("v", [1, 2, 3])
def test_interleaved_zero_bubble_is_torchs_interleaved_zero_bubble(v):
    compared = 0
    for p, m in SIZES:
        try:
            ours = interleaved_zero_bubble(p, m, v)
        except ValueError:
            continue
        theirs = torch_schedule("InterleavedZeroBubble", p, m, n_virtual=v)
        assert ours.actions == theirs.actions, (p, m, v)
        compared += 1
    assert compared >= 30


def test_one_chunk_interleaved_zero_bubble_is_zb_h1():
    for p, m in [(2, 4), (3, 6), (4, 8), (4, 5)]:
        assert interleaved_zero_bubble(p, m, 1).actions == zb_h1(p, m).actions


def test_torchs_validator_and_ours_accept_both_and_refuse_a_w_before_its_i():
    for schedule in (zbv(3, 6), zbv(4, 3), interleaved_zero_bubble(3, 6, 2)):
        validate(schedule)
        validate(with_communication(schedule, Costs(p2p=0.1)))
        placement = torch_validate(schedule)
        if torch.__version__.startswith("2.13"):
            assert placement is not None  # torch 2.13 has the checker
        if placement is not None:
            assert placement == dict(enumerate(schedule.stage_ranks))
    good = zbv(2, 4)
    rank0 = list(good.actions[0])
    i0, w0 = rank0.index(good.actions[0][4]), rank0.index(good.actions[0][5])  # 3I0, 3W0
    rank0[i0], rank0[w0] = rank0[w0], rank0[i0]
    broken = Schedule(good.name, good.n_micro, good.stage_ranks, (tuple(rank0), good.actions[1]))
    with pytest.raises(Exception, match="before|without first running"):
        validate(broken)
    if torch_validate(good) is not None:
        with pytest.raises(AssertionError, match="Backward Weight"):
            torch_validate(broken)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_zbv_idles_half_of_zb_h1_with_equal_costs(p):
    m, t = 4 * p, 1.0
    whole = simulate(zb_h1(p, m), Costs(t, t, t))  # one stage per rank
    halves = simulate(zbv(p, m), Costs(t / 2, t / 2, t / 2))  # the same model, two chunks each
    for r in range(p):
        assert whole.idle(r) == pytest.approx(zero_bubble_idle(p, t, t, t))
        assert halves.idle(r) == pytest.approx(zero_bubble_idle(p, t / 2, t / 2, t / 2))
    assert halves.idle(0) == pytest.approx(whole.idle(0) / 2)
    # the least any schedule can take: rank p-1 waits p-1 chunk forwards, then has 6m chunk actions
    assert halves.makespan == pytest.approx((6 * m + p - 1) * t / 2)


@pytest.mark.parametrize("costs", [(1, 1, 1), (1, 1.5, 0.5), (1, 2, 1), (2, 2, 1), (1, 1, 0.8)])
@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (3, 6, 2), (3, 9, 3), (4, 16, 2)])
def test_interleaved_zero_bubble_idle_time_is_the_formula(costs, p, m, v):
    sim = simulate(interleaved_zero_bubble(p, m, v), Costs(*costs))
    for r in range(p):
        assert sim.idle(r) == pytest.approx(zero_bubble_idle(p, *costs))


def test_the_formula_refuses_a_weight_backward_longer_than_a_forward():
    with pytest.raises(ValueError, match="simulate the schedule"):
        zero_bubble_idle(4, 1.0, 1.0, 2.0)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_activations_in_flight_per_rank(p):
    """ZB-V and interleaved ZB hold ``2p`` half-stage chunks on every rank (``p`` stages'
    worth, 1F1B's first-stage peak); interleaved 1F1B holds more on rank 0; 1F1B ``p - r``."""
    m = 4 * p
    half = Costs(0.5, 0.5, 0.5)
    sims = {
        "1f1b": simulate(one_f_one_b(p, m)),
        "zbv": simulate(zbv(p, m), half),
        "izb": simulate(interleaved_zero_bubble(p, m, 2), half),
        "i1f1b": simulate(interleaved_1f1b(p, m, 2), half),
    }
    assert [sims["1f1b"].peak_rank_in_flight(r) for r in range(p)] == [p - r for r in range(p)]
    assert [sims["zbv"].peak_rank_in_flight(r) for r in range(p)] == [2 * p] * p
    assert [sims["izb"].peak_rank_in_flight(r) for r in range(p)] == [2 * p] * p
    assert sims["i1f1b"].peak_rank_in_flight(0) > 2 * p
    third = simulate(interleaved_zero_bubble(p, m, 3), Costs(1 / 3, 1 / 3, 1 / 3))
    assert [third.peak_rank_in_flight(r) for r in range(p)] == [3 * p] * p  # v·p chunks


def _run_on_rank(p: int, cases: list[tuple[str, int]]) -> list[dict]:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.parallel.pipeline import SCHEDULES, pipeline_gpt

    config = GPTConfig.tiny(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=2 * p)
    out = []
    for name, m in cases:
        pipe = pipeline_gpt(
            GPT(config, seed=0, dtype=torch.float64), Mesh(pp=p), SCHEDULES[name](p, m)
        )
        inputs, targets = SyntheticTokens(config, n_batches=1, batch_size=2 * m, seed=3)[0]
        loss = pipe.step(inputs, targets)
        grads = {n: q.grad.clone() for st in pipe.stages.values() for n, q in st.named_parameters()}
        out.append({"loss": None if loss is None else loss.item(), "grads": grads})
    return out


def test_both_schedules_give_the_single_process_gpts_loss_and_gradients(cluster2):
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn

    cases = [("zbv", 4), ("zbv", 3), ("interleaved_zb", 4)]
    per_rank = cluster2.run(_run_on_rank, 2, cases)
    config = GPTConfig.tiny(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=4)
    for i, (name, m) in enumerate(cases):
        model = GPT(config, seed=0, dtype=torch.float64)
        inputs, targets = SyntheticTokens(config, n_batches=1, batch_size=2 * m, seed=3)[0]
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        want = {n: q.grad for n, q in model.named_parameters()}
        want["lm_head.weight"] = model.lm_head.weight.grad  # tied: the same tensor
        (got_loss,) = [r[i]["loss"] for r in per_rank if r[i]["loss"] is not None]
        assert got_loss == pytest.approx(loss.item(), abs=1e-12), (name, m)
        seen = set()
        for r in per_rank:
            for n, grad in r[i]["grads"].items():
                torch.testing.assert_close(grad, want[n], atol=1e-12, rtol=0)
                seen.add(n)
        assert seen == set(want), (name, m)  # every parameter lives on some stage
