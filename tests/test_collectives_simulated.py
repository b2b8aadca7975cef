"""World sizes the CPU cannot afford as processes (5, 6, 7) run as threads: every algorithm's
schedule still delivers exactly the reduction, for odd lengths, every root and sum/avg/max."""

from __future__ import annotations

import pytest
import torch

from dtlab import collectives as C
from dtlab.collectives.simulated import rank_of_simulation, simulate


def _mismatches(n: int, length: int, op: str) -> list[str]:
    rank = rank_of_simulation()
    inputs = [((torch.arange(length) * 3 + r * 7) % 13).to(torch.bfloat16) for r in range(n)]
    stacked = torch.stack([t.double() for t in inputs])
    want = (stacked.max(0).values if op == "max" else stacked.sum(0)).to(torch.bfloat16)
    want = want.div_(n) if op == "avg" else want
    bounds = C.chunk_bounds(length, n)
    bad = []
    for name, fn in C.ALGORITHMS["all_reduce"].items():
        x = inputs[rank].clone()
        if not torch.equal(fn(x, op), want):
            bad.append(f"all_reduce {name}")
    for name, fn in C.ALGORITHMS["reduce_scatter"].items():
        if not torch.equal(fn(inputs[rank].clone(), op), want[slice(*bounds[rank])]):
            bad.append(f"reduce_scatter {name}")
    gathered = torch.cat([inputs[r][slice(*bounds[r])] for r in range(n)])
    for name, fn in C.ALGORITHMS["all_gather"].items():
        got = fn(inputs[rank][slice(*bounds[rank])].clone(), sizes=C.chunk_sizes(length, n))
        if not torch.equal(got, gathered):
            bad.append(f"all_gather {name}")
    for root in range(n):
        for name, fn in C.ALGORITHMS["broadcast"].items():
            if not torch.equal(fn(inputs[rank].clone(), root), inputs[root]):
                bad.append(f"broadcast {name} root {root}")
        for name, fn in C.ALGORITHMS["reduce"].items():
            got = fn(inputs[rank].clone(), root, op)
            if not torch.equal(got, want if rank == root else inputs[rank]):
                bad.append(f"reduce {name} root {root}")
    C.barrier()
    return bad


@pytest.mark.parametrize("n", [5, 6, 7])
def test_every_schedule_is_correct_at_world_sizes_beyond_the_cpu(n):
    for length, op in [(1, "sum"), (13, "avg"), (101, "max")]:
        assert simulate(n, _mismatches, n, length, op) == [[]] * n


def test_a_mismatched_schedule_is_reported_not_hung():
    def only_rank_zero_receives():
        if rank_of_simulation() == 0:
            C.peers_of().recv(1, torch.empty(1), name="lonely")

    with pytest.raises(RuntimeError, match="never came"):
        simulate(2, only_rank_zero_receives, timeout=0.2)


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "lockstep"])
def test_the_pipelined_ring_gives_the_same_average_the_same_bytes_and_k_messages_per_step(
    n, streaming
):
    """Tiny segments force many per chunk; the lock-step executor (NCCL's) must agree."""
    from dtlab.collectives import p2p
    from dtlab.collectives.ring_pipeline import pipelined_ring_all_reduce_

    def body(length: int, segment_bytes: int, window: int):
        p2p._thread.world.transport.streams = streaming
        rank = rank_of_simulation()
        x = ((torch.arange(length) * 3 + rank * 5) % 11).float()
        with C.counting() as moved:
            pipelined_ring_all_reduce_(
                x, "avg", C.peers_of(), segment_bytes=segment_bytes, window=window
            )
        return x, moved.bytes_sent, moved.messages_sent

    for length, segment_bytes, window in [(13, 4, 1), (40, 8, 3), (960, 16, 4), (7, 1 << 20, 2)]:
        inputs = torch.stack([((torch.arange(length) * 3 + r * 5) % 11).float() for r in range(n)])
        want = inputs.sum(0) / n
        for x, sent, messages in simulate(n, body, length, segment_bytes, window):
            assert torch.equal(x, want)
            if length == 960:  # chunks of 960/n elements in segments of 4: K = 240/n per step
                assert sent == 2 * (n - 1) * 960 * 4 // n
                assert messages == 2 * (n - 1) * (960 // n) // 4


def test_posted_receives_match_messages_in_posting_order_whatever_the_wait_order():
    """As in MPI and gloo: the first receive posted from a peer gets that peer's first message."""

    def body():
        peers = C.peers_of()
        if rank_of_simulation() == 0:
            for value in (1.0, 2.0, 3.0):
                peers.post_send(1, torch.full((2,), value)).wait()
            return None
        boxes = [torch.zeros(2) for _ in range(3)]
        handles = [peers.post_recv(0, box) for box in boxes]
        handles[2].wait()  # waiting on the last fills the earlier ones first
        return [box[0].item() for box in boxes]

    assert simulate(2, body)[1] == [1.0, 2.0, 3.0]
