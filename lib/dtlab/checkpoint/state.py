"""What a rank saves: each tensor's local piece and the :class:`~.slices.Box` it covers.

A :class:`ShardedState` maps names (``model/<param>``, ``optim/<param>/<key>``) to
:class:`Local` pieces. The same description serves both directions: saving writes each
``tensor``; loading fills each ``tensor`` in place from whatever pieces of the checkpoint overlap
its box — so the layout you load into may differ from the layout that saved.

* :func:`fsdp_state` — dtlab's :class:`~dtlab.parallel.FullyShardedDataParallel`: each
  registered parameter is a 1-D view of rank r's chunk of its unit's flat segment, i.e. a flat
  range of the original parameter (possibly empty); replicated parameters are whole.
* :func:`tensor_parallel_state` — :func:`~dtlab.parallel.parallelize_gpt`'s layers: a column-
  parallel weight holds rows ``[r·out/t, (r+1)·out/t)``, a row-parallel weight columns, the
  vocabulary-parallel embedding rows; everything else is replicated.
* :func:`replicated_state` — a plain (or DDP-replicated) module: every tensor whole.

Optimizer state follows its parameter: a tensor of the parameter's size gets the parameter's box,
a scalar (Adam's ``step``) is replicated. A replicated piece is written once: by rank 0 under
:func:`~dtlab.checkpoint.save`'s default ``writers="lowest"`` (DCP's
``dedup_save_to_lowest_rank=True``), or spread over the replicas by planned size with
``writers="balanced"`` — which is what ``torch.distributed.checkpoint``'s *default* planner does:
each duplicate goes to the holder whose plan is smallest so far, not to rank 0
(:mod:`~dtlab.checkpoint.dedup`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import nn

from dtlab.checkpoint.slices import Box, flat_range, split_along, whole
from dtlab.checkpoint.storage import dtype_named


@dataclass
class Local:
    """This rank's piece of one global tensor: ``tensor`` holds the elements of ``box``."""

    tensor: torch.Tensor
    box: Box
    replicated: bool = False


ShardedState = dict[str, Local]


def _add_optimizer_state(
    state: ShardedState, optimizer, param: nn.Parameter, name: str, box: Box, replicated: bool
) -> None:
    if optimizer is None:
        return
    for key, value in optimizer.state.get(param, {}).items():
        if not torch.is_tensor(value):
            continue
        if value.dim() == 0:
            state[f"optim/{name}/{key}"] = Local(value, whole(()), True)
        elif value.shape == param.shape:
            state[f"optim/{name}/{key}"] = Local(value, box, replicated)
        else:
            raise ValueError(
                f"optimizer state {key!r} of {name} has shape {tuple(value.shape)}, neither a "
                f"scalar nor the parameter's {tuple(param.shape)}; only elementwise optimizers "
                "(SGD, Adam, AdamW, ...) can be sharded this way"
            )


def fsdp_state(fsdp, optimizer: torch.optim.Optimizer | None = None) -> ShardedState:
    """Pieces of a :class:`~dtlab.parallel.FullyShardedDataParallel` rank (call between steps)."""
    state: ShardedState = {}
    boxes: dict[int, Box] = {}
    for unit in fsdp.units:
        lo, hi = unit.seg.my_range
        for sp, p, off in zip(unit.shard_params, unit.params, unit.seg.offsets, strict=True):
            start = min(max(off, lo), off + p.numel()) - off
            boxes[id(sp)] = flat_range(p.shape, start, start + sp.numel())
    for name, p in fsdp.module.named_parameters():
        box = boxes.get(id(p))
        replicated = box is None
        box = whole(p.shape) if replicated else box
        state[f"model/{name}"] = Local(p.data, box, replicated)
        _add_optimizer_state(state, optimizer, p, name, box, replicated)
    return state


def tensor_parallel_state(
    model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> ShardedState:
    """Pieces of a model sharded by :func:`~dtlab.parallel.parallelize_gpt`."""
    from dtlab.parallel.tensor import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
    )

    split: dict[int, tuple[int, int, int]] = {}  # id(param) -> (dim, rank, degree)
    for m in model.modules():
        dims = {}
        if isinstance(m, ColumnParallelLinear):
            dims = {"weight": 0, "bias": 0}
        elif isinstance(m, RowParallelLinear):
            dims = {"weight": 1}
        elif isinstance(m, VocabParallelEmbedding):
            dims = {"weight": 0}
        for attr, dim in dims.items():
            p = getattr(m, attr, None)
            if p is not None:
                split[id(p)] = (dim, m.comm.rank, m.comm.world_size)
    state: ShardedState = {}
    for name, p in model.named_parameters():
        if id(p) in split:
            dim, rank, degree = split[id(p)]
            shape = list(p.shape)
            shape[dim] *= degree
            box, replicated = split_along(shape, dim, rank, degree), False
        else:
            box, replicated = whole(p.shape), True
        state[f"model/{name}"] = Local(p.data, box, replicated)
        _add_optimizer_state(state, optimizer, p, name, box, replicated)
    return state


def replicated_state(
    module: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> ShardedState:
    """Pieces of an unsharded module: every tensor whole and replicated (written once; who
    writes each is :func:`~dtlab.checkpoint.save`'s ``writers`` policy)."""
    state: ShardedState = {}
    for name, p in module.named_parameters():
        state[f"model/{name}"] = Local(p.data, whole(p.shape), True)
        _add_optimizer_state(state, optimizer, p, name, whole(p.shape), True)
    return state


def prepare_optimizer_state(
    state: ShardedState, module: nn.Module, optimizer, metadata: dict
) -> ShardedState:
    """Create (zeros) the optimizer state a checkpoint holds for each parameter, so loading can
    fill it in place; returns ``state`` extended with those pieces."""
    for name, p in module.named_parameters():
        local = state.get(f"model/{name}")
        if local is None:
            continue
        prefix = f"optim/{name}/"
        for key, tensor_meta in metadata["tensors"].items():
            if not key.startswith(prefix):
                continue
            slot = key[len(prefix) :]
            dtype = dtype_named(tensor_meta["dtype"])
            scalar = len(tensor_meta["global_shape"]) == 0
            value = torch.zeros((), dtype=dtype) if scalar else torch.zeros_like(p, dtype=dtype)
            optimizer.state.setdefault(p, {})[slot] = value
            box = whole(()) if scalar else local.box
            state[key] = Local(value, box, scalar or local.replicated)
    return state


def rng_states() -> dict:
    """This rank's random-number generators: torch CPU, every CUDA device, and Python's."""
    states = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    """Restore what :func:`rng_states` captured (dropout masks then repeat bit for bit)."""
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
