"""Deduplicated dispatch: each token crosses the node boundary once per destination node, then
fans out to its experts' ranks over the fast link inside that node.

The plain dispatch (:mod:`.dispatch`) sends one row per (token, expert on another rank): a token
whose ``k`` experts sit on three ranks of one remote node crosses the inter-node network three
times. DeepSeek-V3 (DeepSeek-AI 2024, §3.2.2) and its DeepEP kernels send it **once per
remote node** over InfiniBand, to the GPU with the same local index there (its rail peer), which
forwards it over NVLink to every GPU of that node holding one of the token's experts. Node-
limited routing (``MoEConfig.node_limit``) bounds the nodes per token, so it bounds the
inter-node copies (:func:`dtlab.cost.moe.inter_node_dispatch_bytes`).

Here, on an EP group whose ranks are grouped into nodes of ``ranks_per_node`` consecutive ranks
(torchrun numbers ranks node by node; a CPU cluster pretends, as lab 11 does with ``Mesh(...,
ranks_per_node=...)``), one dispatch is two stages, each a count message then the payload:

1. **across nodes** — for each remote node ``m``, this rank sends its rail peer there (rank
   ``m·g + my local index``) the *distinct* tokens routed to any expert of node ``m``: one row
   each, plus ``(token, expert mask)`` as two int64 words per row (which of the node's experts
   chose it);
2. **inside the node** — every rank forwards to each other rank of its node the rows meant for
   that rank's experts: its own tokens routed into its node, and the rows it received as a rail
   peer. One row per (source token, destination rank), plus ``(source rank, token, expert
   mask)``, three words.

Each rank then expands its rows into one per (token, local expert), in the plain dispatch's
order (source rank, expert, token), so the experts see exactly the rows the plain all-to-all
would have delivered (:func:`plain_order_rows`). Bytes per link class, counted from the posted
messages, equal :func:`dtlab.cost.moe.dedup_dispatch_bytes` from the routed choices.

What deduplication cannot shrink: the rows a node must receive for its own experts (one per
distinct (token, node)), and the intra-node fan-out, which grows instead (a forwarded row moves
twice). It trades InfiniBand bytes for NVLink bytes, which move faster per GPU: 160 against
50 GB/s on DeepSeek-V3's H800s (the report's 3.2×), 450 against 50 GB/s (400 Gb/s NIC) on an
H100, about 9×. The combine runs the same
path backwards in DeepEP (summing the node's expert outputs at the rail peer); dtlab's combine
stays the plain one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dtlab.comm import Communicator


@dataclass
class DedupResult:
    """What one rank's deduplicated dispatch delivered and what each link class carried."""

    rows: torch.Tensor  # one row per (source, local expert, token), the plain order
    keys: torch.Tensor  # (source rank, expert, token) per row, int64 (rows, 3)
    bytes_sent: dict[str, int]  # "inter_rows", "inter_meta", "intra_rows", "intra_meta", "counts"


def _post(comm: Communicator, sends, recvs, name: str) -> int:
    """Post and wait; returns the payload bytes this rank sent (counted from the messages)."""
    before = comm.comm_stats.bytes_sent
    comm.start_exchange(sends, recvs, name=name, op=name).wait()
    return int(comm.comm_stats.bytes_sent - before)


def _exchange(comm: Communicator, out: dict[int, tuple], peers: list[int], name: str, width: int):
    """Send ``out[j] = (rows, meta)`` to each ``j`` in ``peers`` behind a one-word count message;
    returns ``({j: (rows, meta)}, bytes by kind)``."""
    device = next(iter(out.values()))[0].device  # NCCL moves device tensors only
    counts_in = {j: torch.empty(1, dtype=torch.int64, device=device) for j in peers}
    counts_out = {
        j: torch.tensor([len(out[j][0])], dtype=torch.int64, device=device) for j in peers
    }
    sends, recvs = [(j, counts_out[j]) for j in peers], [(j, counts_in[j]) for j in peers]
    count_bytes = _post(comm, sends, recvs, f"{name}_counts")  # drawn with its wait: the host
    n_in = {j: int(counts_in[j]) for j in peers}  # needs the counts before it can size a buffer
    some = next(iter(out.values()))
    rows_in = {j: some[0].new_empty((n_in[j], width)) for j in peers}
    meta_in = {j: some[1].new_empty((n_in[j], some[1].shape[1])) for j in peers}
    sends, recvs = [(j, out[j][0]) for j in peers], [(j, rows_in[j]) for j in peers]
    row_bytes = _post(comm, sends, recvs, name)
    sends, recvs = [(j, out[j][1]) for j in peers], [(j, meta_in[j]) for j in peers]
    meta_bytes = _post(comm, sends, recvs, f"{name}_meta")
    received = {j: (rows_in[j], meta_in[j]) for j in peers}
    return received, {"rows": row_bytes, "meta": meta_bytes, "counts": count_bytes}


