"""The router of a mixture-of-experts layer: scores, top-k choice, capacity, balancing losses.

Per token ``t`` (rows of ``x``, width ``d``) and expert ``i`` of ``E``:

* logits ``z = x · W_rᵀ`` (in fp32 at least; ``W_r`` is ``(E, d)``);
* scores ``s = softmax(z)`` (Shazeer et al. 2017; Switch, Fedus et al. 2021) or
  ``s = sigmoid(z)`` (DeepSeek-V3, 2024), whose chosen weights are renormalised to sum to 1;
* the ``k`` experts with the highest ``s + b`` are chosen (``b`` is the auxiliary-loss-free
  balancing bias of DeepSeek-V3, zero unless enabled; it steers the *choice* only, never the
  weight); with node-limited routing the choice is restricted to the best ``M`` nodes first;
* **ties go to the lower index**: exactly equal values rank the lower expert (or node) index
  first, in the experts chosen and in their best-first order (:func:`top_k_indices`, a stable
  sort). ``torch.topk`` promises no order for equal values — in torch 2.13 on CPU, the top 1 of
  four equal scores is expert 2 — so a rule is needed for every rank and run to route alike;
* capacity ``C = ceil(c·T·k/E)`` (:func:`dtlab.cost.moe.expert_capacity`): an expert keeps its
  first ``C`` assignments — all tokens' first choices before any second choice, tokens in order
  within a choice (GShard, Lepikhin et al. 2020) — and drops the rest. ``T`` is the tokens of
  this call: under expert parallelism, one rank's tokens, so the capacity is per rank.

Losses (added to the model's loss through the block's ``aux_loss``):

* Switch load-balancing loss ``E · Σ_i f_i · P_i`` with ``f_i`` the fraction of the ``T·k``
  assignments that chose expert ``i`` (before dropping) and ``P_i`` the mean score of expert ``i``
  (scores normalised to sum to 1 per token). Uniform routing gives 1; it is minimised by
  balance, and only ``P`` carries a gradient (``f`` counts a discrete choice).
* Router z-loss (ST-MoE, Zoph et al. 2022): ``mean_t (log Σ_i exp z_ti)²`` keeps logits small.
* Where ``f`` is counted is a choice (:func:`balance_loss_from_counts`): per micro-batch on one
  rank (the Switch default), over the **global batch** — counts summed over the data-parallel
  ranks and the step's micro-batches (Qiu et al. 2025, "Demons in the detail"; Megatron-Core's
  ``global_aux_loss``), which lets each rank's data favour its own experts as long as the whole
  batch is balanced — or per **sequence** (:func:`sequence_aux_loss`, DeepSeek-V3 §2.1.2), a
  tiny loss beside the balancing bias that only stops one sequence from piling onto few experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from dtlab.cost.moe import expert_capacity


class CountSummer(Protocol):
    """What sums a router's counts over the ranks holding the rest of each sequence: ``size``
    ranks, ``sum(counts)`` (the model knows no parallelism; context parallelism supplies one,
    :class:`dtlab.parallel.expert.balance.SequenceShards`)."""

    size: int

    def sum(self, counts: torch.Tensor) -> torch.Tensor: ...


SCORE_FUNCTIONS = ("softmax", "sigmoid")


@dataclass
class Routing:
    """One forward's routing of ``T`` tokens to ``k`` of ``E`` experts."""

    expert_index: torch.Tensor  # (T, k) int64: chosen experts, best first (ties: lower index)
    weight: torch.Tensor  # (T, k): combine weights (differentiable)
    keep: torch.Tensor  # (T, k) bool: False where capacity dropped the assignment
    probs: torch.Tensor  # (T, E): scores normalised per token (the aux loss's P)
    logits: torch.Tensor  # (T, E)
    capacity: int | None  # None: dropless
    n_experts: int

    @property
    def tokens_per_expert(self) -> torch.Tensor:
        """Assignments each expert was chosen for, before dropping (E,)."""
        return torch.bincount(self.expert_index.reshape(-1), minlength=self.n_experts)

    @property
    def kept_per_expert(self) -> torch.Tensor:
        """Assignments each expert computes after capacity (E,)."""
        return torch.bincount(self.expert_index[self.keep], minlength=self.n_experts)

    @property
    def dropped(self) -> int:
        """Assignments capacity dropped."""
        return int((~self.keep).sum())

    @property
    def dropped_tokens(self) -> int:
        """Tokens capacity dropped from every one of their ``k`` experts (residual only)."""
        return int((~self.keep).all(-1).sum())


