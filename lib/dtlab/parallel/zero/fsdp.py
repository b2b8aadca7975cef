"""ZeRO-3 / FSDP: shard the parameters too, gathering one unit at a time just before it is used.

Rajbhandari et al. (SC 2020) §5.3 and Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully
Sharded Data Parallel" (VLDB 2023). The model is cut into *units* (typically one per transformer
block, plus the *root* unit holding everything else: embeddings, final norm, head); units may
nest (a norm inside a block), and a parameter belongs to the innermost unit that contains it.
Between uses a rank keeps only chunk r of each unit's flat segment (:mod:`~dtlab.parallel.zero.fsdp_unit`). What moves
where:

* **forward** — before unit k runs, all-gather its parameters ((N-1)/N·Ψ_k·b bytes sent per
  rank, ``b`` the compute dtype's size) and launch the all-gather of unit k+1 asynchronously
  (*prefetch*) so it overlaps unit k's compute. After unit k, free the gathered buffer.
* **backward** — when the gradient reaches unit k's outputs, all-gather it again (and prefetch
  the unit before it); when every parameter of unit k has its gradient, launch an asynchronous
  *reduce-scatter* of the gradients ((N-1)/N·Ψ_k·b) and free the full gradients and parameters.
  At the end of backward every reduce-scatter is waited for, averaged, and lands in the
  registered (sharded) parameters' ``.grad``.

Per step that is 3·(N-1)/N·Ψ·b = 1.5× the 2·(N-1)/N·Ψ·b of one DDP all-reduce, in exchange for
holding 16Ψ/N bytes instead of 16Ψ (mixed-precision Adam). Every unit, the root included, is
re-gathered for backward, so the 1.5× holds exactly — with activation checkpointing too: a
recompute runs inside that backward gather and costs no extra all-gather (FSDP2's
``fully_shard`` gathers a checkpointed block exactly as often: once in forward, once in
backward). Gradient accumulation under :meth:`FullyShardedDataParallel.no_sync` trades the
per-micro-batch reduce-scatter for a full unsharded gradient held per rank (see there).

It drops into an ordinary training loop, as torch's ``fully_shard`` does::

    fsdp = FullyShardedDataParallel(model, units=list(model.blocks))
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-3)      # steps the shards in place
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    loss_fn(fsdp(x), y).backward(); fsdp.clip_grad_norm_(1.0); opt.step(); sched.step()

*Why register shards on the module*: a plain optimizer must update what the next forward uses.
The module's registered parameters are therefore views of this rank's shard (FSDP1's
``use_orig_params`` layout; FSDP2 registers DTensor shards for the same reason), and their
``.grad`` after backward is this rank's slice of the averaged gradient (:meth:`full_gradients`
gathers whole ones). While backward runs, a unit keeps its gathered parameters registered from
the moment the gradient reaches its output until its gradients are reduced, so both kinds of
activation checkpointing re-run it on whole parameters: ``checkpoint(block, x)`` from outside
(the re-run passes through the unit's forward hooks, which gather nothing new and free nothing)
and a block that checkpoints its own body inside ``forward`` (the Hugging Face style: the body
re-runs without any hook of the unit, reading whatever its modules hold). FSDP2 does the same:
its pre-backward hook unshards the group and registers the unsharded parameters.

*When* a unit gathers, frees, prefetches and reduces is one state machine,
:mod:`~dtlab.parallel.zero.fsdp_lifecycle` (its docstring draws it). The hooks below only report
events to it (a unit's forward starts or ends, the gradient reaches its output, a parameter's
gradient accumulated, backward ended); the collectives themselves are
:class:`~dtlab.parallel.zero.fsdp_unit.FSDPUnit`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from dtlab.collectives.stats import CommStats
from dtlab.comm import Communicator, nbytes
from dtlab.parallel.gradient_sync import broadcast_module_state
from dtlab.parallel.zero.fsdp_layout import assign_units, cast_inputs, tensors_in
from dtlab.parallel.zero.fsdp_lifecycle import FSDPLifecycle
from dtlab.parallel.zero.fsdp_unit import FSDPUnit
from dtlab.parallel.zero.gather_cast import GatherCast
from dtlab.parallel.zero.grad_clip import clip_sharded_grad_norm_
from dtlab.precision.mixed_precision import MixedPrecision

Policy = MixedPrecision | Callable[[nn.Module], MixedPrecision | None] | None


class FullyShardedDataParallel(nn.Module):
    """Parameter-sharded data parallel over ``units`` (see module docstring).

    ``shard(name, param) -> bool`` picks which trainable parameters are sharded (default: all);
    the rest are replicated and all-reduced. ``mixed_precision`` is one policy or a function
    from a unit's module to its policy (see :func:`~dtlab.parallel.norms_in_fp32`).

    ``forward_prefetch`` / ``backward_prefetch``: how many units ahead launch their all-gather
    (FSDP2's ``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch`` lists;
    ``prefetch=False`` makes both 0). ``reshard_after_forward=False`` keeps each unit gathered
    from forward to backward (FSDP2's flag of the same name): no backward all-gather, all the
    gathered parameters held at the end of forward. What each costs:
    :func:`~dtlab.parallel.zero.prefetch.measure_fsdp_prefetch`.

    ``gather_cast(shard, comm) -> (payload, decode)`` replaces the cast of each unit's shard to
    the compute dtype before its all-gather: the gather moves ``payload`` and every rank writes
    ``decode(gathered)`` into the unit's parameters (:mod:`~dtlab.parallel.zero.gather_cast`;
    :func:`~dtlab.parallel.zero.gather_cast.fp8_e4m3_gather_cast` sends E4M3 bytes with one
    agreed scale per unit). ``None`` (the default) is the plain cast.
    """

    def __init__(
        self,
        module: nn.Module,
        units: list[nn.Module] | None = None,
        process_group: dist.ProcessGroup | None = None,
        mixed_precision: Policy = None,
        prefetch: bool = True,
        shard: Callable[[str, nn.Parameter], bool] | None = None,
        collectives: str = "torch",
        *,
        forward_prefetch: int = 1,
        backward_prefetch: int = 1,
        reshard_after_forward: bool = True,
        gather_cast: GatherCast | None = None,
    ) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError(
                "FSDP needs a process group: run inside cluster.run(...) or torchrun"
            )
        self.module, self.process_group = module, process_group
        self.comm = Communicator(process_group, collectives, dim="dp")
        self.world_size = self.comm.world_size
        broadcast_module_state(module, self.comm)
        self.comm.comm_stats.reset()
        policy_of = mixed_precision if callable(mixed_precision) else lambda _m: mixed_precision
        rank = dist.get_rank(process_group)
        self.units: list[FSDPUnit] = []
        for module_k, sharded, replicated in assign_units(module, units, shard or _shard_all):
            unit = FSDPUnit(
                len(self.units), module_k, sharded, replicated, policy_of(module_k), self.comm,
                rank, gather_cast,
            )  # fmt: skip
            self.units.append(unit)
            _cast_frozen_state(module_k, [u.module for u in self.units], unit.compute_dtype)
            if module_k is not module:
                module_k.register_forward_pre_hook(
                    lambda m, args, u=unit: self._before_forward(u, args)
                )
                module_k.register_forward_hook(
                    lambda m, a, out, u=unit: self._after_forward(u, out)
                )
            for p in unit.params + unit.replicated_compute:
                p.register_post_accumulate_grad_hook(lambda p, u=unit: self._on_gradient(u))
        self.lifecycle = FSDPLifecycle(
            self.units,
            prefetch,
            self.finish_gradient_synchronization,
            forward_prefetch=forward_prefetch,
            backward_prefetch=backward_prefetch,
            reshard_after_forward=reshard_after_forward,
        )

    @property
    def prefetch(self) -> bool:
        """Launch a unit's all-gather while its neighbour computes (forward k+1, backward k-1)."""
        return self.lifecycle.prefetch

    @prefetch.setter
    def prefetch(self, value: bool) -> None:
        self.lifecycle.prefetch = value

    @property
    def comm_stats(self) -> CommStats:
        """What this wrapper's collectives moved (``.counted`` says measured or convention)."""
        return self.comm.comm_stats

    # -- hooks: each reports one event to the lifecycle ------------------------------------------
    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled():
            self.lifecycle.step_start()
        args = self._before_forward(self.units[0], args)
        out = self.module(*args, **kwargs)
        return self._after_forward(self.units[0], out)

    def _before_forward(self, unit: FSDPUnit, args: tuple) -> tuple:
        self.lifecycle.forward_start(unit.index)
        return cast_inputs(args, unit.policy)

    def _after_forward(self, unit: FSDPUnit, output):
        if unit.policy is not None and unit.policy.output_dtype is not None:
            output = cast_inputs(output, unit.policy, unit.policy.output_dtype)
        if self.lifecycle.forward_end(unit.index):
            for t in tensors_in(output):
                if t.requires_grad:
                    t.register_hook(lambda g, u=unit: self._before_backward(u, g))
        return output

    def _before_backward(self, unit: FSDPUnit, grad: torch.Tensor) -> torch.Tensor:
        self.lifecycle.grad_at_output(unit.index)
        return grad

    def _on_gradient(self, unit: FSDPUnit) -> None:
        self.lifecycle.gradient(unit.index)

    def finish_gradient_synchronization(self) -> None:
        """End of backward: reduce units whose parameters got no gradient (zeros), wait for
        every reduction, and free everything gathered."""
        self.lifecycle.backward_end()

    # -- gradient accumulation without reducing ------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards inside this context reduce nothing; the first one outside reduces them all.

        Each unit keeps its *full* gradient (padded Ψ_k elements in the reduce dtype) between
        the micro-batches, adds every later backward's into it, and the next synchronising
        backward reduce-scatters the sum once: K micro-batches send one reduce-scatter instead of
        K, but every rank holds a whole unsharded gradient (Ψ·b bytes, :meth:`unsynced_gradient_bytes`)
        on top of its shards — the memory ZeRO-2/3 exist to save. The all-gathers are not saved:
        every micro-batch still gathers each unit for forward and backward. torch's FSDP1
        ``no_sync()`` and FSDP2's ``set_requires_gradient_sync(False)`` make the same trade.
        Step the optimizer only after the synchronising backward (the registered ``.grad`` are
        untouched until then).
        """
        previous, self.lifecycle.sync = self.lifecycle.sync, False
        try:
            yield
        finally:
            self.lifecycle.sync = previous

    def unsynced_gradient_bytes(self) -> int:
        """Bytes of full gradients this rank holds for a later reduction (0 outside no_sync)."""
        return sum(nbytes(t) for u in self.units for t in u.unsynced.values())

    # -- gradients, clipping and accounting ----------------------------------------------------
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip every gradient by the *global* norm (shards summed over ranks, replicas once)."""
        sharded = [p.grad for u in self.units for p in u.shard_params if p.grad is not None]
        replicated = [p.grad for u in self.units for p in u.replicated if p.grad is not None]
        return clip_sharded_grad_norm_(sharded, max_norm, self.comm, replicated=replicated)

    @torch.no_grad()
    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Every parameter's whole averaged gradient by name (all-gathered; for logging/tests)."""
        from dtlab.parallel.zero.full_state import gather_full_tensors

        return gather_full_tensors(self, lambda p: p.grad)

    def held_bytes(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
        """Bytes this rank holds now by category, measured from the tensors, and by device."""
        from dtlab.parallel.zero.full_state import held_by_category

        return held_by_category(self, optimizer)

    def held_parameter_bytes(self) -> int:
        """Parameter bytes this rank holds now: shards, replicas and any gathered units."""
        return sum(sum(u.held_bytes().values()) for u in self.units)

    def build_optimizer(self, optimizer_cls: type[torch.optim.Optimizer], **kwargs):
        """``optimizer_cls(self.parameters(), **kwargs)``: a plain optimizer steps the shards."""
        return optimizer_cls(self.parameters(), **kwargs)


def _shard_all(_name: str, _param: nn.Parameter) -> bool:
    return True


def _cast_frozen_state(module: nn.Module, unit_modules: list[nn.Module], dtype) -> None:
    """Frozen parameters and buffers owned by this unit compute in its dtype too."""
    inner = {id(m) for m in unit_modules if m is not module}
    stack = [module]
    while stack:
        m = stack.pop()
        for p in list(m._parameters.values()):
            if p is not None and not p.requires_grad and p.is_floating_point():
                p.data = p.data.to(dtype)
        for name, b in list(m._buffers.items()):
            if b is not None and b.is_floating_point():
                m._buffers[name] = b.to(dtype)
        stack.extend(c for c in m.children() if id(c) not in inner)
