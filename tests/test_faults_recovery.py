"""Kill, hang or break a rank mid-run; the supervisor restarts and the job resumes exactly."""

import dataclasses
import random

import pytest
import torch

import dtlab
from dtlab.checkpoint import complete_checkpoints
from dtlab.faults import Fault, JobSpec, run_with_recovery, train_with_checkpoints

SPEC = JobSpec(steps=4, save_every=2, d_model=32)


@pytest.fixture(scope="module")
def cluster():
    with dtlab.Cluster(2, device="cpu", timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def uninterrupted(cluster, tmp_path_factory):
    return cluster.run(train_with_checkpoints, str(tmp_path_factory.mktemp("ref")), SPEC)[0]


def _same(a: dict, b: dict) -> bool:
    return a["losses"] == b["losses"] and all(
        torch.equal(a["params"][k], b["params"][k]) for k in a["params"]
    )


def test_resume_after_kills_at_a_random_step_and_during_a_save_is_bit_for_bit(
    cluster, uninterrupted, tmp_path
):
    step = random.Random(19).randrange(1, SPEC.steps)
    faults = [
        Fault("kill", rank=1, step=step, attempt=0),  # SIGKILL at a random step
        Fault("kill", rank=0, step=4, phase="save", attempt=1),  # mid-save: step 4 never commits
    ]
    rec = run_with_recovery(cluster, train_with_checkpoints, tmp_path, SPEC, faults=faults)
    outcomes = [a.outcome for a in rec.attempts]
    assert outcomes == ["RankDied", "RankDied", "finished"], rec.describe()
    assert all(a.detection_s is not None for a in rec.attempts[:2])
    final = rec.result[0]
    assert final["resumed_from"] == 2  # the half-written step-4 checkpoint was skipped
    assert _same(final, uninterrupted)
    assert complete_checkpoints(tmp_path) == [2, 4]


def test_a_kill_in_the_middle_of_an_async_write_resumes_bit_for_bit(
    cluster, uninterrupted, tmp_path
):
    spec = dataclasses.replace(SPEC, async_save=True)  # same training, saves in the background
    fault = Fault("kill", rank=1, step=4, phase="save")  # in the writer thread, mid-write
    rec = run_with_recovery(cluster, train_with_checkpoints, tmp_path, spec, faults=[fault])
    assert [a.outcome for a in rec.attempts] == ["RankDied", "finished"], rec.describe()
    assert rec.result[0]["resumed_from"] == 2
    assert _same(rec.result[0], uninterrupted)


def test_a_raise_and_a_straggler_on_real_ranks_end_in_a_bit_for_bit_resume(
    cluster, uninterrupted, tmp_path
):
    faults = [
        Fault("slow", rank=0, step=1, seconds=0.2),  # a straggler: everyone waits, nothing fails
        Fault("raise", rank=1, step=3),  # a software bug: RankError, restart from step 2
    ]
    rec = run_with_recovery(cluster, train_with_checkpoints, tmp_path, SPEC, faults=faults)
    assert [a.outcome for a in rec.attempts] == ["RankError", "finished"], rec.describe()
    assert "injected failure on rank 1 at step 3" in rec.attempts[0].message
    assert rec.result[0]["resumed_from"] == 2
    assert _same(rec.result[0], uninterrupted)


def test_a_hung_rank_times_out_and_the_job_resumes_elastically_on_fewer_ranks(cluster, tmp_path):
    spec = JobSpec(steps=4, save_every=2, d_model=32, dropout=0.0)
    reference = cluster.run(train_with_checkpoints, str(tmp_path / "ref"), spec)[0]
    saved_timeout = cluster.timeout
    cluster.timeout = 4.0  # the hang is detected by the Cluster's timeout
    try:
        rec = run_with_recovery(
            cluster,
            train_with_checkpoints,
            tmp_path / "run",
            spec,
            faults=[Fault("hang", rank=1, step=3)],
            elastic_world_size=1,
        )
    finally:
        cluster.timeout = saved_timeout
    assert [(a.outcome, a.world_size) for a in rec.attempts] == [
        ("ClusterTimeout", 2),
        ("finished", 1),
    ]
    final = rec.result[0]
    assert final["resumed_from"] == 2 and final["saved_world_size"] == 2
    # One rank sums the same global batch in another order: equal to float32 rounding.
    assert final["losses"][:2] == reference["losses"][:2]
    for k, v in reference["params"].items():
        torch.testing.assert_close(final["params"][k], v, rtol=1e-4, atol=1e-5)


def test_fault_specs_are_validated():
    with pytest.raises(ValueError, match="not one of"):
        Fault("explode", 0, 1)
    with pytest.raises(ValueError, match="phase"):
        Fault("kill", 0, 1, phase="backward")


def test_a_raise_fault_raises_only_on_its_rank_step_and_attempt(tmp_path):
    from dtlab.faults import InjectedFault, fired_faults, maybe_fail

    faults = [Fault("raise", rank=1, step=3, attempt=0), Fault("slow", 0, 2, seconds=0.0)]
    maybe_fail(faults, rank=1, step=3, attempt=1, log_path=tmp_path / "log")  # a later attempt
    maybe_fail(faults, rank=0, step=3, attempt=0, log_path=tmp_path / "log")  # another rank
    with pytest.raises(InjectedFault, match="rank 1 at step 3"):
        maybe_fail(faults, rank=1, step=3, attempt=0, log_path=tmp_path / "log")
    assert [f["kind"] for f in fired_faults(tmp_path / "log")] == ["raise"]
