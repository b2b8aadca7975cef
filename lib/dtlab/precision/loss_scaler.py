"""Dynamic loss scaling for FP16, written out: scale, unscale, agree on overflow, skip, adapt.

FP16's smallest subnormal is 2⁻²⁴ ≈ 6e-8; many gradients are smaller and flush to zero
(Micikevicius et al., "Mixed Precision Training", ICLR 2018, §3.2). Multiplying the loss by
``S`` multiplies every gradient by ``S`` (backward is linear in the loss), lifting them into
range; dividing by ``S`` before the optimizer step (in fp32) gives the true gradient back. Too
large an ``S`` overflows to inf, so the scale is *dynamic*:

1. ``scaler.scale(loss).backward()`` — gradients are ``S ×`` the true ones;
2. :meth:`DynamicLossScaler.unscale_` checks every gradient *this rank holds* for inf/NaN and
   multiplies it by ``1/S`` (the check reads the scaled gradient, as GradScaler's
   ``_amp_foreach_non_finite_check_and_unscale_`` does). Under DDP each rank holds the whole averaged gradient, so an
   overflow anywhere reaches every rank through the all-reduce itself; under ZeRO-2/3 and FSDP a
   rank holds only its **shard**, and an inf in rank 1's shard is invisible to rank 0. So the
   local flags are combined with **one all-reduce (max) of a one-element flag** — 4 bytes — and
   every rank reaches the same verdict. A rank that stepped while another skipped would hang
   the next all-gather or silently diverge;
3. overflow: **skip** the optimizer step and multiply ``S`` by ``backoff_factor`` (0.5);
   otherwise step, and after ``growth_interval`` consecutive clean steps multiply ``S`` by
   ``growth_factor`` (2) — :func:`next_scale_state`, the same rule as ``torch.amp.GradScaler``.

``S`` is an **FP32 value**, as GradScaler keeps it (a 0-dim float32 tensor, updated by the
``_amp_update_scale_`` kernel): the start is rounded to fp32, and each new scale is the product
``S × factor`` taken in double precision and rounded once to fp32 (:func:`to_fp32`; a 0.3 backoff
from 27 gives 8.100000381…, not 8.1). A growth whose fp32 result is inf is **refused**: the scale
stays (2¹²⁷ × 2 = 2¹²⁸ is finite as a Python float but overflows FP32, and a scale of inf would
skip every later step), and the clean-step count still restarts at 0, as the kernel resets its
growth tracker. The trajectory equals GradScaler's bit for bit, for any factors and any start
that is positive and finite in fp32 (tests sweep them against ``torch.amp.GradScaler``).

``hysteresis = h > 1`` is DeepSpeed's ``DynamicLossScaler(delayed_shift=h)``: the first ``h−1``
overflows only skip (the scale stays) and the ``h``-th backs off; the allowance refills when the
scale next grows, i.e. when a growth interval completes (or after every clean step with
``consecutive_hysteresis=True``). It tolerates
rare spikes without halving the scale each time. With ``h = 1`` the trajectory equals
GradScaler's (tests compare them step by step on the same run).

Checking *after* the gradient reduction also catches a sum that overflowed on the wire.
Gradients that are DTensors (torch FSDP2's ``fully_shard``) are unscaled and checked through
their local shard, so the verdict still costs exactly one flag all-reduce. Unscaling happens in
fp32: a ZeRO optimizer's fp16 gradient shards are upcast first (DeepSpeed unscales its fp32
partition), and plain fp16 gradients are refused, as GradScaler refuses them — divided by ``S``
in fp16, the small ones would flush to zero again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from dtlab.comm import Communicator


def to_fp32(value: float) -> float:
    """``value`` rounded to the nearest FP32 number (inf beyond FP32's range), as a Python float.

    GradScaler's kernel computes ``scale * factor`` with a float scale and a double factor: the
    product is taken in double and rounded once to float; this is that rounding."""
    return torch.tensor(value, dtype=torch.float64).to(torch.float32).item()


@dataclass(frozen=True)
class ScalerConfig:
    """The knobs of dynamic loss scaling (defaults: ``torch.amp.GradScaler``'s).

    ``init_scale`` is rounded to FP32 when the scaler starts, as GradScaler stores it; a start
    that is 0 or inf in FP32 is refused (it would skip every step). ``min_scale`` (DeepSpeed's
    floor, 0 = none as in GradScaler) applies after the fp32 backoff."""

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    hysteresis: int = 1
    consecutive_hysteresis: bool = False
    min_scale: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < to_fp32(self.init_scale) < float("inf"):
            raise ValueError(
                f"init_scale {self.init_scale} must be positive and finite in FP32 (the scale "
                "is an FP32 value, as in torch.amp.GradScaler): between 2**-149 and 2**127, "
                "e.g. 2**16"
            )
        if self.growth_factor <= 1 or not 0 < self.backoff_factor < 1:
            raise ValueError(
                f"growth_factor {self.growth_factor} must be > 1 and backoff_factor "
                f"{self.backoff_factor} in (0, 1), e.g. 2.0 and 0.5"
            )
        if self.growth_interval < 1 or self.hysteresis < 1:
            raise ValueError(
                f"growth_interval {self.growth_interval} and hysteresis {self.hysteresis} must "
                "be >= 1 (hysteresis 1 = back off at every overflow, as GradScaler)"
            )


@dataclass(frozen=True)
class ScalerState:
    """Where the scaler stands: the scale, clean steps since the last change, overflows left."""

    scale: float
    clean_steps: int = 0
    hysteresis_left: int = 1

    @classmethod
    def start(cls, config: ScalerConfig) -> ScalerState:
        return cls(to_fp32(config.init_scale), 0, config.hysteresis)


def next_scale_state(state: ScalerState, found_inf: bool, config: ScalerConfig) -> ScalerState:
    """The update rule: back off on overflow (after the hysteresis allowance), grow after
    ``growth_interval`` clean steps in a row — in FP32, as ``torch._amp_update_scale_``:

    * overflow: ``S ← fp32(S × backoff_factor)``, count ← 0;
    * clean, count + 1 == ``growth_interval``: ``S ← fp32(S × growth_factor)`` only if that is
      finite (else ``S`` stays), count ← 0 either way;
    * clean otherwise: count ← count + 1.

    ``state.clean_steps`` is GradScaler's growth tracker. With hysteresis, the allowance refills
    whenever a growth interval completes, also when the growth is refused at FP32's ceiling (the
    scale did not overflow for a whole interval, which is what the refill rewards)."""
    if found_inf:
        if state.hysteresis_left > 1:
            return replace(state, clean_steps=0, hysteresis_left=state.hysteresis_left - 1)
        scale = max(to_fp32(state.scale * config.backoff_factor), to_fp32(config.min_scale))
        return replace(state, scale=scale, clean_steps=0)
    clean = state.clean_steps + 1
    left = config.hysteresis if config.consecutive_hysteresis else state.hysteresis_left
    if clean == config.growth_interval:
        grown = to_fp32(state.scale * config.growth_factor)
        return ScalerState(grown if grown != float("inf") else state.scale, 0, config.hysteresis)
    return ScalerState(state.scale, clean, left)


def gradients_of(target) -> list[torch.Tensor]:
    """The gradient tensors *this rank holds* for ``target``'s next step.

    ``target`` is a ZeRO optimizer (:class:`~dtlab.parallel.ZeroOptimizer`: its reduced
    ``grad_shards``), any ``torch.optim.Optimizer`` (the ``.grad`` of its parameters: whole
    under DDP, shards under :class:`~dtlab.parallel.FullyShardedDataParallel`), a module, or an
    iterable of tensors. Pending gradient reductions are finished first.
    """
    finish = getattr(target, "finish_gradient_synchronization", None)
    if callable(finish):
        finish()
    if hasattr(target, "grad_shards"):
        return [g for g in target.grad_shards if g is not None]
    if isinstance(target, torch.optim.Optimizer):
        params = [p for group in target.param_groups for p in group["params"]]
    elif isinstance(target, torch.nn.Module):
        params = list(target.parameters())
    else:
        tensors = list(target)
        if tensors and not all(isinstance(t, torch.Tensor) for t in tensors):
            raise TypeError("pass an optimizer, a module or a list of gradient tensors")
        return tensors
    return [p.grad for p in params if p.grad is not None]


def _upcast_shards(target) -> list[torch.Tensor]:
    """:func:`gradients_of` ``target``; a ZeRO optimizer's 16-bit gradient shards are first
    replaced by fp32 copies (its step upcasts them anyway), as DeepSpeed unscales the fp32
    gradient partition: the true gradients, ``S`` times smaller, may lie below fp16's range."""
    tensors = gradients_of(target)
    shards = getattr(target, "grad_shards", None)
    if shards is not None:
        for i, g in enumerate(shards):
            if g is not None and g.dtype in (torch.float16, torch.bfloat16):
                shards[i] = g.float()
        tensors = [g for g in shards if g is not None]
    return tensors


def _local(g: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``g``: a DTensor's local tensor (it shares storage), else ``g``."""
    to_local = getattr(g, "to_local", None)
    return to_local() if callable(to_local) else g


def _inverse_in_fp32(scale: float) -> float:
    """``1/S`` as GradScaler takes it (``scale.double().reciprocal().float()``). A scale backed
    off to 0, or below about 2⁻¹²⁸ (its inverse overflows FP32), gives inf: every gradient then
    reads as overflowed, in GradScaler as here."""
    return to_fp32(1.0 / scale) if scale != 0 else float("inf")


def _default_device() -> torch.device:
    """Where a rank without gradients builds its flag (NCCL reduces GPU tensors only)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass
class ScalerStep:
    """One step on the scaler's timeline."""

    scale: float  # the scale this step's loss was multiplied by
    skipped: bool
    local_overflow: bool  # what this rank saw in its own gradients before the all-reduce


@dataclass
class DynamicLossScaler:
    """``scale(loss)`` → backward → ``step(optimizer)`` (unscale, agree, skip or step) →
    ``update()``. ``comm`` carries the overflow flag (default: every rank, when a process
    group exists; pass the data-parallel group's communicator to count its 4 bytes)."""

    config: ScalerConfig = field(default_factory=ScalerConfig)
    comm: Communicator | None = None
    enabled: bool = True

    def __post_init__(self) -> None:
        self.state = ScalerState.start(self.config)
        self.history: list[ScalerStep] = []
        self._found_inf: bool | None = None
        self._local_found_inf = False

    def get_scale(self) -> float:
        return self.state.scale if self.enabled else 1.0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss × S`` (backward of it gives ``S ×`` the gradients)."""
        return loss * self.get_scale() if self.enabled else loss

    @torch.no_grad()
    def unscale_(self, grads) -> bool:
        """Multiply this rank's gradients by ``1/S`` in place and return whether *any rank*
        found inf/NaN (one all-reduce of a flag). At most once per step."""
        if self._found_inf is not None:
            return self._found_inf
        tensors = [_local(g) for g in _upcast_shards(grads)]
        if any(g.dtype == torch.float16 for g in tensors):
            raise ValueError(
                "these gradients are fp16: unscaling them in fp16 flushes the small ones to zero "
                "again (torch.amp.GradScaler refuses too). Keep fp32 gradients for the optimizer: "
                "fp32 master parameters, or ZeroOptimizer(mixed_precision=...), whose fp16 "
                "gradient shards are unscaled into fp32"
            )
        device = tensors[0].device if tensors else _default_device()
        inv_scale = torch.full(
            (), _inverse_in_fp32(self.get_scale()), dtype=torch.float32, device=device
        )
        local = torch.zeros(1, dtype=torch.float32, device=device)
        for g in tensors:
            # The check reads the gradient as backward left it, before the division, as
            # GradScaler's kernel does: the overflow it looks for happened at scale S.
            local = torch.maximum(local, (~torch.isfinite(g)).any().float().reshape(1))
            g.mul_(inv_scale.to(g.dtype))
        self._local_found_inf = bool(local.item())
        flag = local.clone()
        comm = self._comm()
        if comm is not None:
            comm.all_reduce(flag, name="overflow_flag", op="max")
        self._found_inf = bool(flag.item())
        return self._found_inf

    def _comm(self) -> Communicator | None:
        # Every rank by default: with TP or PP beside DP, each rank of the world holds different
        # gradients, and all of them must agree to skip.
        if self.comm is None and dist.is_initialized() and dist.get_world_size() > 1:
            self.comm = Communicator(None, dim="dp")
        return self.comm

    def step(self, optimizer: torch.optim.Optimizer, grads=None) -> bool:
        """Unscale (unless done), then step ``optimizer`` unless some rank overflowed.
        ``grads`` defaults to :func:`gradients_of` the optimizer. Returns whether it stepped."""
        if not self.enabled:
            optimizer.step()
            return True
        found_inf = self.unscale_(optimizer if grads is None else grads)
        if not found_inf:
            optimizer.step()
        return not found_inf

    def update(self) -> None:
        """Adapt the scale to this step's verdict; record the step on the timeline."""
        if not self.enabled:
            return
        if self._found_inf is None:
            raise RuntimeError("call step() or unscale_() before update(): no verdict yet")
        self.history.append(ScalerStep(self.state.scale, self._found_inf, self._local_found_inf))
        self.state = next_scale_state(self.state, self._found_inf, self.config)
        self._found_inf = None

    @property
    def skipped_steps(self) -> list[int]:
        return [i for i, s in enumerate(self.history) if s.skipped]
