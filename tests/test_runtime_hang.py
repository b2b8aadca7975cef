"""A rank is called stuck only when it waits for what can never come; the report names the call,
its process group, the dtlab API in flight and the user's own line — never a library frame."""

from __future__ import annotations

import inspect
import time

import pytest
import torch
import torch.distributed as dist

import dtlab
from dtlab import Cluster, ClusterTimeout, RankError
from dtlab.runtime.hang import describe_blocking_call, dump_is_complete
from dtlab.runtime.matching import never_joined


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_a_rank_still_computing_after_another_raises_is_not_called_stuck():
    def one_raises_one_computes():
        if dtlab.rank() == 0:
            raise ValueError("bad shard")
        time.sleep(3.0)  # longer than any fixed grace: still working, not waiting on rank 0
        return "done"

    with Cluster(2, device="cpu", timeout=60) as cluster:
        pids = cluster.pids
        with pytest.raises(RankError) as info:
            cluster.run(one_raises_one_computes)
        assert info.value.rank == 0 and "bad shard" in str(info.value)
        assert "unfinished" not in info.value.note
        assert cluster.pids == pids and cluster.restarts == 0  # nobody was stuck: pool kept


def test_a_rank_blocked_on_one_that_raised_is_named_with_its_group():
    def one_raises_one_reduces():
        if dtlab.rank() == 0:
            raise RuntimeError("rank 0 gave up")
        dist.all_reduce(torch.ones(1))

    with Cluster(2, device="cpu", timeout=60) as cluster:
        with pytest.raises(RankError) as info:
            cluster.run(one_raises_one_reduces)
        line = _line_of(one_raises_one_reduces, "dist.all_reduce")
        assert (
            "rank 1: blocked in torch.distributed.all_reduce over ranks [0, 1]" in info.value.note
        )
        assert f"({__file__}:{line})" in info.value.note
        assert cluster.run(lambda: dtlab.rank()) == [0, 1]


def test_a_rank_waiting_where_no_call_is_tracked_is_judged_by_its_progress():
    from torch.nn.parallel import DistributedDataParallel

    def one_raises_one_steps_torch_ddp():
        model = DistributedDataParallel(torch.nn.Linear(4, 1))
        if dtlab.rank() == 0:
            raise ValueError("rank 0 gave up")
        model(torch.ones(2, 4)).sum().backward()  # the C++ reducer waits for rank 0's gradients

    with Cluster(2, device="cpu", timeout=120) as cluster:
        with pytest.raises(RankError) as info:
            cluster.run(one_raises_one_steps_torch_ddp)
        line = _line_of(one_raises_one_steps_torch_ddp, ".backward()")
        assert f"({__file__}:{line}); no progress for" in info.value.note
        assert "after rank 0 raised" in info.value.note
        assert cluster.run(lambda: dtlab.rank()) == [0, 1]


def test_hang_inside_a_dtlab_collective_names_the_api_and_the_user_line():
    from dtlab import collectives as C

    def only_rank_0_reduces():
        if dtlab.rank() == 0:
            C.all_reduce(torch.ones(4))

    with Cluster(2, device="cpu", timeout=60) as cluster, pytest.raises(ClusterTimeout) as info:
        cluster.run(only_rank_0_reduces)
    text = info.value.pending[0]
    assert "inside dtlab.collectives.all_reduce" in text
    assert "over ranks [0, 1]" in text and "rank 1 returned" in text
    line = _line_of(only_rank_0_reduces, "C.all_reduce")
    assert text.endswith(f"called from only_rank_0_reduces ({__file__}:{line})")


def test_hang_inside_dtlab_ddp_backward_names_the_user_line_not_the_library():
    from dtlab.parallel import NaiveDDP

    def only_rank_0_steps():
        model = NaiveDDP(torch.nn.Linear(4, 1))
        if dtlab.rank() == 0:
            model(torch.ones(2, 4)).sum().backward()

    with Cluster(2, device="cpu", timeout=60) as cluster, pytest.raises(ClusterTimeout) as info:
        cluster.run(only_rank_0_steps)
    text = info.value.pending[0]
    assert "blocked in torch.distributed.all_reduce over ranks [0, 1]" in text
    assert "inside dtlab.parallel." in text and "parallel/data/" not in text
    line = _line_of(only_rank_0_steps, ".backward()")
    assert text.endswith(f"called from only_rank_0_steps ({__file__}:{line})")


