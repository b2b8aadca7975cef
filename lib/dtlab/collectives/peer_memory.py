"""One-shot and two-shot all-reduce: every rank talks to every peer directly, in one or two steps.

The ring (:mod:`~dtlab.collectives.allreduce`) is bandwidth-optimal but pays ``2(N-1)`` message
latencies in sequence. Where every GPU can reach every other in one hop — an NVSwitch node, whose
GPUs map each other's buffers into their address space ("symmetric memory", CUDA IPC or
multicast objects) — a rank can read or write all its peers' buffers at once, and two shorter
schedules win small and medium buffers:

=============  ===================================================  ================  ==========================
schedule       who sends what to whom                               bytes sent/rank   α-β time (full mesh)
=============  ===================================================  ================  ==========================
``one_shot``   every rank sends its whole buffer to every peer      ``(N-1)·M``       ``α + (N-1)·M·β``
               (on a GPU: reads every peer's buffer) and adds all
               ``N`` copies itself, in rank order
``two_shot``   step 1: rank ``j`` gets chunk ``j`` of every buffer  ``2(N-1)/N·M``    ``2α + 2(N-1)/N·M·β``
               and adds them (a direct reduce-scatter); step 2: it
               sends its summed chunk to every peer (all-gather)
=============  ===================================================  ================  ==========================

``β`` is the seconds per byte of one rank's link, which all its ``N-1`` transfers share; the
latency is paid once per step because the transfers of a step run at the same time (one kernel
reading ``N-1`` peers, or here ``N-1`` messages posted together). Two-shot moves the ring's bytes
in 2 steps instead of ``2(N-1)``; one-shot moves ``N/2`` times the ring's bytes but needs a
single step and no second synchronisation. So one-shot wins the smallest buffers and two-shot
the rest (:func:`dtlab.cost.crossover_bytes`; on NVLink 4 with ``α`` = 2 µs, one-shot beats
two-shot below ~170 KB and the ring below ~2.2 MB at ``N`` = 8). In this model two-shot never
loses to the ring — same bytes, fewer steps. What caps it in practice is outside the model:
reading ``N-1`` peers at once takes many SMs away from compute, the input must first sit in a
pre-registered symmetric buffer (a copy), and at large sizes NVLS moves fewer bytes than any of
them (``(1 + 1/N)·M``, :mod:`dtlab.cost.nccl_protocols`). So engines use them up to a size cap
and call NCCL above it.

Who uses them: PyTorch's symmetric-memory ops (``torch.ops.symm_mem.one_shot_all_reduce``,
``two_shot_all_reduce_``, and the NVLS ``multimem_*`` variants, ``torch.distributed._symmetric_memory``)
for latency-bound tensor-parallel all-reduces and for fusing a collective with a matmul; inference
engines' custom all-reduces (vLLM's one-stage/two-stage kernels, TensorRT-LLM's ONESHOT/TWOSHOT
strategies, SGLang through PyTorch's symmetric memory) for the small all-reduces of decoding —
a few KiB to a few MiB per token step, where NCCL's ring latency would dominate — falling back
to NCCL above a size cap.

Here the transfers are dtlab's counted point-to-point messages (one :meth:`Peers.exchange` step
each), so the bytes each rank reports are measured and must equal the table. Every rank adds the
``N`` contributions in rank order, so the result is bitwise the same on every rank (a real
one-shot kernel does the same for the same reason). Not offered to ``algorithm="auto"``: its
link model is one port per rank, under which a step to ``N-1`` peers is not one latency.
"""

from __future__ import annotations

import torch

from dtlab.collectives.agreement import CallDescriptor, check_agreement
from dtlab.collectives.ops import chunk_bounds, combine_, finish_, flat_view, normalize_op
from dtlab.collectives.p2p import Group, Peers, peers_of


def _sum_in_rank_order(out: torch.Tensor, parts: list[torch.Tensor], op: str, n: int) -> None:
    """``out = parts[0] ⊕ parts[1] ⊕ … ⊕ parts[N-1]``, in that order on every rank."""
    out.copy_(parts[0])
    for part in parts[1:]:
        combine_(out, part, op)
    finish_(out, op, n)


def all_reduce_one_shot_(flat: torch.Tensor, op: str, peers: Peers) -> None:
    """One step: send ``flat`` to every peer, receive every peer's, add all ``N`` in rank order."""
    n, r = peers.size, peers.rank
    inbox = flat.new_empty((n, flat.numel()))
    others = [p for p in range(n) if p != r]
    peers.exchange(
        sends=[(p, flat) for p in others],
        recvs=[(p, inbox[p]) for p in others],
        name="all_reduce.one_shot",
    )
    inbox[r] = flat
    _sum_in_rank_order(flat, list(inbox), op, n)


def all_reduce_two_shot_(flat: torch.Tensor, op: str, peers: Peers) -> None:
    """Step 1: chunk ``j`` of my buffer to rank ``j``, every peer's copy of my chunk to me; add
    them in rank order. Step 2: my summed chunk to every peer, theirs into place."""
    n, r = peers.size, peers.rank
    bounds = chunk_bounds(flat.numel(), n)
    lo, hi = bounds[r]
    others = [p for p in range(n) if p != r]
    inbox = flat.new_empty((n, hi - lo))
    peers.exchange(
        sends=[(p, flat[slice(*bounds[p])]) for p in others],
        recvs=[(p, inbox[p]) for p in others],
        name="all_reduce.two_shot reduce-scatter",
        step=0,
    )
    inbox[r] = flat[lo:hi]
    _sum_in_rank_order(flat[lo:hi], list(inbox), op, n)
    peers.exchange(
        sends=[(p, flat[lo:hi]) for p in others],
        recvs=[(p, flat[slice(*bounds[p])]) for p in others],
        name="all_reduce.two_shot all-gather",
        step=1,
    )


PEER_MEMORY_ALL_REDUCES = {"one_shot": all_reduce_one_shot_, "two_shot": all_reduce_two_shot_}


def peer_all_reduce(
    tensor: torch.Tensor, op: str = "sum", *, algorithm: str = "one_shot", group: Group = None
) -> torch.Tensor:
    """All-reduce ``tensor`` in place by ``"one_shot"`` or ``"two_shot"`` (see the module table).

    Checked like every dtlab collective: ranks that disagree on length, dtype, op or schedule
    all raise :class:`~dtlab.collectives.agreement.CollectiveMismatch` before anything moves.
    """
    if algorithm not in PEER_MEMORY_ALL_REDUCES:
        raise ValueError(
            f"unknown peer-memory all-reduce {algorithm!r}; choose 'one_shot' or 'two_shot' "
            "(the ring and the trees are dtlab.collectives.all_reduce)"
        )
    op = normalize_op(op)
    peers = peers_of(group)
    call = CallDescriptor("all_reduce", algorithm, tensor.dtype, tensor.numel(), op=op)
    check_agreement(peers, call, tensor.device)
    flat, is_view = flat_view(tensor)
    if peers.size == 1 or flat.numel() == 0:
        finish_(flat, op, peers.size)
    else:
        PEER_MEMORY_ALL_REDUCES[algorithm](flat, op, peers)
    if not is_view:
        tensor.copy_(flat.view_as(tensor))
    return tensor
