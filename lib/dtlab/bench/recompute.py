"""Recomputation's price: measured time overhead against the counted FLOP overhead, in one run.

    dtlab bench recompute [--world-size 1] [--model small] [--seq 256] [--batch 4]
                          [--steps 4] [--repeats 3] [--json PATH]

Every rank trains the same lab GPT (dropout 0.1, fp32) on its own; round r runs one training
step (forward + backward) of each variant in rotated order (:func:`dtlab.bench.run_interleaved`):

* ``plain`` — no recomputation (the baseline);
* ``selective`` — ours, the attention core re-run in backward (Korthikanti et al. 2022);
* ``full`` — ours, every block re-run in backward;
* ``torch_full`` — ``torch.utils.checkpoint`` (non-reentrant) around every block;
* ``torch_sac`` — torch's op-level selective checkpointing, saving matmul outputs (torch ≥ 2.4).

Reported from this one run, per variant: the step-time ratio to ``plain`` (median over repeats,
min–max, and best), the FLOP ratio counted by ``torch.utils.flop_counter.FlopCounterMode`` over
one step (the prediction: ≈ 4/3 for full recomputation of a dense block, the extra forward; a
few percent for selective), the bytes saved for backward (ActivationMeter) and the peak bytes
(:func:`~dtlab.memory.peak.peak_bytes_of`), each ÷ ``plain``'s. ``torch_sac``'s saved bytes
are not reported: it keeps matmul outputs in checkpoint's own cache, which the hooks do not see.

Times vary run to run; the ratios are the point.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

from dtlab.bench import Spread, best_ratios_to, ratios_to, run_on_ranks, slowest_rank

VARIANTS = ("plain", "selective", "full", "torch_full", "torch_sac")
BASELINE = "plain"


def _step_fn(model, variant: str):
    import torch
    import torch.utils.checkpoint as ckpt

    from dtlab.models import loss_fn
    from dtlab.parallel.activations.op_level_checkpointing import checkpoint_saving_matmuls
    from dtlab.parallel.activations.recomputation import (
        Recomputed,
        plain_attention_core,
        recompute_attention_core,
    )

    def blocks_with(run, **kwargs):
        def forward(tokens):
            h, positions = model.embed_tokens(tokens), torch.arange(tokens.shape[1])
            for block in model.blocks:
                h = run(block, h, positions, **kwargs)
            return model.lm_logits(h)

        return forward

    forward = {
        "plain": model,
        "selective": model,
        "full": Recomputed(model),
        "torch_full": blocks_with(ckpt.checkpoint, use_reentrant=False),
        "torch_sac": blocks_with(checkpoint_saving_matmuls),
    }[variant]

    def step(tokens, targets, measure=None):
        (recompute_attention_core if variant == "selective" else plain_attention_core)(model)
        model.zero_grad(set_to_none=True)
        if measure is None:
            loss = loss_fn(forward(tokens), targets)
        else:
            with measure:
                loss = loss_fn(forward(tokens), targets)
        loss.backward()

    return step


def _measure_on_rank(model_size: str, seq: int, batch: int, steps: int, repeats: int) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    from dtlab.bench import run_interleaved
    from dtlab.memory.activations import ActivationMeter
    from dtlab.memory.peak import peak_bytes_of
    from dtlab.models import GPT, GPTConfig, SyntheticTokens
    from dtlab.parallel.activations.op_level_checkpointing import has_op_level_sac

    base = GPTConfig.small() if model_size == "small" else GPTConfig.tiny()
    config = GPTConfig(
        vocab_size=base.vocab_size, seq_len=seq, d_model=base.d_model,
        n_layers=base.n_layers, n_heads=base.n_heads, dropout=0.1,
    )  # fmt: skip
    model = GPT(config, seed=0)
    model.train()
    tokens, targets = next(iter(SyntheticTokens(config, n_batches=1, batch_size=batch, seed=0)))
    variants = [v for v in VARIANTS if v != "torch_sac" or has_op_level_sac()]
    steps_by_variant = {v: _step_fn(model, v) for v in variants}
    seconds = run_interleaved(
        {v: (lambda i, f=f: f(tokens, targets)) for v, f in steps_by_variant.items()},
        rounds=steps * repeats,
    )
    flops, saved, peak = {}, {}, {}
    for v, step in steps_by_variant.items():
        counter = FlopCounterMode(display=False)
        with counter:
            step(tokens, targets)
        flops[v] = counter.get_total_flops()
        meter = ActivationMeter(model)
        step(tokens, targets, measure=meter)
        # torch_sac keeps its matmul outputs in checkpoint's own cache, out of the hooks' sight:
        # its saved-for-backward figure would be an undercount, so only its peak is reported.
        saved[v] = None if v == "torch_sac" else meter.total_bytes
        peak[v] = peak_bytes_of(lambda s=step: s(tokens, targets)).peak_bytes
    return {"seconds": seconds, "flops": flops, "saved": saved, "peak": peak}


@dataclass
class RecomputeBench:
    """One run's ratios to ``plain`` per variant (see the module docstring)."""

    world_size: int
    seq: int
    batch: int
    step_s: dict[str, float]
    time_vs_plain: dict[str, Spread]
    best_vs_plain: dict[str, float]
    flops_vs_plain: dict[str, float]
    saved_vs_plain: dict[str, float | None]
    peak_vs_plain: dict[str, float]


