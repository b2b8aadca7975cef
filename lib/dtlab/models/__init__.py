"""The one small GPT every lab trains, its config, and deterministic synthetic data."""

from dtlab.models.config import GPTConfig
from dtlab.models.data import SyntheticTokens, loss_fn, shard_for_rank
from dtlab.models.gpt import GPT, MLP, Block, CausalSelfAttention

__all__ = [
    "GPTConfig",
    "GPT",
    "Block",
    "CausalSelfAttention",
    "MLP",
    "SyntheticTokens",
    "shard_for_rank",
    "loss_fn",
]
