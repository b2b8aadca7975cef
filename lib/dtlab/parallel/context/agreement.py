"""Before any K/V moves, the CP ranks check that they hold shards of one shape.

Ring, Ulysses and all-gather attention all move *equal* blocks: the ring receives a neighbour's
K/V into a buffer shaped like its own, Ulysses' all-to-all trades ``N`` equal sequence blocks
for head blocks, the all-gather concatenates ``N`` equal blocks. A rank holding 4 tokens while
its neighbour holds 3 (``S = 7`` cut over 2 ranks) does not fail in the algorithm: a message
arrives whose size its receiver did not post, and gloo aborts the process (SIGABRT) without
saying why. So every attention call first all-gathers this rank's shapes — ``q``'s
``(B, H, S, Dh)``, ``k``'s and ``v``'s, and the lengths of its two position vectors: 14 int64
— and compares them on every rank alike. On a disagreement *every* rank raises
:class:`~dtlab.collectives.agreement.CollectiveMismatch` naming each rank's value and what to
change; otherwise the payload moves.

Who sends what: one all-gather of ``14 · 8`` bytes per rank, by the CP group's own torch
collective, whichever ``collectives=`` the communicator runs
(:meth:`~dtlab.comm.Communicator.all_gather_control`). It is a **control message**, as
in :mod:`dtlab.collectives.agreement`: not added to the communicator's ``comm_stats`` (the bytes a
CP attention reports stay its formula's), drawn as a span of kind ``other`` named
``"<method> attention check (control)"`` (``ring``, ``ulysses``, ``allgather``). Cost: latency,
not bandwidth — one synchronisation of the group per attention call, like the collectives' own
check.
"""

from __future__ import annotations

import torch

from dtlab.collectives.agreement import CollectiveMismatch, describe_by_rank
from dtlab.comm import Communicator

_WHY = {  # method → (its name, why it needs equal shards)
    "ring": ("ring attention", "its K/V blocks travel around the ring into buffers shaped like "
             "the receiver's own"),
    "ulysses": ("Ulysses attention", "its all-to-all trades equal sequence blocks for head blocks"),
    "allgather": ("all-gather attention", "its all-gather concatenates equal K/V blocks"),
}  # fmt: skip
# (column of the gathered row, what it is); q, k, v are (B, H, S, Dh), then len(positions_q/k)
_FIELDS = (
    (2, "number of tokens (q's S)"), (6, "number of key tokens (k's S)"), (0, "batch size (B)"),
    (1, "number of query heads (H)"), (5, "number of KV heads (Hkv)"), (3, "head dim (Dh)"),
    (7, "head dim of k"), (11, "head dim of v"),
)  # fmt: skip
_TOKENS = (2, 6)


def _advice(cp: int) -> str:
    return (
        f"pad the sequence to a multiple of 2·cp = {2 * cp} (zig-zag) or cp = {cp} "
        "(contiguous) and cut it with shard_sequence(x, cp, rank, style, dim=2) for "
        "(B, H, S, Dh) tensors (dim=1 for (B, S) tokens), so every rank holds S/cp tokens"
    )


def _local_problem(row: list[int]) -> str | None:
    """What is wrong with one rank's own shapes (the same rule on every rank), or None."""
    q_b, _, q_s, q_d, k_b, _, k_s, k_d, v_b, v_h, v_s, _, pos_q, pos_k = row
    if pos_q != q_s or pos_k != k_s:
        return (
            f"{pos_q} query and {pos_k} key positions for q's {q_s} and k's {k_s} tokens; "
            "pass one global position per token"
        )
    if (k_b, k_s) != (v_b, v_s) or row[5] != v_h or q_b != k_b or q_d != k_d:
        return (
            f"q {tuple(row[0:4])}, k {tuple(row[4:8])}, v {tuple(row[8:12])} do not fit "
            "together: k and v need q's B and the same (B, Hkv, S), k needs q's Dh"
        )
    return None


def check_equal_shards(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions_q: torch.Tensor,
    positions_k: torch.Tensor,
    comm: Communicator,
    method: str,
) -> None:
    """Raise :class:`CollectiveMismatch` on every rank of ``comm`` unless every rank holds q, k,
    v of one shape (``(B, H, S, Dh)`` each) with one position per token; ``method`` is
    ``"ring"``, ``"ulysses"`` or ``"allgather"`` (it picks the explanation)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(
                f"{_WHY[method][0]} takes {name} of shape (B, H, S, Dh); got {tuple(t.shape)}"
            )
    for name, p in (("positions_q", positions_q), ("positions_k", positions_k)):
        if p.device != q.device:  # they travel with the K/V blocks: NCCL moves device tensors
            raise ValueError(
                f"{_WHY[method][0]} takes {name} on q's device ({q.device}), got {p.device}: "
                f"pass {name}.to(q.device) (shard_sequence returns them there)"
            )
    mine = torch.tensor(
        [*q.shape, *k.shape, *v.shape, positions_q.numel(), positions_k.numel()],
        dtype=torch.int64,
        device=q.device,
    )
    everyone = torch.empty(comm.world_size * mine.numel(), dtype=torch.int64, device=q.device)
    comm.all_gather_control(everyone, mine, name=f"{method} attention check")
    rows = everyone.view(comm.world_size, -1).tolist()
    where, why = _WHY[method]
    for rank, row in zip(comm.ranks, rows, strict=True):
        problem = _local_problem(row)
        if problem is not None:
            raise CollectiveMismatch(f"{where}: rank {rank} passes {problem}.")
    for column, what in _FIELDS:
        values = [row[column] for row in rows]
        if len(set(values)) == 1:
            continue
        held = describe_by_rank(values, comm.ranks)
        if column in _TOKENS:
            held, fix = f"{held} ({sum(values)} in all)", _advice(comm.world_size)
        else:
            fix = "give every cp rank the same batch rows and the same model"
        raise CollectiveMismatch(
            f"{where} needs every cp rank to hold the same {what}: {why} — {held}. To fix: {fix}."
        )
