"""The processes behind a Cluster: start N ranks, talk to them, kill them without leaving orphans.

Kept apart from :class:`~dtlab.runtime.cluster.Cluster` so that a ``weakref.finalize`` can shut
the pool down when the Cluster is garbage-collected (the finalizer must not hold the Cluster).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection, wait

from dtlab.runtime.devices import loopback_interface
from dtlab.runtime.hang import dump_is_complete
from dtlab.runtime.last_words import last_words, stderr_path, stderr_size
from dtlab.runtime.worker import WorkerSpec, worker_main

# Imported once in the forkserver, so each rank starts with torch already loaded (and, through
# dtlab.runtime.preload, what torch.optim's first step would import in every rank).
_PRELOAD = [
    "torch",
    "torch.distributed",
    "dtlab.runtime.preload",
    "cloudpickle",
    "dtlab.runtime.payload",
    "dtlab.runtime.worker",
]


@contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Stop multiprocessing from re-running the caller's script in every rank.

    Spawn-style start methods import ``__main__`` again in the child (so a script without an
    ``if __name__ == "__main__"`` guard would start clusters recursively). Ranks never need it:
    cloudpickle sends functions defined in ``__main__`` by value.
    """
    main = sys.modules.get("__main__")
    saved = {a: getattr(main, a) for a in ("__file__", "__spec__") if hasattr(main, a)}
    try:
        if "__file__" in saved:
            del main.__file__
        if main is not None:
            main.__spec__ = None
        yield
    finally:
        for attr, value in saved.items():
            setattr(main, attr, value)


def rank_environment(rank: int, world_size: int, user_env: dict, parent_env=os.environ) -> dict:
    """The variables every rank of a single-machine Cluster starts with.

    gloo listens on the interface ``GLOO_SOCKET_IFNAME`` names, else on the address the host
    name resolves to — often a public one. All ranks share this machine, so they listen on the
    loopback interface and nothing outside can reach them; a value the user set (in ``env`` or
    in this process's environment) wins.
    """
    env = {
        "RANK": rank,
        "LOCAL_RANK": rank,
        "WORLD_SIZE": world_size,
        "LOCAL_WORLD_SIZE": world_size,
    }
    interface = parent_env.get("GLOO_SOCKET_IFNAME") or loopback_interface()
    if interface:
        env["GLOO_SOCKET_IFNAME"] = interface
    return {**env, **user_env}


def _forkserver_context() -> mp.context.BaseContext:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


