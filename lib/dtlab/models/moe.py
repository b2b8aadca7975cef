"""A mixture-of-experts MLP for the lab GPT, plugged in through its MLP factory.

    factory = moe_mlp_factory(MoEConfig(n_experts=8, top_k=2, capacity_factor=1.25))
    model = GPT(config, mlp_factory=factory)       # every block's MLP is an MoE (or every n-th)
    loss = loss_fn(model(x), y) + model.aux_loss   # the routers' balancing losses

One MoE forward on ``T = B·S`` tokens (Shazeer et al. 2017; GShard, Lepikhin et al. 2020;
Switch, Fedus et al. 2021)::

    routing = route(x)                         # top-k experts per token, weights, capacity mask
    rows    = x[token of each kept assignment] # sorted by expert: the "dispatch"
    y_rows  = experts(rows, counts)            # grouped GEMM (or a loop over experts)
    out     = Σ_k weight · y_rows  per token   # the "combine"; dropped assignments add nothing
    out    += shared_expert(x)                 # optional, always on (DeepSeekMoE)

Expert parallelism (:mod:`dtlab.parallel.expert`) replaces ``moe.dispatcher`` — the step from
routed rows to weighted outputs — with two all-to-alls around this rank's experts; the router,
the losses and the counters stay here, so both run the same code.

Parameters vs active parameters: a token runs ``k`` of ``E`` experts (plus the shared one), so
an MoE holds ``E`` expert MLPs but computes with ``k`` per token (:meth:`MoE.active_params`).

Counters of the latest forward (``moe.stats``, one per step without gradient accumulation):
tokens per expert (before dropping), kept per expert, dropped assignments and fully dropped
tokens, imbalance ``max/mean`` of tokens per expert, and — under expert parallelism — the
forward's all-to-all bytes this rank sent, read from the communicator's stats (backward sends
the dispatch and combine bytes once more).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn as nn

from dtlab import trace
from dtlab.models.config import GPTConfig
from dtlab.models.dropout import residual_dropout
from dtlab.models.mlp import MLP, MLPFactory, default_mlp
from dtlab.models.moe_experts import BACKENDS, Experts
from dtlab.models.moe_router import (
    SCORE_FUNCTIONS,
    Routing,
    balance_loss_from_counts,
    route,
    router_z_loss,
    sequence_aux_loss,
    switch_aux_loss,
)

AUX_LOSS_SCOPES = ("micro_batch", "global", "sequence")


@dataclass(frozen=True)
class MoEConfig:
    """How one MoE layer routes and computes.

    Attributes:
        n_experts: routed experts ``E``.
        top_k: experts per token ``k``.
        d_expert: each expert's hidden width (``None``: the model's ``d_ff``).
        score: ``"softmax"`` (Switch, Mixtral) or ``"sigmoid"`` (DeepSeek-V3).
        capacity_factor: ``c`` in ``C = ceil(c·T·k/E)``; ``None`` never drops (dropless).
            ``T`` is the tokens of one forward of this layer on one rank, so under expert
            parallelism capacity is **per rank**: each rank lets each expert keep ``C`` of its
            own assignments, and an expert may receive up to ``ep·C`` rows in all (``C`` from
            each EP rank). One process routing ``n`` ranks' tokens at once caps each expert at
            ``ceil(c·n·T·k/E)`` instead, and can drop different assignments.
        shared_expert: add one always-on expert of width ``d_expert`` (DeepSeekMoE).
        aux_loss_weight: weight of the Switch load-balancing loss (0 disables it).
        aux_loss_scope: where its ``f`` is counted: ``"micro_batch"`` (this forward's tokens on
            this rank), ``"global"`` (the counts :attr:`MoE.load_reducer` returns — expert
            parallelism sums them over the data-parallel ranks and the step's micro-batches,
            :mod:`dtlab.parallel.expert.balance`; this forward's alone without one), or
            ``"sequence"`` (DeepSeek-V3's sequence-wise loss,
            :func:`~dtlab.models.moe_router.sequence_aux_loss`). Under context parallel every
            scope counts whole sequences (:attr:`MoE.sequence_shards`).
        z_loss_weight: weight of the router z-loss (0 disables it).
        bias_balancing: DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias added to
            the scores for the choice only, nudged by ``bias_update_rate`` after each step
            (:meth:`MoE.update_balancing_bias`).
        n_nodes, node_limit: experts spread over ``n_nodes`` nodes in contiguous blocks; each
            token's experts come from at most ``node_limit`` of them (``None``: no limit).
        backend: experts' compute: ``"grouped"``, ``"loop"`` or ``"auto"`` (the grouped GEMM
            where it can run these operands, else the loop, decided per call; what ran is in
            ``experts.last_backend``, see :mod:`dtlab.models.moe_experts`).
        every: experts in every ``every``-th block (1: all blocks; 2: blocks 1, 3, …).
    """

    n_experts: int = 4
    top_k: int = 2
    d_expert: int | None = None
    score: str = "softmax"
    capacity_factor: float | None = None
    shared_expert: bool = False
    aux_loss_weight: float = 0.01
    aux_loss_scope: str = "micro_batch"
    z_loss_weight: float = 0.0
    bias_balancing: bool = False
    bias_update_rate: float = 1e-3
    n_nodes: int = 1
    node_limit: int | None = None
    backend: str = "auto"
    every: int = 1

    def __post_init__(self) -> None:
        if self.n_experts < 1 or not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k={self.top_k} must be between 1 and n_experts={self.n_experts}")
        if self.score not in SCORE_FUNCTIONS:
            raise ValueError(f"score={self.score!r}: choose one of {SCORE_FUNCTIONS}")
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            raise ValueError(
                f"capacity_factor={self.capacity_factor} must be > 0, or None for no dropping"
            )
        if self.aux_loss_scope not in AUX_LOSS_SCOPES:
            raise ValueError(
                f"aux_loss_scope={self.aux_loss_scope!r}: choose one of {AUX_LOSS_SCOPES}"
            )
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: choose one of {BACKENDS}")
        if self.n_experts % self.n_nodes:
            raise ValueError(f"n_nodes={self.n_nodes} must divide n_experts={self.n_experts}")
        if self.every < 1:
            raise ValueError(f"every={self.every} must be ≥ 1")


@dataclass
class MoEStats:
    """Counters of one MoE forward on this rank."""

    tokens_per_expert: list[int] = field(default_factory=list)  # chosen, before dropping
    kept_per_expert: list[int] = field(default_factory=list)
    dropped: int = 0  # assignments (token, expert) past capacity
    capacity: int | None = None
    all_to_all_bytes: dict[str, int] = field(default_factory=dict)  # EP: counted, by exchange
    received_per_local_expert: list[int] = field(default_factory=list)  # EP: rows computed here
    dropped_tokens: int = 0  # tokens that lost all k experts (only the residual passes)

    @property
    def imbalance(self) -> float:
        """``max / mean`` of tokens per expert: 1 when balanced, ``E`` when one expert gets all."""
        total = sum(self.tokens_per_expert)
        return max(self.tokens_per_expert) * len(self.tokens_per_expert) / total if total else 1.0


class LocalDispatch:
    """Every expert on this rank: sort the kept assignments by expert, compute, weigh, sum."""

    def __call__(self, x: torch.Tensor, routing: Routing, experts: Experts, stats: MoEStats):
        token, expert, weight = kept_assignments(routing)
        counts = torch.bincount(expert, minlength=routing.n_experts).tolist()
        with trace.span("moe_experts", kind="compute", tokens=len(token)):
            y = experts(x[token], counts)
        return combine_rows(y, token, weight, x.shape[0])


def kept_assignments(routing: Routing) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(token, expert, weight)`` of every kept assignment, sorted by expert (stable)."""
    tokens = torch.arange(routing.keep.shape[0], device=routing.keep.device)
    token = tokens[:, None].expand_as(routing.keep)[routing.keep]
    expert = routing.expert_index[routing.keep]
    order = torch.argsort(expert, stable=True)
    return token[order], expert[order], routing.weight[routing.keep][order]


