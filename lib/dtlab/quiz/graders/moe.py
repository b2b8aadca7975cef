"""Graders for lab 07 (mixture of experts): top-k routing with capacity, and the dispatch splits.

``moe.top_k_routing`` — ``fn(scores, top_k, capacity) -> (expert_index, weight, keep)``: for
scores (T, E), the ``k`` best experts per token (best first, int64), their scores as weights, and
which assignments fit an expert capacity of ``capacity`` (``None``: all) — every token's first
choice before any second choice, tokens in order within a choice (GShard). Graded on every rank
of the cluster (each its own random scores, one case with a hot expert that overflows) against
:func:`dtlab.models.moe_router.route_top_k`. Calling the library's routing is refused.

``moe.dispatch_splits`` — ``fn(tokens_per_expert) -> (send_splits, recv_splits)``: on every rank
of the EP group (the whole cluster), ``tokens_per_expert`` (E,) counts this rank's rows for each
global expert, experts in contiguous blocks of ``E/ep`` per rank. ``send_splits[j]``: rows for
rank ``j``'s experts; ``recv_splits[s]``: rows rank ``s`` sends here — which only an exchange of
the counts can tell. Graded against the counts every rank drew, then used for a real all-to-all
of the rows (each row labelled with its expert), which must deliver to every rank exactly the
rows of its own experts. The counts are drawn afresh per grading (a seed broadcast from rank 0, so
a rank cannot regenerate another's counts and must exchange them). Calling
:func:`dtlab.parallel.expert.dispatch_splits`, the library's dispatcher or the grader's count
generator is refused, and so is :func:`dtlab.collectives.all_to_all` without ``recv_splits``
(which exchanges the counts for you); an all-to-all or all-gather of the counts is the skill.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.watch import noticing_calls

ROUTING_CASES = ((16, 4, 1, None), (16, 4, 2, 6), (24, 8, 2, 5), (20, 4, 2, "hot"), (12, 6, 3, 4))
SPLIT_EXPERTS = (4, 8)


def _routing_answers() -> dict[Callable, str]:
    from dtlab.models import moe_router

    return {
        moe_router.route_top_k: "dtlab.models.moe_router.route_top_k",
        moe_router.capacity_keep: "dtlab.models.moe_router.capacity_keep",
        moe_router.route: "dtlab.models.moe_router.route",
    }


def _split_answers() -> dict[Callable, str]:
    from dtlab.parallel.expert import dispatch

    return {
        dispatch.dispatch_splits: "dtlab.parallel.expert.dispatch_splits",
        dispatch.AllToAllDispatch.__call__: "dtlab.parallel.expert.AllToAllDispatch",
        _counts_of: "the grader's own count generator",
    }


@contextmanager
def _noticing_library_count_exchange() -> Iterator[list[str]]:
    """Notice :func:`dtlab.collectives.all_to_all` called with ``send_splits`` but no
    ``recv_splits``: it then exchanges the counts itself (its control exchange), and the rows it
    returns reveal the receive splits — the answer, computed by the library."""
    from dtlab.collectives import alltoall

    noticed: list[str] = []
    original = alltoall._agreed_recv_splits

    def watched(peers, call, device):
        if call.more_counts is None and not noticed:
            noticed.append("dtlab.collectives.all_to_all without recv_splits")
        return original(peers, call, device)

    alltoall._agreed_recv_splits = watched
    try:
        yield noticed
    finally:
        alltoall._agreed_recv_splits = original


def _routing_problem(got: Any, scores, top_k: int, capacity) -> str | None:
    import torch

    from dtlab.models.moe_router import capacity_keep, route_top_k

    index, weight, keep = route_top_k(scores, top_k, capacity)
    tokens = scores.shape[0]
    if not isinstance(got, tuple | list) or len(got) != 3:
        return "return a tuple (expert_index, weight, keep)"
    g_index, g_weight, g_keep = got
    shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in got]
    if shapes != [(tokens, top_k)] * 3:
        return (
            f"shapes {shapes}: each of expert_index, weight, keep must be (T, k) = {tokens, top_k}"
        )
    if g_index.dtype != torch.int64 or g_keep.dtype != torch.bool:
        return f"expert_index must be int64 ({g_index.dtype}) and keep bool ({g_keep.dtype})"
    if not torch.equal(g_index, index):
        if torch.equal(g_index.sort(-1).values, index.sort(-1).values):
            return "right experts, wrong order: list each token's experts best first"
        return f"expert_index {g_index[:3].tolist()}… should be {index[:3].tolist()}… (top-k)"
    if not torch.allclose(g_weight, weight):
        return "weight must be each chosen expert's score (the router's probability)"
    if not torch.equal(g_keep, keep):
        kept = torch.bincount(g_index[g_keep], minlength=scores.shape[1])
        if capacity is not None and kept.max() > capacity:
            return f"an expert keeps {int(kept.max())} assignments, more than capacity {capacity}"
        token_major = capacity_keep(g_index.t().contiguous(), scores.shape[1], capacity).t()
        if torch.equal(g_keep, token_major):
            return "drop order: first choices of all tokens come before any second choice"
        return (
            f"keep differs for {int((g_keep != keep).sum())} assignments: an expert keeps its "
            "first `capacity` assignments, all first choices (tokens in order), then second choices"
        )
    return None


def _routing_on_rank(fn: Callable) -> dict:
    import torch
    import torch.distributed as dist

    from dtlab.cost.moe import expert_capacity

    rank = dist.get_rank() if dist.is_initialized() else 0
    g = torch.Generator().manual_seed(700 + rank)
    problems, used, drops = [], [], 0
    for tokens, experts, top_k, capacity in ROUTING_CASES:
        logits = torch.randn(tokens, experts, generator=g)
        if capacity == "hot":
            logits[:, 0] += 3.0
            capacity = expert_capacity(tokens, top_k, experts, 1.0)
        scores = logits.softmax(-1)
        with noticing_calls(_routing_answers()) as noticed:
            try:
                got = fn(scores.clone(), top_k, capacity)
            except NotImplementedError:
                raise
            except Exception as error:  # noqa: BLE001 - reported to the learner
                problems.append(
                    f"T={tokens}, E={experts}, k={top_k}: your routing raised {error!r}"
                )
                continue
        used += noticed
        problem = _routing_problem(got, scores, top_k, capacity)
        if problem:
            problems.append(f"T={tokens}, E={experts}, k={top_k}, capacity={capacity}: {problem}")
        elif capacity is not None:
            drops += int((~got[2]).sum())
    return {"problems": problems, "used": used, "drops": drops, "rank": rank}


@exercise("moe.top_k_routing", title="Top-k routing with capacity", world_size=2)
def grade_top_k_routing(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(scores, top_k, capacity) -> (expert_index, weight, keep)`` (see module doc)."""
    results = cluster.run(_routing_on_rank, fn)
    for r in results:
        if r["used"]:
            raise NotTheSkill(
                f"your routing calls {r['used'][0]} — the library's answer. Write it: topk of "
                "the scores, then count each expert's assignments slot by slot"
            )
    for r in results:
        if r["problems"]:
            raise AssertionError(f"on rank {r['rank']}: {r['problems'][0]}")
    return GradeResult(
        True,
        f"Your routing equals top-k with capacity on {len(ROUTING_CASES)} cases on each of "
        f"{cluster.world_size} ranks, dropping {sum(r['drops'] for r in results)} assignments "
        "in the right order (first choices first).",
    )


