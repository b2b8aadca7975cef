"""One record of bytes on the wire, shared by every collective and every parallel wrapper.

A :class:`CommStats` holds what one rank moved. Where the numbers come from is part of the
record, because the two sources mean different things:

* ``counted=True`` — every message went through :mod:`dtlab.collectives.p2p`, which adds the
  bytes of each real ``isend``/``irecv`` as it is posted. These are *measurements*: a test that
  holds them to a formula can fail.
* ``counted=False`` — the collective ran inside ``torch.distributed`` (gloo's or NCCL's own
  algorithm), which dtlab cannot see into. The bytes are then the nccl-tests ring *convention*
  for that op (see :func:`dtlab.comm.ring_bytes_sent`); printing them as
  "measured" would be false, so labels say "convention".

One record mixes the two only by marking itself uncounted: adding conventional bytes to a
counted record makes the whole record a convention.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace


@dataclass
class CommStats:
    """Messages and bytes this rank sent and received, in total and per collective kind."""

    messages_sent: int = 0
    bytes_sent: int = 0
    messages_received: int = 0
    bytes_received: int = 0
    calls: int = 0
    bytes_by_op: dict[str, float] = field(default_factory=dict)
    counted: bool = True

    @property
    def source(self) -> str:
        """``"counted"`` (real messages) or ``"ring convention"`` (torch collectives)."""
        return "counted" if self.counted else "ring convention"

    def add_call(self, op: str, sent: float, received: float = 0.0, *, counted: bool) -> None:
        """Record one collective call of kind ``op`` that sent ``sent`` bytes from this rank."""
        self.calls += 1
        self.bytes_sent += sent
        self.bytes_received += received
        self.bytes_by_op[op] = self.bytes_by_op.get(op, 0) + sent
        self.counted = self.counted and counted

    def reset(self) -> None:
        """Zero every counter (the record's source is kept)."""
        counted = self.counted
        for f in fields(self):
            setattr(self, f.name, f.default_factory() if callable(f.default_factory) else f.default)
        self.counted = counted

    def snapshot(self) -> CommStats:
        """A frozen copy of the counters now."""
        return replace(self, bytes_by_op=dict(self.bytes_by_op))

    def __sub__(self, earlier: CommStats) -> CommStats:
        return CommStats(
            self.messages_sent - earlier.messages_sent,
            self.bytes_sent - earlier.bytes_sent,
            self.messages_received - earlier.messages_received,
            self.bytes_received - earlier.bytes_received,
            self.calls - earlier.calls,
            {
                op: sent - earlier.bytes_by_op.get(op, 0)
                for op, sent in self.bytes_by_op.items()
                if sent != earlier.bytes_by_op.get(op, 0)
            },
            self.counted and earlier.counted,
        )

    def as_dict(self) -> dict[str, int]:
        """The four message and byte counters, by name."""
        return {
            "messages_sent": self.messages_sent,
            "bytes_sent": self.bytes_sent,
            "messages_received": self.messages_received,
            "bytes_received": self.bytes_received,
        }
