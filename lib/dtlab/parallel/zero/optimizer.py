"""ZeRO stages 1 and 2: shard the optimizer state (1) and the gradients too (2).

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
(SC 2020), §5. Data parallel ranks hold identical parameters, so they need not *each* keep the
optimizer state: rank r keeps it for chunk r of every flat segment (:mod:`~dtlab.parallel.zero.flat_segment`), steps
only that chunk, and the ranks then all-gather the updated chunks back into full parameters.

What moves where, per step, with Ψ elements of ``b`` bytes and N ranks:

* **Stage 1** — backward fills full gradients as usual (every rank holds Ψ of them). At
  :meth:`step` each segment's gradient is *reduce-scattered*: rank r receives the sum of chunk r
  ((N-1)/N·Ψb bytes sent), divides by N, steps, and the parameters are *all-gathered*
  ((N-1)/N·Ψb). Total 2(N-1)/N·Ψb — exactly one DDP all-reduce, split in two halves with the
  optimizer step in between.
* **Stage 2** — the same bytes, but a segment is reduce-scattered from a gradient hook as soon
  as all of its gradients exist, and the full gradients are freed right away, so a rank holds
  only its Ψ/N gradient shard (plus one segment in flight).

Under ``mixed_precision`` pass the model in fp32: the masters are made from the original fp32
weights, then the model's trained parameters become ``param_dtype`` views (cast frozen weights and
buffers yourself afterwards, e.g. ``model.to(torch.bfloat16)``, which leaves the views alone).

Use it without DDP (it does the gradient averaging itself)::

    opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-3)
    loss.backward(); opt.step(); opt.zero_grad()

Parameters are re-laid as views into one flat buffer per segment, so ``model.parameters()`` keep
working (and a tied weight stays tied). Gradients already accumulated in ``.grad`` when the
optimizer is built are kept and reduced at the next step. After a stage-2 backward the model's
``p.grad`` is ``None`` — freeing the full gradient is the point of stage 2 — and this rank's
averaged chunk is in ``grad_shards`` (``optimizer.full_gradients()`` gathers whole ones).
Optimizer caveats: see :mod:`~dtlab.parallel.zero.flat_segment`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dtlab import trace
from dtlab.comm import Communicator, nbytes
from dtlab.parallel.gradient_sync import assign_buckets, queue_end_of_backward
from dtlab.parallel.zero.flat_segment import FlatSegment, normalize_param_groups
from dtlab.parallel.zero.master_shards import MasterShardOptimizer
from dtlab.precision.mixed_precision import MixedPrecision, compute_dtype


class ZeroOptimizer(MasterShardOptimizer):
    """Wrap any torch optimizer class so each rank steps only its shard (ZeRO stage 1 or 2)."""

    def __init__(
        self,
        params,
        optimizer_cls: type[torch.optim.Optimizer],
        *,
        stage: int = 1,
        process_group: dist.ProcessGroup | None = None,
        mixed_precision: MixedPrecision | None = None,
        offload: bool = False,
        bucket_cap_mb: float = 25.0,
        collectives: str = "torch",
        **optimizer_kwargs,
    ) -> None:
        if stage not in (1, 2):
            raise ValueError(
                f"ZeroOptimizer does stage 1 or 2, not {stage}; stage 3 also shards the "
                "parameters, which needs the model: use dtlab.parallel.FullyShardedDataParallel"
            )
        if not dist.is_initialized():
            raise RuntimeError(
                "ZeRO needs a process group: run inside cluster.run(...) or torchrun"
            )
        self.stage = stage
        rank, world = dist.get_rank(process_group), dist.get_world_size(process_group)
        self.world_size, self.process_group = world, process_group
        comm = Communicator(process_group, collectives, dim="dp")
        segments_by_group, initial_shards, self.flats = [], [], []
        for group in normalize_param_groups(params, {}):
            segments = []
            for bucket in assign_buckets(group["params"], bucket_cap_mb):
                seg = FlatSegment(bucket, rank, world)
                original = seg.flatten(
                    [p.detach() for p in bucket], bucket[0].dtype, bucket[0].device
                )
                comm.broadcast(original, name="broadcast_state")  # replicas start equal
                lo, hi = seg.my_range
                initial_shards.append(original[lo:hi])  # masters from the unrounded weights
                flat = original.to(compute_dtype(mixed_precision, original.dtype))
                seg.point_params_at(flat)
                self.flats.append(flat)
                segments.append(seg)
            segments_by_group.append((group, segments))
        super().__init__(
            segments_by_group, initial_shards, optimizer_cls, optimizer_kwargs,
            comm, mixed_precision, offload,
        )  # fmt: skip
        comm.comm_stats.reset()  # the stats describe training steps, not the start-up copy
        self._where = {id(p): i for i, seg in enumerate(self.segments) for p in seg.params}
        self._in_backward = False
        if stage == 2:
            for seg in self.segments:
                for p in seg.params:
                    p.register_post_accumulate_grad_hook(self._on_gradient_ready)

    # -- gradients ---------------------------------------------------------------------------
    @property
    def comm_stats(self):
        """What this optimizer's collectives moved (``.counted`` says measured or convention)."""
        return self.comm.comm_stats

    def _reduce_segment(self, i: int) -> None:
        """Reduce-scatter segment i's gradients; keep chunk r (averaged); free the full grads."""
        _, shard = self.segments[i].reduce_scatter_gradients(
            self.comm, self.flats[i].dtype, self.flats[i].device, name=f"grad_rs[{i}]"
        )
        shard.div_(self.world_size)
        previous = self.grad_shards[i]
        self.grad_shards[i] = shard if previous is None else previous.add_(shard)

    def _on_gradient_ready(self, p: nn.Parameter) -> None:
        if not self._in_backward:
            self._in_backward = True
            self._missing = [len(seg.params) for seg in self.segments]
            self._next_to_reduce = 0
            queue_end_of_backward(self._flush_backward)
        self._missing[self._where[id(p)]] -= 1
        # Segments are reduced in index order on every rank (collectives match by issue order).
        while self._next_to_reduce < len(self.segments) and not self._missing[self._next_to_reduce]:
            self._reduce_segment(self._next_to_reduce)
            self._next_to_reduce += 1

    def _flush_backward(self) -> None:
        """End of backward: reduce segments still waiting (a parameter without a gradient
        contributes zeros, as in FSDP/DeepSpeed)."""
        if not self._in_backward:
            return
        for i in range(self._next_to_reduce, len(self.segments)):
            self._reduce_segment(i)
        self._in_backward = False

    def _reduce_gradients(self) -> None:
        if self.stage == 2:
            self._flush_backward()
        # Stage 1's gradients, and any a stage-2 model held before this optimizer existed.
        if any(p.grad is not None for seg in self.segments for p in seg.params):
            for i in range(len(self.segments)):
                self._reduce_segment(i)

    # -- parameters --------------------------------------------------------------------------
    @torch.no_grad()
    def _publish_parameters(self) -> None:
        for i, master in enumerate(self.masters):
            flat = self.flats[i]
            if self.offload:
                with trace.span("offload:param_to_device", kind="memcpy", nbytes=nbytes(master)):
                    mine = master.detach().to(flat.device, non_blocking=master.is_pinned())
                mine = mine.to(flat.dtype)
            else:
                mine = master.detach().to(device=flat.device, dtype=flat.dtype).clone()
            self.comm.all_gather(flat, mine, name=f"param_ag[{i}]")

    @torch.no_grad()
    def full_gradients(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The averaged gradient of every trained parameter of ``module``, whole, by name."""
        self.finish_gradient_synchronization()
        values = {}
        for seg, shard in zip(self.segments, self.grad_shards, strict=True):
            mine = (
                shard
                if shard is not None
                else torch.zeros(seg.shard_numel, device=seg.params[0].device)
            )
            full = torch.empty(seg.padded_numel, dtype=mine.dtype, device=mine.device)
            self.comm.all_gather(full, mine, name="gather_full_grads")
            values.update(
                {id(p): v.clone() for p, v in zip(seg.params, seg.views(full), strict=True)}
            )
        return {n: values[id(p)] for n, p in module.named_parameters() if id(p) in values}

    def _param_tensors(self) -> list[torch.Tensor]:
        return list(self.flats)

    def _grad_tensors(self) -> list[torch.Tensor]:
        full = [p.grad for seg in self.segments for p in seg.params if p.grad is not None]
        return super()._grad_tensors() + full
