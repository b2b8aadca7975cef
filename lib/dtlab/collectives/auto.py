"""``algorithm="auto"``: every rank prices every schedule with one α-β link model and runs the cheapest.

``all_reduce``, ``reduce_scatter`` and ``all_gather`` take ``algorithm="auto"``. The call's
``M`` bytes and group size ``N`` go to :func:`choose_algorithm`, which prices each registered
schedule of the op with :func:`dtlab.cost.collective_time` on the **link model** —
``α`` (seconds per message) and the bandwidth (bytes per second) — and picks the fastest
(:mod:`dtlab.cost.tuner`; NCCL's tuner does the same at every call with its own model) — for
the pipelined double tree also its number of segments, the model's best rather than the fixed
size a named call uses. The chosen schedule's spans carry ``algorithm=<choice>`` and
``chosen_by="auto"`` labels, and :func:`last_choice` returns the choice with every candidate's
predicted time.

Where the link model comes from, per process (per simulated rank under
:func:`~dtlab.collectives.simulate`, which starts from the process's):

* :func:`set_link_model` — give it (e.g. the datasheet of a GPU link, or a fitted one); or
* :func:`fit_link_model` — measure it: every rank of the group sends ``M`` bytes to its right
  neighbour while receiving from its left (one ring step, ``α + M β``), at 256 B, 4 KiB, 64 KiB
  and 1 MiB, fastest of five each; α and β are fitted to group rank 0's times
  (:func:`dtlab.cost.fit.fit_alpha_beta`) and sent to every rank, so all choose alike. These
  are control messages: not counted in :func:`~dtlab.collectives.comm_stats`, drawn as
  ``link model fit (control)`` spans of kind ``other``. 20–40 ms on three gloo CPU ranks of a
  busy 2-core host.
* neither: the first ``auto`` call of the process fits one, on that call's group, and keeps it.
  Only that group's ranks get it, so when ``auto`` runs on subgroups (a mesh's TP and DP groups)
  call :func:`fit_link_model` on every rank first.

Every rank must price with the same model, or they could choose different schedules and hang.
So an ``auto`` call's agreement check (:mod:`~dtlab.collectives.agreement`) carries a
fingerprint of the rank's model (0 when it has none): ranks that disagree all raise
:class:`~dtlab.collectives.agreement.CollectiveMismatch` before anything moves, and ranks that
all have none fit one together.
"""

from __future__ import annotations

import hashlib
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from dtlab import trace
from dtlab.collectives import p2p
from dtlab.collectives.agreement import CallDescriptor
from dtlab.collectives.p2p import Group, Peers, peers_of
from dtlab.cost.alpha_beta import Link
from dtlab.cost.fit import fit_alpha_beta
from dtlab.cost.tuner import best_segments, fastest_algorithm, predicted_times

AUTO = "auto"

AUTO_CANDIDATES: dict[str, tuple[str, ...]] = {}
"""The schedules ``auto`` may choose per op: every registered one (each op's module fills its
entry), in registry order, which breaks ties."""

FIT_SIZES = (256, 4 << 10, 64 << 10, 1 << 20)
FIT_REPEATS = 5

_process_link: Link | None = None
_choices = threading.local()


@dataclass(frozen=True)
class AutoChoice:
    """What one ``auto`` call chose, and why: every candidate's predicted seconds on ``link``."""

    op: str
    nbytes: int
    world_size: int
    algorithm: str
    predicted_s: dict[str, float]
    link: Link
    segments: int | None = None  # the pipelined double tree's segments per half, model-chosen


def link_model() -> Link | None:
    """The link model ``auto`` prices with on this rank, or ``None`` if none was set or fitted."""
    world = getattr(p2p._thread, "world", None)
    return world.link_model if world is not None else _process_link


def set_link_model(
    alpha_s: float | Link | None, bandwidth_bytes_per_s: float | None = None
) -> Link | None:
    """Use this link for ``auto`` on this rank from now on: ``set_link_model(20e-6, 10e9)``,
    ``set_link_model(Link(...))``, or ``set_link_model(None)`` to forget it (the next ``auto``
    call fits a new one). Set the same one on every rank of a group."""
    global _process_link
    if alpha_s is None or isinstance(alpha_s, Link):
        link = alpha_s
    elif bandwidth_bytes_per_s is None:
        raise ValueError(
            "set_link_model needs a bandwidth too: set_link_model(alpha_s, bandwidth_bytes_per_s)"
            ", e.g. set_link_model(20e-6, 10e9) for 20 µs and 10 GB/s"
        )
    else:
        link = Link(float(alpha_s), float(bandwidth_bytes_per_s), "set_link_model")
    world = getattr(p2p._thread, "world", None)
    if world is not None:
        world.link_model = link
    else:
        _process_link = link
    return link


def fingerprint(link: Link | None) -> int:
    """A 62-bit digest of α and the bandwidth (0 for no model): what ranks compare."""
    if link is None:
        return 0
    packed = struct.pack("<dd", link.alpha_s, link.bandwidth_bytes_per_s)
    return int.from_bytes(hashlib.blake2b(packed, digest_size=8).digest(), "little") >> 2 or 1