@pytest.mark.parametrize("wrapper", ["BucketedDDP", "OverlappedDDP"])
def test_hang_in_an_overlapping_ddp_backward_names_the_learners_backward_line(wrapper):
    from dtlab import parallel

    def only_rank_0_steps(name):
        model = getattr(parallel, name)(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
        if dtlab.rank() == 0:
            model(torch.ones(2, 4)).sum().backward()

    with Cluster(2, device="cpu", timeout=60) as cluster, pytest.raises(ClusterTimeout) as info:
        cluster.run(only_rank_0_steps, wrapper)
    text = info.value.pending[0]
    assert "inside dtlab.parallel." in text
    line = _line_of(only_rank_0_steps, ".backward()")
    assert text.endswith(f"called from only_rank_0_steps ({__file__}:{line})")


def test_hang_in_an_fsdp_forward_names_the_learners_model_call():
    from dtlab.parallel import FullyShardedDataParallel

    def only_rank_0_runs_forward():
        model = FullyShardedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 4)))
        if dtlab.rank() == 0:
            model(torch.ones(2, 4))

    with Cluster(2, device="cpu", timeout=60) as cluster, pytest.raises(ClusterTimeout) as info:
        cluster.run(only_rank_0_runs_forward)
    text = info.value.pending[0]
    assert "inside dtlab.parallel.FullyShardedDataParallel" in text
    line = _line_of(only_rank_0_runs_forward, "model(torch.ones")
    assert text.endswith(f"called from only_rank_0_runs_forward ({__file__}:{line})")


def test_a_rank_stuck_past_the_timeout_inside_fsdp_is_reported_at_the_learners_line():
    """The timeout path (a stack dump, no tracked call): what a rank stuck in native code or in
    an untracked wait shows, as on a GPU where collectives return before they finish."""
    import threading

    from dtlab.parallel import FullyShardedDataParallel

    def forward_that_never_returns():
        waits = torch.nn.Identity()
        waits.forward = threading.Event().wait  # standard library only: no frame of the learner's
        model = FullyShardedDataParallel(torch.nn.Sequential(waits, torch.nn.Embedding(4000, 1)))
        model(torch.tensor([3600]))  # the wait's timeout, in seconds

    with Cluster(1, device="cpu", timeout=4) as cluster, pytest.raises(ClusterTimeout) as info:
        cluster.run(forward_that_never_returns)
    text = info.value.pending[0]
    line = _line_of(forward_that_never_returns, "model(torch.tensor")
    assert "inside dtlab.parallel.FullyShardedDataParallel.forward" in text
    assert f"forward_that_never_returns ({__file__}:{line})" in text, text


DDP_DUMP = """Current thread 0x00007f0000000002 (most recent call first):
  File "/venv/site-packages/torch/distributed/distributed_c10d.py", line 2950 in all_reduce
  File "/venv/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/x/dtlab/parallel/dp_comm.py", line 88 in all_reduce
  File "/x/dtlab/parallel/data/base.py", line 142 in finish_gradient_synchronization
  File "/venv/site-packages/torch/autograd/graph.py", line 829 in _engine_run_backward
  File "/venv/site-packages/torch/_tensor.py", line 625 in backward
  File "/tmp/ipykernel_1/7.py", line 9 in train_step
  File "/x/dtlab/runtime/worker.py", line 70 in _call_user_function
  File "/x/dtlab/runtime/worker.py", line 96 in _run_one
"""


def test_stack_dump_treats_every_dtlab_frame_as_library():
    assert describe_blocking_call(DDP_DUMP) == (
        "blocked in torch.distributed.all_reduce inside "
        "dtlab.parallel.data.base.finish_gradient_synchronization, "
        "called from train_step (/tmp/ipykernel_1/7.py:9)"
    )


def test_stack_dump_is_complete_only_once_the_main_thread_reaches_its_bottom():
    main = (
        "Current thread 0x1 (most recent call first):\n"
        '  File "/x/dtlab/runtime/worker.py", line 180 in worker_main\n'
        '  File "/usr/lib/python3.11/multiprocessing/process.py", line 108 in run\n'
    )
    assert not dump_is_complete(main)
    assert not dump_is_complete(main + '  File "<string>", line 1 in <m')
    assert dump_is_complete(main + '  File "<string>", line 1 in <module>\n')
    assert dump_is_complete(main + "  ...\n")  # faulthandler cut a deep stack short


def test_live_stack_dumps_arrive_complete(cluster2):
    dumps = cluster2._pool.dump_stacks([0, 1])
    assert sorted(dumps) == [0, 1] and all(dump_is_complete(d) for d in dumps.values())


def _op(kind, index, peer=None, members=(0, 1)):
    return {"kind": kind, "group": "0", "tag": 0, "index": index, "peer": peer, "members": members}


def test_a_wait_is_hopeless_only_when_a_returned_peer_posted_fewer():
    collective = ("collective", "0")
    assert never_joined(_op("collective", 2), 1, {0: {collective: 1}}) == 0
    assert never_joined(_op("collective", 2), 1, {0: {collective: 2}}) is None
    assert never_joined(_op("collective", 2), 1, {}) is None  # rank 0 may still call it
    assert never_joined(_op("recv", 1, peer=0), 1, {0: {("send", "0", 1, 0): 1}}) is None
    assert never_joined(_op("recv", 2, peer=0), 1, {0: {("send", "0", 1, 0): 1}}) == 0
    assert never_joined(_op("send", 1, peer=1), 0, {1: {("recv", "0", None, 0): 1}}) is None
    assert never_joined(_op("recv", 1), 1, {0: {}}) == 0  # from any rank: none sent to us
