"""Async TP (collective matmul): the forward collectives of sequence parallelism cut into per-peer
chunks, each chunk's transfer hidden under the matmul of the chunk before it.

Wang et al., "Overlap Communication with Dependent Computation via Decomposition in Large Deep
Learning Models" (ASPLOS 2023) — the *collective matmul* of XLA on TPUs; PyTorch's version is
``torch.distributed._symmetric_memory`` (``fused_all_gather_matmul``,
``fused_matmul_reduce_scatter``) and the micro-pipeline TP pass of ``torch.compile``
(``torch._inductor.config._micro_pipeline_tp = True``), which rewrites an all-gather followed by
a matmul (and a matmul followed by a reduce-scatter) into those fused ops. Both are **GPU-only**:
they copy chunks between GPUs' symmetric-memory buffers with the copy engines (or NVSHMEM) while
the SMs multiply, so no gloo path exists; ``tests/test_gpu_overlap_tp.py`` runs them on CUDA.
Here the same decomposition runs on dtlab's point-to-point messages, so it works on any backend
and every byte is counted.

With sequence parallelism on ``t`` ranks a column-parallel layer needs the whole sequence of its
input (an all-gather) and a row-parallel layer's partial outputs are summed and scattered along
the sequence (a reduce-scatter). Both sit on the critical path: the next GEMM needs them.

:func:`all_gather_matmul` — ``Y = AllGather(X) · Wᵀ``, ``X`` this rank's ``s/t`` tokens. Ring of
``t`` steps: at step ``k`` this rank multiplies the chunk it got from rank ``r−k`` while it
forwards that chunk to rank ``r+1`` and receives rank ``r−k−1``'s from rank ``r−1``. Only the
first chunk is free (its own); every later transfer runs under the previous chunk's GEMM.

:func:`matmul_reduce_scatter` — ``Y_r = Σ_j (X_j · W_jᵀ)[chunk r]``: at step ``k`` this rank
computes the partial product of sequence chunk ``c = r−k−1`` while the running sum of the chunk
before travels to it; it adds the running sum it received to its partial and passes it on. After
``t`` steps each rank holds the full sum of its own chunk.

Bytes per rank are the ring collectives' exactly — ``(t−1)/t`` of the full tensor for each — in
``t−1`` messages of ``1/t``. What it costs: ``t`` GEMMs of ``s/t`` rows instead of one of ``s``
(smaller GEMMs run below peak on a GPU), a pipeline fill (the first step's GEMM hides nothing,
the last transfer of the reduce-scatter hides nothing), and ``t`` waits instead of one.

Forward only: these are the forward's collectives (the ones exposed without async TP; the
backward's input-gradient reduction hides behind wgrad, :mod:`.backward_overlap`). Results equal
plain sequence-parallel TP: the gather's GEMMs are row blocks of the same product (bit-identical
on CPU), the scatter's sums add the same partials in ring order (equal to fp32 rounding).

Spans: ``async_tp.gemm`` (compute, labelled ``chunk``), ``async_tp.all_gather`` /
``async_tp.reduce_scatter`` (comm, one per step) and their ``wait:…`` (idle: the exposed part).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dtlab import trace
from dtlab.comm import Communicator

SEQ_DIM = 1


def _check_tokens(tokens: int, t: int) -> None:
    if tokens % t:
        raise ValueError(
            f"async TP cuts the sequence into one chunk per rank: {tokens} tokens do not split "
            f"over {t} ranks; feed a sequence length that is a multiple of {t}"
        )


def all_gather_matmul(x: torch.Tensor, weight: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """``AllGather_seq(x) · weightᵀ``, each chunk's transfer under the previous chunk's GEMM.

    ``x``: ``(b, s/t, in)``, this rank's sequence shard; ``weight``: ``(out/t, in)``, this rank's
    column shard. Returns ``(b, s, out/t)`` — what ``gather_along(x, 1)`` then ``F.linear`` give.
    """
    t, r = comm.world_size, comm.rank
    chunk_len = x.shape[SEQ_DIM]
    out = x.new_empty((x.shape[0], t * chunk_len, weight.shape[0]))
    current = x.contiguous()
    for step in range(t):
        owner = (r - step) % t  # whose tokens ``current`` holds
        pending = None
        if step < t - 1:  # pass the chunk on while multiplying it
            incoming = torch.empty_like(current)
            pending = comm.start_exchange(
                sends=[((r + 1) % t, current)],
                recvs=[((r - 1) % t, incoming)],
                name="async_tp.all_gather",
                op="all_gather",
            )
        with trace.span("async_tp.gemm", kind="compute", chunk=owner):
            out[:, owner * chunk_len : (owner + 1) * chunk_len] = F.linear(current, weight)
        if pending is not None:
            pending.wait()
            current = incoming
    return out


def matmul_reduce_scatter(
    x: torch.Tensor, weight: torch.Tensor, comm: Communicator
) -> torch.Tensor:
    """``ReduceScatter_seq(x · weightᵀ)``, each partial sum's transfer under the next GEMM.

    ``x``: ``(b, s, in/t)``, this rank's feature shard (a column layer's output); ``weight``:
    ``(out, in/t)``, this rank's row shard. Returns ``(b, s/t, out)``, this rank's sequence chunk
    of the sum over ranks — what ``F.linear`` then ``reduce_scatter_along(·, 1)`` give.
    """
    t, r = comm.world_size, comm.rank
    _check_tokens(x.shape[SEQ_DIM], t)
    chunk_len = x.shape[SEQ_DIM] // t
    running, pending, incoming = None, None, None
    for step in range(t):
        chunk = (r - step - 1) % t  # the last step's chunk is this rank's own
        rows = x[:, chunk * chunk_len : (chunk + 1) * chunk_len]
        with trace.span("async_tp.gemm", kind="compute", chunk=chunk):
            partial = F.linear(rows, weight)
        if pending is not None:
            pending.wait()
            partial = incoming + partial
        if step == t - 1:
            return partial
        running, incoming = partial.contiguous(), torch.empty_like(partial)
        pending = comm.start_exchange(
            sends=[((r + 1) % t, running)],
            recvs=[((r - 1) % t, incoming)],
            name="async_tp.reduce_scatter",
            op="reduce_scatter",
        )
    raise AssertionError("unreachable: the loop returns on its last step")


def collective_matmul_exposed_seconds(transfer_s: float, gemm_s: float, t: int) -> float:
    """The model of what async TP leaves exposed of an all-gather → matmul on ``t`` ranks.

    Unchunked, the rank waits for the whole all-gather (``transfer_s``) before the GEMM
    (``gemm_s``). Chunked, the ring's ``t−1`` transfers of ``transfer_s/(t−1)`` each run under a
    GEMM of ``gemm_s/t``; each waits only for what its GEMM did not cover, so
    ``(t−1)·max(0, transfer_s/(t−1) − gemm_s/t)`` stays exposed (the first chunk, this rank's
    own, has nothing to wait for). Smaller GEMMs running below peak is the price, not modelled.
    """
    if t < 2:
        return 0.0
    return (t - 1) * max(0.0, transfer_s / (t - 1) - gemm_s / t)
