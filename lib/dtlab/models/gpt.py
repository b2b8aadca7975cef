"""The GPT every lab trains: a nanoGPT-style decoder-only transformer, written out explicitly.

Shape (pre-LayerNorm, GPT-2; Radford et al. 2019)::

    idx (B, S) ──embed + pos_embed(positions)──► h (B, S, d)
    for block in blocks:                      # nn.ModuleList: FSDP / pipeline units
        h = h + attn(attn_norm(h), positions) # q_proj, k_proj, v_proj, core, out_proj
        h = h + mlp(mlp_norm(h))              # fc_in, GELU, fc_out (or any MLPFactory's module)
    logits = lm_head(final_norm(h))           # (B, S, vocab); lm_head.weight is embed.weight when tied

The model knows nothing about parallelism; every family is applied from outside:

* data parallelism (DDP/ZeRO/FSDP) wraps it or its ``blocks``;
* tensor parallelism shards the named Linear layers (``q_proj``/``k_proj``/``v_proj``/``fc_in``
  by output columns, ``out_proj``/``fc_out`` by input rows; Shoeybi et al. 2019, Megatron-LM);
  attention reads its local head counts from the projections' widths;
* context parallelism replaces each ``block.attn.core`` (:mod:`dtlab.models.attention`) and feeds
  the global ``positions`` of this rank's tokens to ``forward``;
* pipelining cuts ``blocks`` into stages (:func:`dtlab.models.split_into_stages`);
* expert parallelism builds MoE MLPs through ``mlp_factory`` (:mod:`dtlab.models.mlp`).

Auxiliary losses: after each forward, ``model.aux_loss`` is the sum of the aux losses the blocks'
MLPs returned (a 0-dim zero when none did — add it to the loss unconditionally). It keeps the
autograd graph alive until the next forward.

Initialisation is deterministic and local: every parameter's values depend only on
``(seed, its name, its shape)``, drawn from a private CPU generator. ``GPT(config, seed=0)`` is
therefore bit-identical on every rank, in every run, on every device, whatever the global RNG
state — and the global RNG is not touched.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

import torch
import torch.nn as nn

from dtlab.models.attention import AttentionCore, CausalSelfAttention
from dtlab.models.config import GPTConfig
from dtlab.models.dropout import residual_dropout
from dtlab.models.mlp import MLP, MLPFactory, default_mlp

__all__ = ["GPT", "Block", "CausalSelfAttention", "MLP", "INIT_STD"]

INIT_STD = 0.02


class Block(nn.Module):
    """One pre-LayerNorm transformer block; ``forward(x, positions=None) -> x``.

    ``mlp`` (default a dense :class:`MLP`) may return ``(out, aux_loss)``; the aux loss of the
    latest forward is kept in ``self.aux_loss`` (``None`` when the MLP returned a plain tensor).
    """

    def __init__(
        self,
        config: GPTConfig,
        device: torch.device | str | None = None,
        *,
        mlp: nn.Module | None = None,
        attention_core: AttentionCore | None = None,
    ) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(config.d_model, bias=config.bias, device=device)
        self.attn = CausalSelfAttention(config, device, core=attention_core)
        self.mlp_norm = nn.LayerNorm(config.d_model, bias=config.bias, device=device)
        self.mlp = MLP(config, device) if mlp is None else mlp
        self.aux_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), positions)
        out = self.mlp(self.mlp_norm(x))
        out, self.aux_loss = out if isinstance(out, tuple) else (out, None)
        return x + out


class TokenEnds:
    """The two ends of the network, shared by :class:`GPT` and a pipeline stage that holds them:
    ``embed_tokens`` needs ``embed``/``pos_embed``, ``lm_logits`` needs ``final_norm``/``lm_head``."""

    config: GPTConfig

    def embed_tokens(
        self, idx: torch.Tensor, start_pos: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Token plus position embeddings of ``idx`` (B, S): at ``positions`` (S,) or (B, S) when
        given, else at ``start_pos, start_pos + 1, …``."""
        if positions is None:
            positions = default_positions(idx.shape[-1], self.config, idx.device, start_pos)
        else:
            check_positions(positions, idx.shape[-1], self.config)
        h = self.embed(idx) + self.pos_embed(positions)
        return residual_dropout(h, self.config.dropout, self.training)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final LayerNorm and LM head: hidden states (B, S, d) to logits (B, S, vocab)."""
        return self.lm_head(self.final_norm(h))


class GPT(TokenEnds, nn.Module):
    """A decoder-only transformer sized by :class:`GPTConfig`.

    ``forward(idx, positions=None) -> logits``. ``mlp_factory(config, layer, device)`` builds each
    block's MLP (default: dense :class:`MLP`); ``attention_core`` replaces every block's
    attention core (default: :func:`~dtlab.models.attention.math_attention`).
    """

    def __init__(
        self,
        config: GPTConfig,
        seed: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        mlp_factory: MLPFactory | None = None,
        attention_core: AttentionCore | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.seed = seed
        self.aux_loss: torch.Tensor | None = None
        factory = default_mlp if mlp_factory is None else mlp_factory
        # torch's layers initialise themselves from the global RNG. Construction runs inside
        # fork_rng, which restores the caller's random state afterwards, and every value is then
        # overwritten from our own generator: the model depends on (seed, names, shapes) only.
        # (Building on the meta device would avoid the throw-away init, but meta kernels import
        # torch._dynamo on first use: over a second in every fresh rank process.)
        target = torch.device(device) if device is not None else torch.device("cpu")
        forked = [target.index or 0] if target.type == "cuda" else []
        d = config.d_model
        with torch.random.fork_rng(devices=forked):
            self.embed = nn.Embedding(config.vocab_size, d, device=target)
            self.pos_embed = nn.Embedding(config.seq_len, d, device=target)
            self.blocks = nn.ModuleList(
                Block(
                    config,
                    target,
                    mlp=factory(config, layer, target),
                    attention_core=attention_core,
                )
                for layer in range(config.n_layers)
            )
            self.final_norm = nn.LayerNorm(d, bias=config.bias, device=target)
            self.lm_head = nn.Linear(d, config.vocab_size, bias=False, device=target)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters(seed)
        if dtype is not None:
            self.to(dtype)

    @torch.no_grad()
    def reset_parameters(self, seed: int | None = None) -> None:
        """(Re)initialise every parameter from ``seed`` (GPT-2 scheme, deterministic per name).

        Weights ~ N(0, 0.02²); the two residual-branch outputs (``out_proj``, ``fc_out``) use
        ``0.02 / sqrt(2·n_layers)`` so the residual stream's variance does not grow with depth
        (Radford et al. 2019); biases 0; LayerNorm scales 1.
        """
        seed = self.seed if seed is None else seed
        for name, param in self.named_parameters():
            param.copy_(_initial_value(name, tuple(param.shape), seed, self.config.n_layers))

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, S, vocab) of ``idx`` (B, S) at ``positions`` (default ``0..S-1``); also sets
        ``self.aux_loss``."""
        if positions is None:
            positions = default_positions(idx.shape[-1], self.config, idx.device)
        h = self.embed_tokens(idx, positions=positions)
        for block in self.blocks:
            h = block(h, positions)
        self.aux_loss = sum_aux_losses(self.blocks, h)
        return self.lm_logits(h)

    def num_params(self) -> int:
        """Parameters in this model, each tied tensor counted once."""
        return sum(p.numel() for p in self.parameters())


