"""What a learner's function does on the wire while it is graded, so a grader grades the skill.

Comparing results cannot tell a ring all-reduce from ``dist.reduce`` + ``dist.broadcast``, or a
ZeRO-1 step from an all-reduce and a slice: both give the right numbers. So while the learner's
code runs on a rank, :func:`watching` wraps the entry points every ``torch.distributed`` call
ends in — the methods of ``ProcessGroup`` (``allreduce``, ``_allgather_base``, ``send``, …),
which importing ``all_reduce`` under another name does not get around — and

* **refuses** every collective the exercise rules out, raising :class:`CallNotAllowed` with the
  call's name and the reason (barriers, which move no data, are always allowed);
* **records** each collective it allows: its name, payload bytes ``M`` (the all-reduced or
  broadcast buffer, the all-gather's output, the reduce-scatter's input), and whether it had
  been waited on (``async_op=False`` waits inside the call);
* **counts** the bytes of every point-to-point message, by destination rank, as posted —
  dtlab's own collectives included. Their control messages (the size check before a payload,
  :func:`dtlab.collectives.p2p.sending_control`) are neither refused, recorded nor counted.

:func:`noticing_calls` is the same idea for formula exercises: it notices a call to a library
function that computes the answer (``dtlab.cost.collective_time`` for "price a ring all-reduce"),
whatever name it was imported under. :class:`StorageBirths` counts what a forward pass leaves alive
even when saved-tensor hooks hide it from a meter.

Not covered: ``torch.distributed._functional_collectives`` and raw ``torch.ops.c10d`` calls,
which reach C++ without passing through ``ProcessGroup``'s Python methods.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# ProcessGroup method -> the torch.distributed call a learner writes. Names vary across torch
# versions; only the methods this torch has are wrapped.
COLLECTIVE_METHODS = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "allgather": "all_gather",
    "allgather_coalesced": "all_gather_coalesced",
    "_allgather_base": "all_gather_into_tensor",
    "all_gather_single": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "all_gather_single_coalesced": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "all_to_all_single": "all_to_all_single",
    "barrier": "barrier",
    "monitored_barrier": "monitored_barrier",
}
_KIND = {
    "all_reduce_coalesced": "all_reduce",
    "all_gather_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "monitored_barrier": "barrier",
}
_PAYLOAD_IS_INPUT = ("reduce_scatter", "all_to_all", "gather")  # else the first argument
P2P = "p2p"  # the "kind" of send/recv/isend/irecv/batch_isend_irecv in ``allowed``
EVERY_KIND = frozenset({*(_KIND.get(n, n) for n in COLLECTIVE_METHODS.values()), P2P})


class CallNotAllowed(RuntimeError):
    """The learner's code called something the exercise rules out."""


@dataclass
class CollectiveCall:
    """One ``torch.distributed`` collective the learner issued."""

    name: str  # as the learner writes it: "all_reduce", "all_gather_into_tensor", ...
    kind: str  # its family: "all_reduce", "all_gather", "reduce_scatter", ...
    payload_bytes: int
    waited: bool = False  # wait() was called on it (a blocking call waits inside)
    work: Any = field(default=None, repr=False, compare=False)


@dataclass
class Wire:
    """Everything one rank sent while watched."""

    collectives: list[CollectiveCall] = field(default_factory=list)
    sent_to: dict[int, int] = field(default_factory=dict)  # global rank -> p2p payload bytes
    messages_sent: int = 0

    @property
    def p2p_bytes_sent(self) -> int:
        return sum(self.sent_to.values())

    def summary(self) -> dict:
        """Plain data (no tensors, no Work handles) to send back from a rank."""
        return {
            "collectives": [(c.name, c.kind, c.payload_bytes, c.waited) for c in self.collectives],
            "sent_to": dict(self.sent_to),
            "p2p_bytes_sent": self.p2p_bytes_sent,
            "messages_sent": self.messages_sent,
        }


def _nbytes(obj: Any) -> int:
    """Bytes of every tensor in ``obj`` (a tensor, or lists of them)."""
    if hasattr(obj, "element_size"):
        return obj.numel() * obj.element_size()
    if isinstance(obj, list | tuple):
        return sum(_nbytes(o) for o in obj)
    return 0


def _global_rank(group, group_rank: int) -> int:
    import torch.distributed as dist

    try:
        return dist.get_global_rank(group, group_rank)
    except (ValueError, RuntimeError):
        return group_rank


