"""NCCL's three wire protocols and four all-reduce algorithms, as the cost model sees them.

**Protocols** (how a chunk crosses a link; NCCL source ``src/include/device.h`` and the NCCL
environment-variable docs for ``NCCL_PROTO``):

* **Simple** — large chunks, a memory fence and a flag per chunk: full link bandwidth, but the
  fence costs a few microseconds per step. Wins for large messages.
* **LL** (low latency) — 8-byte stores that carry 4 bytes of data and a 4-byte flag, so the
  receiver polls the data itself, no fence: the lowest latency, **half** the bandwidth.
  Wins for small messages (a few KiB).
* **LL128** — 128-byte lines with 120 bytes of data and an 8-byte flag: near-LL latency at
  ``120/128 ≈ 94%`` of the bandwidth. Needs hardware that keeps 128-byte stores in order
  (NVLink); NCCL enables it only where that holds. Wins in the middle range.

**Algorithms** (``NCCL_ALGO``): **Ring** (bandwidth-optimal, ``2(N-1)`` latency steps),
**Tree** (double binary tree, ``O(log N)`` steps: small and medium messages at scale),
**NVLS** (NVLink SHARP: the NVSwitch reduces and multicasts; H100 and later), **CollNet** (SHARP in
InfiniBand switches across nodes). With NVLS or CollNet the switch does the adding: each GPU
reduces one ``1/N`` slice (the switch reads that slice from all ``N`` GPUs, so each GPU's buffer
leaves it once, ``M`` bytes, and the sum ``M/N`` comes back) and multicasts its summed slice
(``M/N`` out, every slice ``M`` in). Each GPU therefore sends and receives ``(1 + 1/N)·M`` per
direction instead of the ring's ``2(N-1)/N·M``. nccl-tests still reports ``busbw = algbw ·
2(N-1)/N``, which over-states what the link carries by ``2(N-1)/(N+1)`` (1.56× at N = 8) and can
exceed the link's bandwidth: busbw is a normalisation for comparing with the ring, not what the
link carries. The link caps ``algbw`` at ``B·N/(N+1)``: 400 GB/s on NVLink 4 (450 GB/s) at N = 8.
"""

from __future__ import annotations

PAYLOAD_FRACTION = {"simple": 1.0, "ll": 4 / 8, "ll128": 120 / 128}
"""Share of each transfer that is data (the rest is flags)."""


def protocol_bandwidth(protocol: str, link_bytes_per_s: float) -> float:
    """Data bandwidth (bytes/s) a protocol gets from a link of ``link_bytes_per_s``."""
    key = protocol.strip().lower()
    if key not in PAYLOAD_FRACTION:
        raise ValueError(f"unknown NCCL protocol {protocol!r}; choose one of Simple, LL, LL128")
    if link_bytes_per_s <= 0:
        raise ValueError(f"link bandwidth {link_bytes_per_s} must be > 0 bytes/s")
    return PAYLOAD_FRACTION[key] * link_bytes_per_s


def in_network_busbw(nbytes: float, seconds: float, n: int) -> dict[str, float]:
    """What nccl-tests prints for an all-reduce the switch reduced (NVLS/SHARP), against the wire.

    ``M`` = ``nbytes`` all-reduced over ``n`` GPUs in ``seconds``:

    * ``algbw`` = ``M/t``;
    * ``busbw`` = ``M/t · 2(N-1)/N``, nccl-tests' ring normalisation;
    * ``sent_per_gpu`` = ``(1 + 1/N)·M / t``, the bytes/s each GPU really puts on its link (and
      takes off it): its whole buffer read by the switch for the reduction, plus the ``1/N`` slice
      it reduced, sent back for the multicast;
    * ``busbw_over_sent`` = ``2(N-1)/(N+1)``, how far busbw over-states the wire.

    A time whose ``sent_per_gpu`` exceeds the link's bandwidth is impossible on that link.
    """
    if seconds <= 0 or n < 2:
        raise ValueError(f"need seconds > 0 and n >= 2, got {seconds}, {n}")
    algbw = nbytes / seconds
    return {
        "algbw": algbw,
        "busbw": algbw * 2 * (n - 1) / n,
        "sent_per_gpu": algbw * (n + 1) / n,
        "busbw_over_sent": 2 * (n - 1) / (n + 1),
    }


def in_network_bytes_per_gpu(nbytes: float, n: int) -> float:
    """Bytes each GPU sends (and receives) in an NVLS/SHARP all-reduce of ``nbytes`` over ``n``
    GPUs: ``(1 + 1/N)·M`` — more than the ring's ``2(N-1)/N·M`` at ``N = 2``, equal at 3, fewer
    from 4 on (:func:`dtlab.collectives.switch_all_reduce` counts it on ranks)."""
    if n < 2:
        raise ValueError(f"an all-reduce across GPUs needs n >= 2, got {n}")
    return (1 + 1 / n) * nbytes


def in_network_saves_bytes_from() -> int:
    """The smallest ``N`` at which in-network reduction sends fewer bytes per GPU than the ring:
    ``1 + 1/N < 2(N-1)/N`` ⇔ ``N > 3``."""
    n = 2
    while in_network_bytes_per_gpu(1.0, n) >= 2 * (n - 1) / n:
        n += 1
    return n
