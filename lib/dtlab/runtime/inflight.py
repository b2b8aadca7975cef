"""What a rank's communication is doing during a run: every torch.distributed call, counted.

A worker calls :func:`install` once; it wraps ``torch.distributed``'s collectives (every function
taking ``async_op``), ``isend`` and ``irecv`` (which ``send``, ``recv`` and ``batch_isend_irecv``
go through) and ``Work.wait``. A call made inside another counted call is not counted again.
Outside a run the wrappers only forward the call. During one, this rank keeps

* **counts** of what it posted: collectives per process group, sends and receives per
  ``(group, peer, tag)``. Operations match in posting order, so when a rank has *returned*
  having posted fewer than a peer waits for, that peer can never complete: the Cluster compares
  these counts to tell a blocked rank from one still computing (no guessing with a grace time;
  the rule is :func:`dtlab.runtime.matching.never_joined`);
* the **operation the main thread is blocked in** (a collective, or ``wait()`` on a handle);
* every **unfinished handle** (``isend``/``irecv``/``batch_isend_irecv``/``async_op=True``) with
  the user's line that started it. One left behind would be matched by the *next* run's messages,
  so the worker waits for them before it replies, and the Cluster fails the run if one can never
  finish.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import time
import types
from contextlib import suppress

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from dtlab.runtime.hang import WORKER_ENTRY
from dtlab.runtime.matching import Op, op_key

_PRUNE_AT = 256  # prune finished handles past this many, so a long run cannot pile them up


class _State:
    def __init__(self) -> None:
        self.phase = "idle"  # "running" while the user's function runs, then "draining"
        self.main = threading.main_thread().ident
        self.counts: dict[tuple, int] = {}
        self.works: dict[int, tuple] = {}  # id(work) -> (work, [Op, ...]); holds the work alive
        self.current: list[Op] | None = None  # what the main thread is blocked in
        self.batch: list[Op] | None = None  # ops posted inside batch_isend_irecv
        self.groups: dict = {}
        self.prune_at = _PRUNE_AT


_state = _State()
_thread = threading.local()  # .inside: this thread is already in a counted call


def collective_names() -> list[str]:
    """torch.distributed's collectives in this torch version: its functions taking ``async_op``."""
    return sorted(
        name
        for name, fn in vars(c10d).items()
        if type(fn) is types.FunctionType  # not isinstance: a deprecated alias warns on that
        and fn.__module__ == c10d.__name__
        and "async_op" in inspect.signature(fn).parameters
    )


def _frames_from(frame) -> tuple[list[tuple], bool]:
    """``(file, line, function)`` from ``frame`` down to the worker's entry point, and whether
    the entry point was reached (it is not while the rank waits between runs)."""
    frames = []
    while frame is not None and frame.f_code.co_name != WORKER_ENTRY:
        code = frame.f_code
        frames.append(
            (code.co_filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name))
        )
        frame = frame.f_back
    return frames, frame is not None


def _stack(depth: int) -> tuple:
    """The frames of the caller of the function calling this (``depth`` = 1), most recent first;
    kept raw: naming them costs something only when a report needs them."""
    return tuple(_frames_from(sys._getframe(depth + 1))[0])


def _group_of(group) -> tuple[str, tuple[int, ...]] | None:
    group = c10d._get_default_group() if group is None else group
    if group not in _state.groups:
        if not isinstance(group, dist.ProcessGroup) or dist.get_rank(group) < 0:
            return None  # not a member: the call returns at once
        _state.groups[group] = (group.group_name, tuple(dist.get_process_group_ranks(group)))
    return _state.groups[group]


def _post(name: str, kind: str, params: dict, args: tuple, kwargs: dict) -> Op | None:
    def arg(key, default=None):
        if key in kwargs:
            return kwargs[key]
        i = params.get(key)
        return args[i] if i is not None and i < len(args) else default

    resolved = _group_of(arg("group"))
    if resolved is None:
        return None
    group, members = resolved
    peer, tag = None, int(arg("tag", 0) or 0)
    if kind != "collective":
        peer = arg("dst" if kind == "send" else "src")
        local = arg("group_dst" if kind == "send" else "group_src")
        if peer is None and local is not None:
            peer = members[local]
    key = op_key(kind, group, peer, tag)
    _state.counts[key] = _state.counts.get(key, 0) + 1
    return Op(f"torch.distributed.{name}", kind, group, members, peer, tag, _state.counts[key])


def _track(work, ops: list[Op]) -> None:
    state = _state
    if len(state.works) >= state.prune_at:
        state.works = {k: v for k, v in state.works.items() if not _finished(v[0])}
        state.prune_at = max(_PRUNE_AT, 2 * len(state.works))
    state.works[id(work)] = (work, ops)


def _finished(work) -> bool:
    """Whether ``work`` is done. gloo's send/recv handles only say so once waited for."""
    try:
        return work.is_completed()
    except RuntimeError:  # it failed: nothing is left in flight
        return True


def _posts_only(name: str, params: dict, args: tuple, kwargs: dict) -> bool:
    """Whether this call only posts work and returns (isend, irecv, ``async_op=True``)."""
    if name in ("isend", "irecv"):
        return True
    i = params.get("async_op")
    return bool(kwargs.get("async_op", args[i] if i is not None and i < len(args) else False))


