"""Say what a rank was doing when it did not finish: the call it waits in, and the user's line.

Two sources describe a rank. Its *status* (:func:`dtlab.runtime.inflight.snapshot`, sent by a
helper thread of the rank) names the ``torch.distributed`` operation the main thread is blocked in,
with its process group and peer. When that thread cannot answer (the main thread holds the GIL in
native code), a Python stack dumped by ``faulthandler`` from a C-level signal handler is parsed
instead: it has no group, but still names the call.

Either way, every frame inside torch, dtlab, the standard library or an installed package is
*library*; the user's line is the most recent frame outside them, and the dtlab API in flight is
the outermost dtlab frame (the call the user made: ``dtlab.collectives.all_reduce``,
``dtlab.parallel.DataParallelBase.finish_gradient_synchronization``).
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sysconfig
from dataclasses import dataclass

import dtlab

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
# Frames that only forward a call (logging/decorator wrappers in torch.distributed).
_WRAPPERS = {"wrapper", "_fn", "inner", "__call__", "_wrapped_func"}
_DTLAB_DIR = os.path.dirname(os.path.abspath(dtlab.__file__)) + os.sep
# A dtlab path seen from another installation (a copied dump): /anything/dtlab/<subpackage>/...
_DTLAB_SUBPACKAGES = sorted(
    n for n in os.listdir(_DTLAB_DIR) if os.path.isdir(os.path.join(_DTLAB_DIR, n)) and n[0] != "_"
)
_DTLAB_ELSEWHERE = re.compile(rf"/dtlab/((?:{'|'.join(_DTLAB_SUBPACKAGES)})/[^\n]*)\.py$")
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
WORKER_ENTRY = "_call_user_function"


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


def dump_is_complete(dump: str) -> bool:
    """Whether a faulthandler dump has reached the bottom of the rank's main-thread stack.

    The main thread is the oldest, so faulthandler writes it last; its stack runs from
    ``worker_main`` down to the ``<module>`` frame (or ends in ``...`` when it is too deep).
    """
    lines = dump.rstrip("\n").splitlines()
    if not dump.endswith("\n") or not lines:
        return False
    return "in worker_main" in dump and (lines[-1].endswith(" in <module>") or lines[-1] == "  ...")


@functools.lru_cache(maxsize=4096)
def dtlab_module(file: str) -> str | None:
    """``dtlab.collectives.allreduce`` for a file of the dtlab package, else ``None``."""
    path = os.path.abspath(file)
    if path.startswith(_DTLAB_DIR):
        relative = path[len(_DTLAB_DIR) :]
    else:
        match = _DTLAB_ELSEWHERE.search(file.replace("\\", "/"))
        if match is None:
            return None
        relative = match[1] + ".py"
    module = "dtlab." + relative[: -len(".py")].replace(os.sep, ".").replace("/", ".")
    return module.removesuffix(".__init__")


def is_library(frame: Frame) -> bool:
    """Torch, dtlab, the standard library and installed packages: never the user's line."""
    return _is_library_file(frame.file)


@functools.lru_cache(maxsize=4096)
def _is_library_file(file: str) -> bool:
    path = file.replace("\\", "/")
    return (
        dtlab_module(file) is not None
        or "/torch/" in path
        or "/site-packages/" in path
        or "/dist-packages/" in path
        or os.path.abspath(file).startswith(_STDLIB)
    )


def user_frame(frames: list[Frame]) -> Frame | None:
    """The most recent frame that is the user's own code."""
    return next((f for f in frames if not is_library(f)), None)


def where(frames: list[Frame]) -> str:
    """``fn (file:line)`` of the user's line, for messages."""
    frame = user_frame(frames)
    if frame is None:
        return "an unknown frame"
    return f"{frame.func.rpartition('<locals>.')[2]} ({frame.file}:{frame.line})"


