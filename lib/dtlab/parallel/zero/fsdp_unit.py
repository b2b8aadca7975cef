"""One FSDP unit: its sharded parameters, its gathered buffer, and the reductions of its gradients.

A unit (Zhao et al., "PyTorch FSDP", VLDB 2023) is a module whose parameters are gathered and
freed together. It holds two kinds of trainable parameter:

* **sharded** — laid end to end in one :class:`~dtlab.parallel.zero.flat_segment.FlatSegment`. Rank r
  keeps chunk r of it (``shard``, in the parameters' own dtype, fp32 in practice: these are the
  master weights). What the module registers between steps is one ``nn.Parameter`` per original
  parameter, a 1-D *view* of the part of ``shard`` that falls in that parameter (possibly empty),
  so a plain ``torch.optim.AdamW(model.parameters())`` updates exactly the values the next
  all-gather sends — the layout of FSDP1's ``use_orig_params=True``. Before the unit runs, the
  shards are cast to the compute dtype and all-gathered into ``flat``, the original Parameter
  objects become views of it and are registered in their modules in place of the shards.
* **replicated** — kept whole on every rank (chosen with ``shard=``, e.g. small norms and
  biases). They are registered as themselves; under a lower compute dtype a cast copy computes
  and its gradient is all-reduced and averaged, exactly like DDP.

After backward, every registered parameter's ``.grad`` is its part of the averaged gradient
(sharded: the slice of the reduce-scattered shard; replicated: the all-reduced tensor). A
backward that does not synchronise (the wrapper's ``no_sync()``) reduces nothing: the unit adds
its full gradients into ``unsynced`` (one padded flat tensor per kind, in the reduce dtype: a
whole unsharded gradient held per rank) and the next synchronising backward reduces their sum.

This file says *what* a unit can do (gather, free, register, reduce, finish); *when* it does
each is the state machine in :mod:`~dtlab.parallel.zero.fsdp_lifecycle`, which alone calls
these operations and alone knows whether the unit is gathered, prefetched or reduced.
"""

from __future__ import annotations

import torch
from torch import nn

from dtlab.comm import Communicator, PendingCollective, nbytes
from dtlab.parallel.zero.flat_segment import FlatSegment
from dtlab.parallel.zero.gather_cast import DecodedGather, GatherCast
from dtlab.precision.mixed_precision import MixedPrecision, compute_dtype

Slot = tuple[nn.Module, str]


