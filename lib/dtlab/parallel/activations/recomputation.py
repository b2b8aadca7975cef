"""Activation recomputation, written from scratch: keep a region's inputs, rebuild the rest.

Chen et al. 2016 ("Training Deep Nets with Sublinear Memory Cost"); Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models") for the selective variant.

:func:`recompute` ``(fn, *args)`` runs ``fn`` once in the forward pass, *with* its autograd graph,
but intercepts every tensor the graph would save (``torch.autograd.graph.saved_tensors_hooks``):
instead of the tensor the graph keeps a ticket, a small int. What does stay alive is the region's
inputs, saved by a no-op :class:`torch.autograd.Function` so that backward can find them. When
backward first opens a ticket, the region runs again on those inputs — on the same RNG state, so
dropout draws the same masks — and every tensor it saves is filed under its ticket; each ticket
is handed out once and dropped. This is the non-reentrant design of ``torch.utils.checkpoint``:
gradients flow through the *original* graph into the real parameters, so DDP's gradient hooks,
FSDP's per-unit gather (a unit's gathered parameters are registered from the moment backward
reaches its output, so a region re-run in backward — a whole unit, or a body a block recomputes
from inside its own ``forward`` — reads them whole, with no extra all-gather) and tensor
parallelism's collectives behave as without recomputation — the recompute of a TP block
re-runs its forward collectives, which is why full recomputation costs communication too.

What moves where, per layer, for the lab GPT (:mod:`dtlab.memory.activation_families`):

* **full** (:class:`Recomputed`, every ``every``-th block starts a region): keeps each region's
  input (``s·b·h`` elements) and ``positions``; backward re-runs the region's forward: one more
  forward of every block (``2·Ψ`` FLOPs per token on top of ``6·Ψ``: +33 %).
* **selective** (:func:`recompute_attention_core`): only the attention core (``q·kᵀ``, mask,
  softmax, dropout, ``·v``) is re-run; the ``a·s²·b``-sized scores, their mask and dropout
  tensors are dropped, q, k, v kept. It costs the core's ``4·s²·h`` FLOPs per sequence and layer
  (2 matmuls), a small fraction of the block's ``24·s·h²``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from dtlab import trace
from dtlab.models.gpt import default_positions, sum_aux_losses

__all__ = [
    "RECOMPUTE_MODES",
    "RECOMPUTE_SPAN_KIND",
    "Recomputed",
    "plain_attention_core",
    "recompute",
    "recompute_attention_core",
]

RECOMPUTE_MODES = ("none", "selective", "full")
RECOMPUTE_SPAN_KIND = "other"
"""The trace kind of a re-run: it happens *inside* a backward pass a caller may trace as compute;
a kind of its own draws on top of that span on the timeline and keeps compute totals unchanged."""


class _KeepInputs(torch.autograd.Function):
    """Identity on ``(anchor, *inputs)`` that saves the tensor inputs for the recompute."""

    @staticmethod
    def forward(ctx, anchor: torch.Tensor, *inputs: Any) -> torch.Tensor:
        ctx.save_for_backward(*(t for t in inputs if isinstance(t, torch.Tensor)))
        return anchor.view_as(anchor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor, *unused: Any):
        return (grad, *([None] * len(ctx.needs_input_grad[1:])))


class _Region:
    """One recomputable region: its function, RNG state, saved inputs and recomputed tensors."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict) -> None:
        self.fn, self.kwargs = fn, kwargs
        self.arg_slots = [isinstance(a, torch.Tensor) for a in args]
        self.constants = [None if slot else a for slot, a in zip(self.arg_slots, args, strict=True)]
        self.cpu_rng = torch.get_rng_state()
        self.cuda_devices = sorted(
            {a.device.index or 0 for a in args if isinstance(a, torch.Tensor) and a.is_cuda}
        )
        self.cuda_rng = [torch.cuda.get_rng_state(d) for d in self.cuda_devices]
        self.keeper: torch.Tensor | None = None  # an output of _KeepInputs: its node holds inputs
        self.recomputed: dict[int, torch.Tensor] | None = None

    def saved_inputs(self) -> list[Any]:
        assert self.keeper is not None and self.keeper.grad_fn is not None
        tensors = iter(self.keeper.grad_fn.saved_tensors)
        args = []
        for slot, constant in zip(self.arg_slots, self.constants, strict=True):
            if slot:
                t = next(tensors)
                args.append(t.detach().requires_grad_(t.requires_grad))
            else:
                args.append(constant)
        return args

    def rerun(self) -> None:
        """Run ``fn`` again on the saved inputs and RNG state; file what it saves by ticket."""
        args = self.saved_inputs()
        self.recomputed = {}
        counter = itertools.count()

        def keep(t: torch.Tensor) -> None:
            # Returning ``t`` itself would let the re-run's graph hold its own outputs (a saved
            # output's grad_fn is the saving node): a reference cycle that keeps every re-run
            # alive until the garbage collector runs. Nothing ever unpacks this graph.
            self.recomputed[next(counter)] = t.detach()

        span = trace.span("recompute", kind=RECOMPUTE_SPAN_KIND)
        with span, torch.random.fork_rng(devices=self.cuda_devices):
            torch.set_rng_state(self.cpu_rng)
            for device, state in zip(self.cuda_devices, self.cuda_rng, strict=True):
                torch.cuda.set_rng_state(state, device)
            with (
                torch.enable_grad(),
                torch.autograd.graph.saved_tensors_hooks(keep, _never_unpacked),
            ):
                self.fn(*args, **self.kwargs)
        self.keeper = None  # the inputs are no longer needed by this region

    def open(self, ticket: int) -> torch.Tensor:
        if self.recomputed is None or ticket not in self.recomputed:
            if self.keeper is None:
                raise RuntimeError(
                    "a recomputed region's saved tensors were asked for twice (backward through "
                    "the same graph again?); recompute supports one backward: drop retain_graph"
                )
            self.rerun()
        assert self.recomputed is not None
        return self.recomputed.pop(ticket)


