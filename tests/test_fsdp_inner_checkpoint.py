"""A block that checkpoints its own body trains under our FSDP/ZeRO-3 exactly as under ``fully_shard``.

The Hugging Face style of activation checkpointing calls ``torch.utils.checkpoint`` *inside*
``Block.forward`` on the block's body (``use_reentrant=False``). Backward then re-runs the body
without passing through the block's forward hooks, so the body reads whatever the block's
modules hold at that moment: FSDP must have put the gathered parameters back there (FSDP2's
pre-backward hook unshards and registers them). These tests train such a block on 2 ranks under
our FSDP, our ZeRO-3 (``shard_by_zero_stage(..., 3)``), ``compose_gpt(data_parallel="fsdp")`` and
torch's ``fully_shard``, and count the bytes the recompute costs: none beyond the backward
all-gather every unit already pays.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import dtlab
from dtlab.parallel.data.equivalence import FP32_STEP_TOLERANCE, max_abs_difference

STEPS = 3
DIM = 8


class _SelfCheckpointingBlock(nn.Module):
    """``x + body(x)`` with the body under non-reentrant checkpointing, called from ``forward``.

    ``recompute="torch"`` uses ``torch.utils.checkpoint``, ``"dtlab"`` dtlab's own
    :func:`~dtlab.parallel.activations.recomputation.recompute`, ``"none"`` runs the body plainly.
    """

    def __init__(self, recompute: str) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)
        self.recompute = recompute

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(self.norm(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute == "torch":
            return x + checkpoint(self._body, x, use_reentrant=False)
        if self.recompute == "dtlab":
            from dtlab.parallel.activations.recomputation import recompute

            return x + recompute(self._body, x)
        return x + self._body(x)


class _Net(nn.Module):
    """An input layer, two self-checkpointing blocks, a head: 700 parameters, all even counts."""

    def __init__(self, recompute: str = "torch", seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(DIM, DIM)
        self.blocks = nn.ModuleList(_SelfCheckpointingBlock(recompute) for _ in range(2))
        self.head = nn.Linear(DIM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(7)
    return [(torch.randn(8, DIM), torch.randn(8, 4)) for _ in range(STEPS)]


def _train(forward, params, batches, rank: int, world: int) -> list[float]:
    """SGD with momentum (a missing 1/N average shows, see :mod:`dtlab.parallel.data.equivalence`);
    returns the global mean loss of every step."""
    import torch.distributed as dist

    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches:
        rows = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
        opt.zero_grad()
        loss = F.mse_loss(forward(x[rows]), y[rows])
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        if world > 1:
            dist.all_reduce(total)
        losses.append(total.item() / world)
    return losses


def _self_checkpointing_block_everywhere(recompute: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from dtlab.parallel import FullyShardedDataParallel, shard_by_zero_stage
    from dtlab.parallel.zero.full_state import gather_full_parameters

    rank, world = dtlab.rank(), dtlab.world_size()
    batches = _batches()
    reference = _Net(recompute)
    ref_losses = _train(reference, reference.parameters(), batches, 0, 1)
    ref = {n: p.detach() for n, p in reference.named_parameters()}

    ours = _Net(recompute)
    fsdp = FullyShardedDataParallel(ours, units=list(ours.blocks))
    fsdp_losses = _train(fsdp, fsdp.parameters(), batches, rank, world)

    zero3 = _Net(recompute)
    setup = shard_by_zero_stage(zero3, 3, torch.optim.SGD, units=list(zero3.blocks), lr=0.1)
    zero3_losses = _train(setup.forward, setup.forward.parameters(), batches, rank, world)

    theirs = _Net(recompute)
    mesh = init_device_mesh("cpu", (world,))
    for block in theirs.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(theirs, mesh=mesh)
    their_losses = _train(theirs, theirs.parameters(), batches, rank, world)
    their_full = {n: p.full_tensor().detach() for n, p in theirs.named_parameters()}

    def loss_gap(losses):
        return max(abs(a - b) for a, b in zip(losses, their_losses, strict=True))

    return {
        "fsdp_vs_fully_shard": max_abs_difference(gather_full_parameters(fsdp), their_full),
        "zero3_vs_fully_shard": max_abs_difference(
            gather_full_parameters(setup.forward), their_full
        ),
        "fully_shard_vs_single": max_abs_difference(their_full, ref),
        "fsdp_loss_gap": loss_gap(fsdp_losses),
        "zero3_loss_gap": loss_gap(zero3_losses),
        "single_loss_gap": loss_gap(ref_losses),
        "blocks_hold_shards_after_step": all(
            p.dim() == 1 for block in ours.blocks for p in block.parameters()
        ),
    }


def _assert_parity(result: dict) -> None:
    assert result.pop("blocks_hold_shards_after_step"), result
    for name, gap in result.items():
        assert gap < FP32_STEP_TOLERANCE, (name, result)


def test_fsdp_and_zero3_train_a_block_that_checkpoints_its_body_like_fully_shard(cluster2):
    for result in cluster2.run(_self_checkpointing_block_everywhere, "torch"):
        _assert_parity(result)


def test_fsdp_and_zero3_train_a_block_that_recomputes_its_body_with_dtlab_recompute(cluster2):
    for result in cluster2.run(_self_checkpointing_block_everywhere, "dtlab"):
        _assert_parity(result)


def _bytes_with_and_without_recompute() -> dict:
    from dtlab.parallel import FullyShardedDataParallel

    rank, world = dtlab.rank(), dtlab.world_size()
    sent = {}
    for recompute in ("none", "torch"):
        model = _Net(recompute)
        fsdp = FullyShardedDataParallel(model, units=list(model.blocks), collectives="dtlab")
        _train(fsdp, fsdp.parameters(), _batches()[:1], rank, world)
        sent[recompute] = fsdp.comm_stats.bytes_sent
    psi = sum(p.numel() for p in _Net().parameters())
    return {**sent, "formula": 3 * (world - 1) / world * psi * 4}


def test_recomputing_a_body_inside_a_unit_costs_no_extra_all_gather(cluster2):
    """3·(N-1)/N·Ψ·4 bytes per step with or without the inner checkpoint: the recompute runs
    inside the backward all-gather every unit pays anyway (``fully_shard`` gathers as often)."""
    for result in cluster2.run(_bytes_with_and_without_recompute):
        assert result["none"] == result["torch"] == result["formula"], result


def _checkpoint_own_body(block: nn.Module) -> None:
    """Make the lab GPT's ``block`` call ``checkpoint`` on its own forward from inside it."""
    body = block.forward
    block.forward = lambda *args, **kwargs: checkpoint(body, *args, use_reentrant=False, **kwargs)


