"""Asynchronous checkpointing: a short blocking snapshot, then the write overlaps training.

What happens where (the design of torch.distributed.checkpoint's ``async_save`` and of
Nebula/CheckFreq, Mohan et al., FAST 2021):

1. **snapshot** (blocking, span ``checkpoint_snapshot``, kind ``memcpy``): every piece this rank
   writes is copied into host buffers it owns — pinned memory when the source is on a GPU, so the
   device-to-host copy is a fast DMA. From here on training may change its parameters freely:
   the writer never looks at them again.
2. **write** (background thread, span ``checkpoint_write``, kind ``other``): the rank file, its
   CRC-32s and its done flag go to disk from the snapshot; rank 0's thread then commits (it waits
   for the other ranks' done flags on the file system, so the thread needs no collective), and
   every other rank's thread waits, on the file system too, for that commit's ``COMPLETE``.
3. **the handle**: :meth:`AsyncCheckpointer.save` returns a :class:`SaveHandle`, as
   ``torch.distributed.checkpoint.async_save`` returns a future: ``handle.result()`` (or
   ``.wait()``) blocks until the checkpoint is committed — on any rank, ``COMPLETE`` is on disk,
   so a ``load`` right after it finds the checkpoint — and returns its directory, or re-raises the
   error of the write (a full disk, a rank that never finished); ``handle.done()`` polls.

Why training never mutates a tensor being written: the thread only reads the snapshot (and
``extra`` — RNG states, data-loader position — pickled during the snapshot), which
training never references, and a new :meth:`AsyncCheckpointer.save` first waits for the
previous write (at most one in flight), so a snapshot buffer — reused from save to save, since
allocating pinned memory is slow — is never refilled while it is being written.
``snapshot_is_private`` in the tests checks the storages are disjoint from the live tensors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from dtlab.checkpoint.commit import final_dir, wait_for_commit
from dtlab.checkpoint.plain import flatten
from dtlab.checkpoint.save_load import (
    _rank_world,
    boxes_of,
    finish_save,
    pieces_to_write,
    start_save,
    write_rank,
)
from dtlab.checkpoint.state import ShardedState
from dtlab.checkpoint.storage import pickled
from dtlab.trace import span


def snapshot(
    pieces: list[tuple[str, torch.Tensor]], buffers: dict[str, torch.Tensor] | None = None
) -> list[tuple[str, torch.Tensor]]:
    """Private host copies of ``pieces`` (pinned when a piece lives on a GPU).

    ``buffers`` (name -> host tensor) are reused when shape and dtype match, and filled with new
    ones otherwise: pinning memory is slow (it is locked page by page), so it is done once — the
    "staging buffers" of DCP's async save. Safe because at most one write is in flight.
    """
    buffers = {} if buffers is None else buffers
    out = []
    for name, t in pieces:
        pin = t.device.type == "cuda"
        host = buffers.get(name)
        if host is None or host.shape != t.shape or host.dtype != t.dtype:
            host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
            buffers[name] = host
        host.copy_(t.detach(), non_blocking=pin)
        out.append((name, host))
    if any(t.device.type == "cuda" for _, t in pieces):
        torch.cuda.synchronize()
    return out


class SaveHandle:
    """One background save: ``result()``/``wait()`` block until it is committed and return its
    directory (or re-raise the writer's error, every time they are called); ``done()`` polls."""

    def __init__(self, step: int, write: Callable[[], Path]) -> None:
        self.step = step
        self._path: Path | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(write,), name=f"checkpoint-{step}", daemon=True
        )
        self._thread.start()

    def _run(self, write: Callable[[], Path]) -> None:
        try:
            self._path = write()
        except BaseException as exc:  # surfaced by result() on the training thread
            self._error = exc

    def done(self) -> bool:
        """Whether the save has finished: committed, or failed."""
        return not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> Path:
        """Block until committed; the checkpoint's directory. Re-raises the write's error;
        :class:`TimeoutError` if ``timeout`` seconds pass first (the write goes on)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"checkpoint step {self.step} is still being written")
        if self._error is not None:
            raise self._error
        return self._path

    wait = result


class AsyncCheckpointer:
    """Save checkpoints in the background; one write in flight at a time.

    ::

        saver = AsyncCheckpointer(root)
        for step in ...:
            train_step()
            if step % every == 0:
                handle = saver.save(step, fsdp_state(fsdp, opt), extra)  # after the snapshot
        saver.wait()               # or handle.result(): committed, loadable, errors re-raised

    ``state`` may also be a plain ``{"model": ..., "optim": ...}`` of ``state_dict()`` s
    (:mod:`~.plain`).
    """

    def __init__(self, root: str | Path, commit_timeout_s: float = 300.0) -> None:
        self.root = Path(root)
        self.commit_timeout_s = commit_timeout_s
        self._pending: SaveHandle | None = None
        self.last_committed: Path | None = None
        self.snapshot_bytes = 0
        self._buffers: dict[str, torch.Tensor] = {}  # reused host copies (see snapshot)

    def save(
        self,
        step: int,
        state: ShardedState | Mapping,
        extra=None,
        before_flag: Callable[[], None] | None = None,
    ) -> SaveHandle:
        """Snapshot now (blocking), write and commit in a background thread (``before_flag``:
        as in :func:`~dtlab.checkpoint.save`, run in that thread between file and done flag).
        Waits first for the previous save (re-raising its error): one write in flight."""
        self.wait()
        rank, world = _rank_world()
        state, structure = flatten(state)
        temp = start_save(self.root, step)
        pieces = pieces_to_write(state, rank)
        self.snapshot_bytes = sum(t.numel() * t.element_size() for _, t in pieces)
        with span("checkpoint_snapshot", kind="memcpy", nbytes=self.snapshot_bytes, step=step):
            copies = snapshot(pieces, self._buffers)
            frozen_extra = pickled(extra)  # RNG states, data position: as of now, not later
            objects = None if structure is None else pickled(structure)  # learning rates too
        boxes = boxes_of(state)
        timeout = self.commit_timeout_s

        def write() -> Path:
            with span("checkpoint_write", kind="other", nbytes=self.snapshot_bytes, step=step):
                write_rank(temp, rank, copies, boxes, frozen_extra, before_flag, True, objects)
                if rank == 0:
                    final = finish_save(temp, step, world, timeout)
            if rank != 0:
                final = wait_for_commit(final_dir(self.root, step), timeout)
            self.last_committed = final
            return final

        self._pending = SaveHandle(step, write)
        return self._pending

    @property
    def busy(self) -> bool:
        return self._pending is not None and not self._pending.done()

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed; re-raise its error (once)."""
        if self._pending is not None:
            handle, self._pending = self._pending, None
            handle.result()
