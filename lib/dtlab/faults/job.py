"""The training job that lab 10 breaks: FSDP on the lab GPT, checkpointing every few steps.

Everything a bit-for-bit resume needs is saved (:mod:`dtlab.checkpoint`): the sharded weights and
AdamW state, every rank's RNG states (dropout masks depend on them), the data-loader position
(the index of the next global batch) and the losses so far. On start the job loads the newest
*complete* checkpoint, if any, resharding it onto however many ranks this attempt has; it then
continues exactly where that checkpoint left off. Call it on every rank::

    cluster.run(train_with_checkpoints, root, JobSpec(steps=8), faults=[Fault("kill", 1, 5)])
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from dtlab import progress
from dtlab.faults.inject import maybe_fail
from dtlab.trace import span


@dataclass(frozen=True)
class JobSpec:
    """What to train: the tiny lab GPT (with dropout) for ``steps`` steps on a global batch of
    ``batch_size`` rows, saving after every ``save_every`` steps."""

    steps: int = 8
    save_every: int = 2
    batch_size: int = 8
    lr: float = 1e-2
    dropout: float = 0.1
    seed: int = 0
    async_save: bool = False
    d_model: int = 64
    n_layers: int = 2


def fault_log(root: str | Path) -> Path:
    return Path(root) / "faults.log"


def job_config(spec: JobSpec):
    """The :class:`~dtlab.models.GPTConfig` the job trains (to build a model that loads its
    checkpoints)."""
    from dtlab.models import GPTConfig

    return GPTConfig.tiny(dropout=spec.dropout, d_model=spec.d_model, n_layers=spec.n_layers)


def _build(spec: JobSpec):
    from dtlab.models import GPT
    from dtlab.parallel import FullyShardedDataParallel

    config = job_config(spec)
    import dtlab

    fsdp = FullyShardedDataParallel(GPT(config, seed=spec.seed, device=dtlab.device()))
    opt = torch.optim.AdamW(fsdp.parameters(), lr=spec.lr)
    return config, fsdp, opt


def _resume(root: Path, fsdp, opt) -> tuple[int, list[float], int | None]:
    """Load the newest complete checkpoint into ``fsdp`` and ``opt``; (start step, losses, saved N)."""
    from dtlab.checkpoint import (
        complete_checkpoints,
        fsdp_state,
        load,
        prepare_optimizer_state,
        read_metadata,
        set_rng_states,
    )
    from dtlab.checkpoint.commit import final_dir

    steps = complete_checkpoints(root)
    if not steps:
        return 0, [], None
    meta = read_metadata(final_dir(root, steps[-1]))
    state = prepare_optimizer_state(fsdp_state(fsdp, opt), fsdp.module, opt, meta)
    with span("checkpoint_load", kind="other", step=steps[-1]):
        result = load(root, state, steps[-1])
    if result.saved_world_size == dist.get_world_size():
        set_rng_states(result.extra["rng"])
    return result.extra["next_batch"], list(result.extra["losses"]), result.saved_world_size


def train_with_checkpoints(root: str, spec: JobSpec, faults=(), attempt: int = 0) -> dict:
    """Train (resuming if a complete checkpoint exists); return losses and, on rank 0, weights."""
    from dtlab.checkpoint import AsyncCheckpointer, fsdp_state, rng_states, save
    from dtlab.models import SyntheticTokens, loss_fn, shard_for_rank
    from dtlab.parallel import gather_full_parameters

    root = Path(root)
    rank, world = dist.get_rank(), dist.get_world_size()
    config, fsdp, opt = _build(spec)
    device = next(fsdp.parameters()).device
    torch.manual_seed(spec.seed * 1000 + rank)  # each rank's own dropout stream
    start, losses, saved_world = _resume(root, fsdp, opt)
    data = SyntheticTokens(config, spec.steps, spec.batch_size, seed=spec.seed)
    saver = AsyncCheckpointer(root) if spec.async_save else None
    log = fault_log(root)
    for step in progress.track(range(start, spec.steps), desc="training"):
        maybe_fail(faults, rank, step, attempt, "step", log)
        x, y = (t.to(device) for t in shard_for_rank(data[step], rank, world))
        with span("train_step", kind="compute", step=step):
            loss = loss_fn(fsdp(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
        done = step + 1
        if done % spec.save_every == 0 or done == spec.steps:
            extra = {"next_batch": done, "losses": list(losses), "rng": rng_states()}
            state = fsdp_state(fsdp, opt)
            mid_save = functools.partial(maybe_fail, faults, rank, done, attempt, "save", log)
            if saver is not None:  # a kill in mid_save hits the background write
                saver.save(done, state, extra, before_flag=mid_save)
            else:
                with span("checkpoint_save", kind="other", step=done):
                    save(root, done, state, extra, before_flag=mid_save)
    if saver is not None:
        saver.wait()
        dist.barrier()
    params = gather_full_parameters(fsdp)
    return {
        "losses": losses,
        "resumed_from": start,
        "saved_world_size": saved_world,
        "params": params if rank == 0 else None,
    }
