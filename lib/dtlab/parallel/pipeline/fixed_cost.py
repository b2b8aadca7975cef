"""A pipeline stage made to cost fixed times, so a timeline on shared CPU cores reads clearly.

The lab models compute in a millisecond or two, and two cores shared by four ranks make that
noisy. :class:`FixedCost` wraps a stage: on top of its real work the forward sleeps
``forward_s``, the input-gradient part of its backward (I) ``input_s`` and the weight-gradient
part (W) ``weight_s``; a full B pays both. Sleeping leaves the core free, so a collective
running on gloo's background thread really progresses meanwhile — which is what an overlap
measurement needs. The first stage has no input to differentiate: its I is empty and its B or W
pays both sleeps (the executor runs no autograd for a first-stage I).
"""

from __future__ import annotations

import time

import torch


class SleepInBackward(torch.autograd.Function):
    """Identity in forward; its backward sleeps ``seconds`` first."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class FixedCost(torch.nn.Module):
    """``stage`` plus fixed sleeps: F ``forward_s``, I ``input_s``, W ``weight_s`` (module doc)."""

    def __init__(self, stage: torch.nn.Module, forward_s: float, input_s: float, weight_s: float):
        super().__init__()
        self.stage = stage
        self.forward_s, self.input_s, self.weight_s = forward_s, input_s, weight_s
        self.clock = torch.nn.Parameter(torch.zeros(()))  # a weight whose gradient costs W

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.forward_s)
        if x.is_floating_point() and x.requires_grad:  # on the input-gradient path: B and I
            out = self.stage(SleepInBackward.apply(x, self.input_s))
        else:  # a first stage: its B or W does the whole backward
            out = SleepInBackward.apply(self.stage(x), self.input_s)
        return out + SleepInBackward.apply(self.clock, self.weight_s)  # B and W pay this
