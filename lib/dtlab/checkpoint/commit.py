"""The atomic commit: a checkpoint exists only once it is whole, and a reader can tell.

Layout under a checkpoint root::

    root/.step_00000040.<job>.partial/   being written: OWNER, rank_0.bin, rank_0.json, ...
    root/step_00000040/                  renamed once every rank file is on disk
        metadata.json                    global shape, dtype and pieces of every tensor, CRC-sealed
        rank_0.bin, rank_1.bin, ...      each rank's own bytes (see storage.py)
        COMPLETE                         written last: its presence is the commit

The protocol (the one torch.distributed.checkpoint and most training stacks use): every rank
writes its file into the *temporary* directory and ``fsync``s it, then writes its entry list
``rank_r.json`` atomically (:func:`dtlab.files.write_atomic`: temp file, fsync, rename) as its
"done" flag. Rank 0 waits until every rank's flag is there, merges them into ``metadata.json``,
renames the directory to its final name (one atomic step of the file system), ``fsync``s the
root, and writes ``COMPLETE`` last. A crash at any point leaves either no ``step_*`` directory or
one without ``COMPLETE``; :func:`complete_checkpoints` ignores both, so loading picks the newest
*complete* checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

from dtlab.checkpoint.metadata import NAME, sealed
from dtlab.checkpoint.storage import CheckpointError, CheckpointNotFound
from dtlab.files import _fsync_folder, write_atomic

MARKER = "COMPLETE"
_FINAL = re.compile(r"^step_(\d{8})$")


def final_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:08d}"


def temp_dir(root: Path, step: int, job: str) -> Path:
    return Path(root) / f".step_{step:08d}.{job}.partial"


def begin(root: Path, step: int, job: str) -> Path:
    """Create the temporary directory (rank 0) and record who is writing it."""
    final = final_dir(root, step)
    if final.exists():
        raise CheckpointError(
            f"{final} already exists; save under a new step number or delete the old directory"
        )
    for other in Path(root).glob(f".step_{step:08d}.*.partial"):
        owner = _owner(other)
        if owner.get("job") != job and _alive(owner):
            raise CheckpointError(
                f"{other} is being written by another job ({owner}); two jobs must not share a "
                "checkpoint root — give this job its own directory"
            )
    temp = temp_dir(root, step, job)
    temp.mkdir(parents=True, exist_ok=False)
    owner = {"job": job, "pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    write_atomic(temp / "OWNER", json.dumps(owner))
    return temp


def _owner(folder: Path) -> dict:
    try:
        return json.loads((folder / "OWNER").read_text())
    except (OSError, ValueError):
        return {}


def _alive(owner: dict) -> bool:
    """Whether the writer recorded in OWNER still runs (same host only; else assume it does)."""
    if owner.get("host") != socket.gethostname():
        return bool(owner)
    try:
        os.kill(int(owner["pid"]), 0)
    except (KeyError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def wait_for_ranks(temp: Path, world_size: int, timeout_s: float) -> list[list[dict]]:
    """Rank 0: each rank's entry list, once every ``rank_r.json`` exists (its "done" flag)."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r in range(world_size) if not (temp / f"rank_{r}.json").exists()]
        if not missing:
            return [json.loads((temp / f"rank_{r}.json").read_text()) for r in range(world_size)]
        if time.monotonic() > deadline:
            raise CheckpointError(
                f"ranks {missing} did not finish writing {temp} within {timeout_s:.0f} s "
                f"(no rank_{missing[0]}.json); the checkpoint stays uncommitted"
            )
        time.sleep(0.005)


def commit(temp: Path, final: Path, metadata: dict) -> Path:
    """Rank 0: write ``metadata.json`` (sealed by its CRC-32, :mod:`~.metadata`), rename the
    directory, then write ``COMPLETE`` last."""
    write_atomic(temp / NAME, sealed(metadata))
    os.rename(temp, final)
    _fsync_folder(final.parent)
    write_atomic(final / MARKER, json.dumps({"step": metadata["step"], "time": time.time()}))
    return final


def wait_for_commit(final: Path, timeout_s: float) -> Path:
    """Any rank: block until rank 0 has committed ``final`` (its ``COMPLETE`` exists)."""
    deadline = time.monotonic() + timeout_s
    while not (final / MARKER).exists():
        if time.monotonic() > deadline:
            raise CheckpointError(
                f"rank 0 did not commit {final} within {timeout_s:.0f} s (no {MARKER}); its own "
                "error says why, and the previous complete checkpoint is still the newest"
            )
        time.sleep(0.005)
    return final


def complete_checkpoints(root: str | Path) -> list[int]:
    """Steps of every committed checkpoint under ``root`` (those with ``COMPLETE``), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        match = _FINAL.match(child.name)
        if match and (child / MARKER).exists():
            steps.append(int(match.group(1)))
    return sorted(steps)


def checked_dir(root: str | Path, step: int | None) -> Path:
    """The directory to load: ``step``'s, or the newest complete one; refuse incomplete ones."""
    steps = complete_checkpoints(root)
    if step is None:
        if not steps:
            what = "does not exist" if not Path(root).is_dir() else "holds no complete checkpoint"
            raise CheckpointNotFound(f"checkpoint directory {root} {what}; save one first")
        return final_dir(Path(root), steps[-1])
    if step in steps:
        return final_dir(Path(root), step)
    newest = f"the newest complete one is step {steps[-1]}" if steps else "none is complete"
    partial = list(Path(root).glob(f".step_{step:08d}.*.partial"))
    if partial or final_dir(Path(root), step).exists():
        where = partial[0] if partial else final_dir(Path(root), step)
        owner = _owner(where)
        raise CheckpointError(
            f"checkpoint step {step} at {where} is incomplete (no {MARKER} marker): being "
            f"written by {owner or 'a job that died'}; {newest}"
        )
    raise CheckpointNotFound(f"no checkpoint for step {step} under {root}; {newest}")