def _counts_of(rank: int, experts: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed + 31 * rank + experts)
    counts = torch.randint(0, 7, (experts,), generator=g)
    counts[rank % experts] = 0  # an expert nobody on this rank chose
    counts[0] += 9  # expert 0 is hot everywhere
    return counts


def _asymmetric_seed(ep: int) -> int:
    """A fresh seed (drawn per grading, so no rank can regenerate another's counts) under which
    rank ``s`` sends rank ``j`` a different number of rows than ``j`` sends ``s`` for some pair,
    for every expert count: splits that skip the count exchange then always fail."""
    import random

    import torch

    draw = random.SystemRandom()
    while True:
        seed = draw.randrange(2**30)
        rows = [
            torch.stack([_counts_of(r, e, seed).view(ep, -1).sum(1) for r in range(ep)])
            for e in SPLIT_EXPERTS
        ]
        if all(not torch.equal(m, m.t()) for m in rows):
            return seed


def _splits_on_rank(fn: Callable) -> dict:
    import torch
    import torch.distributed as dist

    from dtlab import collectives as C

    rank, ep = dist.get_rank(), dist.get_world_size()
    seed = torch.tensor([_asymmetric_seed(ep) if rank == 0 else 0])
    dist.broadcast(seed, 0)  # the same counts on every rank's grader, unknown in advance
    problems, used = [], []
    for experts in SPLIT_EXPERTS:
        per = experts // ep
        mine = _counts_of(rank, experts, int(seed))
        every = [_counts_of(r, experts, int(seed)) for r in range(ep)]
        want_send = mine.view(ep, per).sum(1).tolist()
        want_recv = [int(every[s][rank * per : (rank + 1) * per].sum()) for s in range(ep)]
        with (
            noticing_calls(_split_answers()) as noticed,
            _noticing_library_count_exchange() as auto,
        ):
            got = fn(mine.clone())
        used += noticed + auto
        try:
            send, recv = ([int(n) for n in split] for split in got)
        except (TypeError, ValueError):
            problems.append(f"return (send_splits, recv_splits), two lists of ints; got {got!r}")
            send = recv = None
        if send is not None and send != want_send:
            problems.append(
                f"E={experts}: send_splits {send} should be {want_send} — one entry per rank: "
                f"the rows for rank j's experts {list(range(per))}+j·{per}"
            )
        elif recv is not None and recv != want_recv:
            hint = " (that is what you send: exchange the counts)" if recv == send else ""
            problems.append(f"E={experts}: recv_splits {recv} should be {want_recv}{hint}")
        ok = torch.tensor([0 if problems else 1])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if not ok.item():
            break
        rows = torch.repeat_interleave(torch.arange(experts), mine).to(torch.float64)[:, None]
        arrived = C.all_to_all(rows, send, recv)  # the learner's splits, on real ranks
        owners = (arrived.view(-1).long() // per).unique().tolist()
        if arrived.shape[0] != sum(want_recv) or owners not in ([], [rank]):
            problems.append(f"E={experts}: the all-to-all delivered rows of experts {owners}")
    return {"problems": problems, "used": used, "rank": rank}


@exercise("moe.dispatch_splits", title="The dispatch all-to-all's splits", world_size=2)
def grade_dispatch_splits(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(tokens_per_expert) -> (send_splits, recv_splits)`` on every rank (module doc)."""
    results = cluster.run(_splits_on_rank, fn)
    for r in results:
        if r["used"]:
            raise NotTheSkill(
                f"your splits call {r['used'][0]} — the library's answer. Write it: sum your "
                "counts per rank's block of experts, and all-to-all the counts to learn the rest"
            )
    for r in results:
        if r["problems"]:
            raise AssertionError(f"on rank {r['rank']}: {r['problems'][0]}")
    return GradeResult(
        True,
        f"Your splits equal the routed counts for E = {SPLIT_EXPERTS} on {cluster.world_size} "
        "ranks, and the all-to-all they drive delivers every row to the rank of its expert.",
    )


# -- quiz keys, from the library -----------------------------------------------------------------
def active_fraction_key(n_experts: int, top_k: int, d_model: int, d_expert: int) -> float:
    """Fraction of an MoE layer's parameters one token computes with (router + k of E experts)."""
    from dtlab.models import GPTConfig
    from dtlab.models.moe import MoE, MoEConfig

    config = GPTConfig(d_model=d_model, n_heads=1, d_ff=d_expert)
    layer = MoE(config, MoEConfig(n_experts=n_experts, top_k=top_k), device="meta")
    return layer.active_params() / sum(p.numel() for p in layer.parameters())


def switch_loss_key(counts: list[int], mean_probs: list[float]) -> float:
    """The Switch loss ``E · Σ f_i · P_i`` of a top-1 routing that sends ``counts[i]`` tokens to
    expert ``i``, every token with router probabilities ``mean_probs``."""
    import torch

    from dtlab.models.moe_router import switch_aux_loss

    n_experts = len(mean_probs)
    index = torch.repeat_interleave(torch.arange(n_experts), torch.tensor(counts))[:, None]
    probs = torch.tensor(mean_probs, dtype=torch.float64).expand(len(index), n_experts)
    return float(switch_aux_loss(probs, index, n_experts))


def global_balance_loss_key(counts_by_rank: list[list[int]], mean_probs: list[float]) -> float:
    """Rank 0's balance loss with ``f`` counted over the global batch: the tokens per expert
    summed over every data-parallel rank (``counts_by_rank``), ``P`` rank 0's ``mean_probs``."""
    import torch

    from dtlab.models.moe_router import balance_loss_from_counts

    counts = torch.tensor(counts_by_rank, dtype=torch.float64).sum(0)
    probs = torch.tensor(mean_probs, dtype=torch.float64)[None]
    return float(balance_loss_from_counts(probs, counts, len(mean_probs)))
