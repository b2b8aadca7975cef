"""Deduplicated dispatch on 4 ranks pretending to be 2 nodes of 2: each token crosses the node
boundary once per remote node, every rank ends with exactly the rows the plain all-to-all would
deliver, and the bytes counted per link class equal the formula from the routed choices."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dtlab.cost.moe import dedup_dispatch_bytes

E, K, D, T, G = 8, 3, 5, 24, 2


def _routing(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7 + rank)
    experts = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    experts[torch.rand(T, K, generator=g) < 0.2] = -1  # some assignments dropped by capacity
    x = torch.randn(T, D, generator=g, dtype=torch.float64)
    return x, experts


def _expected(me: int, ep: int) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
    """The plain dispatch's rows for rank ``me``: by source rank, expert, token."""
    per = E // ep
    rows, keys = [], []
    for s in range(ep):
        x, experts = _routing(s)
        for e in range(me * per, (me + 1) * per):
            for t in range(T):
                if (experts[t] == e).any():
                    rows.append(x[t])
                    keys.append((s, e, t))
    return torch.stack(rows), keys


def _dedup() -> dict:
    from dtlab.comm import Communicator
    from dtlab.parallel.expert.dedup import dedup_dispatch

    me, ep = dist.get_rank(), dist.get_world_size()
    x, experts = _routing(me)
    comm = Communicator(None, collectives="dtlab", dim="ep")
    result = dedup_dispatch(x, experts, comm, E, ranks_per_node=G)
    want_rows, want_keys = _expected(me, ep)
    return {
        "equal": torch.equal(result.rows, want_rows),
        "keys": [tuple(k) for k in result.keys.tolist()] == want_keys,
        "bytes": result.bytes_sent,
        "counted": comm.comm_stats.bytes_sent,
    }


def test_dedup_dispatch_delivers_the_plain_rows_and_counts_each_link_class(cluster4):
    out = cluster4.run(_dedup)
    routed = [[[e for e in row if e >= 0] for row in _routing(s)[1].tolist()] for s in range(4)]
    want = dedup_dispatch_bytes(routed, E, G, D, bytes_per_elem=8)
    for rank, r in enumerate(out):
        assert r["equal"] and r["keys"], rank
        b, w = r["bytes"], want[rank]
        assert (b["inter_rows"], b["intra_rows"]) == (w.dedup_inter_rows, w.dedup_intra_rows)
        assert (b["inter_meta"], b["intra_meta"]) == (w.dedup_inter_meta, w.dedup_intra_meta)
        assert b["counts"] == (1 + 1) * 8  # one count word to the rail peer, one to the mate
        assert r["counted"] == sum(b.values())  # every byte went through the communicator
        # each token crosses once per remote node: never more than once per remote expert
        assert w.dedup_inter_rows < w.plain_inter


def test_dedup_formula_counts_a_token_once_per_remote_node():
    # 2 nodes of 2 ranks, 2 experts per rank: experts 4..7 live on node 1 (ranks 2 and 3)
    routed = [[[4, 5, 6]], [], [], []]  # rank 0's one token: experts on ranks 2, 2, 3
    got = dedup_dispatch_bytes(routed, 8, 2, hidden=1, bytes_per_elem=1)
    assert got[0].plain_inter == 3 and got[0].plain_intra == 0  # three copies cross
    assert got[0].dedup_inter_rows == 1  # one copy crosses, to rank 2 (rank 0's rail peer)
    assert got[2].dedup_intra_rows == 1  # rank 2 keeps one, forwards one to rank 3
    assert got[0].plain_inter_share == 1.0


@pytest.mark.parametrize("bad", [3, 5])
def test_dedup_refuses_nodes_that_do_not_divide_the_group(cluster4, bad):
    def run(g):
        from dtlab.comm import Communicator
        from dtlab.parallel.expert.dedup import dedup_dispatch

        x, experts = _routing(dist.get_rank())
        try:
            dedup_dispatch(x, experts, Communicator(None, "dtlab", "ep"), E, ranks_per_node=g)
        except ValueError as error:
            return str(error)
        return "no error"

    assert all("must divide" in m for m in cluster4.run(run, bad))
