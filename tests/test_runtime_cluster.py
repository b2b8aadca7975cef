"""The Cluster runs notebook-style functions on real ranks and fails loudly, never silently."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

import dtlab
from dtlab import Cluster, ClusterTimeout, RankDied, RankError
from dtlab.runtime.errors import ResultNotPicklable
from dtlab.runtime.pool import pid_alive


def test_run_returns_results_in_rank_order(cluster4):
    assert cluster4.run(lambda: (dtlab.rank(), dtlab.world_size())) == [(r, 4) for r in range(4)]


def test_closures_and_arguments_travel_to_every_rank(cluster2):
    offset = 10

    def add_rank(x, *, scale):
        return (x + dtlab.rank() + offset) * scale

    assert cluster2.run(add_rank, 1, scale=2) == [22, 24]


def test_process_group_stays_warm_across_runs(cluster2):
    cluster2.run(lambda: setattr(torch, "_dtlab_marker", dtlab.rank()))
    pids = cluster2.pids
    assert cluster2.run(lambda: getattr(torch, "_dtlab_marker", None)) == [0, 1]
    assert cluster2.pids == pids


def test_all_reduce_sums_ranks_and_tensors_come_back(cluster4):
    def allreduce_rank():
        t = torch.tensor([float(dtlab.rank())])
        dist.all_reduce(t)
        return t

    out = cluster4.run(allreduce_rank)
    assert all(torch.equal(t, torch.tensor([6.0])) for t in out)


def test_context_helpers_inside_ranks(cluster4):
    def who():
        group, blocks = dtlab.split_into_groups(2)
        t = torch.ones(1)
        dist.all_reduce(t, group=group)
        return dtlab.device().type, dtlab.local_rank(), blocks, t.item()

    out = cluster4.run(who)
    assert [o[0] for o in out] == ["cpu"] * 4
    assert [o[1] for o in out] == [0, 1, 2, 3]
    assert out[0][2] == [[0, 1], [2, 3]]
    assert [o[3] for o in out] == [2.0] * 4


def test_bad_group_size_names_the_valid_choices(cluster4):
    with pytest.raises(RankError, match=r"choose one of \[1, 2, 4\]"):
        cluster4.run(lambda: dtlab.split_into_groups(3))
    assert cluster4.run(lambda: 1) == [1] * 4  # all ranks raised: the pool stays warm


def test_exception_on_one_rank_names_it_with_its_traceback(cluster4):
    def fail_on_two():
        if dtlab.rank() == 2:
            raise ValueError("bad shard")
        return dtlab.rank()

    with pytest.raises(RankError) as info:
        cluster4.run(fail_on_two)
    assert info.value.rank == 2
    assert "bad shard" in str(info.value)
    assert "fail_on_two" in info.value.remote_traceback
    assert cluster4.run(lambda: dtlab.rank()) == [0, 1, 2, 3]


def test_rank_that_raises_while_others_wait_in_a_collective_restarts_the_pool():
    def one_rank_skips_the_allreduce():
        if dtlab.rank() == 0:
            raise RuntimeError("rank 0 gave up")
        dist.all_reduce(torch.ones(1))

    with Cluster(2, device="cpu", timeout=20) as cluster:
        with pytest.raises(RankError) as info:
            cluster.run(one_rank_skips_the_allreduce)
        assert info.value.rank == 0
        assert "all_reduce" in str(info.value)  # says what rank 1 was stuck in
        assert cluster.run(lambda: dtlab.rank()) == [0, 1]


def test_mismatched_collective_times_out_naming_rank_and_collective():
    def mismatched():
        if dtlab.rank() == 1:
            dist.broadcast(torch.ones(1), src=0)  # rank 0 never joins this broadcast

    with Cluster(2, device="cpu", timeout=3) as cluster:
        started = time.monotonic()
        with pytest.raises(ClusterTimeout) as info:
            cluster.run(mismatched)
        assert time.monotonic() - started < 30
        assert set(info.value.pending) == {1}
        assert "broadcast" in info.value.pending[1]
        assert "mismatched" in info.value.pending[1]
        assert cluster.run(lambda: dtlab.rank()) == [0, 1]


def test_rank_killed_by_sigkill_is_named_and_pool_restarts():
    with Cluster(2, device="cpu", timeout=20) as cluster:
        with pytest.raises(RankDied, match="rank 1 .*SIGKILL") as info:
            cluster.run(
                lambda: (
                    os.kill(os.getpid(), signal.SIGKILL) if dtlab.rank() == 1 else time.sleep(30)
                )
            )
        assert info.value.rank == 1
        assert cluster.run(lambda: dtlab.rank()) == [0, 1]
        assert cluster.restarts == 1


def test_close_leaves_no_rank_processes():
    cluster = Cluster(3, device="cpu")
    pids = cluster.pids
    assert len(pids) == 3 and all(pid_alive(p) for p in pids)
    workdir = cluster._workdir
    assert oct(os.stat(workdir).st_mode & 0o777) == "0o700"
    cluster.close()
    assert not any(pid_alive(p) for p in pids)
    assert not os.path.exists(workdir)
    cluster.close()  # idempotent


def test_garbage_collection_leaves_no_rank_processes():
    import gc

    cluster = Cluster(2, device="cpu")
    pids = cluster.pids
    del cluster
    gc.collect()
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in pids)


def test_interrupt_during_run_kills_ranks_and_next_run_works():
    import threading

    with Cluster(2, device="cpu", timeout=60) as cluster:
        pids = cluster.pids
        # Deliver SIGINT to ourselves while run() waits, as Jupyter's interrupt button does.
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            cluster.run(time.sleep, 30)
        assert not any(pid_alive(p) for p in pids)
        assert cluster.run(lambda: dtlab.rank()) == [0, 1]


def test_two_clusters_side_by_side(cluster2):
    with Cluster(2, device="cpu") as other:
        assert other.run(lambda: dtlab.world_size()) == [2, 2]
        assert cluster2.run(lambda: dtlab.world_size()) == [2, 2]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4"])
def test_bad_world_size_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        Cluster(bad)


def test_cuda_without_gpus_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    with pytest.raises(ValueError, match="needs one GPU per rank.*device='cpu'"):
        Cluster(2, device="cuda")


def test_unpicklable_result_and_argument_are_clear_errors(cluster2):
    import threading

    with pytest.raises(ResultNotPicklable, match="could not be sent back"):
        cluster2.run(lambda: threading.Lock())
    with pytest.raises(TypeError, match="could not send"):
        cluster2.run(lambda lock: None, threading.Lock())
    assert cluster2.run(lambda: 7) == [7, 7]


def test_non_callable_is_a_clear_error(cluster2):
    with pytest.raises(TypeError, match="needs a function"):
        cluster2.run(42)


def test_run_returns_trace_of_spans(cluster2):
    def traced():
        with dtlab.trace.span("work", kind="compute"):
            time.sleep(0.01)
        with dtlab.trace.span("allreduce", kind="comm", nbytes=16):
            dist.all_reduce(torch.ones(4))

    out = cluster2.run(traced)
    assert sorted({s.rank for s in out.trace.spans}) == [0, 1]
    assert sorted(s.name for s in out.trace.spans) == ["allreduce", "allreduce", "work", "work"]
    assert cluster2.last_trace is out.trace


def test_a_closed_cluster_reopens_for_a_graded_exercise():
    """Issue 21: after "Run All" the lab's last cell has closed the cluster; re-running an
    exercise cell must still grade on live ranks, and close() must stop them again."""
    from dtlab.quiz import check_exercise

    def rank_sum():
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t)
        return t

    cluster = Cluster(2)
    old_pids = cluster.pids
    cluster.close()
    assert cluster.closed
    result = check_exercise("setup.rank_sum", rank_sum, cluster, record=False)
    assert result.passed, result.message
    assert not cluster.closed and cluster.pids and cluster.pids != old_pids
    new_pids = cluster.pids
    cluster.close()
    deadline = time.time() + 10
    while any(pid_alive(p) for p in new_pids) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in new_pids)
    cluster.reopen()
    try:
        assert cluster.run(lambda: dtlab.rank()) == [0, 1]
    finally:
        cluster.close()