class RankPool:
    """N live rank processes, two pipes each (commands; status questions), plus their private
    rendezvous directory."""

    def __init__(
        self,
        world_size: int,
        backend: str,
        workdir: str,
        generation: int,
        collective_timeout_s: float,
        env: dict,
        start_timeout_s: float,
    ):
        self.world_size = world_size
        self.workdir = workdir
        self.stack_paths = [
            os.path.join(workdir, f"stack.g{generation}.rank{r}") for r in range(world_size)
        ]
        self.stderr_paths = [stderr_path(workdir, generation, r) for r in range(world_size)]
        self._stderr_marks = [0] * world_size
        self.procs: list[mp.Process] = []
        self.conns: list[Connection] = []
        self.diag: list[Connection] = []
        self.pids: list[int] = []
        self._questions = 0
        ctx = _forkserver_context()
        init_method = f"file://{os.path.join(workdir, f'rendezvous.g{generation}')}"
        try:
            for rank in range(world_size):
                rank_env = rank_environment(rank, world_size, env)
                spec = WorkerSpec(
                    rank,
                    world_size,
                    backend,
                    init_method,
                    os.getpid(),
                    self.stack_paths[rank],
                    collective_timeout_s,
                    rank_env,
                    self.stderr_paths[rank],
                )
                parent_end, child_end = ctx.Pipe(duplex=True)
                diag_end, child_diag = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=worker_main,
                    args=(spec, child_end, child_diag),
                    daemon=True,
                    name=f"dtlab-rank{rank}",
                )
                with _main_module_hidden():
                    proc.start()
                child_end.close()
                child_diag.close()
                self.procs.append(proc)
                self.conns.append(parent_end)
                self.diag.append(diag_end)
            self._wait_ready(start_timeout_s)
        except BaseException:
            self.kill()
            raise

    def mark_stderr(self) -> None:
        """Remember how much each rank has written to stderr: a run about to start."""
        self._stderr_marks = [stderr_size(path) for path in self.stderr_paths]

    def stderr_since_mark(self, rank: int) -> str:
        """What ``rank`` wrote to stderr since :meth:`mark_stderr` (its last lines)."""
        return last_words(self.stderr_paths[rank], since=self._stderr_marks[rank])

    def _wait_ready(self, timeout_s: float) -> None:
        self.pids = [0] * self.world_size
        pending = set(range(self.world_size))
        deadline = time.monotonic() + timeout_s
        while pending:
            remaining = deadline - time.monotonic()
            waitables = [self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending]
            ready = wait(waitables, timeout=max(0.0, remaining))
            if not ready:
                raise TimeoutError(
                    f"ranks {sorted(pending)} did not join the process group within {timeout_s:.0f} s"
                )
            for rank in list(pending):
                if self.conns[rank] in ready:
                    _, _, pid = self.conns[rank].recv()
                    self.pids[rank] = pid
                    pending.discard(rank)
                elif self.procs[rank].sentinel in ready:
                    raise RuntimeError(
                        f"rank {rank} exited with code {self.procs[rank].exitcode} while starting"
                    )

    def alive(self) -> bool:
        return bool(self.procs) and all(p.is_alive() for p in self.procs)

    def ask_status(self, rank: int) -> int:
        """Ask ``rank`` what it is doing; the answer ``(number, status)`` arrives on
        ``self.diag[rank]`` and carries the returned number (older answers are stale)."""
        self._questions += 1
        with suppress(OSError, ValueError):
            self.diag[rank].send(("status", self._questions))
        return self._questions

    def statuses(self, ranks: list[int], bound_s: float = 2.0) -> dict[int, dict]:
        """Each rank's current status, waiting at most ``bound_s`` for the answers. A rank whose
        main thread holds the GIL in native code cannot answer and is left out."""
        asked = {r: self.ask_status(r) for r in ranks}
        answers: dict[int, dict] = {}
        deadline = time.monotonic() + bound_s
        while len(answers) < len(asked):
            waiting = [self.diag[r] for r in asked if r not in answers]
            ready = wait(waiting, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for r in asked:
                if self.diag[r] in ready:
                    try:
                        number, status = self.diag[r].recv()
                    except (EOFError, OSError):
                        answers[r] = {}
                        continue
                    if number == asked[r]:
                        answers[r] = status
        return {r: s for r, s in answers.items() if s}

    def cpu_seconds(self, rank: int) -> float | None:
        """CPU time the rank's process has used, all threads (``None`` where /proc is missing)."""
        try:
            with open(f"/proc/{self.procs[rank].pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        except (OSError, ValueError, IndexError):
            return None

    def dump_stacks(self, ranks: list[int], bound_s: float = 2.0) -> dict[int, str]:
        """Ask ``ranks`` to write their Python stacks (faulthandler on SIGUSR1) and read them,
        each as soon as it is complete (:func:`~dtlab.runtime.hang.dump_is_complete`)."""
        sizes = {r: _size(self.stack_paths[r]) for r in ranks}
        for r in ranks:
            if self.procs[r].is_alive():
                os.kill(self.procs[r].pid, signal.SIGUSR1)
        deadline = time.monotonic() + bound_s
        dumps: dict[int, str] = {}
        pause = 0.001
        while True:
            for r in ranks:
                if _size(self.stack_paths[r]) > sizes[r]:
                    with open(self.stack_paths[r]) as f:
                        f.seek(sizes[r])
                        dumps[r] = f.read()
            done = all(dump_is_complete(dumps.get(r, "")) for r in ranks)
            if done or time.monotonic() >= deadline:
                return dumps
            time.sleep(pause)  # a signal handler writes the file: nothing to wait on but its size
            pause = min(pause * 2, 0.05)

    def stop(self, grace_s: float = 5.0) -> None:
        """Polite shutdown: ask every rank to leave the group, then kill whoever is left."""
        for conn in self.conns:
            with suppress(OSError, ValueError):
                conn.send(("stop",))
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        """SIGKILL every rank that is still alive and reap it. Safe to call twice."""
        for proc in self.procs:
            if proc.is_alive():
                with suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.join(timeout=5.0)
        for conn in [*self.conns, *self.diag]:
            conn.close()
        self.procs, self.conns, self.diag = [], [], []


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def remove_workdir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie that exited but is not yet reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
