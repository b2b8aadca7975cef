"""Run a schedule on real ranks: the lab GPT cut into stages, messages over the mesh's pp group.

``pipe = pipeline_gpt(model, mesh, schedule)`` cuts ``model`` into ``schedule.n_stages`` stages
(:func:`dtlab.models.split_into_stages`: the first embeds, the last ends in the LM head) and
keeps the ones ``schedule.stage_ranks`` gives this pipeline rank; ``pipe.step(inputs, targets)``
runs one training step's forward and backward exactly in the schedule's order:

* the batch is cut into ``m`` micro-batches along dim 0; the last stage computes each one's
  loss scaled by ``1/m``, so the gradients accumulated over the micro-batches are the full
  batch's (gradient accumulation) and the returned loss is the batch mean;
* what moves: per micro-batch and stage boundary, one activation ``(b, S, d)`` forward and its
  gradient (same size) backward, point to point over the ``pp`` group
  (:meth:`Communicator.send`/``recv``: blocking, so the order comes from
  :func:`~dtlab.parallel.pipeline.communication.with_communication`, which cannot deadlock);
  between two stages on one rank the tensor is handed over in memory;
* B runs the stage's whole backward; I only the gradient of the stage's input
  (``torch.autograd.grad(..., retain_graph=True)``), W the weights' (``backward(inputs=params)``).
  W walks the activation-gradient chain again — the arithmetic is the same and exact, but unlike
  PyTorch's ``stage_backward_weight`` (which keeps the gradients at each weight's consumer) it
  costs about an I more; the *order* is what these schedules teach;
* tied embeddings: with ``tie_embeddings`` the first stage's token embedding and the last
  stage's LM head are one matrix, held by two ranks; after the last backward their gradients are
  summed by an all-reduce in their own two-rank group (Megatron's "embedding group"), so both
  copies take the same optimizer step. When one rank holds both (a V schedule), they are one
  Parameter and autograd already summed them.

Every action runs under ``trace.labels(micro_batch=..., phase=..., stage=...)``: compute spans
are named like the action (``"1F3"``), and the communicator's spans carry the same labels.
Data parallelism over ``mesh.dp_group`` is applied outside (as for any model); the executor's
``on_stage_done`` hook says when each stage's gradients are final, so a per-stage sync can start
there (:mod:`~dtlab.parallel.pipeline.dp_sync_run`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn as nn

from dtlab import trace
from dtlab.comm import Communicator
from dtlab.parallel.pipeline.actions import Action, Schedule
from dtlab.parallel.pipeline.communication import with_communication
from dtlab.parallel.pipeline.replay import Costs, peer_stage


def tied_parameters(stages: Mapping[int, nn.Module]) -> list[nn.Parameter]:
    """The distinct parameters this rank's stages tie to another stage (``stage.tied_parameters``)."""
    seen: dict[int, nn.Parameter] = {}
    for stage in stages.values():
        for name in getattr(stage, "tied_parameters", {}):
            param = stage.get_parameter(name)
            seen.setdefault(id(param), param)
    return list(seen.values())


def sum_tied_gradients(stages: Mapping[int, nn.Module], comm: Communicator | None) -> None:
    """All-reduce the gradients of the tied parameters over ``comm`` (the embedding group:
    first- and last-stage ranks; bytes per rank ``2(N-1)/N·|E|`` = ``|E|`` for N = 2). ``None``
    when one rank holds both ends: nothing to do."""
    if comm is None:
        return
    for param in tied_parameters(stages):
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        comm.all_reduce(param.grad, name="tied_embedding_grad")


def embedding_group(mesh, schedule: Schedule, collectives: str = "torch") -> Communicator | None:
    """The communicator of this rank's embedding group: the global ranks of its pp group that
    hold the first and the last stage (``None`` if one rank holds both, or this rank holds
    neither). Every rank builds every pp group's embedding group, in the same order
    (:meth:`Communicator.among`): making a process group is collective over the world."""
    first, last = schedule.stage_ranks[0], schedule.stage_ranks[-1]
    if first == last:
        return None
    pairs = [[ranks[first], ranks[last]] for ranks in mesh.layout.groups("pp")]
    return Communicator.among(pairs, collectives, dim="embedding")


