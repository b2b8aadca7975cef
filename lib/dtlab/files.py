"""Write files so that a crash never leaves half of one.

``path.write_bytes(data)`` truncates ``path`` first and then writes: a process killed in between
(Ctrl-C, a full disk, a laptop lid closed) leaves a truncated notebook or CSV behind. Both writers
here write a temporary file *beside* the target instead, ``fsync`` it, and only then give it the
target's name with one atomic step of the file system:

* :func:`write_atomic` — ``os.replace`` (rename): readers see the old file or the new one, never a
  mix. Used for the built notebooks, the scores CSV and the mastery chart.
* :func:`create_once` — ``os.link``, which fails if the name exists: of several processes racing to
  create a file, exactly one wins, and every one of them returns the winner's content. The file
  never exists half-written. Used for ``~/.dtlab/salt`` and ``~/.dtlab/learner_id``.

The temporary file is named ``.<name>.<random>.tmp`` in the same folder (a rename across file
systems would not be atomic) and is removed if anything fails.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a single call may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_folder(folder: Path) -> None:
    """Make a rename or link durable; best effort (Windows cannot open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_temp(path: Path, data: bytes, mode: int) -> Path:
    """A new file beside ``path`` holding ``data``, flushed to disk; ``mode`` is masked by umask."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        temp.unlink(missing_ok=True)
        raise
    os.close(fd)
    return temp


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Replace ``path`` with ``data`` (text is UTF-8) so that no reader ever sees a partial file.

    A new file gets the usual permissions (0666 less the umask); an existing one keeps its own.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = _write_temp(path, payload, 0o666)
    try:
        if path.exists():
            os.chmod(temp, stat.S_IMODE(path.stat().st_mode))
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)
    return path


def create_once(path: str | Path, data: bytes, mode: int = 0o600) -> bytes:
    """Create ``path`` holding ``data`` unless it exists; return what the file holds afterwards.

    Safe under races: when several processes call this at once, one file is created, whole, and
    all of them return its content. ``mode`` is applied exactly (not masked by the umask).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        return path.read_bytes()
    temp = _write_temp(path, data, mode)
    try:
        os.chmod(temp, mode)
        os.link(temp, path)  # fails with FileExistsError if another process got there first
    except FileExistsError:
        return path.read_bytes()
    finally:
        temp.unlink(missing_ok=True)
    _fsync_folder(path.parent)
    return data
