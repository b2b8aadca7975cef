"""The background stream: how ``async_op=True`` on ``collectives="dtlab"`` really overlaps compute.

dtlab's rings (:mod:`dtlab.collectives`) run a collective as steps on the calling thread: post a
step's messages, wait for them, post the next. Nothing moves the ring forward while that thread
computes. So an asynchronous counted collective is handed to another thread — and that thread
must not post its messages as the caller does: gloo matches the messages between two ranks by
their posting order *per tag*, and two threads posting untagged messages in an order that differs
from rank to rank would pair one collective's chunk with another's.

A **background stream** is therefore two things per set of ranks, made once per process:

* a **tag** of its own, derived from the ranks alone (``1 + crc32(ranks) mod (2³¹−2)``), so every
  member computes the same one and no rank has to create anything collectively. gloo matches
  point-to-point messages between two ranks by posting order *per tag*, as MPI does: the stream's
  messages (its rings and their agreement checks, sent as tagged control messages) can only
  match each other, never the main thread's untagged ones;
* one worker thread that runs the queued collectives **in FIFO order** with that tag
  (:func:`dtlab.collectives.p2p.routed_over`). Every member queues the same collectives in the
  same order (SPMD), so the rings on the stream meet as they would on the caller's thread.

Why a tag and not a second process group: ``dist.new_group`` is collective over the whole world
(every rank, the same order), and a member-only group (``use_local_synchronization=True``) is
named from the count of groups each process already holds — both have to be made at a point
every rank reaches, which the first asynchronous call of one mesh dimension is not. Two streams
whose ranks share a pair could only collide if their tags did (a 2⁻³¹ chance per pair of
streams).

This is what a CUDA stream gives NCCL (a queue of collectives that runs beside compute, in
order) and what DDP's and FSDP's async collectives rely on; FSDP2 issues its all-gathers on a
separate stream for the same reason. Communicators over the same ranks share one stream (one
tag, one thread): their FIFO order is still the program order of the calls.

What stays exactly as on the blocking path: the algorithm (the result is bit-identical), the
call agreement (:mod:`dtlab.collectives.agreement`, as tagged messages: a mismatch raises
:class:`~dtlab.collectives.agreement.CollectiveMismatch` from :meth:`QueuedCollective.wait`,
naming every rank's value), the counted bytes and messages (counted on the worker into the
item's own :class:`~dtlab.collectives.stats.CommStats`, added to the communicator's and the
process's counters when the caller waits, so a ``counting()`` block on the caller's thread never
sees another thread's traffic), and the per-step spans (recorded from the worker, on the same
rank's timeline, with the caller's labels at launch plus ``stream="background"``). One more span,
``name`` of kind ``comm`` (``async_op=True``, ``nbytes=0``: the bytes sit on its steps), runs
from the moment the worker starts the collective to its end; the caller's ``wait:<name>`` idle
span is the exposed part, as on torch's path.

Not on NCCL: there the counted path runs an asynchronous collective inside its launch and warns
once with :class:`~dtlab.comm.pending.OverlapRefused` (a worker thread would also need its own
CUDA stream and event ordering with the compute stream; dtlab's GPU labs measure overlap on
torch's path). Lifetime: the worker idles in ``queue.get`` holding no ``Work``, so a waited
stream leaves nothing for ``destroy_process_group`` to abort on; a handle never waited still runs
to completion on every member before the next item on its stream. Wait for every handle before
the function returns: an item still running then would post after the runtime drained its work
(the stream's messages bypass :mod:`dtlab.runtime.inflight`, whose bookkeeping is the main
thread's; a rank blocked in ``wait()`` shows there as waiting on a ``threading`` condition).
"""

from __future__ import annotations

import queue
import threading
import zlib
from collections.abc import Callable

import torch
import torch.distributed as dist

from dtlab import trace
from dtlab.collectives.p2p import comm_stats, routed_over
from dtlab.collectives.stats import CommStats
from dtlab.comm.pending import PendingCollective
from dtlab.runtime.context import cached_groups