def call_descriptor(call: CallDescriptor) -> CallDescriptor:
    """``call`` as the agreement check should see it: for ``auto``, with this rank's model's
    fingerprint in ``detail`` (the ops that take ``auto`` use no other ``detail``)."""
    if call.algorithm != AUTO:
        return call
    return replace(call, detail=fingerprint(link_model()))


def fit_link_model(
    group: Group = None,
    *,
    sizes: Sequence[int] = FIT_SIZES,
    repeats: int = FIT_REPEATS,
    device: torch.device | str | None = None,
) -> Link:
    """Measure α and the bandwidth between the ranks of ``group`` (every rank of it must call
    this) and keep the result as this rank's link model. Returns it."""
    peers = peers_of(group)
    if peers.size < 2:
        raise ValueError("fitting a link needs at least 2 ranks; this group has 1")
    if device is None:
        from dtlab.runtime.context import device as current_device

        device = current_device()
    return _fit_on(peers, sizes, repeats, torch.device(device))


def _fit_on(peers: Peers, sizes: Sequence[int], repeats: int, device: torch.device) -> Link:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    name = "link model fit (control)"
    fastest = []
    for nbytes in sizes:
        outgoing = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        incoming = torch.empty_like(outgoing)
        times = []
        for _ in range(repeats + 1):  # the first exchange of each size is a warm-up
            start = time.perf_counter()
            peers.exchange_control([(peers.right, outgoing)], [(peers.left, incoming)], name=name)
            sync()
            times.append(time.perf_counter() - start)
        fastest.append(min(times[1:]))
    # Group rank 0 fits and everyone adopts its numbers, so every rank holds the same model.
    numbers = torch.zeros(2, dtype=torch.float64, device=device)
    if peers.rank == 0:
        fitted = fit_alpha_beta(sizes, fastest, "broadcast", "flat", 2)
        numbers[0], numbers[1] = fitted.alpha_s, fitted.bandwidth_bytes_per_s
        others = [(p, numbers) for p in range(1, peers.size)]
        peers.exchange_control(sends=others, name=name)
    else:
        peers.exchange_control(recvs=[(0, numbers)], name=name)
    alpha_s, bandwidth = numbers.tolist()
    link = Link(alpha_s, bandwidth, f"fitted on {peers.size} ranks")
    set_link_model(link)
    return link


def choose_algorithm(
    op: str,
    nbytes: int,
    n: int,
    link: Link | None = None,
    algorithms: Sequence[str] | None = None,
) -> str:
    """The schedule ``auto`` runs for ``op`` on ``nbytes`` over ``n`` ranks: the fastest of
    ``algorithms`` (default: every registered one) on ``link`` (default: :func:`link_model`)."""
    if op not in AUTO_CANDIDATES:
        raise ValueError(f"algorithm='auto' is for {sorted(AUTO_CANDIDATES)}, not {op!r}")
    link = link or link_model()
    if link is None:
        raise ValueError(
            "algorithm='auto' has no link model to price the schedules with: call "
            "dtlab.collectives.set_link_model(alpha_s, bandwidth_bytes_per_s) or "
            "fit_link_model() first (an auto collective fits one itself)"
        )
    return fastest_algorithm(op, nbytes, n, link, algorithms or AUTO_CANDIDATES[op])


def choose_for_call(peers: Peers, op: str, nbytes: int, device: torch.device) -> AutoChoice:
    """Inside an ``auto`` collective, after the agreement check: fit a model if the ranks agreed
    they have none, choose (a pipelined schedule's segments too), and remember the choice for
    :func:`last_choice`."""
    link = link_model() or _fit_on(peers, FIT_SIZES, FIT_REPEATS, device)
    chosen = choose_algorithm(op, nbytes, peers.size, link)
    times = predicted_times(op, nbytes, peers.size, link, AUTO_CANDIDATES[op])
    segments = best_segments(op, chosen, nbytes, peers.size, link)
    _choices.last = AutoChoice(op, nbytes, peers.size, chosen, times, link, segments)
    return _choices.last


def schedule_options(choice: AutoChoice | None) -> dict:
    """Keyword arguments for the chosen schedule: the segments of a pipelined one."""
    return {"segments": choice.segments} if choice and choice.segments else {}


def last_choice() -> AutoChoice | None:
    """The latest ``auto`` call's choice on this rank (thread), or ``None`` before the first."""
    return getattr(_choices, "last", None)


@contextmanager
def labelled(requested: str, chosen: str) -> Iterator[None]:
    """Label the schedule's spans with the algorithm ``auto`` chose (nothing for a named one)."""
    if requested != AUTO:
        yield
        return
    with trace.labels(algorithm=chosen, chosen_by=AUTO):
        yield


def check_algorithm(op: str, algorithm: str, known: Sequence[str]) -> None:
    """Raise the learner-facing error for an unknown algorithm name."""
    if algorithm != AUTO and algorithm not in known:
        raise ValueError(
            f"unknown {op.replace('_', '-')} algorithm {algorithm!r}; "
            f"choose one of {[*known, AUTO]}"
        )
