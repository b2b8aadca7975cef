"""Before a collective moves its payload, its ranks check that they were all asked the same thing.

A collective whose ranks disagree — one passes 1000 elements and another 1001, one broadcasts
from root 0 and another from root 1, one all-reduces while another all-gathers — does not fail
in the transport: a rank waits for bytes that no rank will send, and the job hangs until a
timeout (NCCL's watchdog: ten minutes). So every public collective in this package first checks
**a descriptor of the call** against every other rank's. On a disagreement *every* rank raises
:class:`CollectiveMismatch`, naming the ranks and what each one passed; otherwise the payload
moves. A descriptor (:mod:`~dtlab.collectives.descriptor`) is ``8 + 2N`` int64: which
collective, algorithm, dtype, element count, root, reduce op, one more number (an all-to-all's
row width, a hierarchical all-reduce's ranks per node, ``algorithm="auto"``'s link model
fingerprint) and two lists of per-rank counts (an all-gather's ``sizes``; an all-to-all's send
and receive row counts).

The check runs in two rounds, and the second only when it is needed:

1. **digest** — every rank hashes its descriptor to a 62-bit number (BLAKE2b; computed once per
   distinct call signature and cached) and the group all-reduces ``[d, -d]`` with MAX. Every
   rank gets ``max d`` and ``min d`` alike; they are equal exactly when every rank asked the same
   (up to a 2⁻⁶² chance that two different descriptors collide). One all-reduce of two int64;
2. **descriptors** — only if the digests differ, or if the collective needs every rank's counts
   anyway (an all-to-all's splits, an all-gather without ``sizes``): the full descriptors are
   all-gathered and compared field by field, and the message names every rank's value.

Why two rounds and not one: the cost of the check is a synchronisation of the ranks, not its
bytes, and on gloo a collective's cost grows with its message count. Measured on the 2-core host
(busy with other jobs, load average 18; medians of 300, back to back): on 4 ranks the digest
round costs 0.5–0.7 ms, where gathering and comparing every descriptor on each call (the check
before) cost 2.9–3.1 ms — ~7 % of a 16 MiB ring all-reduce there (~40 ms); on 2 ranks 0.18 ms
against 0.20 ms. ``dtlab bench collectives`` prints the check's cost beside the ring's time.

Why every call, and not once per distinct signature: a rank whose call is new would check while
the others, trusting their cache, had already started the payload — the mismatch would hang
instead of raising. Why not a header on the first payload message, checked on receipt: it
compares each rank with its ring neighbour only, so the rank that finds a mismatch could not
stop the others before their payload moved, nor name every rank's value. What *is* kept per
signature is the digest (hashing costs nothing on a repeated call).

The first round is the same for every collective, so ranks that called *different* collectives
still meet in the same exchange, see different digests and raise together — they never wait in
two different exchanges. An all-gather with ``sizes`` takes the fast path too: ``sizes`` is in the
digest, and a rank whose own chunk does not hold ``sizes[rank]`` elements sends a digest no rank
can hold (``-1``), which sends everyone to round 2.

The exchanges are **control messages**, not payload:

* over a torch process group (``group=None`` or a ``ProcessGroup``) they are that group's own
  all-reduce and all-gather; over a plain list of ranks (or simulated ranks) they are Bruck's
  all-gather (Bruck et al., "Efficient algorithms for all-to-all communications in multiport
  message-passing systems", IEEE TPDS 1997): ``ceil(log2 N)`` rounds; in round ``k`` rank ``r``
  sends what it holds to ``r - 2^k`` and receives as much from ``r + 2^k``. Either way the
  check costs latency, not bandwidth (on gloo, point-to-point control messages right before a
  point-to-point payload slowed the 16 MiB ring by several ms; the group's collective did not,
  hence the two paths);
* their bytes are **not** added to :func:`~dtlab.collectives.p2p.comm_stats`, so the bytes a
  collective reports are still exactly its payload's, the formulas of :mod:`dtlab.cost`;
* each is drawn as its own span (kind ``other``) named ``"<collective> check (control)"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.distributed as dist

from dtlab.collectives.descriptor import CallDescriptor, _decode, _encode, digest
from dtlab.collectives.p2p import Peers


class CollectiveMismatch(ValueError):
    """The ranks of a collective were asked different things; raised on every rank at once."""


def _gather_rows(peers: Peers, mine: torch.Tensor, name: str) -> torch.Tensor:
    """Every rank's 1-D int64 ``mine``, as the rows of an ``N x len`` tensor in group order: the
    torch group's all-gather when the peers are one, else Bruck's all-gather of control messages."""
    n, r = peers.size, peers.rank
    held = torch.empty((n, mine.numel()), dtype=torch.int64, device=mine.device)
    if peers.torch_group is not None:
        peers.all_gather_control(held.view(-1), mine, name=name)
        return held
    held[0] = mine
    have, step = 1, 0
    while have < n:  # row i holds the row of rank r + i
        count = min(have, n - have)
        peers.exchange_control(
            sends=[((r - have) % n, held[:count])],
            recvs=[((r + have) % n, held[have : have + count])],
            name=name,
            step=step,
        )
        have, step = have + count, step + 1
    return torch.roll(held, shifts=r, dims=0)


def all_gather_descriptors(peers: Peers, call: CallDescriptor, device=None) -> list[CallDescriptor]:
    """Every rank's descriptor, in group order (round 2 of the check)."""
    n = peers.size
    mine = torch.tensor(_encode(call, n), dtype=torch.int64, device=device)
    rows = _gather_rows(peers, mine, f"{call.collective} check (control)").tolist()
    return [_decode(row, n) for row in rows]


