"""Shared-memory channels between ranks of one host: the transport of ``all_reduce(transport="shm")``.

Over gloo every dtlab message is a TCP loopback send (:class:`~dtlab.collectives.transport.TorchTransport`):
the sender's kernel copies the bytes into a socket buffer, the receiver's kernel copies them out,
gloo's I/O thread wakes for each piece, and only then may the ring add them. gloo offers nothing
faster for CPU tensors (its transports are TCP, ibverbs and libuv — all sockets or a NIC). NCCL
does not use sockets inside a node either: its **P2P** transport has a GPU write into (or read
from) its peer's buffer over NVLink/PCIe, and its **SHM** transport moves data through a
shared-memory FIFO in host memory when P2P is unavailable (NCCL ``src/transport/p2p.cc``,
``shm.cc``). This module is the SHM idea for CPU ranks.

What moves where, for each directed ring pair ``left → me`` (a :class:`Channel`):

* **the buffer** — a POSIX shared-memory segment (:class:`multiprocessing.shared_memory.SharedMemory`)
  owned by the receiver, cut into ``S`` slots of one ring segment each. The sender writes
  segment ``k`` of the pair's stream into slot ``k % S``; the receiver reads it *in place*
  through a tensor view (``torch.frombuffer``) — its reduction is ``torch.add(mine, slot,
  out=next_slot)``: the peer's bytes are read straight from shared memory and the sum is written
  straight into the next rank's slot. No kernel copy, no receive scratch buffer.
* **two doorbells** — named FIFOs (``os.mkfifo``): on ``ready`` the sender writes one byte per
  segment written, on ``free`` the receiver one byte per slot it is done with. A blocked rank
  sleeps in ``poll`` (no spinning: on a 2-core host a spinning rank steals the CPU its peer needs
  to produce the bytes it waits for). A rank that dies closes its ends: its neighbours read
  end-of-file and raise :class:`ShmPeerGone` at once, and a rank that raises closes its own
  ends, so the failure travels round the ring instead of leaving ranks waiting.

Set-up, once per process group and buffer size (:func:`channels_for`, reused by later calls):
each rank creates its inbound segment under a random name and its FIFOs in a private temporary
directory (mode 0700), the names travel by one ``all_gather_object`` over the group (control
messages), hostnames are compared (shared memory cannot cross hosts: ranks of different hosts
get a ``ValueError``), each rank maps its right neighbour's segment and opens the FIFO ends,
and then **every name is unlinked at once**: the mappings and open descriptors keep working,
but nothing is left in ``/dev/shm`` or ``/tmp`` even if a rank is killed.

Why ``S`` = segments per chunk + 1: a send never waits for a receive to be posted (the slot is
the posted receive), so the sender may run up to ``S`` segments ahead. Each rank sends a
chunk's ``K`` segments of step 0 up front and then one segment per segment it receives; a rank
waiting for a free slot still holds the slot it is folding from, so with ``S = K`` all ranks
could wait for each other for ever; with ``S ≥ K + 1`` some rank can always move. The price:
a rank's inbox holds its chunk plus one segment (``M/N`` + 4 MiB: 36 MiB for 64 MiB on 2
ranks), where NCCL keeps a fixed 4 MiB per channel and makes its sender wait for credits. A
later call of another size re-cuts the same segment (:meth:`Channel.cut`) if it fits, and
only a bigger one makes a new segment.

Why it is opt-in (``all_reduce(..., transport="shm")``) and not the default: it cannot cross
hosts, it needs ``/dev/shm`` room for a chunk per rank, it serves only the main thread's calls
over a torch group (not simulated ranks, not a background stream's tagged messages), it carries
the ring only — and it is not always faster. In one sweep here (load average 6–7) it beat the
socket ring at every size from 1 KiB to 64 MiB (1.1–7×) and gloo's all-reduce on 4 ranks, but
on 2 ranks it lost to gloo below 2 MiB (0.5–0.9×): there the agreement check alone costs about
as much as gloo's whole all-reduce.

Measured on the 2-core host (gloo, ``shm_ring_all_reduce_`` interleaved with
``dist.all_reduce``, 9 iterations, medians of iteration-paired ratios, load average 5–6 from
other jobs, 2026-11-27): segments of 1, 4 and 16 MiB all ran 2.7–4.7× gloo's all-reduce at
16 and 64 MiB, 256 KiB segments 2.3–3.3× (more doorbells); **spinning** on the doorbell
(non-blocking reads in a loop) instead of sleeping in ``poll`` fell to 1.2–1.9×: on two cores
the spinning rank takes the CPU its neighbour needs to write the segment it is waiting for.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import tempfile
from multiprocessing.shared_memory import SharedMemory

import torch
import torch.distributed as dist

from dtlab.collectives.shm_primitives import (
    TIMEOUT_S,
    Doorbell,
    attach_untracked,
)

_ALIGN = 64  # slot starts on a cache line, so every dtype's view of it is aligned


class Channel:
    """One direction of one ring pair: a shared segment cut into ``S`` slots of ``slot_bytes``,
    and the two doorbells. The sender's side counts free slots (credits), the receiver's side
    segments ready; the ``k``-th segment since the last :meth:`cut` uses slot ``k % S``."""

    def __init__(self, segment: SharedMemory, capacity: int, ready, free, sender: bool) -> None:
        self.segment, self.capacity = segment, capacity
        self._bytes = torch.frombuffer(segment.buf, dtype=torch.uint8, count=capacity)
        self.ready, self.free, self.sender = ready, free, sender
        self.slots = self.slot_bytes = self.count = self.tokens = 0

    def cut(self, slots: int, slot_bytes: int) -> None:
        """Re-cut the segment into ``slots`` × ``slot_bytes`` (both ends do it in the same call).
        Between calls every segment sent has been taken and every slot given back — each rank
        finished the last call before any passed this call's agreement check — so the sender
        only collects the credits still in its doorbell and both ends start from slot 0."""
        if (slots, slot_bytes) == (self.slots, self.slot_bytes):
            return
        if slots * slot_bytes > self.capacity:
            raise ValueError(f"{slots} slots of {slot_bytes} B do not fit in {self.capacity} B")
        if self.sender:
            owed = self.slots - self.tokens
            while owed > 0:
                owed -= self.free.wait()
        self._rows = self._bytes[: slots * slot_bytes].view(slots, slot_bytes)
        self.slots, self.slot_bytes, self.count = slots, slot_bytes, 0
        self.tokens = slots if self.sender else 0  # free slots (sender), ready segments (receiver)

    def _slot(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        index = self.count % self.slots
        self.count += 1
        return self._rows[index, : numel * dtype.itemsize].view(dtype)

    def acquire(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Sender: the next free slot, as ``numel`` elements of ``dtype`` (waits for a free one)."""
        if self.tokens == 0:
            self.tokens += self.free.wait()
        self.tokens -= 1
        return self._slot(numel, dtype)

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Receiver: the next segment written by the sender, read in place (waits for it)."""
        if self.tokens == 0:
            self.tokens += self.ready.wait()
        self.tokens -= 1
        return self._slot(numel, dtype)

    def close(self) -> None:
        self.ready.close()
        self.free.close()
        self._rows = self._bytes = None
        with contextlib.suppress(BufferError):  # a view still alive: the mapping goes at exit
            self.segment.close()


class ShmRing:
    """A rank's two channels of a ring: ``outbox`` (me → right) and ``inbox`` (left → me)."""

    def __init__(self, outbox: Channel, inbox: Channel) -> None:
        self.outbox, self.inbox = outbox, inbox
        self.capacity = inbox.capacity

    def cut(self, slots: int, slot_bytes: int) -> None:
        self.outbox.cut(slots, slot_bytes)
        self.inbox.cut(slots, slot_bytes)

    def close(self) -> None:
        self.outbox.close()
        self.inbox.close()


