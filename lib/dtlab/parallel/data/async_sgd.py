"""Asynchronous SGD with a parameter server: no waiting, but gradients arrive stale.

Dean et al., "Large Scale Distributed Deep Networks" (NeurIPS 2012, Downpour SGD); Recht et al.,
"Hogwild!" (2011). Rank 0 is the *server*: it owns the parameters and applies every gradient
the moment it arrives. Ranks 1..N-1 are *workers* that loop independently:

    pull parameters (version v)  →  compute a gradient on a local batch  →  push (v, gradient)

What moves where: each push sends Ψ gradient elements plus the version worker → server; each
reply sends Ψ parameter elements plus the new version server → worker (point-to-point, no
collective, nobody waits for the slowest worker). The price is *staleness*: by the time a
gradient computed at version v is applied, the server may be at version v + s, having applied
``s`` other workers' updates meanwhile, so the gradient describes parameters that no longer
exist. Synchronous DDP always has s = 0; with one worker async SGD is exactly sequential SGD.

The messages go through a world :class:`~dtlab.comm.Communicator` (spans labelled ``ps``, bytes
in its ``comm_stats``): the server receives from *any* worker (``recv(source=None)``, torch's path),
which is what lets it serve whoever finishes first. gloo only: NCCL matches every receive to a
named peer, so :func:`run_async_sgd` refuses it on every rank before any message moves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from dtlab import trace
from dtlab.comm import Communicator


@dataclass
class AsyncSGDResult:
    """What the server saw: one staleness per applied gradient, and who sent it."""

    staleness: list[int] = field(default_factory=list)
    senders: list[int] = field(default_factory=list)

    @property
    def mean_staleness(self) -> float:
        return sum(self.staleness) / max(1, len(self.staleness))


def run_async_sgd(
    model: nn.Module,
    loss_on_batch: Callable[[nn.Module, int], torch.Tensor],
    steps_per_worker: int,
    lr: float,
) -> AsyncSGDResult:
    """Train ``model`` with a parameter server on rank 0; call on every rank.

    ``loss_on_batch(model, step)`` returns a worker's loss for its ``step``-th local batch.
    On return rank 0's ``model`` holds the trained parameters; rank 0's result lists staleness.
    """
    if dist.is_initialized() and dist.get_backend() == "nccl":  # every rank refuses, none waits
        raise ValueError(
            "asynchronous SGD's server receives from whichever worker pushes first (a receive "
            "from any source), which NCCL cannot do: run it on gloo, "
            "dtlab.Cluster(n, device='cpu'), with the model on the CPU"
        )
    comm = Communicator(dim="ps")  # every rank: the server is rank 0
    world = comm.world_size
    if world < 2:
        raise ValueError("a parameter server needs at least 2 ranks: one server, one worker")
    params = [p for p in model.parameters() if p.requires_grad]
    flat = parameters_to_vector(params).detach()
    message = flat.new_empty(flat.numel() + 1)  # [version, payload...]
    result = AsyncSGDResult()
    if comm.rank == 0:
        version = 0
        for worker in range(1, world):  # everyone starts from version 0
            comm.send(torch.cat([flat.new_zeros(1), flat]), worker, name="send_parameters")
        for _ in range((world - 1) * steps_per_worker):
            sender = comm.recv(message, name="recv_gradient")  # from whoever pushes first
            result.staleness.append(version - int(message[0].item()))
            result.senders.append(sender)
            with trace.span("apply_gradient", kind="optimizer"):
                flat.add_(message[1:], alpha=-lr)
                version += 1
            comm.send(torch.cat([flat.new_tensor([version]), flat]), sender, "send_parameters")
        vector_to_parameters(flat, params)
        return result
    for step in range(steps_per_worker):
        comm.recv(message, 0, name="pull_parameters")
        version = message[0].clone()
        vector_to_parameters(message[1:].clone(), params)
        model.zero_grad(set_to_none=True)
        with trace.span("compute_gradient", kind="compute", step=step):
            loss_on_batch(model, step).backward()
        grad = parameters_to_vector([p.grad for p in params])
        comm.send(torch.cat([version.reshape(1), grad]), 0, name="push_gradient")
    comm.recv(message, 0, name="pull_parameters")  # the reply to the last push
    return result
