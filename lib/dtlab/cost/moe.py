"""Mixture-of-experts arithmetic: expert capacity, all-to-all bytes from token counts, and what
node-limited routing saves on the inter-node links.

Capacity (GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021): with ``T`` tokens routed to
``k`` of ``E`` experts, a balanced expert receives ``T·k/E`` assignments; each expert accepts at
most ``C = ceil(c · T·k/E)`` of them (``c`` the capacity factor), the rest are dropped (the token
keeps only its residual for that expert).

All-to-all bytes of expert parallelism over ``ep`` ranks, per rank, from the token counts the
router actually produced (rows of ``h`` values of ``e`` bytes):

* dispatch sends every kept assignment whose expert lives on another rank:
  ``Σ_{experts not mine} kept_e · h · e``;
* combine sends back every row this rank received from another rank;
* backward runs both again with the roles swapped (the same bytes);
* the counts themselves are exchanged first, one int64 message per peer: a header of
  ``COUNT_HEADER_WORDS`` words (call number, experts, row width, dtype — the call's agreement,
  :mod:`dtlab.parallel.expert.exchange`) and the ``E/ep`` counts of that peer's experts,
  ``(ep-1) · (H + E/ep)`` int64 values per rank.

Node-limited routing (DeepSeek-V3, DeepSeek-AI 2024, §2.1.2): each token's experts sit on at most
``M`` nodes. A token's vector crosses the inter-node network once per *remote node* it needs (it
is then forwarded over NVLink to the GPUs inside that node), so inter-node copies per token fall
from ``(n-1)/n · E[D]`` to ``(n-1)/n · E[min(D, M)]``, with ``D`` the distinct nodes among the
``k`` experts of uniform routing (:func:`distinct_nodes_pmf`). For ``M ≥ k`` the limit never
binds: a top-k expert's node always ranks among the best ``k`` nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dtlab.cost.hardware import link

COUNT_HEADER_WORDS = 4
"""int64 words before the counts in each count message: call number, experts, row width, dtype."""


def expert_capacity(tokens: int, top_k: int, n_experts: int, capacity_factor: float) -> int:
    """Assignments one expert accepts: ``ceil(capacity_factor · tokens · top_k / n_experts)``."""
    if tokens < 0 or top_k < 1 or n_experts < 1:
        raise ValueError(
            f"tokens={tokens}, top_k={top_k}, n_experts={n_experts}: need tokens ≥ 0, k ≥ 1, E ≥ 1"
        )
    if capacity_factor <= 0:
        raise ValueError(
            f"capacity_factor={capacity_factor} must be > 0 (1.0: exactly the balanced share)"
        )
    return math.ceil(capacity_factor * tokens * top_k / n_experts - 1e-9)


def experts_of_rank(n_experts: int, ep: int, rank: int) -> range:
    """The experts EP rank ``rank`` holds: a contiguous block of ``n_experts / ep``."""
    if n_experts % ep:
        raise ValueError(
            f"ep={ep} does not divide n_experts={n_experts}; each rank holds whole experts"
        )
    per = n_experts // ep
    return range(rank * per, (rank + 1) * per)


@dataclass(frozen=True)
class DispatchBytes:
    """Bytes one rank sends in one MoE layer's all-to-alls, from actual token counts."""

    dispatch: int  # forward dispatch (rows to other ranks' experts)
    combine: int  # forward combine (rows received from other ranks, sent back)
    counts: int  # the count exchange before the dispatch (int64: header + counts per peer)

    @property
    def forward(self) -> int:
        return self.dispatch + self.combine + self.counts

    @property
    def forward_and_backward(self) -> int:
        """Forward, plus backward's two all-to-alls: combine's gradient out, dispatch's back."""
        return self.forward + self.dispatch + self.combine


def count_exchange_bytes(
    ep: int, n_experts: int, header_words: int = COUNT_HEADER_WORDS, count_bytes: int = 8
) -> int:
    """Bytes one rank sends in the count exchange: one message to each of the ``ep − 1`` other
    ranks, ``header_words`` words then the ``n_experts / ep`` counts of that rank's experts."""
    per = experts_of_rank(n_experts, ep, 0).stop
    return (ep - 1) * (header_words + per) * count_bytes


