"""Before a collective moves its payload, its ranks check that they were all asked the same thing.

A collective whose ranks disagree — one passes 1000 elements and another 1001, one broadcasts
from root 0 and another from root 1, one all-reduces while another all-gathers — does not fail
in the transport: a rank waits for bytes that no rank will send, and the job hangs until a
timeout (NCCL's watchdog: ten minutes). So every public collective in this package first
**all-gathers a descriptor of the call** from every rank and compares them. On a disagreement
*every* rank raises :class:`CollectiveMismatch`, naming the ranks and what each one passed;
otherwise the payload moves. A descriptor is ``8 + 2N`` int64: which collective, algorithm,
dtype, element count, root, reduce op, one more number (an all-to-all's row width, a
hierarchical all-reduce's ranks per node, ``algorithm="auto"``'s link model fingerprint) and two
lists of per-rank counts (an all-gather's ``sizes``; an all-to-all's send and receive row counts).

The exchange is a **control message**, not payload:

* over a torch process group (``group=None`` or a ``ProcessGroup``) it is that group's own
  all-gather of the descriptors; over a plain list of ranks (or simulated ranks) it is Bruck's
  all-gather (Bruck et al., "Efficient algorithms for all-to-all communications in multiport
  message-passing systems", IEEE TPDS 1997): ``ceil(log2 N)`` rounds; in round ``k`` rank ``r``
  sends the descriptors it holds to ``r - 2^k`` and receives as many from ``r + 2^k``. Either
  way it costs latency, not bandwidth: about ``log2 N · α`` plus one synchronisation of the
  ranks. On two gloo CPU ranks that is 0.2–0.4 ms back to back, and up to ~2 ms (~10% of a
  16 MiB ring all-reduce, less beyond) on a busy 2-core host, where every wake-up is slow.
  (There, point-to-point control messages right before a point-to-point payload slowed the
  16 MiB ring by several ms more; the group's collective did not, hence the two paths);
* its bytes are **not** added to :func:`~dtlab.collectives.p2p.comm_stats`, so the bytes a
  collective reports are still exactly its payload's, the formulas of :mod:`dtlab.cost`;
* it is drawn as its own span (kind ``other``) named ``"<collective> check (control)"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dtlab.collectives.p2p import Peers

_WORDS = (
    "",
    *("all_reduce", "broadcast", "reduce", "reduce_scatter", "all_gather", "all_to_all"),
    *("gather", "scatter", "hierarchical_all_reduce"),
    *("naive", "ring", "recursive_doubling", "rabenseifner", "binary_tree"),
    *("flat", "binomial", "chain", "pairwise"),
    *("sum", "avg", "max", "min"),
    *("double_binary_tree", "recursive_halving", "auto"),
)
_DTYPES = tuple(
    getattr(torch, name)
    for name in (
        *("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8"),
        *("uint8", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2"),
    )
    if hasattr(torch, name)
)
_HEADER = 8


class CollectiveMismatch(ValueError):
    """The ranks of a collective were asked different things; raised on every rank at once."""


@dataclass(frozen=True)
class CallDescriptor:
    """What one rank asked a collective to do (the fields that every rank must agree on)."""

    collective: str
    algorithm: str = ""
    dtype: torch.dtype | None = None
    numel: int = 0
    root: int = -1
    op: str = ""
    detail: int = 0  # all-to-all: elements per row; hierarchical: ranks per node; auto: link
    counts: tuple[int, ...] | None = None  # all-gather: sizes; all-to-all: send_splits
    more_counts: tuple[int, ...] | None = None  # all-to-all: recv_splits


def _dtype_code(dtype: torch.dtype | None) -> int:
    if dtype is None:
        return -1
    return _DTYPES.index(dtype) if dtype in _DTYPES else 100 + dtype.itemsize


def _dtype_of(code: int) -> torch.dtype | str | None:
    if code < 0:
        return None
    return _DTYPES[code] if code < 100 else f"a {code - 100}-byte dtype"


def _encode(call: CallDescriptor, n: int) -> list[int]:
    def counts(values: tuple[int, ...] | None) -> list[int]:
        return [-1] * n if values is None else list(values)

    return [
        _WORDS.index(call.collective),
        _WORDS.index(call.algorithm),
        _dtype_code(call.dtype),
        call.numel,
        call.root,
        _WORDS.index(call.op),
        call.detail,
        0,
        *counts(call.counts),
        *counts(call.more_counts),
    ]


def _decode(row: list[int], n: int) -> CallDescriptor:
    def counts(values: list[int]) -> tuple[int, ...] | None:
        return None if values and values[0] < 0 else tuple(values)

    return CallDescriptor(
        _WORDS[row[0]],
        _WORDS[row[1]],
        _dtype_of(row[2]),
        row[3],
        row[4],
        _WORDS[row[5]],
        row[6],
        counts(row[_HEADER : _HEADER + n]),
        counts(row[_HEADER + n :]),
    )


def all_gather_descriptors(peers: Peers, call: CallDescriptor, device=None) -> list[CallDescriptor]:
    """Every rank's descriptor, in group order: by the torch group's all-gather when the peers
    are one, else by Bruck's all-gather of point-to-point control messages."""
    n, r = peers.size, peers.rank
    name = f"{call.collective} check (control)"
    mine = torch.tensor(_encode(call, n), dtype=torch.int64, device=device)
    if peers.torch_group is not None:
        everyone = torch.empty((n, mine.numel()), dtype=torch.int64, device=device)
        peers.all_gather_control(everyone.view(-1), mine, name=name)
        return [_decode(row, n) for row in everyone.tolist()]
    held = torch.empty((n, mine.numel()), dtype=torch.int64, device=device)
    held[0] = mine
    have, step = 1, 0
    while have < n:  # row i holds the descriptor of rank r + i
        count = min(have, n - have)
        peers.exchange_control(
            sends=[((r - have) % n, held[:count])],
            recvs=[((r + have) % n, held[have : have + count])],
            name=name,
            step=step,
        )
        have, step = have + count, step + 1
    rows = torch.roll(held, shifts=r, dims=0).tolist()
    return [_decode(row, n) for row in rows]


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
    peers: Peers, call: CallDescriptor, device=None, *, same_numel: bool = True
) -> list[CallDescriptor]:
    """Exchange descriptors (a control message) and raise :class:`CollectiveMismatch` on every
    rank if any field that must be equal differs; returns every rank's descriptor.

    ``same_numel=False`` for collectives whose ranks hold different amounts (all-gather with
    ``sizes``, all-to-all): the caller checks their counts against each other.
    """
    if peers.size == 1:
        return [call]
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
]
