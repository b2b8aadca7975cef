"""Communication a run leaves unfinished fails *that* run, naming the rank and the line, and never
leaks into the next run; correct asynchronous use (dtlab's own p2p layer included) passes."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import dtlab
from dtlab import Cluster
from dtlab.runtime import UnfinishedWork


def _leave_isend():
    if dtlab.rank() == 0:
        dist.isend(torch.ones(3), 1)  # never waited for, and rank 1 never receives


def _leave_irecv():
    if dtlab.rank() == 1:
        dist.irecv(torch.zeros(3), 0)  # rank 0 never sends


def _leave_batch():
    if dtlab.rank() == 0:
        dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(3), 1)])


def _send_seven_to_rank_1():
    if dtlab.rank() == 0:
        dist.send(torch.full((3,), 7.0), 1)
        return None
    received = torch.zeros(3)
    dist.recv(received, 0)
    return received


def _line_of(fn, text: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize(
    "leave, rank, call",
    [
        (_leave_isend, 0, "torch.distributed.isend to rank 1"),
        (_leave_irecv, 1, "torch.distributed.irecv from rank 0"),
        (_leave_batch, 0, "torch.distributed.batch_isend_irecv (send) to rank 1"),
    ],
)
def test_unfinished_p2p_fails_its_own_run_and_the_next_run_is_clean(leave, rank, call):
    with Cluster(2, device="cpu", timeout=60) as cluster:
        with pytest.raises(UnfinishedWork) as info:
            cluster.run(leave)
        assert set(info.value.unfinished) == {rank}
        message = str(info.value)
        assert call in message
        line = _line_of(leave, "dist.")
        assert f"{leave.__name__} ({__file__}:{line})" in message  # the user's own line
        # The leftover message is gone with the old ranks: the next exchange is not matched to it.
        out = cluster.run(_send_seven_to_rank_1)
        assert torch.equal(out[1], torch.full((3,), 7.0))


def test_unwaited_isend_the_peer_receives_later_completes_in_the_same_run():
    def receive_late():
        if dtlab.rank() == 0:
            dist.isend(torch.full((3,), 2.0), 1)  # not waited for: the worker finishes it
            return None
        time.sleep(0.5)  # rank 0 has long returned; its send is still matched by this recv
        received = torch.zeros(3)
        dist.recv(received, 0)
        return received

    with Cluster(2, device="cpu", timeout=60) as cluster:
        pids = cluster.pids
        assert torch.equal(cluster.run(receive_late)[1], torch.full((3,), 2.0))
        assert cluster.pids == pids and cluster.restarts == 0


def test_unwaited_async_all_reduce_is_finished_before_the_result_is_sent(cluster2):
    def reduce_without_waiting():
        t = torch.full((1 << 20,), float(dtlab.rank() + 1))
        dist.all_reduce(t, async_op=True)
        return t  # pickled only after the reduction has landed

    out = cluster2.run(reduce_without_waiting)
    assert all(torch.all(t == 3.0) for t in out)


def test_dtlab_collectives_over_p2p_leave_nothing_unfinished(cluster4):
    from dtlab import collectives as C

    def every_schedule():
        results = []
        for algorithm in C.ALL_REDUCES:
            x = torch.arange(10.0) * (dtlab.rank() + 1)
            C.all_reduce(x, algorithm=algorithm)
            results.append(x)
        root = torch.arange(5.0) if dtlab.rank() == 0 else torch.zeros(5)
        C.broadcast(root, root=0)
        return results, root

    pids = cluster4.pids
    for _ in range(2):
        for results, root in cluster4.run(every_schedule):
            assert all(torch.equal(x, torch.arange(10.0) * 10) for x in results)
            assert torch.equal(root, torch.arange(5.0))
    assert cluster4.pids == pids  # no run was failed and restarted


def test_correct_isend_irecv_and_batches_pass(cluster2):
    def ring_exchange():
        peer = 1 - dtlab.rank()
        box = torch.zeros(2)
        handles = [dist.isend(torch.full((2,), float(dtlab.rank())), peer), dist.irecv(box, peer)]
        for handle in handles:
            handle.wait()
        other = torch.zeros(2)
        ops = [dist.P2POp(dist.isend, box + 1, peer), dist.P2POp(dist.irecv, other, peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return box, other

    pids = cluster2.pids
    (box0, other0), (box1, other1) = cluster2.run(ring_exchange)
    assert box0.tolist() == [1.0, 1.0] and box1.tolist() == [0.0, 0.0]
    assert other0.tolist() == [1.0, 1.0] and other1.tolist() == [2.0, 2.0]
    assert cluster2.pids == pids
