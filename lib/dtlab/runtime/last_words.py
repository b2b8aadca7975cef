"""What a rank said before it died: its standard error, kept in a file the driver can read.

A rank that dies takes its reason with it unless something outside the process kept it: gloo's
abort message, a C++ ``terminate called ...``, Python's own fatal-error traceback. So each rank
points file descriptor 2 at ``stderr.g<generation>.rank<r>`` in the Cluster's private directory
before anything else runs: everything written to standard error, from Python or from C++, lands
there first and survives the process. :func:`capture_stderr` also turns on
:mod:`faulthandler` for fatal signals (SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL), so a rank
aborted in native code leaves the Python stack it died in (the learner's line among it).

A daemon thread copies the file to where standard error went before (the terminal, the Jupyter
server's log), so nothing a rank prints disappears from view; that copy may lose the last fraction
of a second when the rank dies, the file never does. When a rank dies, the driver reads the file's
tail with :func:`last_words` and puts it into :class:`~dtlab.runtime.errors.RankDied` beside the
signal's name. A rank killed by SIGKILL (the out-of-memory killer, ``kill -9``) cannot write
anything: the error says so.
"""

from __future__ import annotations

import faulthandler
import os
import threading
import time

from dtlab.runtime.hang import dtlab_api, parse_thread_stacks, where

_FATAL = "Fatal Python error:"
_COPY_EVERY_S = 0.2  # how often the console copy looks for new bytes (an idle rank stays idle)


def stderr_path(workdir: str, generation: int, rank: int) -> str:
    """The file a rank's standard error goes to."""
    return os.path.join(workdir, f"stderr.g{generation}.rank{rank}")


def capture_stderr(path: str) -> None:
    """In a rank process: send fd 2 to ``path`` (append), keep a copy flowing to the old stderr,
    and dump Python stacks there on a fatal signal."""
    console = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable(all_threads=True)  # writes to sys.stderr, whose fd is now 2
    threading.Thread(target=_copy_to_console, args=(path, console), daemon=True).start()


def _copy_to_console(path: str, console: int) -> None:
    with open(path, "rb") as source:
        while True:
            chunk = source.read(65536)
            if not chunk:
                time.sleep(_COPY_EVERY_S)
                continue
            try:
                os.write(console, chunk)
            except OSError:  # the console went away (a closed terminal): the file still has it
                return


def stderr_size(path: str) -> int:
    """How many bytes the rank has written to standard error so far."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def last_words(path: str, since: int = 0, max_lines: int = 25, max_chars: int = 4000) -> str:
    """The last lines a rank wrote to standard error after byte ``since`` (the size when the
    run started, so an earlier run's warnings are never taken for this death's reason), or
    ``""`` if it wrote nothing since."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(since, size - 4 * max_chars))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    said, fatal = _split_fatal_error(text)
    lines = [line.rstrip() for line in said.splitlines() if line.strip()]
    tail = "\n".join(lines[-max_lines:])[-max_chars:]
    return f"{tail}\n{fatal}".strip("\n")


def _split_fatal_error(text: str) -> tuple[str, str]:
    """``(what the rank wrote, one line for faulthandler's fatal-error report)``.

    faulthandler writes every thread's stack and a list of extension modules; the line the
    learner needs is where the main thread died: the most recent frame of their own code, and
    the dtlab call it was inside."""
    start = text.rfind(_FATAL)
    if start < 0:
        return text, ""
    report = text[start:]
    headline = report.splitlines()[0].strip()
    current = report.split("Current thread 0x", 1)
    if len(current) < 2:
        return text[:start], headline
    frames = parse_thread_stacks("Current thread 0x" + current[1].split("\n\n", 1)[0])
    stack = frames[0] if frames else []
    api = dtlab_api(stack)
    inside = f", inside {api}" if api else ""
    return text[:start], f"{headline} in {where(stack)}{inside}"
