"""Algorithm bandwidth and bus bandwidth, exactly as nccl-tests defines them.

nccl-tests (github.com/NVIDIA/nccl-tests, ``doc/PERFORMANCE.md``) reports two numbers per size:

* ``algbw = size / time`` — bytes of the operation's *size* per second of wall time.
* ``busbw = algbw · factor(op, n)`` — the bandwidth each rank's link would need to run the
  optimal (ring-style) algorithm in that time. It is comparable across operations and rank counts
  and with the hardware's per-direction link bandwidth; ``algbw`` is not.

What ``size`` (our ``nbytes``) means differs by operation, and getting it wrong is the usual way
to misread a table:

* **all_reduce**: the buffer each rank holds (input size = output size). Factor ``2(n-1)/n``: a
  ring sends ``2(n-1)`` chunks of ``size/n`` per rank.
* **all_gather**: the **output** (receive) size, i.e. ``n ×`` the per-rank input shard.
  Factor ``(n-1)/n``: each rank receives the ``n-1`` shards it does not have.
* **reduce_scatter**: the **input** (send) size, i.e. ``n ×`` the per-rank output shard.
  Factor ``(n-1)/n``.
* **all_to_all** (``alltoall``): the per-rank send buffer (= receive buffer); ``1/n`` of it stays
  local, so factor ``(n-1)/n``.
* **broadcast**, **reduce**: the buffer size; factor ``1`` (a pipelined chain moves every byte
  over every link once).
* **send_recv** (``sendrecv``): the buffer one rank sends; factor ``1``.
"""

from __future__ import annotations

BUSBW_OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "send_recv",
)

_ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "sendrecv": "send_recv",
    "send": "send_recv",
    "recv": "send_recv",
}


def _canonical_op(op: str) -> str:
    key = op.strip().lower().replace("-", "_")
    key = _ALIASES.get(key.replace("_", ""), key)
    if key not in BUSBW_OPS:
        raise ValueError(f"unknown collective {op!r}; choose one of {BUSBW_OPS}")
    return key


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: the operation's size (see module docstring) over time."""
    if seconds <= 0:
        raise ValueError(f"seconds={seconds} must be > 0 to compute a bandwidth")
    return nbytes / seconds


def busbw_factor(op: str, n: int) -> float:
    """The nccl-tests factor turning algbw into busbw for ``op`` over ``n`` ranks.

    all_reduce ``2(n-1)/n``; all_gather, reduce_scatter, all_to_all ``(n-1)/n``;
    broadcast, reduce, send_recv ``1``.
    """
    if n < 1:
        raise ValueError(f"number of ranks n={n} must be >= 1")
    op = _canonical_op(op)
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def busbw(op: str, nbytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth in bytes/s: ``algbw(nbytes, seconds) · busbw_factor(op, n)``."""
    return algbw(nbytes, seconds) * busbw_factor(op, n)