def dispatch_bytes_from_counts(
    kept_per_expert_by_rank: Sequence[Sequence[int]],
    rank: int,
    hidden: int,
    bytes_per_elem: int = 4,
    count_bytes: int = 8,
    header_words: int = COUNT_HEADER_WORDS,
) -> DispatchBytes:
    """Bytes ``rank`` sends when source rank ``s`` routes ``kept_per_expert_by_rank[s][e]`` rows to
    expert ``e`` (experts in contiguous blocks of ``E/ep``, one block per rank); each count
    message carries ``header_words`` words before its ``E/ep`` counts."""
    ep = len(kept_per_expert_by_rank)
    n_experts = len(kept_per_expert_by_rank[0])
    mine = experts_of_rank(n_experts, ep, rank)
    row = hidden * bytes_per_elem
    own = kept_per_expert_by_rank[rank]
    dispatch = sum(n for e, n in enumerate(own) if e not in mine) * row
    combine = sum(kept_per_expert_by_rank[s][e] for s in range(ep) if s != rank for e in mine) * row
    counts = count_exchange_bytes(ep, n_experts, header_words, count_bytes)
    return DispatchBytes(int(dispatch), int(combine), int(counts))


@dataclass(frozen=True)
class InterNodeTraffic:
    """Inter-node bytes one rank's dispatch sends, uniform routing, with and without a node limit."""

    remote_copies_per_token: float  # token vectors crossing the inter-node network per token
    bytes_per_rank: float  # dispatch, forward only


def distinct_nodes_pmf(top_k: int, n_experts: int, n_nodes: int) -> list[float]:
    """``P(D = j)`` for ``j = 0..n_nodes``: ``D`` the distinct nodes among ``top_k`` experts drawn
    uniformly without replacement, ``n_experts / n_nodes`` experts per node (inclusion–exclusion:
    the k-subsets of ``j`` given nodes' experts that touch all ``j`` of them)."""
    per_node = n_experts // n_nodes
    total = math.comb(n_experts, top_k)
    pmf = []
    for j in range(n_nodes + 1):
        onto = sum(
            (-1) ** i * math.comb(j, i) * math.comb((j - i) * per_node, top_k) for i in range(j + 1)
        )
        pmf.append(math.comb(n_nodes, j) * onto / total)
    return pmf


def inter_node_dispatch_bytes(
    tokens_per_rank: int,
    hidden: int,
    top_k: int,
    n_experts: int,
    n_nodes: int,
    node_limit: int | None = None,
    dedup_per_node: bool = True,
    bytes_per_elem: float = 2,
) -> InterNodeTraffic:
    """Expected inter-node dispatch bytes per rank for uniform routing over ``n_nodes`` nodes.

    Without deduplication every (token, remote expert) pair is a copy: ``k·(n-1)/n`` per token.
    With it (one copy per remote node, forwarded inside the node over NVLink) the copies are the
    expected distinct remote nodes, ``(n-1)/n · E[min(D, M)]`` (module docstring; ``M = n``
    without a limit). The sender's node is one of the ``n`` uniformly, hence ``(n-1)/n``.
    """
    if n_experts % n_nodes:
        raise ValueError(f"n_nodes={n_nodes} must divide n_experts={n_experts}")
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k={top_k} must be in 1..n_experts={n_experts}")
    if node_limit is not None and not 1 <= node_limit <= n_nodes:
        raise ValueError(f"node_limit={node_limit} must be in 1..n_nodes={n_nodes}")
    remote_share = (n_nodes - 1) / n_nodes
    if not dedup_per_node:
        copies = top_k * remote_share
    else:
        limit = n_nodes if node_limit is None else node_limit
        pmf = distinct_nodes_pmf(top_k, n_experts, n_nodes)
        copies = remote_share * sum(min(j, limit) * p for j, p in enumerate(pmf))
    return InterNodeTraffic(copies, copies * tokens_per_rank * hidden * bytes_per_elem)


