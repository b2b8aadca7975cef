"""The expert-parallel token exchange: the count message doubles as the call's agreement, the
payload moves in one posting into buffers kept across steps, and both transports (dtlab's
counted messages, torch's ``all_to_all_single``) deliver the same rows."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dtlab import collectives as C
from dtlab.cost.moe import COUNT_HEADER_WORDS, dispatch_bytes_from_counts

E, D = 8, 6


def _routed(rank: int, tokens: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    expert = torch.sort(torch.randint(0, E, (tokens,), generator=g)).values
    rows = torch.randn(tokens, D, generator=g, dtype=torch.float64)
    rows[:, 0] = expert  # each row names its expert
    return torch.bincount(expert, minlength=E), rows


def _round_trip(via: str) -> dict:
    from dtlab.comm import Communicator
    from dtlab.parallel.expert import TokenExchange

    rank, ep = dist.get_rank(), dist.get_world_size()
    counts, rows = _routed(rank)
    exchange = TokenExchange(Communicator(None, collectives=via, dim="ep"))
    splits = exchange.exchange_counts(counts, D, rows.dtype)
    after_counts = exchange.comm.comm_stats.bytes_sent
    arrived = exchange.exchange_rows(rows, splits.send, splits.recv, "dispatch").clone()
    back = exchange.exchange_rows(arrived, splits.recv, splits.send, "combine")
    per = E // ep
    return {
        "counts": counts.tolist(),
        "count_bytes": after_counts,
        "sent": exchange.comm.comm_stats.bytes_sent,
        "on_my_experts": bool(((arrived[:, 0] // per) == rank).all()),
        "home": bool(torch.equal(back, rows)),
        "arrived": arrived,
        "received": splits.received.tolist(),
    }


@pytest.mark.parametrize("world", ["cluster2", "cluster4"])
def test_dispatch_and_combine_equal_all_to_all_single_and_count_the_formula(world, request):
    cluster = request.getfixturevalue(world)
    ours, torch_path = cluster.run(_round_trip, "dtlab"), cluster.run(_round_trip, "torch")
    ep = cluster.world_size
    kept = [r["counts"] for r in ours]
    for rank, (a, b) in enumerate(zip(ours, torch_path, strict=True)):
        assert a["on_my_experts"] and a["home"] and b["home"]
        assert torch.equal(a["arrived"], b["arrived"]) and a["received"] == b["received"]
        want = dispatch_bytes_from_counts(kept, rank, D, 8)
        assert a["count_bytes"] == want.counts == (ep - 1) * (COUNT_HEADER_WORDS + E // ep) * 8
        assert b["count_bytes"] == want.counts  # one all_to_all_single of the headed counts
        assert a["sent"] == want.forward == b["sent"]  # counted == formula == torch's record


def _one_agreement_then_one_message_per_peer(via: str) -> dict:
    from dtlab import trace
    from dtlab.comm import Communicator
    from dtlab.parallel.expert import TokenExchange

    counts, rows = _routed(dist.get_rank())
    exchange = TokenExchange(Communicator(None, collectives=via, dim="ep"))
    for step in range(3):
        with trace.labels(step=step):
            calls = exchange.comm.comm_stats.calls
            with C.counting() as moved:
                splits = exchange.exchange_counts(counts, D, rows.dtype)
            calls = exchange.comm.comm_stats.calls - calls
            exchange.exchange_rows(rows, splits.send, splits.recv, "dispatch")
    return {"count_messages": moved.messages_sent, "count_calls": calls}


@pytest.mark.parametrize("via", ["dtlab", "torch"])
def test_the_count_message_is_the_only_check_after_the_first_call(cluster2, via):
    out = cluster2.run(_one_agreement_then_one_message_per_peer, via)
    spans = out.trace.spans
    checks = [s for s in spans if s.labels.get("control")]
    # the expert count is agreed once (first call); every later call checks its header only
    assert {s.labels["step"] for s in checks} == {0}
    assert all("experts check" in s.name for s in checks)
    if via == "dtlab":  # one count message to the one peer, counted from the messages
        assert all(r["count_messages"] == 1 and r["count_calls"] == 2 for r in out)  # send+recv
    else:  # one all_to_all_single, and no message of dtlab's own
        assert all(r["count_messages"] == 0 and r["count_calls"] == 1 for r in out)
    counts = [s for s in spans if s.name == "moe_count_exchange"]
    dispatch = [s for s in spans if s.name == "moe_dispatch" and s.kind == "comm"]
    assert len(counts) == len(dispatch) == 2 * 3
    for rank in (0, 1):  # on the timeline: the count exchange ends before the payload is posted
        c = sorted((s for s in counts if s.rank == rank), key=lambda s: s.start_ns)
        d = sorted((s for s in dispatch if s.rank == rank), key=lambda s: s.start_ns)
        assert all(a.end_ns <= b.start_ns for a, b in zip(c, d, strict=True))


def _mismatch(what: str, via: str) -> str:
    from dtlab.comm import Communicator
    from dtlab.parallel.expert import TokenExchange

    rank = dist.get_rank()
    counts, rows = _routed(rank)
    exchange = TokenExchange(Communicator(None, collectives=via, dim="ep"))
    width, dtype = D, rows.dtype
    if what == "width" and rank == 1:
        width = D + 2
    if what == "dtype" and rank == 0:
        dtype = torch.bfloat16
    if what == "experts" and rank == 1:
        counts = torch.cat([counts, counts])
    if what == "ahead":
        exchange.exchange_counts(counts, width, dtype)  # agree on the experts, call 0
        if rank == 1:
            exchange.calls += 1  # as if rank 1 had run one more forward of this layer
    try:
        exchange.exchange_counts(counts, width, dtype)
    except C.CollectiveMismatch as error:
        return str(error)
    return "no error"


@pytest.mark.parametrize(
    "what, named",
    [
        ("width", ["row width: rank 0: 6, rank 1: 8"]),
        ("dtype", ["dtype: rank 0: bfloat16, rank 1: float64"]),
        ("experts", ["experts — rank 0: 8, rank 1: 16"]),
        ("ahead", ["call number: rank 0: 1, rank 1: 2"]),
    ],
)
@pytest.mark.parametrize("via", ["dtlab", "torch"])
def test_a_mismatched_call_raises_on_every_rank_naming_each_ranks_value(cluster2, what, named, via):
    # over "torch" the check rides the one all_to_all_single of the counts: no extra call
    for message in cluster2.run(_mismatch, what, via):
        for text in named:
            assert text in message, message


def _buffers(labels: list[int]) -> list[int]:
    from dtlab import trace
    from dtlab.comm import Communicator
    from dtlab.parallel.expert import TokenExchange

    counts, rows = _routed(dist.get_rank())
    exchange = TokenExchange(Communicator(None, collectives="dtlab", dim="ep"))
    pointers = []
    for micro_batch in labels:
        with trace.labels(micro_batch=micro_batch):
            splits = exchange.exchange_counts(counts, D, rows.dtype)
            out = exchange.exchange_rows(rows, splits.send, splits.recv, "dispatch")
        pointers.append(out.data_ptr())
    return pointers


def test_receive_buffers_are_kept_across_steps_one_per_micro_batch(cluster2):
    for pointers in cluster2.run(_buffers, [0, 0, 1, 1, 0]):
        assert pointers[0] == pointers[1] == pointers[4]  # the same buffer, step after step
        assert pointers[2] == pointers[3] != pointers[0]  # another micro-batch, another buffer


def _stale_graph(same_micro_batch: bool) -> str:
    from dtlab import trace
    from dtlab.comm import Communicator
    from dtlab.models import GPTConfig
    from dtlab.models.moe import MoE, MoEConfig
    from dtlab.parallel.expert import AllToAllDispatch

    torch.manual_seed(0)
    layer = MoE(GPTConfig.tiny(d_model=8, n_heads=2), MoEConfig(n_experts=4, top_k=2))
    comm = Communicator(None, collectives="dtlab", dim="ep")
    per = 4 // comm.world_size
    for holder in (layer.experts.fc_in, layer.experts.fc_out):
        mine = holder.weight.detach()[comm.rank * per : (comm.rank + 1) * per].clone()
        holder.weight = torch.nn.Parameter(mine)
    layer.dispatcher = AllToAllDispatch(comm)
    x = torch.randn(2, 16, 8)
    losses = []
    for micro_batch in (0, 0 if same_micro_batch else 1):
        with trace.labels(micro_batch=micro_batch):
            out, _ = layer(x)
        losses.append(out.square().sum())
    try:
        losses[0].backward()  # the first forward's combine rows were overwritten if shared
    except RuntimeError as error:
        return str(error)
    losses[1].backward()
    return "ok"


def test_a_graph_that_saved_an_overwritten_buffer_raises_instead_of_using_wrong_rows(cluster2):
    for message in cluster2.run(_stale_graph, True):  # autograd's version check, in backward
        assert "modified inplace" in message or "modified by an inplace operation" in message
    assert cluster2.run(_stale_graph, False) == ["ok", "ok"]