def default_positions(
    seq: int, config: GPTConfig, device: torch.device, start: int = 0
) -> torch.Tensor:
    """``start, …, start + seq - 1``, refused past the model's context."""
    if start + seq > config.seq_len:
        raise ValueError(
            f"positions {start}..{start + seq - 1} exceed the model's context "
            f"(config.seq_len={config.seq_len}); feed shorter sequences"
        )
    return torch.arange(start, start + seq, device=device)


def check_positions(positions: torch.Tensor, seq: int, config: GPTConfig) -> None:
    """Refuse ``positions`` that do not give one position to each of ``seq`` tokens, or (checked
    on CPU only, where it costs no device sync) fall outside ``0 … seq_len - 1``."""
    if positions.dtype != torch.long or positions.shape[-1] != seq or positions.dim() > 2:
        raise ValueError(
            f"positions must be int64 of shape ({seq},) or (batch, {seq}) — one per token — "
            f"got {positions.dtype} {tuple(positions.shape)}"
        )
    if positions.device.type == "cpu" and positions.numel():
        low, high = int(positions.min()), int(positions.max())
        if low < 0 or high >= config.seq_len:
            raise ValueError(
                f"positions {low}..{high} exceed the model's context "
                f"(config.seq_len={config.seq_len}); feed positions in 0..{config.seq_len - 1}"
            )


def sum_aux_losses(blocks: Iterable[nn.Module], like: torch.Tensor) -> torch.Tensor:
    """Sum of the blocks' latest aux losses; a 0-dim zero shaped like ``like`` when none has one."""
    losses = [b.aux_loss for b in blocks if getattr(b, "aux_loss", None) is not None]
    if not losses:
        return like.new_zeros(())
    total = losses[0]
    for loss in losses[1:]:
        total = total + loss
    return total


def _initial_value(name: str, shape: tuple[int, ...], seed: int, n_layers: int) -> torch.Tensor:
    """The fp32 CPU initial value of parameter ``name``: a function of (seed, name, shape) only."""
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name:
        return torch.ones(shape) if leaf == "weight" else torch.zeros(shape)
    if leaf == "bias":
        return torch.zeros(shape)
    std = INIT_STD
    if name.endswith(("out_proj.weight", "fc_out.weight")):
        std = INIT_STD / math.sqrt(2 * n_layers)
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
    return torch.empty(shape).normal_(0.0, std, generator=generator)
