"""In-job recovery (replicas keep stepping while one replica's process is SIGKILLed — at the
start of a step or with its gradient all-reduce in flight — and a new process copies state from
a peer) and the silent-data-corruption check, on three real replicas."""

import dataclasses

import pytest
import torch

import dtlab
from dtlab.faults import ReplicaSpec, compare_replicas, flip_bit, train_replicas
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank

STEPS = 6
SPEC = ReplicaSpec(steps=STEPS, heartbeat_s=3.0)


def _replay(spec: ReplicaSpec, quorums: dict, n: int) -> GPT:
    """One process, the same training with the recorded quorums: each step's gradient is the
    mean over the members' rows (what the quorum's all-reduce computes)."""
    model = GPT(GPTConfig.tiny(), seed=spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    data = SyntheticTokens(model.config, spec.steps + 1, spec.batch_size, seed=spec.seed)
    for step in range(spec.steps):
        members = quorums[step]
        for r in members:
            x, y = shard_for_rank(data[step], r, n)
            (loss_fn(model(x), y) / len(members)).backward()
        opt.step()
        opt.zero_grad()
    return model


def _replay_distance(spec: ReplicaSpec, survivor: dict) -> float:
    """Largest weight difference between a survivor and the replay of its recorded quorums."""
    replay = _replay(spec, survivor["quorums"], 3)
    return max(
        float((survivor["params"][k] - v).abs().max()) for k, v in replay.state_dict().items()
    )


@pytest.fixture(scope="module")
def unfailed(cluster3):
    return cluster3.run(train_replicas, SPEC)


def test_in_job_recovery_loses_no_step_and_ends_near_the_unfailed_loss(cluster3, unfailed):
    crash = ReplicaSpec(steps=STEPS, heartbeat_s=3.0, crash=(2, 3))
    failed = cluster3.run(train_replicas, crash)
    survivors, replaced = failed[0], failed[2]
    # a real death: replica 2's process was SIGKILLed and a new process took its place
    assert [(d["signal"], d["phase"], d["step"]) for d in replaced["deaths"]] == [
        ("SIGKILL", "start", 3)
    ]
    assert survivors["deaths"] == [] and failed[1]["deaths"] == []
    assert survivors["aborted"] == []  # nobody was in a collective with it: nothing to redo
    assert len({o["pid"] for o in failed} | {o["pid"] for o in unfailed}) == 6
    assert sorted(survivors["losses"]) == list(range(STEPS))  # the survivors never stopped
    assert 2 not in survivors["quorums"][3]  # step 3 ran without the dead replica
    assert survivors["quorums"][STEPS - 1] == [0, 1, 2]  # ... which came back
    assert 3 not in replaced["losses"] and replaced["state_bytes_received_or_sent"] > 0
    for name, value in survivors["params"].items():  # the replacement holds the same weights
        assert torch.equal(value, replaced["params"][name]), name
    # The training the quorum history describes, replayed in one process: equal but for the
    # all-reduce's summation order, which AdamW's normalisation can amplify to ~1e-4 on a weight
    # whose gradient is near zero (a step with the wrong members moves weights by ~lr = 1e-2).
    replay = _replay(crash, survivors["quorums"], 3)
    for name, value in replay.state_dict().items():
        torch.testing.assert_close(survivors["params"][name], value, rtol=0, atol=1e-3)
    data = SyntheticTokens(replay.config, STEPS + 1, crash.batch_size, seed=crash.seed)
    with torch.no_grad():
        replayed_loss = float(loss_fn(replay(data[STEPS][0]), data[STEPS][1]))
    assert abs(replayed_loss - survivors["held_out_loss"]) < 1e-4 * replayed_loss
    # ... and, stated tolerance, within 10% of the unfailed run's held-out loss: the steps
    # without replica 2 averaged over 2/3 of their batch.
    final, reference = survivors["held_out_loss"], unfailed[0]["held_out_loss"]
    assert abs(final - reference) < 0.10 * reference, survivors["quorums"]
    # the killed process's steps reached the timeline, up to its death at the start of step 3
    killed = [s for s in failed.trace.spans if s.rank == 2 and s.name.endswith("(killed)")]
    assert [(s.name, s.labels["step"]) for s in killed] == [("start (killed)", 3)]
    early = {s.labels["step"] for s in failed.trace.spans if s.rank == 2 and s.name == "allreduce"}
    assert {0, 1, 2} <= early


ALLREDUCE_CRASH = ReplicaSpec(steps=STEPS, heartbeat_s=3.0, crash=(2, 3, "allreduce"))


def test_a_replica_killed_during_the_allreduce_aborts_the_step_which_is_redone(cluster3, unfailed):
    failed = cluster3.run(train_replicas, ALLREDUCE_CRASH)
    replaced = failed[2]
    assert [(d["signal"], d["phase"], d["step"]) for d in replaced["deaths"]] == [
        ("SIGKILL", "allreduce", 3)
    ]
    for survivor in failed[:2]:
        assert survivor["deaths"] == []
        # the broken collective raised and the attempt was discarded, not committed ...
        [broken] = survivor["aborted"]
        assert (broken["step"], broken["attempt"], broken["members"]) == (3, 0, [0, 1, 2])
        assert broken["error"]  # gloo's own error (connection closed or reset by peer)
        # ... step 3 was redone without replica 2, and every step committed exactly once
        assert survivor["committed"] == list(range(STEPS))
        assert survivor["quorums"][3] == [0, 1] and survivor["quorums"][STEPS - 1] == [0, 1, 2]
        # what was applied is what the committed quorums describe: nothing of the broken step
        assert _replay_distance(ALLREDUCE_CRASH, survivor) < 1e-3
    # the replacement rejoined after the redone step and holds the survivors' weights exactly
    assert 3 not in replaced["committed"] and replaced["state_bytes_received_or_sent"] > 0
    for name, value in failed[0]["params"].items():
        assert torch.equal(value, failed[1]["params"][name]), name
        assert torch.equal(value, replaced["params"][name]), name
    final, reference = failed[0]["held_out_loss"], unfailed[0]["held_out_loss"]
    assert abs(final - reference) < 0.10 * reference
    killed = [s for s in failed.trace.spans if s.rank == 2 and s.name.endswith("(killed)")]
    assert [(s.name, s.labels["step"]) for s in killed] == [("allreduce (killed)", 3)]


def test_a_survivor_that_applies_the_broken_allreduce_is_caught_by_the_replay(cluster3):
    """The negative check: skip the commit vote and apply what the failed all-reduce left in
    the buffer — the survivors then no longer match the training their quorums describe."""
    spec = dataclasses.replace(ALLREDUCE_CRASH, apply_broken_allreduce=True)
    failed = cluster3.run(train_replicas, spec)
    assert failed[0]["aborted"] == [] and failed[0]["quorums"][3] == [0, 1, 2]
    assert [d["phase"] for d in failed[2]["deaths"]] == ["allreduce"]
    assert min(_replay_distance(spec, survivor) for survivor in failed[:2]) > 1e-2


def _corrupt_and_check(bad_rank: int):
    model = GPT(GPTConfig.tiny(d_model=32), seed=0)  # identical on every replica
    clean = compare_replicas(model)
    if dtlab.rank() == bad_rank:
        flip_bit(model.blocks[1].mlp.fc_in.weight.data, index=5, bit=3)
    found = compare_replicas(model)
    return clean, [str(d) for d in found], [(d.parameter, d.suspects) for d in found]


def test_a_planted_bit_flip_is_caught_and_the_rank_named(cluster3):
    clean, messages, found = cluster3.run(_corrupt_and_check, 1)[0]
    assert clean == []
    assert found == [("blocks.1.mlp.fc_in.weight", [1])], messages
    assert "rank(s) [1] disagree with the majority" in messages[0]


def test_flip_bit_changes_exactly_one_bit():
    t = torch.zeros(4)
    flip_bit(t, 2, 31)
    assert str(t[2].item()) == "-0.0" and t.view(torch.int32).tolist() == [0, 0, -(2**31), 0]
    with pytest.raises(ValueError, match="outside"):
        flip_bit(t, 0, 40)
