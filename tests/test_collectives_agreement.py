"""Ranks that disagree fail at once, on every rank, with the sizes in the message — never a hang.

Every public collective first all-reduces a digest of its call, and all-gathers the full
descriptors only when the digests differ or the collective needs every rank's counts (control
messages, not counted in ``comm_stats``). These tests give one rank a different length, root, dtype,
algorithm or split and check that *every* rank raises ``CollectiveMismatch`` naming the ranks
and their values, that the group is still in step afterwards, and that the check leaves the
payload's byte counts alone. Also: all-to-all splits given as tensors (``torch.bincount``).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dtlab import collectives as C
from dtlab.collectives.simulated import rank_of_simulation, simulate
from dtlab.runtime.errors import ClusterTimeout, RankError


# -- all-to-all with tensor splits --------------------------------------------------------------
def _bincount_all_to_all_matches_torch() -> dict:
    """Route 5 + rank tokens to random ranks (some ranks get none), as MoE dispatch does."""
    rank, n = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(rank)
    destination = torch.randint(0, n, (5 + rank,), generator=generator)
    destination[destination == (rank + 1) % n] = rank  # nothing for the right neighbour
    tokens = (torch.arange(float(5 + rank)) + 100 * rank).view(-1, 1).repeat(1, 3)
    tokens = tokens[destination.argsort(stable=True)]
    send = torch.bincount(destination, minlength=n)  # a 1-D int64 tensor
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    want = torch.empty(int(recv.sum()), 3)
    dist.all_to_all_single(want, tokens, recv.tolist(), send.tolist())  # plain int lists
    return {
        "1-D tensor, counts exchanged": torch.equal(C.all_to_all(tokens, send), want),
        "1-D tensors both ways": torch.equal(C.all_to_all(tokens, send, recv), want),
        "list of 0-d tensors": torch.equal(C.all_to_all(tokens, list(send), list(recv)), want),
        "sends nothing to its right neighbour": send[(rank + 1) % n].item() == 0,
    }


@pytest.mark.parametrize("world", ["cluster2", "cluster4"])
def test_all_to_all_takes_bincount_splits_like_all_to_all_single(world, request):
    results = request.getfixturevalue(world).run(_bincount_all_to_all_matches_torch)
    for rank, checks in enumerate(results):
        assert all(checks.values()), f"rank {rank}: {checks}"


def test_split_counts_must_be_whole_numbers():
    with pytest.raises(ValueError, match="integer tensor"):
        C.all_to_all(torch.ones(2), torch.tensor([2.0]))
    with pytest.raises(ValueError, match="whole row counts"):
        C.all_to_all(torch.ones(2), [1.5])


# -- every collective, one rank out of line -----------------------------------------------------
def _every_mismatch() -> dict[str, str]:
    """Each call below is wrong on exactly one rank; returns what every rank raised."""
    rank, n = dist.get_rank(), dist.get_world_size()
    odd = rank == 1  # the rank out of line
    seen: dict[str, str] = {}

    def expect_mismatch(label, call):
        try:
            call()
        except C.CollectiveMismatch as error:
            seen[label] = str(error)
        else:
            seen[label] = "no error"

    ten = torch.ones(11 if odd else 10)
    expect_mismatch("all_reduce length", lambda: C.all_reduce(ten.clone()))
    expect_mismatch("all_reduce naive length", lambda: C.all_reduce(ten.clone(), algorithm="naive"))
    expect_mismatch(
        "all_reduce algorithm",
        lambda: C.all_reduce(torch.ones(8), algorithm="naive" if odd else "ring"),
    )
    expect_mismatch(
        "all_reduce dtype",
        lambda: C.all_reduce(torch.ones(8, dtype=torch.float64 if odd else None)),
    )
    expect_mismatch("broadcast length", lambda: C.broadcast(ten.clone(), 0))
    expect_mismatch("broadcast root", lambda: C.broadcast(torch.ones(4), 1 if odd else 0))
    expect_mismatch("reduce length", lambda: C.reduce(ten.clone(), 0))
    expect_mismatch("reduce_scatter length", lambda: C.reduce_scatter(ten.clone()))
    expect_mismatch("all_gather unequal", lambda: C.all_gather(torch.ones(3 + rank)))
    expect_mismatch(
        "all_gather wrong sizes",
        lambda: C.all_gather(torch.ones(2), sizes=[2] * (n - 1) + [3 if odd else 2]),
    )
    expect_mismatch(
        "all_to_all recv_splits",
        lambda: C.all_to_all(torch.ones(n, 2), [1] * n, [2 if odd else 1] + [1] * (n - 1)),
    )
    expect_mismatch("all_to_all row shape", lambda: C.all_to_all(torch.ones(n, 3 if odd else 2)))
    expect_mismatch("gather length", lambda: C.gather(ten.clone()))
    expect_mismatch(
        "scatter length", lambda: C.scatter(ten.clone(), [ten] * n if rank == 0 else None)
    )
    expect_mismatch(
        "different collectives",
        lambda: C.broadcast(torch.ones(4), 0) if odd else C.all_reduce(torch.ones(4)),
    )
    x = torch.full((6,), float(rank))  # the group is still in step: nothing stale is in flight
    C.all_reduce(x)
    seen["after"] = x.tolist()
    return seen


def test_every_collective_fails_on_every_rank_naming_ranks_and_sizes(cluster3):
    per_rank = cluster3.run(_every_mismatch)
    for rank, seen in enumerate(per_rank):
        assert seen.pop("after") == [3.0] * 6
        assert "no error" not in seen.values(), f"rank {rank}: {seen}"
        assert seen == per_rank[0], "every rank raises the same message"
    seen = per_rank[0]
    for label in ("all_reduce length", "all_reduce naive length", "broadcast length"):
        assert "number of elements — ranks [0, 2]: 10; rank 1: 11" in seen[label]
    assert "algorithm — ranks [0, 2]: ring; rank 1: naive" in seen["all_reduce algorithm"]
    assert "rank 1: torch.float64" in seen["all_reduce dtype"]
    assert "root — ranks [0, 2]: 0; rank 1: 1" in seen["broadcast root"]
    for label in ("reduce length", "reduce_scatter length", "gather length", "scatter length"):
        assert "rank 1: 11" in seen[label], label
    assert "rank 0: 3; rank 1: 4; rank 2: 5" in seen["all_gather unequal"]
    assert "pass sizes=[3, 4, 5]" in seen["all_gather unequal"]
    assert "rank 1: [2, 2, 3]" in seen["all_gather wrong sizes"]
    assert "pass sizes=[2, 2, 2]" in seen["all_gather wrong sizes"]
    assert (
        "rank 1 expects [2, 1, 1] (its recv_splits) but is sent [1, 1, 1]"
        in (seen["all_to_all recv_splits"])
    )
    assert "elements per row — ranks [0, 2]: 2; rank 1: 3" in seen["all_to_all row shape"]
    assert "rank 1: broadcast" in seen["different collectives"]


def test_a_mismatch_reaches_the_caller_as_a_rank_error_not_a_timeout(cluster2):
    """The issue's case: ranks disagree on an all-to-all's lengths. torch fails at once; so must we."""

    def disagree_on_lengths():
        rank = dist.get_rank()
        return C.all_to_all(torch.ones(4, 2), [2, 2], [3, 1] if rank == 0 else [2, 2])

    restarts = cluster2.restarts
    with pytest.raises(RankError) as caught:
        cluster2.run(disagree_on_lengths)
    assert not isinstance(caught.value, ClusterTimeout)
    assert caught.value.exc_type == "CollectiveMismatch"
    assert "rank 0 expects [3, 1] (its recv_splits) but is sent [2, 2]" in str(caught.value)
    assert cluster2.restarts == restarts, "no rank was left waiting, so the pool was kept"
    assert cluster2.run(lambda: C.all_reduce(torch.ones(2)).tolist()) == [[2.0, 2.0]] * 2


# -- the check is a control message --------------------------------------------------------------
def test_the_check_is_not_counted_and_is_drawn_as_its_own_span(cluster2):
    def counted():
        with C.counting() as moved:
            C.all_reduce(torch.ones(1000), algorithm="ring")
            C.all_to_all(torch.ones(4, 3), [1, 3] if dist.get_rank() else [3, 1])
        return moved.bytes_sent, moved.messages_sent

    result = cluster2.run(counted)
    # ring: 2(N-1)/N · 4000 B in 2 messages; all-to-all: the rows for the other rank only
    assert list(result) == [(4000 + 1 * 12, 3), (4000 + 1 * 12, 3)]
    spans = result.trace.spans
    checks = [s for s in spans if s.name.endswith("check (control)")]
    assert {s.name for s in checks} == {"all_reduce check (control)", "all_to_all check (control)"}
    assert all(s.kind == "other" and s.nbytes > 0 and s.labels["control"] for s in checks)
    assert C.traffic_matrix(spans, 2) == [[0, 4012], [4012, 0]]


@pytest.mark.parametrize("n", [5, 6, 7])
def test_descriptors_reach_every_rank_at_any_world_size(n):
    """Bruck's all-gather in ceil(log2 N) rounds, also when N is not a power of two."""

    def body():
        rank = rank_of_simulation()
        gathered = C.all_gather(torch.full((rank + 1,), float(rank)), sizes=list(range(1, n + 1)))
        try:
            C.all_reduce(torch.ones(4 if rank == n - 1 else 3))
        except C.CollectiveMismatch as error:
            return gathered.tolist(), str(error)
        return gathered.tolist(), "no error"

    want = [float(r) for r in range(n) for _ in range(r + 1)]
    for gathered, error in simulate(n, body):
        assert gathered == want
        assert f"ranks {list(range(n - 1))}: 3; rank {n - 1}: 4" in error