def open_ring(group, rank: int, size: int, capacity: int, names: tuple[str, str]) -> ShmRing:
    """Create and connect this rank's channels of ``capacity`` bytes each (every rank of
    ``group`` calls it together). ``names``: the left and right neighbours, for errors."""
    mine = SharedMemory(create=True, size=capacity, name=f"dtlab_{secrets.token_hex(8)}")
    folder = tempfile.mkdtemp(prefix="dtlab-shm-")  # mode 0700: private to this user
    fds: list[int] = []
    try:
        for name in ("ready", "free"):
            os.mkfifo(os.path.join(folder, name), 0o600)
        ready_in = os.open(os.path.join(folder, "ready"), os.O_RDONLY | os.O_NONBLOCK)
        fds.append(ready_in)
        everyone: list = [None] * size
        dist.all_gather_object(everyone, (socket.gethostname(), mine.name, folder), group=group)
        hosts = [host for host, _, _ in everyone]
        if len(set(hosts)) > 1:
            raise ValueError(
                f"transport='shm' needs every rank on one host, but the ranks run on {hosts}; "
                "use the default transport between hosts"
            )
        _, right_name, right_folder = everyone[(rank + 1) % size]
        theirs = attach_untracked(right_name)
        free_in = os.open(os.path.join(right_folder, "free"), os.O_RDONLY | os.O_NONBLOCK)
        fds.append(free_in)
        dist.barrier(group=group)  # every read end is open: the write ends can open now
        free_out = os.open(os.path.join(folder, "free"), os.O_WRONLY | os.O_NONBLOCK)
        ready_out = os.open(os.path.join(right_folder, "ready"), os.O_WRONLY | os.O_NONBLOCK)
        fds += [free_out, ready_out]
        for fd in (free_out, ready_out):  # writes of one byte to a pipe never block for long
            os.set_blocking(fd, True)
        dist.barrier(group=group)  # every end is open: the names may go
    except BaseException:
        for fd in fds:
            os.close(fd)
        mine.close()
        raise
    finally:
        mine.unlink()
        shutil.rmtree(folder, ignore_errors=True)
    timeout = TIMEOUT_S
    outbox = Channel(
        theirs,
        capacity,
        Doorbell(ready_out, names[1], "segment-ready", timeout),
        Doorbell(free_in, names[1], "slot-free", timeout),
        sender=True,
    )
    inbox = Channel(
        mine,
        capacity,
        Doorbell(ready_in, names[0], "segment-ready", timeout),
        Doorbell(free_out, names[0], "slot-free", timeout),
        sender=False,
    )
    return ShmRing(outbox, inbox)