def available() -> bool:
    """Whether this process's counted collectives can run on a background stream (gloo)."""
    return dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo"


def stream_tag(ranks: tuple[int, ...]) -> int:
    """The message tag of the stream over ``ranks``: the same on every member, never 0 (the
    main thread's), inside gloo's nonnegative int32."""
    return 1 + zlib.crc32(",".join(map(str, ranks)).encode()) % (2**31 - 2)


class _Item:
    """One queued collective: what to run, and what came of it."""

    def __init__(self, name: str, run: Callable[[], None], labels: dict) -> None:
        self.name, self.run, self.labels = name, run, labels
        self.grad_enabled = torch.is_grad_enabled()  # grad mode is per thread: carry the caller's
        self.moved = CommStats()
        self.error: BaseException | None = None
        self.started, self.done = threading.Event(), threading.Event()

    def execute(self, tag: int) -> None:
        self.started.set()
        try:
            with (
                routed_over(tag, self.moved),
                torch.set_grad_enabled(self.grad_enabled),
                trace.labels(**self.labels, stream="background"),
                trace.span(self.name, kind="comm", async_op=True),
            ):
                self.run()
        except BaseException as exc:  # handed to the caller's wait(), which raises it
            self.error = exc
        finally:
            self.done.set()


class BackgroundStream:
    """The tag of ``ranks``' stream and the worker thread that runs its queue in order."""

    def __init__(self, ranks: tuple[int, ...]) -> None:
        self.ranks, self.tag = ranks, stream_tag(ranks)
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._serve, name=f"dtlab-background-{list(ranks)}", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        while True:
            self._queue.get().execute(self.tag)

    def submit(self, item: _Item) -> None:
        self._queue.put(item)


def stream_for(ranks: list[int]) -> BackgroundStream:
    """The background stream over ``ranks`` (made on first use; nothing to agree on)."""
    key = tuple(sorted(ranks))
    return cached_groups(("background_stream", key), lambda: BackgroundStream(key))


class QueuedCollective(PendingCollective):
    """A counted collective queued on a :class:`BackgroundStream`; :meth:`wait` joins it.

    ``wait()`` blocks (drawn as the ``idle`` span ``wait:<name>``: the exposed part) until the
    worker has finished it, adds its counted bytes and messages to ``stats`` and to this rank's
    counters, and raises what the collective raised there (a
    :class:`~dtlab.collectives.agreement.CollectiveMismatch`, a peer's failure). Idempotent.
    """

    overlapped = True

    def __init__(self, item: _Item, op: str, stats: CommStats) -> None:
        self.item, self.op, self.stats, self.name = item, op, stats, item.name
        self.work = item  # not None until waited: "still in flight", as on torch's path
        self.labels, self.start_ns = item.labels, trace.now_ns()
        self.start_event, self.done_ns = None, None
        self.sent = 0.0  # bytes counted on the stream: known once waited for

    def wait(self) -> None:
        """Block until the collective ran on the stream; raise its error, if any."""
        item = self.item
        if item is None:
            return
        with trace.span(f"wait:{self.name}", kind="idle"):
            item.done.wait()
        self.item = self.work = None
        moved = item.moved
        self.sent = moved.bytes_sent
        self.stats.add_call(self.op, moved.bytes_sent, moved.bytes_received, counted=True)
        self.stats.messages_sent += moved.messages_sent
        self.stats.messages_received += moved.messages_received
        process = comm_stats()
        process.messages_sent += moved.messages_sent
        process.bytes_sent += moved.bytes_sent
        process.messages_received += moved.messages_received
        process.bytes_received += moved.bytes_received
        if item.error is not None:
            raise item.error


def launch(
    ranks: list[int], op: str, name: str, run: Callable[[], None], labels: dict, stats: CommStats
) -> QueuedCollective:
    """Queue ``run`` (a counted collective over ``ranks``) on their stream; return its handle."""
    item = _Item(name, run, labels)
    stream_for(ranks).submit(item)
    return QueuedCollective(item, op, stats)
