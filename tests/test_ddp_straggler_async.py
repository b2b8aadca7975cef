"""One slow rank stalls synchronous DDP; async SGD never waits but applies stale gradients."""

from __future__ import annotations

import time

import torch

import dtlab
from dtlab.parallel import NaiveDDP
from dtlab.parallel.data.async_sgd import run_async_sgd
from dtlab.parallel.data.equivalence import TiedToyModel, lm_loss, rank_slice, toy_batches
from dtlab.parallel.data.straggler import Straggler, straggle

DELAY = 0.2


def _straggling_step() -> float:
    rank, world = dtlab.rank(), dtlab.world_size()
    model = TiedToyModel(seed=0)
    ddp = NaiveDDP(model)
    ((tokens, targets),) = toy_batches(1)
    dtlab.barrier()
    start = time.perf_counter()
    straggle(Straggler(slow_rank=1, delay_s=DELAY))
    lm_loss(ddp(rank_slice(tokens, rank, world)), rank_slice(targets, rank, world)).backward()
    return time.perf_counter() - start


def test_every_rank_waits_for_the_straggler(cluster2):
    # A lower bound, not a timing: the all-reduce cannot complete before the slow rank joins it.
    step_times = cluster2.run(_straggling_step)
    assert min(step_times) >= DELAY


def _async_sgd(steps: int):
    batches = toy_batches(steps * dtlab.world_size(), global_batch=2)

    def loss_on_batch(model, step):
        tokens, targets = batches[step * dtlab.world_size() + dtlab.rank()]
        return lm_loss(model(tokens), targets)

    model = TiedToyModel(seed=0)
    result = run_async_sgd(model, loss_on_batch, steps_per_worker=steps, lr=0.1)
    return result, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_async_sgd_with_one_worker_is_sequential_sgd(cluster2):
    (result, params), _ = cluster2.run(_async_sgd, 3)
    assert result.staleness == [0, 0, 0] and result.senders == [1, 1, 1]
    reference = TiedToyModel(seed=0)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    batches = toy_batches(6, global_batch=2)
    for step in range(3):
        tokens, targets = batches[step * 2 + 1]  # worker rank 1's batches
        opt.zero_grad()
        lm_loss(reference(tokens), targets).backward()
        opt.step()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(params[name], p.detach(), rtol=0, atol=1e-6)


def test_async_sgd_applies_every_push_and_reports_staleness(cluster4):
    run = cluster4.run(_async_sgd, 4)
    (result, _), *_ = run
    assert sorted(result.senders) == sorted([1, 2, 3] * 4)
    assert all(s >= 0 for s in result.staleness)
    # A worker's first gradient was computed at version 0, so its staleness is exactly the number
    # of updates the server applied before it arrived (its position in the arrival order).
    for worker in (1, 2, 3):
        first = result.senders.index(worker)
        assert result.staleness[first] == first
    assert result.mean_staleness > 0  # with 3 workers someone is always behind
    # Every message went through the communication layer: its spans carry the group and bytes.
    comm = [s for s in run.trace.spans if s.kind == "comm"]
    pushes = [s for s in comm if s.name == "push_gradient"]
    assert len(pushes) == 3 * 4 and all(s.labels["group"] == "ps" for s in comm)
    assert len([s for s in comm if s.name == "recv_gradient" and s.rank == 0]) == 3 * 4
    assert len({s.nbytes for s in pushes}) == 1 and pushes[0].nbytes > 0
