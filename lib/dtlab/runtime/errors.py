"""Errors the Cluster raises in the notebook, each naming the rank and what to do next."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """Base class: something went wrong on the ranks of a Cluster."""


class RankError(ClusterError):
    """A user function raised on a rank. Carries that rank and its remote traceback.

    ``str(err)`` ends with the remote traceback, so a notebook shows where on the rank it broke.
    """

    def __init__(
        self, rank: int, exc_type: str, message: str, remote_traceback: str, note: str = ""
    ):
        self.rank = rank
        self.exc_type = exc_type
        self.remote_message = message
        self.remote_traceback = remote_traceback
        self.note = note
        text = f"rank {rank} raised {exc_type}: {message}"
        if note:
            text += f"\n{note}"
        text += f"\n\n--- traceback on rank {rank} ---\n{remote_traceback.rstrip()}"
        super().__init__(text)


class ResultNotPicklable(RankError):
    """The function ran, but its return value could not be sent back to the caller."""


class ClusterTimeout(ClusterError):
    """Some ranks did not finish within the timeout (a hang: mismatched collective, deadlock).

    ``pending`` maps each unfinished rank to what it was doing, e.g.
    ``{1: "torch.distributed.all_reduce, called from fn (cell line 3)"}``.
    """

    def __init__(self, message: str, pending: dict[int, str]):
        self.pending = pending
        super().__init__(message)


class RankDied(ClusterError):
    """A rank process exited while the caller was waiting on it (killed, OOM, os._exit)."""

    def __init__(self, message: str, rank: int, exitcode: int | None):
        self.rank = rank
        self.exitcode = exitcode
        super().__init__(message)