def scores_of(logits: torch.Tensor, score: str) -> torch.Tensor:
    """``softmax`` or ``sigmoid`` of the router logits (T, E)."""
    if score == "softmax":
        return logits.softmax(dim=-1)
    if score == "sigmoid":
        return logits.sigmoid()
    raise ValueError(f"score={score!r} is not a router score; choose one of {SCORE_FUNCTIONS}")


def top_k_indices(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (…, k) of the ``k`` largest ``values`` along the last dimension, largest first;
    exactly equal values rank the lower index first.

    A stable descending sort keeps equal values in index order, so the rule holds on every
    device and torch version; for distinct values it picks what ``torch.topk`` picks, in the
    same order. NaN counts as the largest value, as in ``topk``.
    """
    return torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :k]


def node_limited_mask(
    selection: torch.Tensor, top_k: int, n_nodes: int, node_limit: int
) -> torch.Tensor:
    """Bool mask (T, E) of the experts on each token's best ``node_limit`` nodes.

    Experts sit in ``n_nodes`` contiguous blocks (expert-parallel ranks fill nodes in order). A
    node's score is the sum of its best ``max(1, k // M)`` expert scores (DeepSeek-V3 §2.1.2);
    nodes with exactly equal scores rank the lower node index first (:func:`top_k_indices`).
    """
    tokens, n_experts = selection.shape
    if n_experts % n_nodes:
        raise ValueError(f"n_nodes={n_nodes} must divide n_experts={n_experts}")
    per_node = n_experts // n_nodes
    if not 1 <= node_limit <= n_nodes or node_limit * per_node < top_k:
        raise ValueError(
            f"node_limit={node_limit} with {per_node} experts per node cannot give top_k={top_k} "
            f"experts; choose node_limit in {-(-top_k // per_node)}..{n_nodes}"
        )
    best = min(max(1, top_k // node_limit), per_node)
    by_node = selection.view(tokens, n_nodes, per_node)
    node_score = by_node.topk(best, dim=-1).values.sum(-1)  # values only: ties cannot matter
    nodes = top_k_indices(node_score, node_limit)
    allowed = torch.zeros(tokens, n_nodes, dtype=torch.bool, device=selection.device)
    allowed.scatter_(1, nodes, True)
    return allowed.repeat_interleave(per_node, dim=1)


def capacity_keep(expert_index: torch.Tensor, n_experts: int, capacity: int | None) -> torch.Tensor:
    """Which assignments (T, k) fit: each expert keeps its first ``capacity``, counted over all
    tokens' first choices, then all second choices, … (tokens in order within a choice)."""
    if capacity is None:
        return torch.ones_like(expert_index, dtype=torch.bool)
    slot_major = expert_index.t().reshape(-1)
    one_hot = F.one_hot(slot_major, n_experts)
    position = (one_hot.cumsum(0) - 1).gather(1, slot_major[:, None]).squeeze(1)
    return (position < capacity).view(expert_index.shape[1], -1).t()


def route_top_k(
    scores: torch.Tensor, top_k: int, capacity: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k routing with capacity on scores (T, E): ``(expert_index, weight, keep)``, each (T, k).

    The reference for the lab's routing exercise: the ``k`` highest scores' experts (best
    first, exactly equal scores to the lower expert index), their scores as weights, and
    :func:`capacity_keep`'s mask.
    """
    expert_index = top_k_indices(scores, top_k)
    weight = scores.gather(-1, expert_index)
    return expert_index, weight, capacity_keep(expert_index, scores.shape[-1], capacity)


def switch_aux_loss(
    probs: torch.Tensor, expert_index: torch.Tensor, n_experts: int
) -> torch.Tensor:
    """Switch Transformer's balance loss ``E · Σ_i f_i · P_i`` (see module docstring), with
    ``f`` from this call's own assignments."""
    counts = torch.bincount(expert_index.reshape(-1), minlength=n_experts)
    return balance_loss_from_counts(probs, counts, n_experts)


def balance_loss_from_counts(
    probs: torch.Tensor, counts: torch.Tensor, n_experts: int
) -> torch.Tensor:
    """``E · Σ_i f_i · P_i`` with ``f_i = counts_i / Σ counts`` taken from ``counts`` (any scope:
    this micro-batch, the global batch) and ``P_i`` the mean of this call's ``probs`` — the only
    factor with a gradient, so each rank pushes its own probabilities against the load it is
    given."""
    counts = counts.to(device=probs.device, dtype=probs.dtype)
    return n_experts * (counts / counts.sum().clamp_min(1) * probs.mean(0)).sum()


def sequence_aux_loss(
    probs: torch.Tensor,
    expert_index: torch.Tensor,
    n_experts: int,
    seq_len: int,
    shards: CountSummer | None = None,
) -> torch.Tensor:
    """DeepSeek-V3's sequence-wise balance loss (eqs. 17–20): per sequence of ``seq_len``
    tokens, ``Σ_i f_i · P_i`` with ``f_i = E/(k·T) · #{t: i in top-k(t)}`` and ``P_i`` the mean
    normalised score; averaged over sequences. 1 when every sequence is balanced.

    Under context parallelism each rank holds ``seq_len`` of every sequence's
    ``T = shards.size · seq_len`` tokens (``shards``:
    :class:`~dtlab.parallel.expert.balance.SequenceShards`): ``f`` counts the whole sequence
    (the ``(B, E)`` counts summed over the shards), ``P`` stays this rank's mean, whose average
    over equal shards is the sequence's."""
    tokens, k = expert_index.shape
    if tokens % seq_len:
        raise ValueError(f"{tokens} tokens are not whole sequences of {seq_len}")
    sequences = tokens // seq_len
    chosen = F.one_hot(expert_index.reshape(sequences, seq_len * k), n_experts).sum(1)
    whole = seq_len
    if shards is not None:
        chosen, whole = shards.sum(chosen), seq_len * shards.size
    f = chosen.to(probs.dtype) * n_experts / (k * whole)
    p = probs.view(sequences, seq_len, n_experts).mean(1)
    return (f * p).sum(1).mean()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's z-loss: ``mean_t (logsumexp_i z_ti)²``."""
    return logits.logsumexp(-1).pow(2).mean()


def route(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    top_k: int,
    *,
    score: str = "softmax",
    capacity_factor: float | None = None,
    bias: torch.Tensor | None = None,
    n_nodes: int = 1,
    node_limit: int | None = None,
) -> Routing:
    """Route the rows of ``x`` (T, d) with ``router_weight`` (E, d); see the module docstring.

    Every choice here — the nodes, then the experts, with or without the bias — goes through
    :func:`top_k_indices`: exactly equal values go to the lower index.
    """
    n_experts = router_weight.shape[0]
    dtype = torch.promote_types(x.dtype, torch.float32)  # fp32 at least: bf16 logits tie
    logits = x.to(dtype) @ router_weight.to(dtype).t()
    scores = scores_of(logits, score)
    selection = scores.detach() if bias is None else scores.detach() + bias
    if node_limit is not None:
        mask = node_limited_mask(selection, top_k, n_nodes, node_limit)
        selection = selection.masked_fill(~mask, float("-inf"))
    expert_index = top_k_indices(selection, top_k)
    weight = scores.gather(1, expert_index)
    if score == "sigmoid":
        weight = weight / weight.sum(-1, keepdim=True)
    probs = scores if score == "softmax" else scores / scores.sum(-1, keepdim=True)
    capacity = (
        None
        if capacity_factor is None
        else expert_capacity(x.shape[0], top_k, n_experts, capacity_factor)
    )
    keep = capacity_keep(expert_index, n_experts, capacity)
    return Routing(expert_index, weight.to(x.dtype), keep, probs, logits, capacity, n_experts)