def combine_rows(y: torch.Tensor, token: torch.Tensor, weight: torch.Tensor, n_tokens: int):
    """``out[t] = Σ weight · y`` over the rows of token ``t`` (zeros for fully dropped tokens)."""
    out = y.new_zeros(n_tokens, y.shape[-1])
    return out.index_add(0, token, y * weight[:, None].to(y.dtype))


class MoE(nn.Module):
    """Router, experts and optional shared expert; ``forward(x) -> (out, aux_loss)``."""

    def __init__(
        self, config: GPTConfig, moe: MoEConfig, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        self.moe, self.dropout = moe, config.dropout
        width = moe.d_expert or config.d_ff
        self.router = nn.Linear(config.d_model, moe.n_experts, bias=False, device=device)
        self.experts = Experts(moe.n_experts, config.d_model, width, moe.backend, device)
        self.shared = (
            MLP(replace(config, d_ff=width, dropout=0.0), device) if moe.shared_expert else None
        )
        self.register_buffer("balancing_bias", torch.zeros(moe.n_experts, device=device))
        self.dispatcher = LocalDispatch()
        self.load_reducer = None  # "global" scope: counts (E,) -> the global batch's counts
        # Context parallel: the ranks holding the other parts of these sequences, over which
        # the balance loss sums its counts (dtlab.parallel.expert.balance.SequenceShards).
        self.sequence_shards = None
        self.stats = MoEStats()
        self.routing: Routing | None = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.reshape(-1, x.shape[-1])
        routing = route(
            flat,
            self.router.weight,
            self.moe.top_k,
            score=self.moe.score,
            capacity_factor=self.moe.capacity_factor,
            bias=self.balancing_bias if self.moe.bias_balancing else None,
            n_nodes=self.moe.n_nodes,
            node_limit=self.moe.node_limit,
        )
        self.routing, self._seq_len = routing, x.shape[-2] if x.dim() > 2 else flat.shape[0]
        self.stats = MoEStats(
            routing.tokens_per_expert.tolist(),
            routing.kept_per_expert.tolist(),
            routing.dropped,
            routing.capacity,
            dropped_tokens=routing.dropped_tokens,
        )
        out = self.dispatcher(flat, routing, self.experts, self.stats)
        if self.shared is not None:
            out = out + self.shared(flat)
        return residual_dropout(out.view_as(x), self.dropout, self.training), self.aux_loss(routing)

    def aux_loss(self, routing: Routing) -> torch.Tensor:
        """``aux_loss_weight · Switch loss + z_loss_weight · z-loss`` of ``routing``."""
        loss = routing.logits.new_zeros(())
        if self.moe.aux_loss_weight:
            loss = loss + self.moe.aux_loss_weight * self.balance_loss(routing)
        if self.moe.z_loss_weight:
            loss = loss + self.moe.z_loss_weight * router_z_loss(routing.logits)
        return loss

    def balance_loss(self, routing: Routing) -> torch.Tensor:
        """The unweighted balance loss of ``routing`` in this layer's ``aux_loss_scope``.

        With :attr:`sequence_shards` (context parallel: this rank holds a share of every
        sequence) ``f`` counts the whole sequences — the counts summed over the shards — and
        ``P`` stays this rank's own mean, so the shards' average is one process's loss."""
        scope, n, shards = self.moe.aux_loss_scope, routing.n_experts, self.sequence_shards
        if scope == "sequence":
            return sequence_aux_loss(routing.probs, routing.expert_index, n, self._seq_len, shards)
        if scope == "global" and self.load_reducer is not None:
            counts = self.load_reducer(routing.tokens_per_expert)
            return balance_loss_from_counts(routing.probs, counts, n)
        if shards is not None:
            counts = shards.sum(routing.tokens_per_expert)
            return balance_loss_from_counts(routing.probs, counts, n)
        return switch_aux_loss(routing.probs, routing.expert_index, n)

    @torch.no_grad()
    def update_balancing_bias(self, tokens_per_expert: torch.Tensor | None = None) -> None:
        """DeepSeek-V3's bias step: ``b_i += γ · sign(mean load − load_i)`` (this forward's
        tokens per expert unless given, e.g. summed over the data-parallel group)."""
        load = torch.tensor(self.stats.tokens_per_expert, dtype=torch.float32)
        if tokens_per_expert is not None:
            load = tokens_per_expert.float().cpu()
        step = self.moe.bias_update_rate * torch.sign(load.mean() - load)
        self.balancing_bias += step.to(self.balancing_bias.device)

    def active_params(self) -> int:
        """Parameters one token computes with: router, ``k`` experts, the shared expert."""
        per_expert = self.experts.fc_in.weight[0].numel() + self.experts.fc_out.weight[0].numel()
        shared = sum(p.numel() for p in self.shared.parameters()) if self.shared else 0
        return self.router.weight.numel() + self.moe.top_k * per_expert + shared


def moe_mlp_factory(moe: MoEConfig) -> MLPFactory:
    """An :data:`~dtlab.models.mlp.MLPFactory`: an :class:`MoE` in every ``moe.every``-th block
    (blocks ``every-1, 2·every-1, …``), the dense MLP elsewhere."""

    def factory(config: GPTConfig, layer: int, device=None) -> nn.Module:
        if (layer + 1) % moe.every:
            return default_mlp(config, layer, device)
        return MoE(config, moe, device)

    return factory


def moe_layers(model: nn.Module) -> list[MoE]:
    """Every :class:`MoE` inside ``model``, in order."""
    return [m for m in model.modules() if isinstance(m, MoE)]


def is_expert_param(name: str) -> bool:
    """Whether parameter ``name`` belongs to routed experts (sharded by expert parallelism)."""
    return ".experts." in f".{name}"