_RINGS: dict[tuple, ShmRing] = {}


def channels_for(peers, slots: int, slot_bytes: int) -> ShmRing:
    """This group's ring of channels, cut into ``slots`` slots of ``slot_bytes``: the one made
    by an earlier call if it is big enough, else a new one (all ranks decide alike: they agreed
    on the call). Only ranks of a torch process group on one host can have one."""
    if peers.torch_group is None:
        raise ValueError(
            "transport='shm' needs group=None or a torch ProcessGroup (its channels are set up "
            "by the group's own collectives), not a list of ranks or simulated ranks"
        )
    key = tuple(peers.global_ranks)  # channels join processes, whichever group set them up
    slot_bytes = -(-slot_bytes // _ALIGN) * _ALIGN
    ring = _RINGS.get(key)
    if ring is None or ring.capacity < slots * slot_bytes:
        if ring is not None:
            dist.barrier(group=peers.torch_group)  # nobody still reads the old slots
            close_ring(key)
        names = tuple(f"rank {peers.global_ranks[i]}" for i in (peers.left, peers.right))
        ring = open_ring(peers.torch_group, peers.rank, peers.size, slots * slot_bytes, names)
        _RINGS[key] = ring
    ring.cut(slots, slot_bytes)
    return ring


def close_ring(key: tuple) -> None:
    ring = _RINGS.pop(key, None)
    if ring is not None:
        ring.close()


def close_all() -> None:
    """Close every channel of this process at once, without waiting for anyone: what a rank does
    when its ring call fails, so that its neighbours read end-of-file and fail too."""
    for key in list(_RINGS):
        close_ring(key)


def close_channels(peers) -> None:
    """Tear down the group's channels in step (every rank of it calls this): a barrier first, so
    no neighbour still rings a doorbell this rank is about to close, then unmap and close."""
    key = tuple(peers.global_ranks)  # channels join processes, whichever group set them up
    if key in _RINGS:
        dist.barrier(group=peers.torch_group)
        close_ring(key)


def open_rings() -> dict[tuple, ShmRing]:
    """This process's open rings by group (a copy; for tests: reuse across calls, teardown)."""
    return dict(_RINGS)
