"""The GPT every lab trains: a nanoGPT-style decoder-only transformer, written out explicitly.

Shape (pre-LayerNorm, GPT-2; Radford et al. 2019)::

    idx (B, S) ──embed + pos_embed──► h (B, S, d)
    for block in blocks:                      # nn.ModuleList: FSDP / pipeline units
        h = h + attn(attn_norm(h))            # q_proj, k_proj, v_proj, out_proj
        h = h + mlp(mlp_norm(h))              # fc_in, GELU, fc_out
    logits = lm_head(final_norm(h))           # (B, S, vocab); lm_head.weight is embed.weight when tied

The model knows nothing about parallelism: DDP/ZeRO/FSDP wrap it, tensor parallelism shards the
named Linear layers (``q_proj``/``k_proj``/``v_proj``/``fc_in`` by output columns, ``out_proj``/
``fc_out`` by input rows; Shoeybi et al. 2019, Megatron-LM), pipelining cuts ``blocks``.
Attention derives its local head count from ``q_proj``'s output width, so a column-sharded
``q_proj`` simply runs fewer heads.

Initialisation is deterministic and local: every parameter's values depend only on
``(seed, its name, its shape)``, drawn from a private CPU generator. ``GPT(config, seed=0)`` is
therefore bit-identical on every rank, in every run, on every device, whatever the global RNG
state — and the global RNG is not touched.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtlab.models.config import GPTConfig

INIT_STD = 0.02


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with separate q, k, v projections."""

    def __init__(self, config: GPTConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        d, bias = config.d_model, config.bias
        self.head_dim = config.head_dim
        self.dropout = config.dropout
        self.q_proj = nn.Linear(d, d, bias=bias, device=device)
        self.k_proj = nn.Linear(d, d, bias=bias, device=device)
        self.v_proj = nn.Linear(d, d, bias=bias, device=device)
        self.out_proj = nn.Linear(d, d, bias=bias, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        heads = q.shape[-1] // self.head_dim  # fewer when q_proj is column-sharded (TP)
        q, k, v = (t.view(batch, seq, heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, H, S, S)
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))
        weights = F.softmax(scores, dim=-1)
        if self.training and self.dropout > 0:
            weights = F.dropout(weights, self.dropout)
        out = (weights @ v).transpose(1, 2).reshape(batch, seq, heads * self.head_dim)
        return _residual_dropout(self.out_proj(out), self.dropout, self.training)


class MLP(nn.Module):
    """Position-wise feed-forward: ``fc_out(GELU(fc_in(x)))``."""

    def __init__(self, config: GPTConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.dropout = config.dropout
        self.fc_in = nn.Linear(config.d_model, config.d_ff, bias=config.bias, device=device)
        self.fc_out = nn.Linear(config.d_ff, config.d_model, bias=config.bias, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(self.fc_in(x), approximate="tanh")
        return _residual_dropout(self.fc_out(hidden), self.dropout, self.training)


class Block(nn.Module):
    """One pre-LayerNorm transformer block."""

    def __init__(self, config: GPTConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(config.d_model, bias=config.bias, device=device)
        self.attn = CausalSelfAttention(config, device)
        self.mlp_norm = nn.LayerNorm(config.d_model, bias=config.bias, device=device)
        self.mlp = MLP(config, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """A decoder-only transformer sized by :class:`GPTConfig`; ``forward(idx) -> logits``."""

    def __init__(
        self,
        config: GPTConfig,
        seed: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.seed = seed
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
            self.blocks = nn.ModuleList(Block(config, target) for _ in range(config.n_layers))
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

    def embed_tokens(self, idx: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """Token plus position embeddings of ``idx`` (B, S) at positions ``start_pos …``."""
        seq = idx.shape[-1]
        if start_pos + seq > self.config.seq_len:
            raise ValueError(
                f"positions {start_pos}..{start_pos + seq - 1} exceed the model's context "
                f"(config.seq_len={self.config.seq_len}); feed shorter sequences"
            )
        positions = torch.arange(start_pos, start_pos + seq, device=idx.device)
        h = self.embed(idx) + self.pos_embed(positions)
        return _residual_dropout(h, self.config.dropout, self.training)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final LayerNorm and LM head: hidden states (B, S, d) to logits (B, S, vocab)."""
        return self.lm_head(self.final_norm(h))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(idx)
        for block in self.blocks:
            h = block(h)
        return self.lm_logits(h)

    def num_params(self) -> int:
        """Parameters in this model, each tied tensor counted once."""
        return sum(p.numel() for p in self.parameters())


def _residual_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    # Skipping the call at p == 0 keeps dropout masks out of the saved-activation accounting.
    return F.dropout(x, p) if training and p > 0 else x


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