def _composed_fsdp_vs_fully_shard() -> dict:
    from torch.distributed.fsdp import fully_shard

    from dtlab.mesh import Mesh
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
    from dtlab.parallel.compose import compose_gpt

    config = GPTConfig.tiny(seq_len=8, d_model=32, vocab_size=64, dropout=0.0)
    tokens, targets = SyntheticTokens(config, n_batches=1, batch_size=4, seed=3)[0]
    mesh = Mesh(dp=2)

    model = GPT(config, seed=0, dtype=torch.float64)
    for block in model.blocks:
        _checkpoint_own_body(block)
    ours = compose_gpt(model, mesh, data_parallel="fsdp")
    our_loss = ours.train_step(tokens, targets)
    our_grads = ours.local_full_gradients()

    theirs = GPT(config, seed=0, dtype=torch.float64)
    for block in theirs.blocks:
        _checkpoint_own_body(block)
        fully_shard(block, mesh=mesh.device_mesh["dp"])
    fully_shard(theirs, mesh=mesh.device_mesh["dp"])
    rows = slice(mesh.dp_rank * 2, mesh.dp_rank * 2 + 2)
    their_loss = loss_fn(theirs(tokens[rows]), targets[rows])
    their_loss.backward()
    total = their_loss.detach().clone()
    torch.distributed.all_reduce(total, group=mesh.dp_group)
    their_grads = {n: p.grad.full_tensor() for n, p in theirs.named_parameters()}
    return {
        "loss": abs(our_loss - total.item() / 2),
        "grads": max((our_grads[n] - g).abs().max().item() for n, g in their_grads.items()),
        "same_names": sorted(our_grads) == sorted(their_grads),
    }


def test_composed_fsdp_trains_gpt_blocks_that_checkpoint_themselves_like_fully_shard(cluster2):
    for result in cluster2.run(_composed_fsdp_vs_fully_shard):
        assert result["same_names"], result
        assert result["loss"] < 1e-10 and result["grads"] < 1e-10, result