def dtlab_api(frames: list[Frame]) -> str | None:
    """The dtlab call the user made: the outermost dtlab frame (the runtime's own excluded),
    named by its public path — the outermost package below ``dtlab`` that exports it
    (``dtlab.collectives.all_reduce``, ``dtlab.parallel.FullyShardedDataParallel`` for a class
    that lives in ``dtlab.parallel.zero.fsdp``)."""
    outer = None
    for frame in frames:
        module = dtlab_module(frame.file)
        if module is not None and not module.startswith("dtlab.runtime"):
            outer = (module, frame.func)
    if outer is None:
        return None
    module, qualname = outer
    parts = module.split(".")
    for depth in range(2, len(parts)):  # dtlab.parallel, dtlab.parallel.zero, ...
        package = ".".join(parts[:depth])
        try:
            exported = getattr(importlib.import_module(package), qualname.split(".")[0], None)
        except ImportError:
            continue
        if getattr(exported, "__module__", None) == module:
            return f"{package}.{qualname}"
    return f"{module}.{qualname}"


def torch_call(frames: list[Frame]) -> str | None:
    """The outermost ``torch.distributed`` function on the stack (``torch.distributed.send``)."""
    calls = [
        name
        for f in frames
        if "/torch/distributed/" in f.file.replace("\\", "/")
        and (name := f.func.rpartition(".")[2]) not in _WRAPPERS
        and "<" not in name
    ]
    return f"torch.distributed.{calls[-1]}" if calls else None


def _above_entry(frames: list[Frame], entry: str) -> list[Frame] | None:
    for i, frame in enumerate(frames):
        if frame.func == entry:
            return frames[:i]
    return None


def describe_blocking_call(dump: str, worker_entry: str = WORKER_ENTRY) -> str:
    """One line from a faulthandler dump: the call a rank was in, the dtlab API, the user line."""
    stack = next(
        (s for t in parse_thread_stacks(dump) if (s := _above_entry(t, worker_entry)) is not None),
        None,
    )
    if stack is None:
        return "no Python stack could be read"
    call, api = torch_call(stack), dtlab_api(stack)
    if call is not None:
        inside = f" inside {api}" if api else ""
        return f"blocked in {call}{inside}, called from {where(stack)}"
    if api is not None:  # dtlab waits on Work handles (C++): name the API and where it waited
        innermost = next(f.func for f in stack if dtlab_module(f.file))
        return f"blocked in {api} (waiting in {innermost}), called from {where(stack)}"
    return f"busy or blocked in {where(stack)} (no torch.distributed call on its stack)"


def describe_op(op: dict) -> str:
    """``torch.distributed.isend to rank 1 over ranks [0, 1]``, from an operation's record."""
    peer = op.get("peer")
    if op["kind"] == "send":
        direction = f" to rank {peer}"
    elif op["kind"] == "recv":
        direction = f" from rank {peer}" if peer is not None else " from any rank"
    else:
        direction = ""
    return f"{op['call']}{direction} over ranks {list(op['members'])}"


def describe_status(status: dict, culprit: int | None = None) -> str:
    """One line from a rank's status: blocked in what, over which ranks, why, and where."""
    stack = [Frame(*f) for f in status.get("frames", ())]
    api = dtlab_api(stack)
    inside = f" inside {api}" if api else ""
    blocked = status.get("blocked")
    if blocked:
        op = dict(blocked[0], call=torch_call(stack) or blocked[0]["call"])
        text = f"blocked in {describe_op(op)}"
        if culprit is not None:
            text += f" (rank {culprit} returned without posting its side: it can never complete)"
        return f"{text}{inside}, called from {where(stack)}"
    if status.get("state") == "draining":
        return "returned, waiting for its unfinished communication"
    call = torch_call(stack)
    if call is not None:
        return f"in {call}{inside}, called from {where(stack)} (not waiting on a tracked peer)"
    if stack and is_library(stack[0]):
        top = f"{stack[0].func} ({os.path.basename(stack[0].file)})"
        return f"in {top}{inside}, called from {where(stack)}"
    return f"running its own code{inside} at {where(stack)} (not waiting on another rank)"
