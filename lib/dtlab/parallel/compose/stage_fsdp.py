"""FSDP with pipeline stages: each stage gathered once per step, resharded after its last backward.

A pipeline stage runs once per micro-batch: ``m`` forwards and ``m`` backwards in one step. FSDP
that gathers a unit around every forward and backward (:mod:`dtlab.parallel.zero.fsdp`, the
plain FSDP recipe) would all-gather each stage ``2m`` times and reduce-scatter it ``m`` times per
step. torchtitan composes FSDP with pipelining the other way, and so does this file:

* torchtitan's ``parallelize_llama`` passes ``reshard_after_forward=False`` to ``fully_shard``
  when pipelining is on (its ``reshard_after_forward_policy="default"``: "to avoid per-microbatch
  all-gathers"), and ``torch.distributed.pipelining``'s stage runs every micro-batch's backward
  with ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)``; one
  ``REDUCE_GRAD`` action after the stage's last B/W (``_PipelineStageBase.perform_reduce_grad``)
  reduce-scatters the accumulated gradient once and reshards (torch 2.13
  ``distributed/pipelining/stage.py``).
* here (:class:`StageShards`): before the step's first action, every stage this rank holds is
  all-gathered over dp, once (one collective per stage); the micro-batches' gradients accumulate
  into the whole parameters; right after the action that completes a stage's gradients (its last
  B or W — the executor's ``on_stage_done``) its gradient is reduce-scattered once, averaged over
  dp, and the whole parameters and gradients are freed. A stage that holds the tied embedding
  waits until the executor has summed that gradient over the embedding group, after the step's
  last action (the same bytes, a later start).

Bytes per rank per step (:func:`stage_fsdp_bytes`): for each stage ``s`` on this rank, with
``C_s = Σ ⌈numel/dp⌉`` over its parameters (each parameter padded to a multiple of dp, FSDP2's
per-parameter sharding), one all-gather and one reduce-scatter of ``(dp−1)·C_s·b`` bytes each —
independent of the number of micro-batches. The price: a stage's whole parameters and gradients
are held for the whole step (what ``reshard_after_forward=False`` costs in torchtitan too), so
only the parameters, gradients and optimizer state *between* steps are 1/dp.

Between steps the optimizer steps the shards (:attr:`StageShards.shards`, one 1-D parameter per
name: this rank's ``⌈numel/dp⌉`` elements of the flattened, zero-padded parameter); the next
gather reads them, so a plain ``torch.optim`` optimizer trains the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from dtlab.comm import Communicator


def _chunk(numel: int, dp: int) -> int:
    return -(-numel // dp)


def stage_fsdp_bytes(
    numels_by_stage: Mapping[int, list[int]],
    dp: int,
    element_size: int,
    n_micro: int = 1,
    *,
    per_micro_batch: bool = False,
) -> dict[str, int]:
    """Bytes one rank sends per step over dp for the stages it holds (``{stage: [numel, ...]}``).

    Once per step (this file's recipe, torchtitan's): one all-gather and one reduce-scatter of
    ``(dp−1)·C_s·b`` per stage. ``per_micro_batch=True``: the plain FSDP recipe run inside the
    pipeline — gathered for every forward and again for every backward, reduced after every
    backward: ``2·n_micro`` all-gathers and ``n_micro`` reduce-scatters per stage."""
    gathers, reductions = (2 * n_micro, n_micro) if per_micro_batch else (1, 1)
    per_stage = [(dp - 1) * sum(_chunk(n, dp) for n in numels) * element_size
                 for numels in numels_by_stage.values()]  # fmt: skip
    return {"all_gather": gathers * sum(per_stage), "reduce_scatter": reductions * sum(per_stage)}


@dataclass
class _Stage:
    """One stage's parameters on this rank: the whole ones the stage computes with (freed
    between steps) and this rank's shard of each."""

    index: int
    names: list[str]
    full: list[nn.Parameter]
    shards: list[nn.Parameter]
    shapes: list[torch.Size]
    chunks: list[int]
    holds_tie: bool
    gathered: bool = False
    reduced: bool = field(default=True)

    @property
    def numels(self) -> list[int]:
        return [s.numel() for s in self.shapes]