def run(
    cluster=None,
    world_size: int = 1,
    model_size: str = "small",
    seq: int = 256,
    batch: int = 4,
    steps: int = 4,
    repeats: int = 3,
) -> RecomputeBench:
    """Measure on ``cluster`` (or a fresh ``Cluster(world_size)``); ratios from one run."""
    import statistics

    per_rank = run_on_ranks(
        cluster, world_size, steps, repeats, _measure_on_rank, model_size, seq, batch, steps,
        repeats,
    )  # fmt: skip
    seconds = slowest_rank([r["seconds"] for r in per_rank])
    first = per_rank[0]

    def vs_plain(values: dict) -> dict[str, float | None]:
        return {v: None if x is None else x / values[BASELINE] for v, x in values.items()}

    return RecomputeBench(
        world_size=len(per_rank),
        seq=seq,
        batch=batch,
        step_s={v: statistics.median(s) for v, s in seconds.items()},
        time_vs_plain=ratios_to(seconds, BASELINE, repeats),
        best_vs_plain=best_ratios_to(seconds, BASELINE),
        flops_vs_plain=vs_plain(first["flops"]),
        saved_vs_plain=vs_plain(first["saved"]),
        peak_vs_plain=vs_plain(first["peak"]),
    )


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="dtlab bench recompute", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--world-size", type=int, default=1, help="ranks, each its own model")
    parser.add_argument("--model", choices=("tiny", "small"), default="small")
    parser.add_argument("--seq", type=int, default=256, help="sequence length")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="measured rounds per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="ratios: median and min–max")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    r = run(None, args.world_size, args.model, args.seq, args.batch, args.steps, args.repeats)
    print(
        f"GPT {args.model} fwd+bwd, seq={r.seq}, batch={r.batch}, dropout 0.1, "
        f"{r.world_size} rank(s): {args.repeats} repeats × {args.steps} rounds, interleaved"
    )
    print("ratios to plain: time median (min–max), best; FLOPs counted; saved and peak bytes")
    print(
        f"{'variant':<12}{'step ms':>8}  {'time':<18}{'best':>6}{'FLOPs':>7}{'saved':>7}{'peak':>7}"
    )
    for v, s in r.time_vs_plain.items():
        ratio = f"{s.median:.2f} ({s.low:.2f}–{s.high:.2f})"
        print(
            f"{v:<12}{r.step_s[v] * 1e3:>8.1f}  {ratio:<18}{r.best_vs_plain[v]:>6.2f}"
            f"{r.flops_vs_plain[v]:>7.2f}{_ratio(r.saved_vs_plain[v]):>7}{r.peak_vs_plain[v]:>7.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(asdict(r), f, indent=1)
    return 0
