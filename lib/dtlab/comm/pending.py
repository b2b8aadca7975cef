"""Handles of communication in flight: ``wait()`` blocks until the data has moved.

A :class:`~dtlab.comm.Communicator` call that does not block returns one of these; ``wait()``
blocks until the data has moved and records the spans, so a timeline shows how much of the
transfer ran under compute:

* :class:`PendingCollective` — a collective on torch's backend (``async_op=True``);
* :class:`~dtlab.comm.background.QueuedCollective` (a subclass) — a counted collective on
  ``collectives="dtlab"`` queued on the ranks' background stream (:mod:`dtlab.comm.background`);
* :class:`PendingMessages` — point-to-point messages posted by
  :meth:`~dtlab.comm.Communicator.start_exchange` (``isend``/``irecv``), on either path;
* :class:`Finished` — what ``async_op=True`` returns on ``collectives="dtlab"`` where there is no
  background stream (NCCL): the collective already ran to completion inside the call.

How the counted path overlaps (issue 30): :mod:`dtlab.collectives` runs a collective as steps on
the calling thread, posting each step's messages after the last landed, so nothing progresses
the ring while that thread computes — and a second thread posting untagged messages on the same process group
would interleave its messages with the first's (gloo matches messages between two ranks by
posting order per tag). So an asynchronous counted collective runs on a worker thread whose
messages carry a tag of their own, the same on every member (:mod:`dtlab.comm.background`):
counted *and* overlapped, bit-identical to the blocking call.
Posted messages (:meth:`~dtlab.comm.Communicator.start_exchange`: ring attention, the pipeline,
async TP's per-peer chunks) overlap without a worker: gloo's own threads progress them.

:class:`OverlapRefused` stays public for the one case left: NCCL, where the counted path has no
background stream (a worker would need a CUDA stream of its own and event ordering with the
compute stream) and runs an asynchronous collective inside its launch. There the first such call
on each communicator warns, and the handle says ``overlapped=False``; on gloo it is never raised.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.distributed as dist

from dtlab import trace


class OverlapRefused(UserWarning):
    """An asynchronous collective was asked of ``collectives="dtlab"`` on NCCL, where the counted
    path has no background stream; it ran synchronously. Never raised on gloo."""


def refuse_overlap(name: str, dim: str) -> None:
    """Warn that ``name`` on the ``dim`` group will not overlap compute (see module docstring)."""
    warnings.warn(
        f"{name!r} on the {dim} group was asked to run asynchronously (async_op=True: a prefetch "
        "or an overlapped gradient reduction), but on NCCL collectives='dtlab' has no background "
        "stream and runs every collective to completion inside the call, counting each message "
        "as it is posted; nothing overlaps compute. The bytes counted are exact; the timeline's "
        "overlap is not. Build the wrapper with collectives='torch' to see communication hide "
        "behind compute on a GPU.",
        OverlapRefused,
        stacklevel=4,
    )


class PendingCollective:
    """A collective in flight; :meth:`wait` blocks until it is done and records its spans.

    The ``comm`` span runs from launch to completion, so it shows how much of the communication
    ran under compute; the time spent blocked in :meth:`wait` is recorded separately as an
    ``idle`` span named ``wait:<name>`` — that is the *exposed* part. On a GPU both ends are CUDA
    events on the compute stream (``wait`` makes that stream wait for the NCCL stream).
    """

    overlapped = True

    def __init__(
        self,
        work: dist.Work | None,
        name: str,
        sent: float,
        labels: dict | None = None,
        start_ns: int | None = None,
    ) -> None:
        self.work, self.name, self.sent, self.labels = work, name, sent, labels or {}
        self.start_ns = trace.now_ns() if start_ns is None else start_ns
        self.start_event = trace.cuda_mark()
        self.done_ns: int | None = None
        if work is not None:  # gloo completes the future on its own thread when the data lands
            with contextlib.suppress(AttributeError, RuntimeError):
                work.get_future().then(self._mark_done)

    def _mark_done(self, _fut) -> None:
        self.done_ns = trace.now_ns()

    def wait(self) -> None:
        """Block until done; idempotent. The Work is dropped, so nothing is left for teardown."""
        if self.work is None:
            return
        with trace.span(f"wait:{self.name}", kind="idle"):
            self.work.wait()
        self.work = None
        if self.start_event is not None:
            trace.record_cuda(
                self.name, "comm", self.start_event, trace.cuda_mark(), int(self.sent)
            )
            return
        end = self.done_ns if self.done_ns is not None else trace.now_ns()
        trace.record(
            self.name, "comm", self.start_ns, end, int(self.sent), async_op=True, **self.labels
        )


class Finished(PendingCollective):
    """A collective that already finished: ``collectives="dtlab"`` on NCCL runs synchronously."""

    overlapped = False

    def __init__(self) -> None:
        self.work = None


_P2P_FUTURES = [True]  # whether this process's point-to-point handles offer get_future()


class PendingMessages:
    """Point-to-point messages in flight; :meth:`wait` blocks until every one has moved.

    Drawn as one ``comm`` span ``name`` from posting to the last message's arrival (labelled
    ``to=[[global peer, bytes], ...]`` and the group) plus an ``idle`` span ``wait:<name>`` for
    the time :meth:`wait` blocked — the part of the transfer that compute did not hide. The send
    buffers are kept alive until then: a message may still be reading them.
    """

    def __init__(
        self,
        works: list,
        sends: list[torch.Tensor],
        name: str,
        sent: int,
        to: list[list[int]],
        group: str,
        start_ns: int,
    ) -> None:
        self.works, self._sending, self.name = works, sends, name
        self.sent, self.to, self.group, self.start_ns = sent, to, group, start_ns
        self._arrivals: list[int] = []
        for work in works if _P2P_FUTURES[0] else ():  # completed on gloo's thread on arrival
            try:
                work.get_future().then(lambda _: self._arrivals.append(trace.now_ns()))
            except (AttributeError, RuntimeError):  # "Work::getFuture not implemented" (gloo
                _P2P_FUTURES[0] = False  # p2p): learned once, as raising costs every message
                break

    def wait(self) -> None:
        """Block until every message has moved; idempotent."""
        if self._sending is None:
            return
        with trace.span(f"wait:{self.name}", kind="idle"):
            for work in self.works:
                work.wait()
        arrivals = self._arrivals
        end = max(arrivals) if arrivals and len(arrivals) == len(self.works) else trace.now_ns()
        if self.works:
            labels = {"to": self.to} if self.to else {}
            trace.record(
                self.name, "comm", self.start_ns, end, self.sent, async_op=True, **labels,
                group=self.group,
            )  # fmt: skip
        self.works, self._sending = [], None