class StageShards:
    """This rank's pipeline stages sharded over dp (``comm``), gathered once per step.

    Call :meth:`gather` before the pipeline step, :meth:`on_stage_done` from the executor's hook
    (reduces a stage whose gradients are final), and :meth:`finish` after the step (reduces the
    stages still waiting: the tied ones). The optimizer steps :attr:`shards`."""

    def __init__(self, stages: Mapping[int, nn.Module], comm: Communicator) -> None:
        self.comm = comm
        dp, rank = comm.world_size, comm.rank
        self.stages: dict[int, _Stage] = {}
        seen: list[nn.Parameter] = []
        for index in sorted(stages):
            module = stages[index]
            names, full, shards, shapes, chunks = [], [], [], [], []
            for name, param in module.named_parameters():
                if not param.requires_grad or any(param is q for q in seen):
                    continue  # a tensor two stages on this rank share is sharded once
                seen.append(param)
                chunk = _chunk(param.numel(), dp)
                padded = torch.zeros(chunk * dp, dtype=param.dtype, device=param.device)
                padded[: param.numel()] = param.detach().reshape(-1)
                shard = nn.Parameter(padded[rank * chunk : (rank + 1) * chunk].clone())
                names.append(name), full.append(param), shards.append(shard)
                shapes.append(param.shape), chunks.append(chunk)
            holds_tie = bool(getattr(module, "tied_parameters", {}))
            self.stages[index] = _Stage(index, names, full, shards, shapes, chunks, holds_tie)
            self._free(self.stages[index])

    @property
    def shards(self) -> dict[str, nn.Parameter]:
        """Full-model name → this rank's shard (what the optimizer steps), each tensor once."""
        return {
            n: s for st in self.stages.values() for n, s in zip(st.names, st.shards, strict=True)
        }

    def gather(self) -> None:
        """All-gather every stage's parameters over dp, once for the step (one collective per
        stage), into the whole parameters its modules compute with."""
        for stage in self.stages.values():
            dp, total = self.comm.world_size, sum(stage.chunks)
            mine = torch.cat([s.detach() for s in stage.shards])
            flat = torch.empty(dp * total, dtype=mine.dtype, device=mine.device)
            self.comm.all_gather(flat, mine, name=f"stage[{stage.index}].all_gather")
            by_rank, offset = flat.view(dp, total), 0
            for param, shape, chunk in zip(stage.full, stage.shapes, stage.chunks, strict=True):
                whole = by_rank[:, offset : offset + chunk].reshape(-1)[: shape.numel()]
                param.data = whole.reshape(shape)
                param.grad, offset = None, offset + chunk
            stage.gathered, stage.reduced = True, False

    def on_stage_done(self, index: int) -> None:
        """The executor's hook: ``index``'s gradients are final — reduce it now, unless it holds
        the tied embedding (summed over the embedding group after the step)."""
        if index in self.stages and not self.stages[index].holds_tie:
            self._reduce(self.stages[index])

    def finish(self) -> None:
        """After the step: reduce every stage not reduced yet (the tied ones)."""
        for stage in self.stages.values():
            if not stage.reduced:
                self._reduce(stage)

    def _reduce(self, stage: _Stage) -> None:
        """Reduce-scatter the stage's accumulated gradient once, average it over dp into the
        shards' ``.grad``, and free the whole parameters and gradients."""
        dp = self.comm.world_size
        columns = []
        for param, chunk in zip(stage.full, stage.chunks, strict=True):
            grad = torch.zeros(chunk * dp, dtype=param.dtype, device=param.device)
            if param.grad is not None:
                grad[: param.numel()] = param.grad.reshape(-1)
            columns.append(grad.view(dp, chunk))
        full = torch.cat(columns, dim=1).reshape(-1)  # rank-major: rank r's chunks together
        mine = torch.empty(sum(stage.chunks), dtype=full.dtype, device=full.device)
        self.comm.reduce_scatter(mine, full, name=f"stage[{stage.index}].reduce_scatter")
        mine /= dp
        offset = 0
        for shard, chunk in zip(stage.shards, stage.chunks, strict=True):
            shard.grad = mine[offset : offset + chunk].clone()
            offset += chunk
        stage.reduced = True
        self._free(stage)

    @staticmethod
    def _free(stage: _Stage) -> None:
        for param in stage.full:
            param.grad = None
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
        stage.gathered = False

    def bytes_formula(self, n_micro: int = 1, *, per_micro_batch: bool = False) -> dict[str, int]:
        """:func:`stage_fsdp_bytes` for the stages this rank holds."""
        numels = {i: s.numels for i, s in self.stages.items()}
        size = next(s.shards[0].element_size() for s in self.stages.values() if s.shards)
        return stage_fsdp_bytes(
            numels, self.comm.world_size, size, n_micro, per_micro_batch=per_micro_batch
        )

    @torch.no_grad()
    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Name → whole averaged gradient of every parameter this rank's stages hold, gathered
        over dp as a control message (a check, not training traffic)."""
        dp, out = self.comm.world_size, {}
        for stage in self.stages.values():
            for name, shard, shape in zip(stage.names, stage.shards, stage.shapes, strict=True):
                whole = torch.empty(dp * shard.numel(), dtype=shard.dtype, device=shard.device)
                self.comm.all_gather_control(whole, shard.grad.contiguous(), name="full_grad")
                out[name] = whole[: shape.numel()].reshape(shape)
        return out
