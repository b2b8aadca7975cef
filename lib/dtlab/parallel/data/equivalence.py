"""The yardstick for every data-parallel mechanism: does it train exactly like one process?

Same seed, same global batch: one process computes ``mean(loss over B samples)``; N ranks each
compute ``mean(loss over B/N samples)`` and average the gradients, which is the same number
mathematically. In floating point it is *almost* the same: the B per-sample terms are added in a
different order (per rank, then across ranks), and fp32 addition is not associative, so a
gradient can differ in its last bit or two (one ulp of fp32 is 2**-23 ≈ 1.2e-7 relative).
With N a power of two the division by N is exact, so only that summation order differs; after a
handful of optimizer steps parameters agree to ~1e-6 absolute on O(1) weights, which is the
tolerance :data:`FP32_STEP_TOLERANCE` states. Anything bigger is a real bug (a missing average, a
stale gradient, a rank that skipped a step). Prove equivalence with SGD (with momentum) rather than
Adam: Adam divides each gradient by its own running RMS, so it barely notices a gradient that is
N times too large — exactly the bug a missing 1/N average produces.

:class:`TiedToyModel` packs the cases that break naive implementations into a few hundred
parameters: a tied (shared) weight, a frozen parameter, a buffer that gets no gradient, and an
optional branch whose parameters get no gradient in some steps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

FP32_STEP_TOLERANCE = 1e-5
"""Max |Δparam| allowed after a few fp32 steps when only the batch summation order differs."""


class TiedToyModel(nn.Module):
    """Embedding tied to the output head, a frozen layer, a no-grad buffer, an optional branch.

    Every parameter's element count is a multiple of 4 so flat shards split evenly at N = 2 and 4.
    """

    def __init__(self, vocab: int = 16, dim: int = 8, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab, dim)
        self.frozen = nn.Linear(dim, dim)
        self.frozen.requires_grad_(False)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, dim))
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)
        self.branch = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: one Parameter, two uses
        self.use_branch = True

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.frozen(self.embed(tokens)) * self.scale
        h = h + self.down(F.gelu(self.up(h)))
        if self.use_branch:
            h = h + self.branch(h)
        return self.head(h)


def toy_batches(
    steps: int, global_batch: int = 8, seq_len: int = 6, vocab: int = 16, seed: int = 1
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` (tokens, targets) pairs of shape [global_batch, seq_len], fixed by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        seq = torch.randint(0, vocab, (global_batch, seq_len + 1), generator=g)
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def rank_slice(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous share of a global batch (dimension 0)."""
    if t.shape[0] % world_size:
        raise ValueError(f"global batch {t.shape[0]} does not split over {world_size} ranks")
    return t.chunk(world_size)[rank]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (fp32 even when logits are bf16)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def train_single_process(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    before_step: Callable[[int], None] | None = None,
) -> dict[str, torch.Tensor]:
    """The reference run: full global batch on one process. Returns name → parameter copy."""
    for step, (tokens, targets) in enumerate(batches):
        if before_step is not None:
            before_step(step)
        optimizer.zero_grad(set_to_none=True)
        lm_loss(model(tokens), targets).backward()
        optimizer.step()
    return parameters_by_name(model)


def parameters_by_name(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def max_abs_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest |a[name] - b[name]| over all shared names (names must match)."""
    if a.keys() != b.keys():
        raise KeyError(f"parameter names differ: {sorted(a.keys() ^ b.keys())}")
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)