# -- the check's rounds ---------------------------------------------------------------------------
def _one_call_of_each() -> None:
    import dtlab

    rank, n = dist.get_rank(), dist.get_world_size()
    calls = {
        "all_reduce": lambda: C.all_reduce(torch.ones(6)),
        "broadcast": lambda: C.broadcast(torch.ones(6), 0),
        "all_gather with sizes": lambda: C.all_gather(torch.ones(2 + rank), sizes=[2, 3][:n]),
        "all_gather without sizes": lambda: C.all_gather(torch.ones(2)),
        "all_to_all": lambda: C.all_to_all(torch.ones(n, 2)),
    }
    for label, call in calls.items():
        with dtlab.trace.labels(call=label):
            call()


def test_ranks_that_agree_pay_one_digest_round_unless_they_need_each_others_counts(cluster2):
    spans = cluster2.run(_one_call_of_each).trace.spans
    for rank in (0, 1):
        checks = [s for s in spans if s.rank == rank and s.name.endswith("check (control)")]
        rounds = {}
        for s in checks:
            rounds[s.labels["call"]] = rounds.get(s.labels["call"], 0) + 1
        assert rounds == {
            "all_reduce": 1,
            "broadcast": 1,
            "all_gather with sizes": 1,
            "all_gather without sizes": 2,
            "all_to_all": 2,
        }