NO_DIGEST = -1
"""The digest a rank sends when it knows its own call is wrong: no descriptor hashes to it."""


def digests_agree(peers: Peers, mine: int, name: str, device=None) -> bool:
    """Round 1: whether every rank of ``peers`` holds the digest ``mine`` (and none sent
    :data:`NO_DIGEST`). Every rank gets the same answer: over a torch group from one MAX
    all-reduce of ``[d, -d]`` (max and min of every rank's ``d``), else from Bruck's all-gather."""
    if peers.torch_group is not None:
        both = torch.tensor([mine, -mine], dtype=torch.int64, device=device)
        peers.all_reduce_control(both, name=name, op=dist.ReduceOp.MAX)
        highest, minus_lowest = both.tolist()
        return highest == -minus_lowest and highest != NO_DIGEST
    mine_row = torch.tensor([mine], dtype=torch.int64, device=device)
    held = _gather_rows(peers, mine_row, name).view(-1).tolist()
    return len(set(held)) == 1 and held[0] != NO_DIGEST


_MUST_AGREE = (
    ("collective", "which collective they called", "every rank must call the same collectives "
     "in the same order"),
    ("algorithm", "the algorithm", "pass the same algorithm= on every rank: each one is a "
     "different schedule of messages"),
    ("root", "the root", "pass the same root on every rank"),
    ("op", "the reduce op", "pass the same op on every rank"),
    ("dtype", "the dtype", "cast the tensor to one dtype on every rank"),
    ("detail", None, None),  # what it means depends on the collective: _DETAIL
    ("numel", "the number of elements", "pass a tensor with the same number of elements on "
     "every rank"),
)  # fmt: skip
_LINK_MODEL = (
    "the link model algorithm='auto' prices the schedules with (a fingerprint of α and the "
    "bandwidth; 0: none yet)",
    "call dtlab.collectives.fit_link_model() on every rank before the first auto call (or "
    "set_link_model(alpha_s, bandwidth) with the same numbers everywhere)",
)
_DETAIL = {
    "all_to_all": ("the elements per row", "give the rows the same shape on every rank"),
    "hierarchical_all_reduce": ("the ranks per node", "pass the same ranks_per_node everywhere"),
    "all_reduce": _LINK_MODEL,  # detail is used by algorithm="auto" only (collectives.auto)
    "reduce_scatter": _LINK_MODEL,
    "all_gather": _LINK_MODEL,
}


def describe_by_rank(values: Sequence, global_ranks: Sequence[int]) -> str:
    """``"rank 0: 1000; ranks [1, 2]: 1001"``: who passed what, ranks with equal values merged."""
    groups: dict[str, list[int]] = {}
    for rank, value in zip(global_ranks, values, strict=True):
        groups.setdefault(str(value), []).append(rank)
    return "; ".join(
        f"rank {ranks[0]}: {value}" if len(ranks) == 1 else f"ranks {ranks}: {value}"
        for value, ranks in groups.items()
    )


def check_agreement(
    peers: Peers,
    call: CallDescriptor,
    device=None,
    *,
    same_numel: bool = True,
    numels: Sequence[int] | None = None,
) -> list[CallDescriptor]:
    """Check ``call`` against every rank's and raise :class:`CollectiveMismatch` on every rank if
    any field that must be equal differs; returns every rank's descriptor.

    ``same_numel=False`` for collectives whose ranks hold different amounts (all-gather with
    ``sizes``, all-to-all): the caller checks their counts against each other. When every
    rank's element count is known to all in advance (an all-gather's ``sizes``), pass it as
    ``numels``: the check then needs only its first round when the ranks agree.
    """
    n = peers.size
    if n == 1:
        return [call]
    counts_known = same_numel or numels is not None
    hashed = call if same_numel else replace(call, numel=0)
    mine = digest(hashed, n)
    if numels is not None and (len(numels) != n or call.numel != numels[peers.rank]):
        mine = NO_DIGEST
    if digests_agree(peers, mine, f"{call.collective} check (control)", device) and counts_known:
        return [call] * n if same_numel else [replace(call, numel=int(k)) for k in numels]
    calls = all_gather_descriptors(peers, call, device)
    for field_name, what, advice in _MUST_AGREE:
        if field_name == "numel" and not same_numel:
            continue
        values = [getattr(c, field_name) for c in calls]
        if len(set(map(str, values))) == 1:
            continue
        if field_name == "detail":
            what, advice = _DETAIL.get(call.collective, ("a setting", "pass the same arguments"))
        # Ranks in different collectives would name different ones first: say it the same way.
        where = "" if field_name == "collective" else f"{call.collective}: "
        raise CollectiveMismatch(
            f"{where}the ranks disagree on {what} — "
            f"{describe_by_rank(values, peers.global_ranks)}. To fix: {advice}."
        )
    return calls


__all__ = [
    "CallDescriptor",
    "CollectiveMismatch",
    "all_gather_descriptors",
    "check_agreement",
    "describe_by_rank",
    "digest",
    "digests_agree",
]