class PipelineExecutor:
    """Runs ``schedule``'s actions for this rank's ``stages`` (``{stage index: module}``).

    ``comm`` is the pipeline group's communicator; ``activation_shape(micro_batch_inputs)``
    gives the shape of the tensor a stage receives (default ``(b, S, hidden_size)``);
    ``tied_comm`` sums tied gradients (see :func:`embedding_group`). Build one with
    :func:`pipeline_gpt`.
    """

    def __init__(
        self,
        stages: Mapping[int, nn.Module],
        schedule: Schedule,
        comm: Communicator,
        *,
        hidden_size: int,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        dtype: torch.dtype = torch.float32,
        tied_comm: Communicator | None = None,
        costs: Costs | None = None,
    ) -> None:
        self.schedule = schedule
        self.plan = with_communication(schedule, costs)  # validates it
        self.rank = comm.rank
        if sorted(stages) != schedule.stages_of(self.rank):
            raise ValueError(
                f"pipeline rank {self.rank} holds stages {schedule.stages_of(self.rank)} in "
                f"{schedule.name}, but was given stages {sorted(stages)}"
            )
        self.stages, self.comm, self.tied_comm = dict(stages), comm, tied_comm
        self.hidden_size, self.loss_fn, self.dtype = hidden_size, loss_fn, dtype
        self.last_stage = schedule.n_stages - 1
        self.on_stage_done: Callable[[int], None] | None = None
        """Called with a stage's index right after the action that completes its weights'
        gradients (its last B or W) — where a per-stage data-parallel sync can start
        (:mod:`~dtlab.parallel.pipeline.dp_sync`). Tied gradients are summed after the step."""
        last_gradient = {a.stage: i for i, a in enumerate(self.actions) if a.kind in ("B", "W")}
        self._stage_done_after = {i: stage for stage, i in last_gradient.items()}

    @property
    def actions(self) -> tuple[Action, ...]:
        """This rank's actions, sends and receives included, in the order they run."""
        return self.plan.actions[self.rank]

    def step(
        self, inputs: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """One forward and backward of the batch, micro-batch by micro-batch; gradients land in
        ``.grad`` (accumulated: zero them between steps) and tied ones are summed. Every rank
        passes the same batch (the first stage reads the tokens, the last the targets, the others
        its shape). ``positions`` (S,), when given, reach every stage's blocks (context parallel:
        a rank's tokens are not ``0..S-1``). Returns the batch's mean loss on the rank holding
        the last stage, ``None`` on the others."""
        m = self.schedule.n_micro
        if inputs.shape[0] % m:
            raise ValueError(
                f"a batch of {inputs.shape[0]} sequences does not split into m={m} equal "
                f"micro-batches; use a batch size that is a multiple of {m}"
            )
        self._inputs, self._targets = inputs.chunk(m), targets.chunk(m)
        self._saved: dict[tuple[int, int], tuple] = {}  # (stage, mb) -> input, outputs, grads
        self._inbox: dict[tuple[str, int, int], torch.Tensor] = {}
        self._outbox: dict[tuple[str, int, int], torch.Tensor] = {}
        self._losses: list[torch.Tensor] = []
        self._positions = positions
        for i, action in enumerate(self.actions):
            phase = action.kind if action.is_compute else action.kind[-1]
            with trace.labels(micro_batch=action.micro_batch, phase=phase, stage=action.stage):
                if action.is_compute:
                    with trace.span(str(action), kind="compute"):
                        getattr(self, f"_{action.kind.lower()}")(action)
                else:
                    self._message(action)
            if self.on_stage_done is not None and i in self._stage_done_after:
                self.on_stage_done(self._stage_done_after[i])
        sum_tied_gradients(self.stages, self.tied_comm)
        if self.last_stage not in self.stages:
            return None
        return torch.stack(self._losses).sum()

    # -- the four computations ----------------------------------------------------------------

    def _f(self, a: Action) -> None:
        s, mb = a.stage, a.micro_batch
        x = self._inputs[mb] if s == 0 else self._inbox.pop(("F", s, mb))
        out = self.stages[s](x) if self._positions is None else self.stages[s](x, self._positions)
        roots = [out]
        aux = getattr(self.stages[s], "aux_loss", None)
        if aux is not None and aux.requires_grad:  # mixture-of-experts stages: their own aux loss
            roots.append(aux / self.schedule.n_micro)
        if s == self.last_stage:
            loss = self.loss_fn(out, self._targets[mb]) / self.schedule.n_micro
            self._losses.append(loss.detach())
            roots[0] = loss
        else:
            self._deliver("F", s + 1, mb, out.detach())
        self._saved[(s, mb)] = (x, roots)

    def _b(self, a: Action) -> None:
        x, roots = self._saved.pop((a.stage, a.micro_batch))
        torch.autograd.backward(roots, self._output_grads(a, roots))
        if a.stage > 0:
            self._deliver("B", a.stage - 1, a.micro_batch, x.grad)

    def _i(self, a: Action) -> None:
        x, roots = self._saved[(a.stage, a.micro_batch)]
        grads = self._output_grads(a, roots)
        self._saved[(a.stage, a.micro_batch)] = (x, roots, grads)
        if a.stage > 0:
            (grad_x,) = torch.autograd.grad(roots, [x], grads, retain_graph=True)
            self._deliver("B", a.stage - 1, a.micro_batch, grad_x)

    def _w(self, a: Action) -> None:
        _, roots, grads = self._saved.pop((a.stage, a.micro_batch))
        params = [p for p in self.stages[a.stage].parameters() if p.requires_grad]
        torch.autograd.backward(roots, grads, inputs=params)

    def _output_grads(self, a: Action, roots: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """The gradient arriving for each root: from the next stage for the output, none (=1)
        for a loss."""
        first = (
            None if a.stage == self.last_stage else self._inbox.pop(("B", a.stage, a.micro_batch))
        )
        return [first] + [None] * (len(roots) - 1)

    # -- moving tensors -----------------------------------------------------------------------

    def _deliver(self, direction: str, stage: int, mb: int, tensor: torch.Tensor) -> None:
        """Hand ``tensor`` to ``stage``: in memory if it is here, else keep it for the send."""
        if stage in self.stages:
            self._inbox[(direction, stage, mb)] = _as_received(direction, tensor)
        else:
            sender = stage - 1 if direction == "F" else stage + 1
            self._outbox[(direction, sender, mb)] = tensor.contiguous()

    def _message(self, a: Action) -> None:
        direction = a.kind[-1]
        peer = self.schedule.stage_ranks[peer_stage(a)]
        if a.kind.startswith("SEND"):
            self.comm.send(
                self._outbox.pop((direction, a.stage, a.micro_batch)), to=peer, name=str(a)
            )
            return
        b = self._inputs[a.micro_batch].shape[0]
        shape = (b, self._inputs[a.micro_batch].shape[1], self.hidden_size)
        buffer = torch.empty(shape, dtype=self.dtype, device=self._inputs[a.micro_batch].device)
        self.comm.recv(buffer, source=peer, name=str(a))
        self._inbox[(direction, a.stage, a.micro_batch)] = _as_received(direction, buffer)


def _as_received(direction: str, tensor: torch.Tensor) -> torch.Tensor:
    """A received activation is a fresh leaf whose gradient the backward fills in."""
    return tensor.detach().requires_grad_() if direction == "F" else tensor


def pipeline_gpt(
    model: nn.Module,
    mesh,
    schedule: Schedule,
    *,
    collectives: str = "torch",
    loss_fn: Callable | None = None,
    boundaries: list[int] | None = None,
) -> PipelineExecutor:
    """Cut the lab GPT into ``schedule.n_stages`` stages and keep this pipeline rank's.

    ``mesh.pp_size`` must equal ``schedule.n_ranks``; every rank must call this (the embedding
    groups are made collectively). ``collectives="dtlab"`` counts every byte sent.
    """
    from dtlab.models import loss_fn as cross_entropy
    from dtlab.models import split_into_stages

    if mesh.pp_size != schedule.n_ranks:
        raise ValueError(
            f"{schedule.name} is for p={schedule.n_ranks} pipeline ranks, but the mesh has "
            f"pp={mesh.pp_size}; build the schedule for p={mesh.pp_size}"
        )
    stages = split_into_stages(model, schedule.n_stages, boundaries)
    mine = {s: stages[s] for s in schedule.stages_of(mesh.pp_rank)}
    tied = None
    if any(stage.tied_parameters for stage in stages):  # the same on every rank
        tied = embedding_group(mesh, schedule, collectives)
    return PipelineExecutor(
        mine,
        schedule,
        Communicator.along(mesh, "pp", collectives),
        hidden_size=model.config.d_model,
        loss_fn=loss_fn or cross_entropy,
        dtype=next(model.parameters()).dtype,
        tied_comm=tied,
    )
