"""The steps the lab measures: one lab-GPT training step, with and without host syncs.

:func:`gpt_training_step` builds the step once (model, SGD, a fixed batch) and returns a
closure, so profiling and counting see only the step. ``syncs`` plants the host reads a real
training loop tends to grow, each one the way people write it:

* ``"print_loss"`` — ``print(f"loss {loss}")`` every step;
* ``"item"`` — ``loss.item()`` for a running average;
* ``"tolist"`` — token counts per "expert" (the argmax of the logits' first columns, counted
  with ``bincount``) turned into a Python list, as MoE dispatch does for its split sizes;
* ``"nonzero"`` — the positions of one token id (``nonzero``), a data-dependent shape.

:func:`gpt_training_step_fixed` is the same step with each fixed: the loss accumulates on the
device and is read once every ``read_every`` steps, the counts stay a tensor, the mask is used as
a mask (``torch.where``), nothing is printed.

:func:`gpt_training_step_compiled` is :func:`gpt_training_step` (no syncs) with the model's
blocks, head and loss under ``torch.compile``; the token and position embedding stays eager.
That split is a decision, not a limitation of the compiler: on a CPU the model checks its
positions with ``int(positions.min())`` (``check_positions``), a host read that breaks the
graph in two (section 6's syncs, as the compiler sees them) and would double the compile time.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from contextlib import redirect_stdout

import torch

from dtlab.models import GPT, GPTConfig, loss_fn

SYNCS = ("print_loss", "item", "tolist", "nonzero")
EXPERTS = 4


def _model_and_batch(config: GPTConfig, batch: int, device: torch.device, seed: int):
    model = GPT(config, seed=seed, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (batch, config.seq_len + 1), generator=g)
    tokens = tokens.to(device)
    return model, optimizer, tokens[:, :-1], tokens[:, 1:]


def gpt_training_step(
    config: GPTConfig,
    batch: int = 4,
    device: torch.device | str = "cpu",
    syncs: tuple[str, ...] = (),
    seed: int = 0,
) -> Callable[[], torch.Tensor]:
    """One forward, backward and SGD step of the lab GPT, with the host reads named in ``syncs``."""
    unknown = set(syncs) - set(SYNCS)
    if unknown:
        raise ValueError(f"unknown syncs {sorted(unknown)}; choose from {SYNCS}")
    model, optimizer, inputs, targets = _model_and_batch(config, batch, torch.device(device), seed)
    log = io.StringIO()
    history: list[float] = []

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = loss_fn(logits, targets)
        loss.backward()
        optimizer.step()
        if "print_loss" in syncs:
            with redirect_stdout(log):
                print(f"loss {loss}")
        if "item" in syncs:
            history.append(loss.item())
        if "tolist" in syncs:
            experts = logits.detach()[..., :EXPERTS].argmax(-1).flatten()
            torch.bincount(experts, minlength=EXPERTS).tolist()
        if "nonzero" in syncs:
            (inputs == 0).nonzero()
        return loss.detach()

    return step


def gpt_training_step_fixed(
    config: GPTConfig,
    batch: int = 4,
    device: torch.device | str = "cpu",
    read_every: int = 10,
    seed: int = 0,
) -> Callable[[], torch.Tensor]:
    """The planted-sync step with every sync fixed; reads the loss once per ``read_every`` steps."""
    model, optimizer, inputs, targets = _model_and_batch(config, batch, torch.device(device), seed)
    total = torch.zeros((), device=inputs.device)
    steps = [0]
    readings: list[float] = []

    def step() -> torch.Tensor:
        nonlocal total
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = loss_fn(logits, targets)
        loss.backward()
        optimizer.step()
        total = total + loss.detach()  # stays on the device
        experts = logits.detach()[..., :EXPERTS].argmax(-1).flatten()
        torch.bincount(experts, minlength=EXPERTS)  # split sizes kept as a tensor
        torch.where(inputs == 0, 1, 0)  # a mask, not positions: the shape is known
        steps[0] += 1
        if steps[0] % read_every == 0:
            readings.append(total.item() / read_every)  # one sync per read_every steps
            total = torch.zeros((), device=inputs.device)
        return loss.detach()

    return step


def gpt_training_step_compiled(
    config: GPTConfig,
    batch: int = 4,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> Callable[[], torch.Tensor]:
    """:func:`gpt_training_step` with the blocks, head and loss compiled by ``torch.compile``.

    Nothing compiles until the first call (the cold start); the backward graph compiles during
    the first ``backward``."""
    model, optimizer, inputs, targets = _model_and_batch(config, batch, torch.device(device), seed)
    positions = torch.arange(config.seq_len, device=inputs.device)[: inputs.shape[1]]

    def body(h: torch.Tensor) -> torch.Tensor:
        for block in model.blocks:
            h = block(h, positions)
        return loss_fn(model.lm_logits(h), targets)

    compiled = torch.compile(body)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = compiled(model.embed_tokens(inputs))
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step
