"""Say what a hung rank was doing, from a Python stack dumped by ``faulthandler``.

A rank stuck inside a gloo/NCCL collective is blocked in C++, so no Python signal handler can run
there. ``faulthandler`` can: it writes every thread's Python stack from a C-level signal handler.
The Cluster sends SIGUSR1 to the ranks that did not finish, reads what they wrote, and names the
``torch.distributed`` call (or :mod:`dtlab.collectives` collective) each one was blocked in and
the user line that called it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
# Frames that only forward a call (logging/decorator wrappers in torch.distributed).
_WRAPPERS = {"wrapper", "_fn", "inner", "__call__", "_wrapped_func"}


@dataclass
class Frame:
    file: str
    line: int
    func: str


def parse_thread_stacks(dump: str) -> list[list[Frame]]:
    """Split a faulthandler dump into per-thread frame lists, most recent call first."""
    threads: list[list[Frame]] = []
    for raw in dump.splitlines():
        if raw.startswith(("Thread 0x", "Current thread 0x", "Stack (most recent")):
            threads.append([])
            continue
        match = _FRAME.match(raw)
        if match and threads:
            threads[-1].append(Frame(match["file"], int(match["line"]), match["func"]))
    return threads


def _is_torch_distributed(frame: Frame) -> bool:
    return "/torch/distributed/" in frame.file.replace("\\", "/")


def _is_dtlab_collective(frame: Frame) -> bool:
    return "/dtlab/collectives/" in frame.file.replace("\\", "/")


def _is_library_internal(frame: Frame) -> bool:
    path = frame.file.replace("\\", "/")
    return (
        "/torch/" in path
        or "/dtlab/runtime/" in path
        or "/multiprocessing/" in path
        or _is_dtlab_collective(frame)
    )


def describe_blocking_call(dump: str, worker_entry: str = "_call_user_function") -> str:
    """One line: the collective a rank was blocked in and the user frame that called it."""
    threads = parse_thread_stacks(dump)
    # The thread running user code is the one whose stack passes through the worker's entry point.
    stack = next((t for t in threads if any(f.func == worker_entry for f in t)), None)
    if stack is None:
        return "no Python stack could be read"
    user_frames = stack[: next(i for i, f in enumerate(stack) if f.func == worker_entry)]
    collective = next(
        (f for f in user_frames if _is_torch_distributed(f) and f.func not in _WRAPPERS), None
    )
    caller = next((f for f in user_frames if not _is_library_internal(f)), None)
    where = f"{caller.func} ({caller.file}:{caller.line})" if caller else "an unknown frame"
    if collective is not None:
        return f"blocked in torch.distributed.{collective.func}, called from {where}"
    ours = [f for f in user_frames if _is_dtlab_collective(f)]
    if ours:  # our collectives wait on Work handles (C++): name the outermost one we were in
        return (
            f"blocked in dtlab.collectives {ours[-1].func} (waiting in {ours[0].func}), "
            f"called from {where}"
        )
    return f"busy or blocked in {where} (no torch.distributed call on its stack)"
