"""The ring all-reduce through shared memory (``transport="shm"``) is the socket ring, moved
differently: same result (exact for integers, bitwise the socket ring's for floats), same counted
bytes and messages, same agreement check first; its channels are made once and reused, leave
no name in ``/dev/shm``, and a neighbour that fails or dies makes the others fail, not hang.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from dtlab import Cluster
from dtlab import collectives as C
from dtlab.collectives import shm_transport
from dtlab.collectives.shm_ring import shm_ring_all_reduce_
from dtlab.runtime.errors import ClusterTimeout, RankDied

DTYPES = (torch.int64, torch.int32, torch.float32, torch.float64, torch.bfloat16)
LENGTHS = (1, 7, 1001, (5 << 20) // 4 + 3)  # none divisible by 2, 3 or 4; the last: 2 segments


def _input(length: int, dtype: torch.dtype) -> torch.Tensor:
    """Different on every rank, and not all small integers for the float types."""
    g = torch.Generator().manual_seed(dist.get_rank() * 1000 + length)
    if dtype.is_floating_point:
        return torch.randn(length, generator=g).to(dtype)
    return torch.randint(-1000, 1000, (length,), generator=g).to(dtype)


def _shm_matches_torch_and_socket_ring() -> list[str]:
    wrong = []
    for dtype in DTYPES:
        for length in LENGTHS:
            x = _input(length, dtype)
            expected = x.clone()
            dist.all_reduce(expected)
            socket_ring = C.all_reduce(x.clone())
            shm = C.all_reduce(x.clone(), transport="shm")
            # gloo adds in another order; bf16 sums near 8 are 1/16 apart, so a few ulps of slack
            atol = 0.25 if dtype == torch.bfloat16 else 1e-4
            close = torch.allclose(shm.double(), expected.double(), rtol=1e-5, atol=atol)
            exact = torch.equal(shm, expected) or dtype.is_floating_point
            if not (close and exact and torch.equal(shm, socket_ring)):
                wrong.append(f"{dtype} x {length}")
    return wrong


@pytest.mark.parametrize("world", [2, 3, 4])
def test_shm_ring_all_reduce_equals_dist_all_reduce_for_odd_lengths_and_dtypes(world, request):
    cluster = request.getfixturevalue(f"cluster{world}")
    assert cluster.run(_shm_matches_torch_and_socket_ring) == [[]] * world


def _other_ops_and_many_segments() -> list[str]:
    from dtlab.collectives.p2p import peers_of

    wrong = []
    x = _input(1001, torch.float32)
    for op in ("max", "min", "avg"):
        expected = C.all_reduce(x.clone(), op)
        if not torch.equal(C.all_reduce(x.clone(), op, transport="shm"), expected):
            wrong.append(op)
    # 64-byte segments: dozens of segments per chunk, slots reused within and across calls
    for _ in range(3):
        y = x.clone()
        shm_ring_all_reduce_(y, "sum", peers_of(None), segment_bytes=64)
        if not torch.equal(y, C.all_reduce(x.clone())):
            wrong.append("64-byte segments")
    shm_transport.close_channels(peers_of(None))
    return wrong


def test_shm_ring_matches_for_max_min_avg_and_tiny_segments(cluster3):
    assert cluster3.run(_other_ops_and_many_segments) == [[]] * 3


def _channels_across_calls() -> tuple[bool, bool, bool]:
    from dtlab.collectives.p2p import peers_of

    shm_transport.close_channels(peers_of(None))  # an earlier test's channels may be bigger
    x = torch.ones(1000)
    C.all_reduce(x.clone(), transport="shm")
    first = shm_transport.open_rings()
    for _ in range(3):
        C.all_reduce(x.clone(), transport="shm")
        C.all_reduce(torch.ones(10, dtype=torch.int64), transport="shm")  # fits: same slots
    after = shm_transport.open_rings()
    same = len(after) == 1 and list(after.values())[0] is list(first.values())[0]
    C.all_reduce(torch.ones(1 << 20), transport="shm")  # bigger than the slots: grown once
    grown = shm_transport.open_rings()
    regrown = len(grown) == 1 and list(grown.values())[0] is not list(first.values())[0]
    shm_transport.close_channels(peers_of(None))
    return same, regrown, shm_transport.open_rings() == {}


def test_repeated_calls_reuse_the_channels_and_grow_them_only_when_too_small(cluster2):
    assert cluster2.run(_channels_across_calls) == [(True, True, True)] * 2


def _counted(length: int) -> tuple[int, int, int, int]:
    x = torch.ones(length)
    with C.counting() as socket_ring:
        C.all_reduce(x.clone())
    with C.counting() as shm:
        C.all_reduce(x.clone(), transport="shm")
    return shm.bytes_sent, shm.messages_sent, socket_ring.bytes_sent, socket_ring.messages_sent


@pytest.mark.parametrize("world", [3, 4])
def test_counted_bytes_equal_the_ring_formula(world, request):
    cluster = request.getfixturevalue(f"cluster{world}")
    for length in (960, 1001):
        per_rank = cluster.run(_counted, length)
        bounds = C.chunk_bounds(length, world)
        for r, (sent, messages, socket_sent, socket_messages) in enumerate(per_rank):
            mine = bounds[r][1] - bounds[r][0]
            right = bounds[(r + 1) % world][1] - bounds[(r + 1) % world][0]
            assert sent == 4 * (2 * length - mine - right), (r, length)
            assert messages == 2 * (world - 1)
            assert (sent, messages) == (socket_sent, socket_messages)
        if length == 960:
            assert per_rank[0][0] == 2 * (world - 1) * 4 * length // world


def _mismatch(kind: str) -> str:
    rank = dist.get_rank()
    try:
        if kind == "transport":
            C.all_reduce(torch.ones(8), transport="shm" if rank == 1 else "torch")
        else:
            C.all_reduce(torch.ones(11 if rank == 1 else 10), transport="shm")
    except C.CollectiveMismatch as error:
        return str(error)
    return "no error"


def test_a_mismatched_shm_call_raises_on_every_rank_naming_each_value(cluster3):
    for message in cluster3.run(_mismatch, "transport"):
        assert "ranks [0, 2]: ring" in message and "rank 1: ring_shm" in message
    for message in cluster3.run(_mismatch, "length"):
        assert "ranks [0, 2]: 10" in message and "rank 1: 11" in message


def _names_while_open() -> tuple[str, bool, bool]:
    from dtlab.collectives.p2p import peers_of

    C.all_reduce(torch.ones(4096), transport="shm")
    ring = list(shm_transport.open_rings().values())[0]
    name = ring.inbox.segment.name.lstrip("/")
    listed_while_open = os.path.exists(f"/dev/shm/{name}")
    shm_transport.close_channels(peers_of(None))
    return name, listed_while_open, os.path.exists(f"/dev/shm/{name}")


def test_no_segment_is_left_in_dev_shm_during_or_after_use(tmp_path):
    with Cluster(2, device="cpu", timeout=60.0) as cluster:
        names = cluster.run(_names_while_open)
        cluster.run(lambda: C.all_reduce(torch.ones(4096), transport="shm").sum().item())
    assert [(listed, after) for _, listed, after in names] == [(False, False)] * 2
    assert all(name.startswith("dtlab_") for name, _, _ in names)
    left = [n for n in os.listdir("/dev/shm") if n in {name for name, _, _ in names}]
    assert left == []


def _fail_mid_call(how: str) -> str:
    """Rank 1 fails at its first received segment: it raises, or its process dies."""
    original = shm_transport.Channel.take

    def take(self, numel, dtype):
        if how == "die":
            os._exit(3)
        raise RuntimeError("injected failure on rank 1")

    if dist.get_rank() == 1:
        shm_transport.Channel.take = take
    try:
        C.all_reduce(torch.ones(1 << 16), transport="shm")
    except Exception as error:  # noqa: BLE001 - the test reports which error each rank saw
        return f"{type(error).__name__}: {error}"
    finally:
        shm_transport.Channel.take = original
    return "finished"


def test_a_rank_that_fails_or_dies_mid_call_makes_the_others_fail_not_hang():
    with Cluster(3, device="cpu", timeout=60.0) as cluster:
        cluster.run(lambda: C.all_reduce(torch.ones(1 << 16), transport="shm").sum().item())
        seen = cluster.run(_fail_mid_call, "raise")
        assert [message.split(":")[0] for message in seen] == [
            "ShmPeerGone",
            "RuntimeError",
            "ShmPeerGone",
        ]
        assert "rank 1 closed its end" in seen[2]  # rank 2 names its left neighbour
        with pytest.raises((RankDied, ClusterTimeout)) as caught:
            cluster.run(_fail_mid_call, "die")
        assert isinstance(caught.value, RankDied) and caught.value.rank == 1
        after = cluster.run(lambda: C.all_reduce(torch.ones(5), transport="shm").tolist())
    assert after == [[3.0] * 5] * 3


def _pretend_rank_1_is_elsewhere() -> str:
    from dtlab.collectives.p2p import peers_of

    shm_transport.close_channels(peers_of(None))  # so this call has to set channels up
    real = shm_transport.socket.gethostname
    if dist.get_rank() == 1:
        shm_transport.socket.gethostname = lambda: "another-host"
    try:
        C.all_reduce(torch.ones(64), transport="shm")
    except ValueError as error:
        return str(error)
    finally:
        shm_transport.socket.gethostname = real
    return "no error"


def test_ranks_on_different_hosts_are_refused_on_every_rank(cluster2):
    for message in cluster2.run(_pretend_rank_1_is_elsewhere):
        assert "needs every rank on one host" in message and "another-host" in message
    assert (
        cluster2.run(lambda: C.all_reduce(torch.ones(3), transport="shm").tolist())
        == [[2.0] * 3] * 2
    )