class _Patches:
    """Attributes replaced for the duration of a ``with`` block, restored exactly afterwards."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def replace(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, make(original))

    def restore(self) -> None:
        for owner, name, before in reversed(self._saved):
            if before is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, before)


_MISSING = object()


@contextmanager
def watching(
    allowed: Collection[str], why: str, *, dtlab_collectives: bool = True
) -> Iterator[Wire]:
    """Within the block, on this rank: refuse collectives whose kind is not in ``allowed``
    (``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``, …, and ``"p2p"`` for send/recv),
    explaining ``why``; record the rest into the :class:`Wire` yielded. With
    ``dtlab_collectives=False`` dtlab's own collectives are refused too (they are built from
    the very messages the exercise asks for)."""
    import torch.distributed as dist

    from dtlab.collectives import p2p

    wire, by_work, patches = Wire(), {}, _Patches()

    def refuse(call: str) -> CallNotAllowed:
        return CallNotAllowed(f"{call} is not allowed in this exercise: {why}")

    def collective(method: str) -> Callable[[Callable], Callable]:
        name = COLLECTIVE_METHODS[method]
        kind = _KIND.get(name, name)

        def make(original: Callable) -> Callable:
            def wrapped(self, *args, **kwargs):
                if p2p.sending_control():  # a dtlab collective's size check, not the learner's
                    return original(self, *args, **kwargs)
                if kind not in allowed and kind != "barrier":
                    raise refuse(f"dist.{name}")
                work = original(self, *args, **kwargs)
                payload = args[1] if kind in _PAYLOAD_IS_INPUT and len(args) > 1 else args[:1]
                call = CollectiveCall(name, kind, _nbytes(payload), work=work)
                wire.collectives.append(call)
                if work is not None:
                    by_work[id(work)] = call  # call.work keeps the id from being reused
                return work

            return wrapped

        return make

    def send(original: Callable) -> Callable:
        def wrapped(self, tensors, dst, *args, **kwargs):
            if P2P not in allowed:
                raise refuse("dist.send/isend (point-to-point messages)")
            work = original(self, tensors, dst, *args, **kwargs)
            if not p2p.sending_control():
                peer = _global_rank(self, dst)
                wire.sent_to[peer] = wire.sent_to.get(peer, 0) + _nbytes(tensors)
                wire.messages_sent += 1
            return work

        return wrapped

    def recv(original: Callable) -> Callable:
        def wrapped(self, *args, **kwargs):
            if P2P not in allowed:
                raise refuse("dist.recv/irecv (point-to-point messages)")
            return original(self, *args, **kwargs)

        return wrapped

    def wait(original: Callable) -> Callable:
        def wrapped(self, *args, **kwargs):
            call = by_work.get(id(self))
            if call is not None:
                call.waited = True
            return original(self, *args, **kwargs)

        return wrapped

    def dtlab_refused(original: Callable) -> Callable:
        def wrapped(*args, **kwargs):
            raise refuse("dtlab.collectives")

        return wrapped

    try:
        for method in COLLECTIVE_METHODS:
            if hasattr(dist.ProcessGroup, method):
                patches.replace(dist.ProcessGroup, method, collective(method))
        patches.replace(dist.ProcessGroup, "send", send)
        for method in ("recv", "recv_anysource"):
            if hasattr(dist.ProcessGroup, method):
                patches.replace(dist.ProcessGroup, method, recv)
        patches.replace(dist.Work, "wait", wait)
        if not dtlab_collectives:
            for method in ("exchange", "exchange_control", "post_send", "post_recv"):
                patches.replace(p2p.Peers, method, dtlab_refused)
        yield wire
    finally:
        patches.restore()


@contextmanager
def noticing_calls(functions: Mapping[Callable, str]) -> Iterator[list[str]]:
    """The names (values of ``functions``) of those functions called inside the block, in
    order of first call — under whatever name the caller imported them (this thread only)."""
    codes = {inspect.unwrap(f).__code__: name for f, name in functions.items()}
    noticed: list[str] = []

    def profile(frame, event, arg) -> None:
        if event == "call" and frame.f_code in codes and codes[frame.f_code] not in noticed:
            noticed.append(codes[frame.f_code])

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield noticed
    finally:
        sys.setprofile(previous)


class StorageBirths:
    """Every storage an op creates while on, weakly: which of them are still alive afterwards.

    A ``TorchDispatchMode`` sees each aten op, wherever it runs — in the learner's forward, in
    saved-tensor hooks that keep or copy tensors — so what the forward pass leaves alive is
    counted even when the learner's own hooks hide the saves from the meter's.
    """

    def __init__(self) -> None:
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        births = self.refs = []

        class Mode(TorchDispatchMode):  # runs on every aten op: nothing imported in here
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                        storage = t.untyped_storage()
                        births.append((StorageWeakRef(storage), storage.nbytes()))
                return out

        self.mode = Mode()

    def alive_bytes(self, *exclude) -> int:
        """Bytes of the storages born while on that are still alive, each counted once, leaving
        out those of the tensors in ``exclude``."""
        from torch.multiprocessing.reductions import StorageWeakRef

        skip = {StorageWeakRef(t.untyped_storage()).cdata for t in exclude}
        alive = {
            ref.cdata: n for ref, n in self.refs if not ref.expired() and ref.cdata not in skip
        }
        return sum(alive.values())
