"""The one small GPT every lab trains, its config, deterministic synthetic data, and the hooks
parallelism uses from outside: attention cores, MLP factories, pipeline stages.

The model knows nothing about parallelism (no module here imports :mod:`dtlab.parallel`,
:mod:`dtlab.mesh` or :mod:`dtlab.plan`): whether a layout fits it is
:mod:`dtlab.mesh.layout_rules`' question."""

from dtlab.models.attention import (
    AttentionCore,
    CausalSelfAttention,
    future_mask,
    math_attention,
    repeat_kv,
)
from dtlab.models.config import GPTConfig
from dtlab.models.data import SyntheticTokens, loss_fn, shard_for_rank
from dtlab.models.gpt import GPT, Block
from dtlab.models.mlp import MLP, MLPFactory, default_mlp
from dtlab.models.pipeline_stages import PipelineStage, balanced_stage_layers, split_into_stages

__all__ = [
    "GPTConfig",
    "GPT",
    "Block",
    "CausalSelfAttention",
    "MLP",
    "SyntheticTokens",
    "shard_for_rank",
    "loss_fn",
    "AttentionCore",
    "math_attention",
    "repeat_kv",
    "future_mask",
    "MLPFactory",
    "default_mlp",
    "PipelineStage",
    "split_into_stages",
    "balanced_stage_layers",
]