class FSDPUnit:
    """A unit's parameters in their three forms: sharded (at rest), gathered, and replicated."""

    def __init__(
        self,
        index: int,
        module: nn.Module,
        sharded: list[tuple[nn.Parameter, list[Slot]]],
        replicated: list[tuple[nn.Parameter, list[Slot]]],
        policy: MixedPrecision | None,
        comm: Communicator,
        rank: int,
        gather_cast: GatherCast | None = None,
    ) -> None:
        self.index, self.module, self.policy, self.comm = index, module, policy, comm
        self.gather_cast = gather_cast
        self.params = [p for p, _ in sharded]  # the original Parameters: views of ``flat`` in use
        self.slots = [slots for _, slots in sharded]
        self.seg = FlatSegment(self.params, rank, comm.world_size)
        first = (self.params or [p for p, _ in replicated] or [None])[0]
        self.master_dtype = first.dtype if first is not None else torch.float32
        self.compute_dtype = compute_dtype(policy, self.master_dtype)
        self.reduce_dtype = (policy and policy.gradient_dtype) or self.compute_dtype
        self.pending: list[tuple[PendingCollective | None, torch.Tensor, str]] = []
        self.unsynced: dict[str, torch.Tensor] = {}  # kind -> full gradient not yet reduced
        self.flat = torch.empty(0)
        self.shard = torch.empty(0)
        self.replicated = [p for p, _ in replicated]
        self.replicated_slots = [slots for _, slots in replicated]
        self.replicated_compute = [
            p if p.dtype == self.compute_dtype else nn.Parameter(p.detach().to(self.compute_dtype))
            for p in self.replicated
        ]
        self._copied_version = [p._version for p in self.replicated]
        self.shard_params: list[nn.Parameter] = []
        if self.params:
            self._shard_parameters()

    @property
    def gradient_count(self) -> int:
        """How many gradients one backward accumulates into this unit (one per hooked tensor)."""
        return len(self.params) + len(self.replicated_compute)

    # -- sharded layout ---------------------------------------------------------------------
    @torch.no_grad()
    def _shard_parameters(self) -> None:
        seg, device = self.seg, self.params[0].device
        full = seg.flatten([p.detach() for p in self.params], self.master_dtype, device)
        lo, hi = seg.my_range
        self.shard = full[lo:hi].clone()
        for off, n in zip(seg.offsets, seg.numels, strict=True):
            start, stop = max(off, lo), min(off + n, hi)
            view = self.shard[start - lo : max(start, stop) - lo]
            self.shard_params.append(nn.Parameter(view))
        self.flat = torch.empty(seg.padded_numel, dtype=self.compute_dtype, device=device)
        seg.point_params_at(self.flat)
        self.free()
        self.register(sharded=True)

    def register(self, sharded: bool) -> None:
        """Put the shards (at rest) or the gathered parameters (in use) into the modules."""
        for i, slots in enumerate(self.slots):
            param = self.shard_params[i] if sharded else self.params[i]
            for module, name in slots:
                module._parameters[name] = param
        for i, slots in enumerate(self.replicated_slots):
            param = self.replicated[i] if sharded else self.replicated_compute[i]
            for module, name in slots:
                module._parameters[name] = param

    def free(self) -> None:
        """Drop the gathered parameters: the buffer's storage shrinks to zero bytes."""
        self.flat.untyped_storage().resize_(0)

    def launch_gather(self, async_op: bool) -> PendingCollective | DecodedGather | None:
        """All-gather every rank's shard (cast to the compute dtype) into ``flat``; with a
        ``gather_cast`` (:mod:`~dtlab.parallel.zero.gather_cast`), its payload instead, decoded
        into ``flat`` when waited for (at once when ``async_op`` is False)."""
        self.flat.untyped_storage().resize_(self.seg.padded_numel * self.flat.element_size())
        with torch.no_grad():  # refresh a replica's compute copy only after the optimizer ran:
            # copying again in backward would bump the version autograd saved for it
            for i, (compute, master) in enumerate(
                zip(self.replicated_compute, self.replicated, strict=True)
            ):
                if compute is not master and self._copied_version[i] != master._version:
                    compute.copy_(master)
                    self._copied_version[i] = master._version
        if not self.params:
            return None
        name = f"unit[{self.index}].all_gather"
        if self.gather_cast is None:
            send = self.shard.detach().to(self.compute_dtype)
            return self.comm.all_gather(self.flat, send, name=name, async_op=async_op)
        payload, decode = self.gather_cast(self.shard.detach(), self.comm)
        if payload.dim() != 1 or payload.numel() != self.shard.numel():
            raise ValueError(
                f"gather_cast returned a payload of shape {tuple(payload.shape)} for a shard of "
                f"{self.shard.numel()} elements; return a 1-D tensor with one element per shard "
                "element (view float8 as uint8 for gloo)"
            )
        wire = payload.new_empty(self.seg.padded_numel)
        handle = self.comm.all_gather(wire, payload, name=name, async_op=async_op)

        def finish() -> None:  # ``.data``: no version bump on the Parameters viewing ``flat``
            self.flat.data.copy_(decode(wire).to(self.compute_dtype))

        gather = DecodedGather(handle, finish)
        if not async_op:
            gather.wait()
            return None
        return gather

    # -- gradients ----------------------------------------------------------------------------
    @torch.no_grad()
    def launch_reduction(self, sync: bool = True) -> None:
        """Reduce-scatter the sharded gradients, all-reduce the replicated ones (asynchronously),
        then free the full gradients and the gathered parameters.

        With ``sync=False`` nothing is sent: the full gradients are added into ``unsynced``
        instead, and the next ``sync=True`` call reduces them together with its own.
        """
        device = self.flat.device
        if self.params:
            carried = self.unsynced.pop("sharded", None)
            if sync:
                work, shard = self.seg.reduce_scatter_gradients(
                    self.comm, self.reduce_dtype, device,
                    name=f"unit[{self.index}].grad_rs", async_op=True, carried=carried,
                )  # fmt: skip
                self.pending.append((work, shard, "sharded"))
            else:
                self.unsynced["sharded"] = self.seg.take_gradients(
                    self.reduce_dtype, device, carried
                )
        if self.replicated_compute:
            rep = FlatSegment(self.replicated_compute, 0, 1)
            carried = self.unsynced.pop("replicated", None)
            flat = rep.take_gradients(self.reduce_dtype, self.replicated[0].device, carried)
            if sync:
                work = self.comm.all_reduce(flat, name=f"unit[{self.index}].grad_ar", async_op=True)
                self.pending.append((work, flat, "replicated"))
            else:
                self.unsynced["replicated"] = flat
        self.free()

    @torch.no_grad()
    def finish_reduction(self) -> None:
        """Wait for the reductions, average, and add the results to the registered ``.grad``."""
        for work, buffer, kind in self.pending:
            if work is not None:
                work.wait()
            buffer = buffer.to(self.master_dtype).div_(self.comm.world_size)
            if kind == "sharded":
                lo = self.seg.my_range[0]
                for sp, off in zip(self.shard_params, self.seg.offsets, strict=True):
                    start = max(off, lo) - lo
                    _accumulate(sp, buffer[start : start + sp.numel()])
            else:
                rep = FlatSegment(self.replicated, 0, 1)
                for p, view in zip(self.replicated, rep.views(buffer), strict=True):
                    _accumulate(p, view.to(p.dtype))
        self.pending = []

    def held_bytes(self) -> dict[str, int]:
        """Parameter bytes this rank holds now: shards, replicas, and the gathered buffer."""
        distinct = {id(p): p for p in self.replicated + self.replicated_compute}
        return {
            "sharded": nbytes(self.shard),
            "replicated": sum(nbytes(p) for p in distinct.values()),
            "gathered": self.flat.untyped_storage().size(),
        }


def _accumulate(param: nn.Parameter, grad: torch.Tensor) -> None:
    """``param.grad += grad`` (a view when there was none: no copy for the common case)."""
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)
