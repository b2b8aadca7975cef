"""The alpha-beta (latency-bandwidth) model of a link, and ring all-reduce as its worked example.

Sending one message of ``n`` bytes over a link costs ``α + n·β``: a fixed start-up latency ``α``
(seconds: software stack, kernel launch, NIC/switch traversal) plus ``β`` seconds per byte, where
``β = 1 / bandwidth``. Small messages are latency-bound (``α`` dominates), large ones are
bandwidth-bound (``n·β`` dominates); the crossover size is ``α / β = α · bandwidth`` bytes.

This is the Hockney model (Hockney 1994, "The communication challenge for MPP"), used for the
collective algorithms of MPICH by Thakur, Rabenseifner & Gropp (2005, "Optimization of collective
communication operations in MPICH"), whose formulas NCCL's ring and tree algorithms follow.

Ring all-reduce (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
workstations"): the buffer of ``nbytes`` is cut into ``n`` chunks of ``nbytes/n``. A reduce-scatter
takes ``n-1`` steps, in each of which every rank sends one chunk to its right neighbour and adds
the chunk arriving from its left; after it, rank ``i`` owns the full sum of chunk ``i``. An
all-gather then takes ``n-1`` more steps passing the finished chunks around the ring. Every rank
sends (and receives) ``2(n-1)`` messages of ``nbytes/n`` bytes, so::

    T_ring_allreduce = 2(n-1)·α + 2(n-1)/n · nbytes · β

The bandwidth term approaches ``2·nbytes·β`` as ``n`` grows: independent of the number of ranks,
which is why the ring is "bandwidth optimal". The latency term grows linearly in ``n``, which is
why trees and hierarchical algorithms win for small messages or very many ranks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """One link in the alpha-beta model.

    Attributes:
        alpha_s: start-up latency per message, in seconds.
        bandwidth_bytes_per_s: sustained bandwidth in bytes per second, *per direction*
            (what one sender can push to one receiver while the reverse direction is also busy).
        name: a label for plots and error messages.
    """

    alpha_s: float
    bandwidth_bytes_per_s: float
    name: str = ""

    def __post_init__(self) -> None:
        if self.alpha_s < 0:
            raise ValueError(f"link latency alpha_s={self.alpha_s} must be >= 0 seconds")
        if self.bandwidth_bytes_per_s <= 0:
            raise ValueError(
                f"link bandwidth {self.bandwidth_bytes_per_s} must be > 0 bytes/s "
                "(e.g. 50e9 for an InfiniBand NDR port)"
            )

    @property
    def beta_s_per_byte(self) -> float:
        """β: seconds per byte, the inverse of the bandwidth."""
        return 1.0 / self.bandwidth_bytes_per_s

    def time(self, nbytes: float, messages: int = 1) -> float:
        """Seconds to send ``nbytes`` in total as ``messages`` back-to-back messages.

        ``messages·α + nbytes·β``: every message pays the latency once; the bytes pay bandwidth.
        """
        if nbytes < 0 or messages < 0:
            raise ValueError(f"nbytes={nbytes} and messages={messages} must be >= 0")
        return messages * self.alpha_s + nbytes * self.beta_s_per_byte

    def crossover_bytes(self) -> float:
        """Message size at which latency and bandwidth terms are equal (``α / β``)."""
        return self.alpha_s * self.bandwidth_bytes_per_s


def ring_allreduce_time(nbytes: float, n: int, link: Link) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` per rank over ``n`` ranks.

    ``2(n-1)·α + 2(n-1)/n · nbytes · β`` (see the module docstring for who sends what to whom).
    One rank has nothing to exchange, so ``n == 1`` costs zero.
    """
    if n < 1:
        raise ValueError(f"a ring needs at least 1 rank, got n={n}")
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes} must be >= 0")
    steps = 2 * (n - 1)
    return steps * link.alpha_s + steps / n * nbytes * link.beta_s_per_byte