def test_a_chunk_that_contradicts_sizes_sends_everyone_to_the_full_round():
    """Rank 1's chunk has 3 elements where every rank's ``sizes`` says 2: its digest is
    NO_DIGEST, so every rank gathers the descriptors and names the lengths."""

    def body():
        rank = rank_of_simulation()
        try:
            C.all_gather(torch.ones(3 if rank == 1 else 2), sizes=[2, 2, 2])
        except C.CollectiveMismatch as error:
            return str(error)
        return "no error"

    for message in simulate(3, body):
        assert "chunks have [2, 3, 2] elements" in message
        assert "pass sizes=[2, 3, 2]" in message


def test_the_digest_is_the_same_number_in_every_process_and_differs_by_any_field():
    from dtlab.collectives.agreement import CallDescriptor, digest

    call = CallDescriptor("all_reduce", "ring", torch.float32, 1000, op="sum")
    assert digest(call, 4) == digest(
        CallDescriptor("all_reduce", "ring", torch.float32, 1000, op="sum"), 4
    )
    assert 0 <= digest(call, 4) < 2**62
    others = [
        CallDescriptor("all_reduce", "ring", torch.float32, 1001, op="sum"),
        CallDescriptor("all_reduce", "naive", torch.float32, 1000, op="sum"),
        CallDescriptor("all_reduce", "ring", torch.float64, 1000, op="sum"),
        CallDescriptor("all_reduce", "ring", torch.float32, 1000, op="max"),
        CallDescriptor("broadcast", "ring", torch.float32, 1000, op="sum"),
    ]
    assert len({digest(c, 4) for c in [call, *others]}) == 6


def _one_rank_differs_in_dtype() -> list[str]:
    rank = dist.get_rank()
    dtype = torch.float64 if rank == 2 else torch.float32
    messages = []
    for call in (
        lambda: C.all_reduce(torch.ones(8, dtype=dtype)),
        lambda: C.peer_all_reduce(torch.ones(8, dtype=dtype), algorithm="two_shot"),
        lambda: C.switch_all_reduce(torch.ones(8, dtype=dtype), switch=3),
    ):
        try:
            call()
        except C.CollectiveMismatch as error:
            messages.append(str(error))
        else:
            messages.append("no error")
    return messages


def test_one_rank_of_four_in_another_dtype_is_named_beside_the_other_three(cluster4):
    """The digests differ, so every rank gathers the descriptors and every rank's dtype is
    named — the three that agree as well as the one that does not — by every rank alike."""
    per_rank = cluster4.run(_one_rank_differs_in_dtype)
    for messages in per_rank:
        assert messages == per_rank[0]
        for message in messages:
            assert "ranks [0, 1, 3]: torch.float32; rank 2: torch.float64" in message, message


def test_dtypes_of_one_size_never_share_a_digest():
    """Same-size dtypes move the same bytes, so a shared code would let the payload through and
    reinterpret it silently: every dtype torch has gets its own code."""
    from dtlab.collectives.agreement import CallDescriptor, digest

    dtypes = {d for d in vars(torch).values() if isinstance(d, torch.dtype)}
    codes = {digest(CallDescriptor("all_reduce", "ring", d, 8, op="sum"), 4) for d in dtypes}
    assert len(codes) == len(dtypes)
