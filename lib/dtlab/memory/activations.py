"""Count the bytes autograd keeps for the backward pass: the activation memory of a step.

Every op that needs its inputs or outputs to compute gradients *saves* them on the autograd graph
(Linear saves its input, ReLU its output, softmax its output, ...). PyTorch lets us intercept each
save with ``torch.autograd.graph.saved_tensors_hooks(pack, unpack)``: ``pack`` sees the tensor at
save time, and the object it returns lives exactly as long as the graph keeps that tensor —
until backward consumes it. :class:`ActivationMeter` wraps each save in a small handle that
counts its storage while alive, so it reports both the **total** saved in the forward pass and
the **peak** held at once (which, with backward freeing as it goes, is what the allocator sees).

Conventions:

* Bytes are of unique **storages**: ``q.view(...).transpose(...)`` saved twice, or a layer input
  saved by three projections, is one storage counted once. A saved view keeps its whole storage
  alive, so the storage is what costs memory.
* **Parameters are not activations**: Linear also saves its weight (as ``weight.t()``), which
  costs nothing extra. Tensors that are parameters, views of parameters, or share storage with a
  parameter of ``model`` are skipped.
* Under ``torch.utils.checkpoint`` (non-reentrant) only what a region keeps is seen — its inputs;
  the tensors saved inside it are dropped by checkpoint's own hooks and recomputed in backward,
  after the meter's forward-pass window.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
import torch.nn as nn

from dtlab.memory.measure import MemoryReport, _current_rank

_StorageKey = tuple[str, int | None, int]


def _storage_of(t: torch.Tensor) -> torch.UntypedStorage | None:
    local = getattr(t, "_local_tensor", t)  # a DTensor's shard is what this rank stores
    try:
        return local.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. sparse)
        return None


def _key(storage: torch.UntypedStorage) -> _StorageKey:
    return (storage.device.type, storage.device.index, storage.data_ptr())


class SavedStorage(NamedTuple):
    """One distinct storage saved for backward: who saved it first, as what, and its bytes."""

    module: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


class _Saved:
    """What the autograd graph holds instead of a saved tensor while the meter is on."""

    __slots__ = ("meter", "key", "tensor")

    def __init__(self, meter: ActivationMeter, key: _StorageKey, tensor: torch.Tensor) -> None:
        self.meter, self.key, self.tensor = meter, key, tensor

    def __del__(self) -> None:
        self.meter._release(self.key)


class ActivationMeter:
    """Context manager measuring the bytes saved for backward by the code run inside it.

    Example::

        with ActivationMeter(model) as meter:
            loss = loss_fn(model(x), y)
        print(meter.total_bytes, meter.by_module)   # what the forward pass stored
        loss.backward()                             # frees it: meter.current_bytes drops to 0

    Attributes:
        total_bytes: bytes of all distinct storages saved while the meter was on.
        peak_bytes: the most bytes held by saved tensors at any one moment.
        current_bytes: bytes held right now (falls as backward frees the graph).
        num_saved: how many tensors were saved (before de-duplication by storage).
        by_module: with ``model``, bytes by the innermost module whose forward saved the storage
            first (``""`` is the model's own forward).
        records: one :class:`SavedStorage` per distinct storage, in the order first saved — the
            raw material for a breakdown by tensor family
            (:func:`dtlab.memory.activation_families.measured_families`).
    """

    def __init__(
        self, model: nn.Module | None = None, exclude: Iterable[torch.Tensor] = ()
    ) -> None:
        self.model = model
        self._parameter_keys: set[_StorageKey] = set()
        for t in [*(model.parameters() if model is not None else ()), *exclude]:
            storage = _storage_of(t)
            if storage is not None:
                self._parameter_keys.add(_key(storage))
        self.total_bytes = 0
        self.peak_bytes = 0
        self.current_bytes = 0
        self.num_saved = 0
        self.by_module: dict[str, int] = {}
        self.records: list[SavedStorage] = []
        self._live: dict[_StorageKey, list[int]] = {}  # key -> [handles alive, nbytes]
        self._module_stack: list[str] = []
        self._module_hooks: list[Any] = []
        self._saved_hooks: torch.autograd.graph.saved_tensors_hooks | None = None

    def __enter__(self) -> ActivationMeter:
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._saved_hooks.__enter__()
        if self.model is not None:
            self._module_stack = []
            for name, module in self.model.named_modules():
                self._module_hooks.append(
                    module.register_forward_pre_hook(self._enter_module(name))
                )
                self._module_hooks.append(
                    module.register_forward_hook(self._leave_module, always_call=True)
                )
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._saved_hooks is not None
        self._saved_hooks.__exit__(*exc_info)
        for handle in self._module_hooks:
            handle.remove()
        self._module_hooks.clear()

    def report(self) -> MemoryReport:
        """The peak as a :class:`MemoryReport` with only ``activations`` filled in."""
        return MemoryReport(rank=_current_rank(), by_category={"activations": self.peak_bytes})

    # -- saved-tensor hooks ---------------------------------------------------------------

    def _pack(self, tensor: torch.Tensor) -> Any:
        self.num_saved += 1
        storage = _storage_of(tensor)
        if storage is None or self._is_parameter(tensor, storage):
            return tensor
        key = _key(storage)
        entry = self._live.get(key)
        if entry is None:
            nbytes = storage.nbytes()
            self._live[key] = entry = [0, nbytes]
            self.total_bytes += nbytes
            self.current_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
            owner = self._module_stack[-1] if self._module_stack else ""
            if self.model is not None:
                self.by_module[owner] = self.by_module.get(owner, 0) + nbytes
            self.records.append(SavedStorage(owner, tuple(tensor.shape), tensor.dtype, nbytes))
        entry[0] += 1
        return _Saved(self, key, tensor)

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Saved) else packed

    def _release(self, key: _StorageKey) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.current_bytes -= entry[1]
            del self._live[key]

    def _is_parameter(self, tensor: torch.Tensor, storage: torch.UntypedStorage) -> bool:
        if isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter):
            return True
        return _key(storage) in self._parameter_keys

    # -- module attribution ---------------------------------------------------------------

    def _enter_module(self, name: str):
        def hook(module: nn.Module, args: Any) -> None:
            self._module_stack.append(name)

        return hook

    def _leave_module(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._module_stack:
            self._module_stack.pop()
