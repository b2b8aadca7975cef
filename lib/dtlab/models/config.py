"""The one knob that sizes every lab's model: :class:`GPTConfig`.

Presets:

* :meth:`GPTConfig.tiny` — a CPU training step in milliseconds (fast mode, CI, tests).
* :meth:`GPTConfig.small` — a few million parameters: CPU in seconds, a GPU barely notices.
* :meth:`GPTConfig.gpt2_124m` — GPT-2 small (Radford et al. 2019), the real-size model for GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass


def _divisors(n: int) -> list[int]:
    # The model's own shape rules name their choices with this; the layout rules (does a mesh fit
    # this model?) live in dtlab.mesh.layout_rules, which the model does not import.
    return [k for k in range(1, n + 1) if n % k == 0]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a nanoGPT-style decoder-only transformer.

    Attributes:
        vocab_size: number of token ids.
        seq_len: context length (also the number of learned positions).
        d_model: residual stream width.
        n_layers: transformer blocks.
        n_heads: attention (query) heads; must divide ``d_model``.
        d_ff: MLP hidden width; ``None`` means ``4 · d_model``. It is resolved when the config is
            built, so ``dataclasses.replace(cfg, d_model=...)`` keeps the old width — pass
            ``d_ff=None`` alongside to re-derive it.
        dropout: dropout probability on embeddings, attention weights and residual branches.
        tie_embeddings: share the token-embedding matrix with the LM head (GPT-2 does).
        bias: biases in the Linear layers and LayerNorms.
        n_kv_heads: key/value heads for grouped-query attention (Ainslie et al. 2023); must
            divide ``n_heads``. ``None`` means ``n_heads`` (ordinary multi-head attention); like
            ``d_ff`` it is resolved when the config is built, so ``dataclasses.replace(cfg,
            n_heads=...)`` keeps the old count — pass ``n_kv_heads=None`` alongside to re-derive.
    """

    vocab_size: int = 128
    seq_len: int = 32
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int | None = None
    dropout: float = 0.0
    tie_embeddings: bool = True
    bias: bool = True
    n_kv_heads: int | None = None  # last, so positional construction keeps its meaning

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "n_layers", "n_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}; "
                f"choose n_heads from {_divisors(self.d_model)} (or change d_model)"
            )
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        elif not isinstance(self.n_kv_heads, int) or self.n_kv_heads < 1:
            raise ValueError(
                f"GPTConfig.n_kv_heads must be a positive integer or None, got {self.n_kv_heads!r}"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}: each "
                f"kv head serves a whole group of query heads; choose n_kv_heads from "
                f"{_divisors(self.n_heads)} (after dataclasses.replace(..., n_heads=...), pass "
                "n_kv_heads=None to get n_heads again)"
            )
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        elif not isinstance(self.d_ff, int) or self.d_ff < 1:
            raise ValueError(
                f"GPTConfig.d_ff must be a positive integer or None, got {self.d_ff!r}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout {self.dropout} must be in [0, 1)")

    @property
    def head_dim(self) -> int:
        """Width of one attention head: ``d_model // n_heads``."""
        return self.d_model // self.n_heads

    @property
    def kv_width(self) -> int:
        """Output width of ``k_proj`` and ``v_proj``: ``n_kv_heads · head_dim``."""
        return self.n_kv_heads * self.head_dim

    def num_params(self) -> int:
        """Exact parameter count of ``GPT(self)`` with dense MLPs (tied weights counted once)."""
        from dtlab.cost.flops import gpt_param_count

        return gpt_param_count(
            n_layers=self.n_layers,
            d_model=self.d_model,
            vocab_size=self.vocab_size,
            seq_len=self.seq_len,
            d_ff=self.d_ff,
            tie_embeddings=self.tie_embeddings,
            bias=self.bias,
            kv_width=self.kv_width,
        )

    @classmethod
    def tiny(cls, **overrides) -> GPTConfig:
        """vocab 128, seq 32, d 64, 2 layers, 4 heads (~0.1M params): milliseconds per CPU step."""
        return cls(
            **{**dict(vocab_size=128, seq_len=32, d_model=64, n_layers=2, n_heads=4), **overrides}
        )

    @classmethod
    def small(cls, **overrides) -> GPTConfig:
        """vocab 1024, seq 128, d 256, 4 layers, 8 heads (~3.5M params)."""
        base = dict(vocab_size=1024, seq_len=128, d_model=256, n_layers=4, n_heads=8)
        return cls(**{**base, **overrides})

    @classmethod
    def gpt2_124m(cls, **overrides) -> GPTConfig:
        """GPT-2 small: vocab 50257, seq 1024, d 768, 12 layers, 12 heads (124,439,808 params)."""
        base = dict(vocab_size=50257, seq_len=1024, d_model=768, n_layers=12, n_heads=12)
        return cls(**{**base, **overrides})