def _never_unpacked(_: None) -> torch.Tensor:
    raise RuntimeError("the re-run's own graph is never differentiated")


def recompute(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, keeping only the tensor ``args`` for backward and re-running
    ``fn`` (same RNG state) when backward needs what it saved. Gradients equal plain autograd's
    bit for bit when ``fn`` is deterministic given its inputs and the RNG state.

    ``fn`` must run the same ops in the same order when re-run (no data-dependent control flow
    that differs), and may be a module (its forward hooks run again, as FSDP needs).
    """
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    region = _Region(fn, args, kwargs)
    tensor_args = [a for a in args if isinstance(a, torch.Tensor)]
    anchor = torch.zeros((), requires_grad=True)
    region.keeper = _KeepInputs.apply(anchor, *tensor_args)
    tickets = itertools.count()

    def pack(t: torch.Tensor) -> tuple[_Region, int]:
        return region, next(tickets)

    def unpack(packed: tuple[_Region, int]) -> torch.Tensor:
        owner, ticket = packed
        return owner.open(ticket)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return fn(*args, **kwargs)


class Recomputed(nn.Module):
    """The lab GPT with full recomputation: every ``every`` consecutive blocks form one region.

    ``Recomputed(model, every=k)(idx) == model(idx)``; parameter names gain a ``model.`` prefix.
    Wrap it in DDP or FSDP (``units=list(model.blocks)``), or pass a tensor-parallel model
    (``parallelize_gpt(...).model``): each block is still called through its own hooks.
    """

    def __init__(self, model: nn.Module, every: int = 1) -> None:
        super().__init__()
        n = len(model.blocks)
        if not 1 <= every <= n:
            raise ValueError(f"every={every} must be between 1 and the number of blocks ({n})")
        self.model, self.every = model, every

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        model = self.model
        if positions is None:
            positions = default_positions(idx.shape[-1], model.config, idx.device)
        h = model.embed_tokens(idx, positions=positions)
        blocks = list(model.blocks)
        for start in range(0, len(blocks), self.every):
            h = recompute(_run_blocks(blocks[start : start + self.every]), h, positions)
        model.aux_loss = sum_aux_losses(model.blocks, h)
        return model.lm_logits(h)


def _run_blocks(blocks: list[nn.Module]) -> Callable:
    def run(h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        for block in blocks:
            h = block(h, positions)
        return h

    return run


class _RecomputedCore:
    """An attention core run under :func:`recompute` (selective recomputation)."""

    def __init__(self, core: Callable) -> None:
        self.core = core

    def __call__(self, q, k, v, positions_q, positions_k, **kwargs):
        return recompute(self.core, q, k, v, positions_q, positions_k, **kwargs)


def recompute_attention_core(model: nn.Module) -> nn.Module:
    """Selective recomputation: every block's attention core becomes a recomputed region.

    Works on the lab GPT, its tensor-parallel version and any module whose blocks have
    ``attn.core``; returns ``model``. Undo with :func:`plain_attention_core`.
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise ValueError("recompute_attention_core needs a model with .blocks (the lab GPT)")
    for block in blocks:
        if not isinstance(block.attn.core, _RecomputedCore):
            block.attn.core = _RecomputedCore(block.attn.core)
    return model


def plain_attention_core(model: nn.Module) -> nn.Module:
    """Undo :func:`recompute_attention_core`."""
    for block in model.blocks:
        if isinstance(block.attn.core, _RecomputedCore):
            block.attn.core = block.attn.core.core
    return model
