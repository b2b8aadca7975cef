"""Cutting the GPT's ``blocks`` into pipeline stages (GPipe, Huang et al. 2019; Narayanan et al.
2021, Megatron-LM) without the model knowing.

``split_into_stages(model, n_stages)`` returns one :class:`PipelineStage` per stage, each a module
whose ``forward`` maps the previous stage's output to the next one's input::

    stage 0:     idx (B, S) int64 ─embed + pos_embed─► blocks[0:a] ─► h (B, S, d)
    stage k:     h (B, S, d) ─────────────────────────► blocks[a:b] ─► h (B, S, d)
    stage n-1:   h (B, S, d) ─► blocks[b:L] ─► final_norm ─► lm_head ─► logits (B, S, vocab)

What moves between stages: one activation ``h`` of ``B·S·d`` elements forward per micro-batch
and its gradient of the same size backward, point to point from stage ``k`` to ``k+1`` (and back).

The stages *share* the model's modules — nothing is copied, and every parameter keeps the name it
has in the full model (``blocks.5.attn.q_proj.weight`` stays ``blocks.5…``, so checkpoints and the
name-based initialisation line up). A pipeline rank keeps ``stages[pp_rank]`` and drops the rest.

Tied embeddings: with ``tie_embeddings`` the LM head *is* the token embedding. Stage 0 needs it
to embed, stage ``n-1`` to produce logits, so both hold it: in one process it is one Parameter
whose gradient accumulates both uses, but on separate ranks each holds a copy, and after backward
the two copies' gradients must be summed (an all-reduce over the group {first, last stage} —
Megatron's "embedding group") before the optimizer step, or the copies drift apart. Each stage
lists such parameters in ``stage.tied_parameters`` (its parameter name → tie-group name,
``{"embed.weight": "embedding"}`` on the first stage, ``{"lm_head.weight": "embedding"}`` on the
last); a pipeline all-reduces each group's gradients within its own process group.

Aux losses (mixture-of-experts MLPs): after a forward, ``stage.aux_loss`` sums its blocks' aux
losses (a 0-dim zero when none); each stage must backpropagate its own, alongside its output.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from dtlab.models.gpt import GPT, TokenEnds, default_positions, sum_aux_losses

TIED_EMBEDDING_GROUP = "embedding"


def balanced_stage_layers(n_layers: int, n_stages: int) -> list[range]:
    """Block indices of each stage, as even as possible: the first ``n_layers % n_stages`` stages
    take one block more (the last stage also carries the LM head, the heaviest single layer)."""
    if not isinstance(n_stages, int) or n_stages < 1:
        raise ValueError(f"n_stages={n_stages!r} must be a positive integer")
    if n_stages > n_layers:
        raise ValueError(
            f"n_stages={n_stages} exceeds the model's {n_layers} blocks: every stage needs at "
            f"least one block; choose n_stages from 1 to {n_layers}, add layers, or pass "
            "explicit boundaries (a stage may then hold only the embedding or only the head)"
        )
    per_stage, extra = divmod(n_layers, n_stages)
    ranges, start = [], 0
    for stage in range(n_stages):
        stop = start + per_stage + (1 if stage < extra else 0)
        ranges.append(range(start, stop))
        start = stop
    return ranges


class PipelineStage(TokenEnds, nn.Module):
    """Blocks ``layers`` of a :class:`~dtlab.models.GPT`, plus the embeddings on the first stage
    and the final norm and LM head on the last. ``forward(x, positions=None)``: ``x`` is ``idx``
    (B, S) on the first stage and hidden states (B, S, d) on the others; returns hidden states,
    or logits on the last stage. Iterate blocks with ``stage.blocks.values()`` (keyed by their
    index in the full model)."""

    def __init__(self, model: GPT, index: int, n_stages: int, layers: range) -> None:
        super().__init__()
        self.config = model.config
        self.index, self.n_stages, self.layers = index, n_stages, layers
        self.is_first, self.is_last = index == 0, index == n_stages - 1
        if self.is_first:
            self.embed, self.pos_embed = model.embed, model.pos_embed
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})
        if self.is_last:
            self.final_norm, self.lm_head = model.final_norm, model.lm_head
        self.tied_parameters: dict[str, str] = {}
        self.aux_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if positions is None:
            positions = default_positions(x.shape[1], self.config, x.device)
        h = self.embed_tokens(x, positions=positions) if self.is_first else x
        for block in self.blocks.values():
            h = block(h, positions)
        self.aux_loss = sum_aux_losses(self.blocks.values(), h)
        return self.lm_logits(h) if self.is_last else h

    def extra_repr(self) -> str:
        return f"stage {self.index} of {self.n_stages}, blocks {list(self.layers)}"


def split_into_stages(
    model: GPT, n_stages: int, boundaries: Sequence[int] | None = None
) -> list[PipelineStage]:
    """Cut ``model`` into ``n_stages`` :class:`PipelineStage` modules that share its parameters.

    ``boundaries`` (``n_stages - 1`` non-decreasing block indices) names the first block of
    stages 1, 2, …; the default is :func:`balanced_stage_layers`. Running the stages one after
    another reproduces ``model``'s forward and backward exactly. Parameters tied across stages are
    reported in each stage's ``tied_parameters`` (see the module docstring).
    """
    n_layers = len(model.blocks)
    if boundaries is None:
        layers = balanced_stage_layers(n_layers, n_stages)
    else:
        cuts = list(boundaries)
        if len(cuts) != n_stages - 1:
            raise ValueError(
                f"boundaries {cuts} name {len(cuts)} cuts, but {n_stages} stages need "
                f"{n_stages - 1}: the first block index of each stage after the first"
            )
        if cuts != sorted(cuts) or any(not 0 <= c <= n_layers for c in cuts):
            raise ValueError(
                f"boundaries {cuts} must be non-decreasing block indices in 0..{n_layers}"
            )
        edges = [0, *cuts, n_layers]
        layers = [range(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    stages = [PipelineStage(model, i, n_stages, r) for i, r in enumerate(layers)]
    if n_stages > 1 and model.lm_head.weight is model.embed.weight:
        stages[0].tied_parameters["embed.weight"] = TIED_EMBEDDING_GROUP
        stages[-1].tied_parameters["lm_head.weight"] = TIED_EMBEDDING_GROUP
    return stages