def dedup_dispatch(
    x: torch.Tensor, experts: torch.Tensor, comm: Communicator, n_experts: int, ranks_per_node: int
) -> DedupResult:
    """Dispatch the kept assignments ``experts`` (tokens, k; ``-1`` where dropped) of ``x``
    (tokens, d) over ``comm``'s EP group, once per destination node (module docstring)."""
    ep, me, g = comm.world_size, comm.rank, ranks_per_node
    if ep % g or n_experts % ep:
        raise ValueError(
            f"ranks_per_node={g} must divide the EP group of {ep} ranks, and the group must divide "
            f"n_experts={n_experts}"
        )
    per_rank, n_nodes = n_experts // ep, ep // g
    per_node = per_rank * g
    if per_node > 62:
        raise ValueError(f"{per_node} experts per node do not fit one int64 mask; use ≤ 62")
    node, local = me // g, me % g
    chosen = experts >= 0
    dest_node = torch.where(chosen, experts // per_node, -1)
    bit = torch.where(
        chosen, torch.bitwise_left_shift(torch.ones_like(experts), experts % per_node), 0
    )
    tokens = torch.arange(len(x), device=x.device)  # indexed by masks on x's device

    def node_rows(m: int) -> tuple[torch.Tensor, torch.Tensor]:
        mask = (bit * (dest_node == m)).sum(1)
        picked = tokens[mask > 0]
        return x[picked], torch.stack([picked, mask[picked]], 1)

    # 1. across nodes: one row per distinct token for each remote node, to my rail peer there
    rail = [m * g + local for m in range(n_nodes) if m != node]
    out1 = {m * g + local: node_rows(m) for m in range(n_nodes) if m != node}
    got1, inter = _exchange(comm, out1, rail, "moe_dedup_inter", x.shape[1]) if rail else ({}, {})
    # what this rank holds for its node: (source rank, token, node-expert mask) and the row
    own_rows, own_meta = node_rows(node)
    held = [(own_rows, torch.cat([torch.full_like(own_meta[:, :1], me), own_meta], 1))]
    for j, (rows, meta) in got1.items():
        held.append((rows, torch.cat([torch.full_like(meta[:, :1], j), meta], 1)))
    rows_here = torch.cat([r for r, _ in held])
    meta_here = torch.cat([m for _, m in held])
    # 2. inside the node: to each rank of my node, the rows meant for its experts
    rank_bits = torch.bitwise_left_shift(
        torch.full((g,), (1 << per_rank) - 1, device=x.device),
        per_rank * torch.arange(g, device=x.device),
    )
    wants = (meta_here[:, 2:3] & rank_bits) > 0  # (rows, g): which local ranks need each row
    mates = [node * g + q for q in range(g) if q != local]
    out2 = {node * g + q: (rows_here[wants[:, q]], meta_here[wants[:, q]]) for q in range(g)}
    got2, intra = _exchange(comm, out2, mates, "moe_dedup_intra", x.shape[1]) if mates else ({}, {})
    mine = [out2[me]] + list(got2.values())
    rows, keys = plain_order_rows(
        torch.cat([r for r, _ in mine]), torch.cat([m for _, m in mine]), me, per_rank, per_node
    )
    bytes_sent = {
        "inter_rows": inter.get("rows", 0),
        "inter_meta": inter.get("meta", 0),
        "intra_rows": intra.get("rows", 0),
        "intra_meta": intra.get("meta", 0),
        "counts": inter.get("counts", 0) + intra.get("counts", 0),
    }
    return DedupResult(rows, keys, bytes_sent)


def plain_order_rows(
    rows: torch.Tensor, meta: torch.Tensor, me: int, per_rank: int, per_node: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand rows tagged ``(source, token, node-expert mask)`` into one row per (token, expert of
    rank ``me``), sorted by (source rank, expert, token): the plain dispatch's order."""
    first = me * per_rank  # my first expert's global index
    offset = first % per_node  # its bit in the node's mask
    pieces, keys = [], []
    for e in range(per_rank):
        hit = (meta[:, 2] >> (offset + e)) & 1 > 0
        pieces.append(rows[hit])
        keys.append(
            torch.stack([meta[hit, 0], torch.full_like(meta[hit, 0], first + e), meta[hit, 1]], 1)
        )
    key = torch.cat(keys)
    flat = torch.cat(pieces)
    order = torch.argsort((key[:, 0] * (1 << 20) + key[:, 1]) * (1 << 30) + key[:, 2])
    return flat[order], key[order]
