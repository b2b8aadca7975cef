"""The gather cast: what a unit's all-gather puts on the wire, and how every rank reads it back.

By default an FSDP unit casts this rank's master shard to the compute dtype and all-gathers that
into ``flat`` (BF16 under a BF16 policy: 2 bytes per element on the wire). A **gather cast**
(``FullyShardedDataParallel(..., gather_cast=...)``) replaces the cast: a callable
``gather_cast(shard, comm) -> (payload, decode)`` where

* ``shard`` — this rank's master shard of the unit (1-D, detached, the master dtype);
* ``payload`` — a 1-D tensor of ``shard.numel()`` elements in any dtype the backend moves (gloo
  has no float8: send its bytes as ``uint8``). The all-gather moves the payloads, so the counted
  bytes are the payload's;
* ``decode(gathered)`` — from the gathered payloads (``N · shard.numel()`` elements, rank order)
  to the unit's parameters in any floating dtype (written into ``flat`` in the compute dtype).
  It must depend only on ``gathered`` and on values every rank agreed on, so that every rank
  decodes the same bits.

The hook runs on the calling thread when the gather is launched (a prefetch too) and may run
collectives over ``comm`` — every rank launches the same gathers in the same order — e.g. agree
on a scale. ``decode`` runs when the gather is waited for. Between the two the rank holds the
gathered payload beside ``flat`` (``N · shard.numel()`` payload elements).

:func:`fp8_e4m3_gather_cast` is torchao's FP8 all-gather for FSDP2
(``enable_fsdp_float8_all_gather`` with ``precompute_float8_dynamic_scale_for_fsdp``) on a whole
unit: one agreed amax per unit, E4M3 bytes on the wire — half of BF16's.
:mod:`dtlab.precision.fp8_all_gather` does the same per weight outside FSDP.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dtlab.comm import Communicator
from dtlab.precision.formats import E4M3_MAX

Decode = Callable[[torch.Tensor], torch.Tensor]
GatherCast = Callable[[torch.Tensor, Communicator], tuple[torch.Tensor, Decode]]


def fp8_e4m3_gather_cast(shard: torch.Tensor, comm: Communicator) -> tuple[torch.Tensor, Decode]:
    """One unit's shard as E4M3 bytes with a scale every rank agrees on.

    The amax of the local shard is all-reduced (MAX) over ``comm`` — ``N`` float32s, as the
    ring splits its payload into ``N`` chunks — so ``scale = amax / 448`` is the whole unit's on
    every rank; the shard is divided by it, saturated at ±448 and cast to E4M3; ``decode`` is
    ``q · scale`` in float32. A unit of all zeros uses scale 1.
    """
    amax = (
        shard.detach().abs().max().float()
        if shard.numel()
        else torch.zeros((), device=shard.device)
    )
    agreed = amax.expand(comm.world_size).clone().to(shard.device)
    comm.all_reduce(agreed, name="fp8_amax", op="max")
    top = float(agreed[0])
    scale = top / E4M3_MAX if top > 0 else 1.0
    codes = (shard.detach().float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)

    def decode(gathered: torch.Tensor) -> torch.Tensor:
        return gathered.view(torch.float8_e4m3fn).float() * scale

    return codes.view(torch.uint8), decode


class DecodedGather:
    """A unit's all-gather of a gather cast's payload; :meth:`wait` decodes it into ``flat``."""

    def __init__(self, handle, finish: Callable[[], None]) -> None:
        self.handle, self.finish, self._done = handle, finish, False

    @property
    def overlapped(self) -> bool:
        return bool(getattr(self.handle, "overlapped", False))

    def wait(self) -> None:
        """Wait for the payloads, then decode them (once)."""
        if self._done:
            return
        if self.handle is not None:
            self.handle.wait()
        self.finish()
        self._done = True