def all_to_all_seconds(bytes_per_rank: float, peers: int, link_name: str) -> float:
    """α-β time of one rank's all-to-all: ``peers`` messages, ``bytes_per_rank`` in all."""
    return link(link_name).time(bytes_per_rank, max(peers, 1))


@dataclass(frozen=True)
class LinkBytes:
    """Dispatch bytes one rank sends, split by link class: inside its node (NVLink) or across
    nodes (InfiniBand), plain (one row per (token, expert on another rank)) and
    deduplicated (one row per token and remote node, then fanned out inside the node)."""

    plain_inter: int  # plain all-to-all rows to ranks on other nodes
    plain_intra: int  # plain all-to-all rows to other ranks of this node
    dedup_inter_rows: int  # one row per (token, remote node), to the rail peer there
    dedup_intra_rows: int  # one row per (token, another rank of its node that needs it)
    dedup_inter_meta: int  # (token, expert mask) per inter-node row, int64
    dedup_intra_meta: int  # (source rank, token, expert mask) per intra-node row, int64

    @property
    def plain_inter_share(self) -> float:
        """The share of the plain dispatch's bytes that crosses a node boundary."""
        total = self.plain_inter + self.plain_intra
        return self.plain_inter / total if total else 0.0


def dedup_dispatch_bytes(
    experts_by_rank: Sequence[Sequence[Sequence[int]]],
    n_experts: int,
    ranks_per_node: int,
    hidden: int,
    bytes_per_elem: int = 4,
) -> list[LinkBytes]:
    """Per sending rank, the dispatch bytes by link class from the routed choices:
    ``experts_by_rank[s][t]`` lists the kept experts of source rank ``s``'s token ``t``.
    Experts sit in contiguous blocks per rank, ranks in nodes of ``ranks_per_node``
    (:mod:`dtlab.parallel.expert.dedup` says who sends what)."""
    ep, g = len(experts_by_rank), ranks_per_node
    per_rank = experts_of_rank(n_experts, ep, 0).stop
    row, word = hidden * bytes_per_elem, 8
    plain_inter, plain_intra = [0] * ep, [0] * ep
    inter_rows, intra_rows = [0] * ep, [0] * ep
    for s, tokens in enumerate(experts_by_rank):
        node, local = divmod(s, g)
        for chosen in tokens:
            ranks = {e // per_rank for e in chosen}
            for e in chosen:
                r = e // per_rank
                if r != s:
                    (plain_inter if r // g != node else plain_intra)[s] += row
            for m in {r // g for r in ranks}:
                holder = s if m == node else m * g + local  # who fans it out inside node m
                if m != node:
                    inter_rows[s] += row
                intra_rows[holder] += row * len({r for r in ranks if r // g == m} - {holder})
    return [
        LinkBytes(
            plain_inter[s],
            plain_intra[s],
            inter_rows[s],
            intra_rows[s],
            inter_rows[s] // row * 2 * word if row else 0,
            intra_rows[s] // row * 3 * word if row else 0,
        )  # fmt: skip
        for s in range(ep)
    ]


@dataclass(frozen=True)
class TokenCopies:
    """Copies of one token's vector per link class in one dispatch (rows, not bytes)."""

    plain_inter: int  # one per chosen expert on another node
    plain_intra: int  # one per chosen expert on another rank of this node
    dedup_inter: int  # one per remote node touched (to the rail peer there)
    dedup_intra: int  # forwards inside each touched node to its other ranks that need it


def token_link_copies(
    experts: Sequence[int], source_rank: int, n_experts: int, ep: int, ranks_per_node: int
) -> TokenCopies:
    """:func:`dedup_dispatch_bytes` for one token of ``source_rank`` choosing ``experts``."""
    routed = [[] for _ in range(ep)]
    routed[source_rank] = [list(experts)]
    links = dedup_dispatch_bytes(routed, n_experts, ranks_per_node, hidden=1, bytes_per_elem=1)
    return TokenCopies(
        links[source_rank].plain_inter,
        links[source_rank].plain_intra,
        links[source_rank].dedup_inter_rows,
        sum(w.dedup_intra_rows for w in links),
    )
