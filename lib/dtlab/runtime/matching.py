"""Operations match in posting order: what a rank posted, and when one can never complete.

Every rank numbers the operations it posts per counter (:func:`op_key`): collectives per process
group, sends and receives per ``(group, peer, tag)``. ``torch.distributed`` matches them in that
order — the k-th collective on a group with every member's k-th, the k-th send to a peer with
that peer's k-th receive from this rank — so once a rank has *returned* having posted fewer than
a peer waits for, the peer's operation can never complete (:func:`never_joined`). The counts are
kept by :mod:`dtlab.runtime.inflight` on each rank and judged by :mod:`dtlab.runtime.watch` in
the Cluster; this rule needs no grace time, so a slow rank is never taken for a stuck one.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.runtime.hang import Frame, dtlab_api, where


@dataclass
class Op:
    """One posted operation: ``index`` is its position among this rank's posts with the same key
    in this run (the 3rd send to rank 1 on group "0", tag 0 has index 3)."""

    call: str
    kind: str  # "collective", "send" or "recv"
    group: str
    members: tuple[int, ...]
    peer: int | None  # global rank of the other side (p2p); None: a receive from any rank
    tag: int
    index: int
    stack: tuple = ()  # (file, line, function) of the caller's frames, most recent first

    def to_dict(self) -> dict:
        """Plain data for the Cluster, with the user's line and the dtlab API named."""
        frames = [Frame(*f) for f in self.stack]
        fields = {k: v for k, v in vars(self).items() if k != "stack"}
        return {**fields, "where": where(frames), "api": dtlab_api(frames)}


def op_key(kind: str, group: str, peer: int | None = None, tag: int = 0) -> tuple:
    """The counter an operation advances: ``("collective", group)`` or ``(kind, group, peer, tag)``."""
    return ("collective", group) if kind == "collective" else (kind, group, peer, tag)


def never_joined(op: dict, rank: int, finished: dict[int, dict]) -> int | None:
    """A rank that returned having posted fewer operations than ``op`` (of ``rank``) needs from
    it, so ``op`` can never complete; ``None`` while every rank it needs may still post.

    ``finished`` maps each returned rank to its counts. Operations match in posting order, so the
    k-th collective on a group needs every member's k-th, and the k-th send to a peer needs that
    peer's k-th receive from this rank (a receive from any rank counts too).
    """
    group, tag, k, peer = op["group"], op["tag"], op["index"], op["peer"]
    if op["kind"] == "collective":
        key = op_key("collective", group)
        return next(
            (m for m in op["members"] if m in finished and finished[m].get(key, 0) < k), None
        )
    if op["kind"] == "send" and peer in finished:
        counts = finished[peer]
        posted = counts.get(op_key("recv", group, rank, tag), 0)
        posted += counts.get(op_key("recv", group, None, tag), 0)
        return peer if posted < k else None
    if op["kind"] == "recv" and peer is not None and peer in finished:
        return peer if finished[peer].get(op_key("send", group, rank, tag), 0) < k else None
    if op["kind"] == "recv" and peer is None:  # from any rank: only when every other has returned
        others = [m for m in op["members"] if m != rank]
        if all(m in finished for m in others):
            sent = sum(finished[m].get(op_key("send", group, rank, tag), 0) for m in others)
            return others[0] if others and sent < k else None
    return None
