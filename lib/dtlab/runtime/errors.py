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
    """Some ranks did not finish: a hang (mismatched collective, deadlock). Raised when the
    timeout passes, or at once when a rank is blocked on a peer that has already returned
    without posting its side (that wait can never end).

    ``pending`` maps each unfinished rank to what it was doing, e.g.
    ``{1: "blocked in torch.distributed.all_reduce over ranks [0, 1], called from fn (cell:3)"}``.
    """

    def __init__(self, message: str, pending: dict[int, str]):
        self.pending = pending
        super().__init__(message)


class UnfinishedWork(ClusterError):
    """The function returned on every rank, but left communication that can never finish: an
    ``isend``/``irecv`` (or ``async_op=True`` collective) whose peer never posted its side. Left
    alone it would be matched by the *next* run's messages, so the Cluster restarts instead.

    ``unfinished`` maps each rank to its unfinished operations, e.g.
    ``{0: ["torch.distributed.isend to rank 1 over ranks [0, 1], started at fn (cell:3)"]}``.
    """

    def __init__(self, message: str, unfinished: dict[int, list[str]]):
        self.unfinished = unfinished
        super().__init__(message)


class RankDied(ClusterError):
    """A rank process exited while the caller was waiting on it (killed, OOM, os._exit).

    The message names the signal and ends with what the rank last wrote to standard error
    (gloo's abort reason, a C++ ``terminate``, Python's fatal-error stack), also kept in
    ``last_words`` (``""`` when it wrote nothing, as a SIGKILLed rank cannot).
    """

    def __init__(self, message: str, rank: int, exitcode: int | None, last_words: str = ""):
        self.rank = rank
        self.exitcode = exitcode
        self.last_words = last_words
        super().__init__(message)
