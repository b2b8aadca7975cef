"""Activation offloading: what autograd saves for backward waits in host memory instead.

The third way to shrink activation memory, next to recomputation and sharding (ZeRO-Offload's
idea applied to activations; PyTorch ships it as ``torch.autograd.graph.save_on_cpu``). Every
tensor the forward pass saves goes through a saved-tensor hook: ``pack`` copies it device → host
(``nbytes`` over PCIe on a GPU, into pinned memory so the copy can be asynchronous) and the graph
keeps only the host copy; ``unpack``, when backward reaches the op, copies it host → device. Each
copy is a ``memcpy`` span on the trace, with its bytes, so the timeline shows what the transfers
cost and whether they hide behind compute.

Device memory saved = every saved activation (minus the ones below ``min_bytes``, kept on the
device: small tensors cost more in latency than they save). Price: ``2 ×`` the saved bytes over
the host link per step. On a CPU-only cluster the device *is* the host: ``pack`` still copies
(the spans show the cost) but saves nothing, ``unpack`` has nothing to copy back
(``bytes_to_device`` stays 0), and the lab says so.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from dtlab import trace

__all__ = ["OffloadActivations", "OffloadStats"]


@dataclass
class OffloadStats:
    """Saved tensors sent to the host and fetched back, counted from the copies themselves."""

    tensors_offloaded: int = 0
    bytes_to_host: int = 0
    bytes_to_device: int = 0
    tensors_kept: int = 0


class _OnHost:
    """A saved tensor's host copy; ``on_device`` is its copy back, shared by every op that saved
    the same tensor (freed with the last of them)."""

    __slots__ = ("host", "device", "on_device")

    def __init__(self, host: torch.Tensor, device: torch.device) -> None:
        self.host, self.device = host, device
        self.on_device: torch.Tensor | None = None


class OffloadActivations:
    """Context manager: tensors saved for backward inside it are kept in host memory.

    Example::

        with OffloadActivations() as offload:
            loss = loss_fn(model(x), y)
        loss.backward()
        offload.stats.bytes_to_host, offload.stats.bytes_to_device

    ``pin_memory`` (default: when CUDA is available) page-locks the host copies; parameters
    (``exclude``, or any ``nn.Parameter``) and tensors under ``min_bytes`` stay where they are.
    """

    def __init__(
        self,
        exclude: tuple[torch.Tensor, ...] | list[torch.Tensor] = (),
        min_bytes: int = 0,
        pin_memory: bool | None = None,
    ) -> None:
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.min_bytes = min_bytes
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.stats = OffloadStats()
        self._copies: dict[tuple, tuple[weakref.ref, _OnHost]] = {}
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None

    def __enter__(self) -> OffloadActivations:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._hooks is not None
        self._hooks.__exit__(*exc_info)
        self._copies.clear()  # the graph keeps its own references to the host copies

    def _pack(self, tensor: torch.Tensor) -> Any:
        nbytes = tensor.numel() * tensor.element_size()
        if (
            isinstance(tensor, torch.nn.Parameter)
            or isinstance(tensor._base, torch.nn.Parameter)
            or tensor.untyped_storage().data_ptr() in self.exclude
            or nbytes < self.min_bytes
        ):
            self.stats.tensors_kept += 1
            return tensor
        # A layer input saved by the q, k and v projections is copied once. The key holds a weak
        # reference to the tensor's base: while it is alive its memory cannot be reused.
        base = tensor if tensor._base is None else tensor._base
        key = (
            tensor.data_ptr(),
            tensor.dtype,
            tuple(tensor.shape),
            tensor.stride(),
            tensor._version,
        )
        hit = self._copies.get(key)
        if hit is not None and hit[0]() is base:
            return hit[1]
        with trace.span("offload", kind="memcpy", nbytes=nbytes):
            host = torch.empty(
                tensor.size(), dtype=tensor.dtype, layout=tensor.layout,
                pin_memory=self.pin_memory and tensor.is_cuda,
            )  # fmt: skip
            host.copy_(tensor, non_blocking=self.pin_memory and tensor.is_cuda)
        self.stats.tensors_offloaded += 1
        self.stats.bytes_to_host += nbytes
        packed = _OnHost(host, tensor.device)
        self._copies[key] = (weakref.ref(base), packed)
        return packed

    def _unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, _OnHost):
            return packed
        if packed.device == packed.host.device:  # a CPU run: the host copy *is* the device's
            return packed.host
        if packed.on_device is None:
            nbytes = packed.host.numel() * packed.host.element_size()
            with trace.span("reload", kind="memcpy", nbytes=nbytes):
                packed.on_device = packed.host.to(
                    packed.device, non_blocking=packed.host.is_pinned()
                )
            self.stats.bytes_to_device += nbytes
        return packed.on_device
