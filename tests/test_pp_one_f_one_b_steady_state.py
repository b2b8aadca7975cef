"""1F1B's steady state is written where a reader looks for it — ``one_f_one_b(p, m,
messages=True)`` spells out every rank's three phases with the messages that join them — and
the written order is the one that runs: the validator's replay proves it cannot deadlock under
blocking send/recv, the executor runs it action for action, and on real ranks it trains exactly
like the order the executor derives by itself."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from dtlab.parallel.pipeline import (
    Action,
    PipelineExecutor,
    one_f_one_b,
    simulate,
    validate,
    with_communication,
)

SIZES = [(p, m) for p in range(1, 6) for m in range(1, 10)]


@pytest.mark.parametrize(("p", "m"), SIZES)
def test_the_written_1f1b_computes_in_the_order_of_the_compute_only_schedule(p, m):
    written = one_f_one_b(p, m, messages=True)
    assert written.compute_only().actions == one_f_one_b(p, m).actions


@pytest.mark.parametrize(("p", "m"), SIZES)
def test_the_replay_proves_the_written_1f1b_deadlock_free_with_the_same_bubble(p, m):
    written = validate(one_f_one_b(p, m, messages=True))  # raises on a cycle of waits
    derived = with_communication(one_f_one_b(p, m))
    assert written.has_communication == (p > 1)
    assert simulate(written).makespan == simulate(derived).makespan
    assert simulate(written).bubble_fraction_of_total == pytest.approx(
        simulate(one_f_one_b(p, m)).bubble_fraction_of_total
    )


def test_every_steady_forward_sends_its_activation_and_receives_the_gradient_w_older():
    p, m = 4, 8
    written = one_f_one_b(p, m, messages=True)
    for r in range(1, p - 1):  # a middle rank: neighbours on both sides
        warmup = p - 1 - r
        actions = [str(a) for a in written.actions[r]]
        for backward in range(m - warmup):
            forward = backward + warmup
            at = actions.index(f"{r}F{forward}")
            assert actions[at + 1 : at + 4] == [
                f"{r}SEND_F{forward}",
                f"{r}RECV_B{backward}",
                f"{r}B{backward}",
            ]
            following = [f"{r}RECV_F{forward + 1}"] if forward + 1 < m else []
            assert actions[at + 4 : at + 5 + len(following)] == [*following, f"{r}SEND_B{backward}"]


def test_the_two_ends_of_every_link_list_its_messages_in_the_same_order():
    p, m = 4, 6
    written = one_f_one_b(p, m, messages=True)
    for r in range(p - 1):
        up = [
            (a.kind[-1], a.micro_batch)
            for a in written.actions[r]
            if a.kind in ("SEND_F", "RECV_B")
        ]
        down = [
            (a.kind[-1], a.micro_batch)
            for a in written.actions[r + 1]
            if a.kind in ("RECV_F", "SEND_B")
        ]
        assert up == down


@pytest.mark.parametrize(("p", "m"), [(2, 3), (4, 6)])
def test_the_executor_runs_the_written_order_action_for_action(p, m):
    written = one_f_one_b(p, m, messages=True)
    for r in range(p):
        executor = PipelineExecutor(
            {r: nn.Identity()},
            written,
            SimpleNamespace(rank=r),
            hidden_size=4,
            loss_fn=lambda out, target: out.sum(),
        )
        assert executor.actions == written.actions[r]
        assert all(isinstance(a, Action) for a in executor.actions)


def _written_and_derived_on_rank(m: int) -> dict:
    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.parallel.pipeline import pipeline_gpt

    config = GPTConfig.tiny(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=4)
    batch = SyntheticTokens(config, n_batches=1, batch_size=2 * m, seed=3)[0]
    mesh, out = Mesh(pp=2), {}
    for label, messages in (("written", True), ("derived", False)):
        pipe = pipeline_gpt(
            GPT(config, seed=0, dtype=torch.float64), mesh, one_f_one_b(2, m, messages=messages)
        )
        loss = pipe.step(*batch)
        out[label] = {
            "loss": None if loss is None else loss.item(),
            "grads": {
                n: p.grad.clone() for s in pipe.stages.values() for n, p in s.named_parameters()
            },
            "ran": [str(a) for a in pipe.actions],
        }
    return out


def test_on_real_ranks_the_written_order_trains_exactly_like_the_derived_one(cluster2):
    m = 3
    for rank, out in enumerate(cluster2.run(_written_and_derived_on_rank, m)):
        written, derived = out["written"], out["derived"]
        assert written["ran"] == [str(a) for a in one_f_one_b(2, m, messages=True).actions[rank]]
        assert written["loss"] == derived["loss"]
        assert written["grads"].keys() == derived["grads"].keys()
        for name, grad in written["grads"].items():
            assert torch.equal(grad, derived["grads"][name]), name