def _wrap(name: str, kind: str, original):
    params = {p: i for i, p in enumerate(inspect.signature(original).parameters)}

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        state = _state
        if state.phase != "running" or getattr(_thread, "inside", False):
            return original(*args, **kwargs)  # one count per call: not for what it calls inside
        op = _post(name, kind, params, args, kwargs)
        on_main = threading.get_ident() == state.main
        previous = state.current
        # Only a call that blocks counts as "blocked in" it: a status read while an isend, irecv
        # or async collective is merely being posted must not make the rank look stuck.
        if on_main and op is not None and not _posts_only(name, params, args, kwargs):
            state.current = [op]
        _thread.inside = True
        try:
            work = original(*args, **kwargs)
        finally:
            _thread.inside = False
            if on_main:
                state.current = previous
        if op is not None and state.batch is not None:
            state.batch.append(op)  # the batch tracks the handles it returns (NCCL: one for all)
        elif op is not None and isinstance(work, dist.Work):
            op.stack = _stack(1)
            _track(work, [op])
        return work

    wrapper._dtlab_original = original
    return wrapper


def _wrap_batch(original):
    @functools.wraps(original)
    def batch_isend_irecv(p2p_op_list):
        state = _state
        if state.phase != "running":
            return original(p2p_op_list)
        outer, state.batch = state.batch, []
        try:
            works = original(p2p_op_list)
        finally:
            ops, state.batch = state.batch, outer
        stack = _stack(1)
        for op in ops:
            op.call, op.stack = f"torch.distributed.batch_isend_irecv ({op.kind})", stack
        # gloo returns one handle per op; NCCL coalesces the batch into one handle for all.
        paired = len(works) == len(ops)
        for i, work in enumerate(works):
            _track(work, [ops[i]] if paired else ops)
        return works

    batch_isend_irecv._dtlab_original = original
    return batch_isend_irecv


def _wait(original):
    @functools.wraps(original)
    def wait(self, *args, **kwargs):
        state = _state
        entry = state.works.get(id(self))
        if entry is None or threading.get_ident() != state.main:
            return original(self, *args, **kwargs)
        previous, state.current = state.current, entry[1]
        try:
            return original(self, *args, **kwargs)
        finally:
            state.current = previous
            state.works.pop(id(self), None)  # waited for: nothing of it is left in flight

    wait._dtlab_original = original
    return wait


def install() -> None:
    """Wrap torch.distributed's calls in this process (idempotent; a no-op outside runs)."""
    wrapped = {name: "collective" for name in collective_names()}
    wrapped |= {"isend": "send", "irecv": "recv"}
    for name, kind in [*wrapped.items(), ("batch_isend_irecv", "batch")]:
        original = getattr(c10d, name, None)
        if original is None or hasattr(original, "_dtlab_original"):
            continue
        wrapper = _wrap_batch(original) if kind == "batch" else _wrap(name, kind, original)
        setattr(c10d, name, wrapper)  # torch's own callers (send, P2POp checks) see it too
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapper)
    if not hasattr(dist.Work.wait, "_dtlab_original"):
        dist.Work.wait = _wait(dist.Work.wait)


def begin_run() -> None:
    """Start counting for one run (counts restart: every rank starts a run in step)."""
    _state.counts, _state.works, _state.current, _state.batch = {}, {}, None, None
    _state.phase, _state.prune_at = "running", _PRUNE_AT


def unfinished() -> list[tuple]:
    """``(work, ops)`` for every handle the run left unfinished."""
    return [entry for entry in _state.works.values() if not _finished(entry[0])]


def report(entries: list[tuple]) -> dict:
    """What the Cluster needs to judge this rank: its counts and its unfinished operations."""
    ops = [op.to_dict() for _, op_list in entries for op in op_list]
    return {"counts": dict(_state.counts), "unfinished": ops}


def drain(entries: list[tuple]) -> None:
    """Wait until every unfinished handle completes (the Cluster kills this rank if one never
    can), then wait() on each so errors surface here; the caller drops them before any teardown.

    On gloo, ``wait()`` blocks until the message has moved (the GIL released, so the status
    thread still answers). On NCCL it only orders the current CUDA stream after the work, so the
    handles are polled until the GPU has finished them.
    """
    _state.phase = "draining"
    pause = 0.0005
    while dist.get_backend() == "nccl" and any(not _finished(w) for w, _ in entries):
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
    for work, _ in entries:
        with suppress(RuntimeError):  # a peer failed: that rank's own error tells the story
            work.wait()


def end_run() -> dict:
    """Stop counting; drop every handle; return the counts of the run."""
    counts = dict(_state.counts)
    _state.phase, _state.works, _state.current, _state.batch = "idle", {}, None, None
    return counts


def snapshot() -> dict:
    """The main thread's state for the Cluster, taken from another thread of this rank."""
    state = _state
    current = state.current
    frames, in_user_code = _frames_from(sys._current_frames().get(state.main))
    return {
        "state": state.phase,
        "frames": frames if in_user_code else [],
        "blocked": [op.to_dict() for op in current] if current else None,
    }


def forget_groups() -> None:
    """Drop cached process groups when the process group is torn down."""
    _state.groups.clear()
