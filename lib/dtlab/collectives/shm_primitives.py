"""The two operating-system objects :mod:`dtlab.collectives.shm_transport` is built of.

A shared-memory segment mapped by a rank that does not own it (:func:`attach_untracked`: only the
owner may unlink it), and a doorbell (:class:`Doorbell`): one end of a named FIFO, where
``ring()`` writes one byte and ``wait()`` sleeps in ``poll`` until bytes arrive — a waiting rank
blocks in the kernel instead of spinning, which on a 2-core host would steal its neighbour's
CPU. End-of-file on a doorbell means the peer closed it (died or raised): :class:`ShmPeerGone`.
They stand alone because they are plumbing; the transport module is what moves where.
"""

from __future__ import annotations

import os
import select
import sys
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

TIMEOUT_S = float(os.environ.get("DTLAB_SHM_TIMEOUT_S", "600"))
"""How long a rank waits at a doorbell before it gives up (a peer alive but stuck). A peer that
*dies* is noticed at once (end-of-file), and a Cluster's own timeout fires first."""


class ShmPeerGone(RuntimeError):
    """A ring neighbour closed its end of a shared-memory channel (it died or raised)."""


def attach_untracked(name: str) -> SharedMemory:
    """Map an existing segment without registering it with the resource tracker: only its owner
    unlinks it. Before Python 3.13 (no ``track=False``) every attach registers the name too
    (bpo-39959) and the tracker, shared by processes forked from one parent, then sees the
    name unregistered twice or unlinks it at exit; so registration is skipped for the attach."""
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, track=False)
    register = resource_tracker.register
    resource_tracker.register = lambda *args: None
    try:
        return SharedMemory(name=name)
    finally:
        resource_tracker.register = register


class Doorbell:
    """One end of a FIFO: ``ring()`` writes a byte, ``wait()`` returns how many have arrived."""

    def __init__(self, fd: int, peer: str, what: str, timeout_s: float) -> None:
        self.fd, self.peer, self.what, self.timeout_ms = fd, peer, what, int(timeout_s * 1000)
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def ring(self) -> None:
        try:
            os.write(self.fd, b"\1")
        except BrokenPipeError as e:
            raise ShmPeerGone(
                f"{self.peer} closed its end of the {self.what} doorbell: it died or raised"
            ) from e

    def wait(self) -> int:
        if not self._poll.poll(self.timeout_ms):
            raise TimeoutError(
                f"{self.peer} rang no {self.what} doorbell for {self.timeout_ms / 1000:.0f} s: "
                "it is stuck "
                "(raise DTLAB_SHM_TIMEOUT_S if it is only slow)"
            )
        try:
            got = os.read(self.fd, 4096)
        except BlockingIOError:  # woken with nothing to read after all: wait again
            return self.wait()
        if not got:
            raise ShmPeerGone(
                f"{self.peer} closed its end of the {self.what} doorbell: it died or raised"
            )
        return len(got)

    def close(self) -> None:
        os.close(self.fd)
