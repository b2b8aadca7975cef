"""DDP variants vs torch DDP, interleaved step by step: step time ratios and hidden communication.

    dtlab bench ddp [--world-size 2] [--steps 8] [--repeats 3] [--model tiny|small] [--json PATH]

Every rank builds naive, overlapped and bucketed DDP and torch's ``DistributedDataParallel`` up
front, each on its own replica of the lab GPT with its own AdamW, then trains them all in one
run: round r runs each variant's step r (same batch), in an order rotated every round
(:func:`dtlab.bench.run_interleaved`), so load drift on a shared machine slows every variant
alike. After 2 warm-up rounds, ``--repeats`` × ``--steps`` rounds are measured. A step's time is
the slowest rank's. *vs torch DDP* is, per repeat, the median over rounds of the variant's step ÷
torch DDP's step in the same round; the table shows its median over repeats (min–max). *best* is
the fastest step ÷ torch DDP's fastest, the steadier figure on a busy machine.

*Comm hidden* is measured the same way for every variant, from the run's trace: the share of
gradient-communication time (``comm`` spans, launch to completion) that lay inside backward
compute (from ``loss.backward()`` starting until the last gradient is accumulated), summed over
ranks and steps, per repeat. Naive DDP reduces after backward, so it hides 0 %. torch DDP's
reducer is C++, so it runs with a comm hook that is torch's default all-reduce hook plus the span
(one Python call per bucket). *comm ms* is the time per step with a gradient collective in
flight, per rank. Times vary run to run; the ratios are the point.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
from dataclasses import asdict, dataclass

from dtlab.bench import Spread, best_ratios_to, ratios_to, run_on_ranks, slowest_rank

VARIANTS = ("naive", "overlapped", "bucketed", "torch_ddp")
BASELINE = "torch_ddp"
WARMUP_ROUNDS = 2


def _mark():
    """Now, as a CUDA event on a GPU (device time, like the wrappers' comm spans) or host ns."""
    from dtlab import trace

    return trace.cuda_mark() or trace.now_ns()


def _record(name: str, kind: str, start, end, nbytes: int = 0) -> None:
    from dtlab import trace

    if isinstance(start, int):
        trace.record(name, kind, start, end, nbytes)
    else:
        trace.record_cuda(name, kind, start, end, nbytes)


class _BackwardSpan:
    """Records one ``backward`` compute span per step: from :meth:`start` to the moment the last
    gradient of ``model`` was accumulated (a post-accumulate-grad hook on every parameter), so
    collectives issued after backward — naive DDP's — fall outside it."""

    def __init__(self, model) -> None:
        self.started = self.last_gradient = None
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._on_gradient)

    def _on_gradient(self, _param) -> None:
        self.last_gradient = _mark()

    def start(self) -> None:
        self.started, self.last_gradient = _mark(), None

    def record(self) -> None:
        if self.last_gradient is not None:
            _record("backward", "compute", self.started, self.last_gradient)


def _traced_allreduce_hook(_state, bucket):
    """torch's default DDP comm hook (divide by N, async all-reduce, hand the bucket back) plus a
    ``comm`` span from launch to completion — what dtlab's wrappers record for theirs."""
    import torch.distributed as dist

    tensor, world = bucket.buffer(), dist.get_world_size()
    tensor.div_(world)
    sent = int(2 * (world - 1) / world * tensor.numel() * tensor.element_size())
    start = _mark()

    def done(fut):
        _record(f"bucket[{bucket.index()}]", "comm", start, _mark(), sent)
        return fut.value()[0]

    return dist.all_reduce(tensor, async_op=True).get_future().then(done)


def _measure_on_rank(model_size: str, steps: int, repeats: int) -> dict[str, list[float]]:
    import torch

    import dtlab
    from dtlab.bench import run_interleaved
    from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
    from dtlab.parallel import BucketedDDP, NaiveDDP, OverlappedDDP

    rank, world, device = dtlab.rank(), dtlab.world_size(), dtlab.device()
    config = GPTConfig.tiny() if model_size == "tiny" else GPTConfig.small()
    wrappers = {
        "naive": NaiveDDP,
        "overlapped": OverlappedDDP,
        "bucketed": BucketedDDP,
        "torch_ddp": torch.nn.parallel.DistributedDataParallel,
    }
    rounds = steps * repeats
    data = SyntheticTokens(config, n_batches=WARMUP_ROUNDS + rounds, batch_size=8 * world, seed=0)
    batches = [tuple(t.to(device) for t in shard_for_rank(b, rank, world)) for b in data]

    def build(variant: str):
        model = GPT(config, seed=0).to(device)
        backward = _BackwardSpan(model)  # first, so its hook runs before every wrapper's
        ddp = wrappers[variant](model)
        if variant == BASELINE:
            ddp.register_comm_hook(None, _traced_allreduce_hook)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(i: int) -> None:
            x, y = batches[i]
            opt.zero_grad()
            loss = loss_fn(ddp(x), y)
            backward.start()
            loss.backward()
            backward.record()
            opt.step()

        return step

    return run_interleaved({v: build(v) for v in VARIANTS}, rounds, WARMUP_ROUNDS)


def hidden_fractions(trace, steps: int, repeats: int) -> dict[str, dict]:
    """Per variant: ``comm`` time inside ``backward`` spans ÷ all ``comm`` time, per repeat (as a
    :class:`Spread`), and the mean communication seconds per rank per step.

    Every ``comm`` and ``backward`` span belongs to the ``bench_step`` window it starts in, on
    its rank; warm-up and start-up spans (the initial broadcast) lie in no window and are dropped.
    """
    from dtlab.trace.analysis import length_of, overlap_of, union_of

    comm: dict[tuple, list] = {}
    compute: dict[tuple, list] = {}
    for rank, spans in trace.by_rank().items():
        windows = [s for s in spans if s.name == "bench_step"]  # start-ordered, disjoint
        starts = [w.start_ns for w in windows]
        for s in spans:
            if s.kind != "comm" and s.name != "backward":
                continue
            i = bisect.bisect_right(starts, s.start_ns) - 1
            if i < 0 or s.start_ns >= windows[i].end_ns:
                continue
            key = (windows[i].labels["variant"], windows[i].labels["round"], rank)
            (comm if s.kind == "comm" else compute).setdefault(key, []).append(s)
    hidden: dict[tuple, int] = {}
    total: dict[tuple, int] = {}
    for key, spans in comm.items():
        variant, round_index, _ = key
        in_flight = union_of(spans)
        repeat = (variant, min(round_index // steps, repeats - 1))
        hidden[repeat] = hidden.get(repeat, 0) + overlap_of(
            in_flight, union_of(compute.get(key, []))
        )
        total[repeat] = total.get(repeat, 0) + length_of(in_flight)
    n_ranks = max(len(trace.ranks), 1)
    out = {}
    for variant in VARIANTS:
        per_repeat = [
            hidden.get((variant, r), 0) / total[(variant, r)]
            for r in range(repeats)
            if total.get((variant, r))
        ]
        comm_ns = sum(total.get((variant, r), 0) for r in range(repeats))
        out[variant] = {
            "hidden": Spread.of(per_repeat) if per_repeat else None,
            "comm_s_per_step": comm_ns / 1e9 / (n_ranks * steps * repeats),
        }
    return out


@dataclass
class VariantResult:
    """One variant: median step (slowest rank), its ratio to torch DDP, hidden communication."""

    variant: str
    step_s: float
    vs_torch_ddp: Spread
    best_vs_torch_ddp: float
    comm_s_per_step: float
    comm_hidden: Spread | None
    step_s_per_round: list[float]


def run(
    cluster=None,
    world_size: int = 2,
    model_size: str = "tiny",
    steps: int = 8,
    repeats: int = 3,
) -> list[VariantResult]:
    """Measure every variant on ``cluster`` (or a fresh one of ``world_size`` ranks)."""
    out = run_on_ranks(
        cluster, world_size, steps, repeats, _measure_on_rank, model_size, steps, repeats
    )
    seconds = slowest_rank(list(out))
    ratios, best = ratios_to(seconds, BASELINE, repeats), best_ratios_to(seconds, BASELINE)
    hidden = hidden_fractions(out.trace, steps, repeats)
    return [
        VariantResult(
            variant,
            statistics.median(seconds[variant]),
            ratios[variant],
            best[variant],
            hidden[variant]["comm_s_per_step"],
            hidden[variant]["hidden"],
            seconds[variant],
        )
        for variant in VARIANTS
    ]


def _spread_text(spread: Spread | None, fmt: str) -> str:
    if spread is None:
        return "n/a"
    return f"{spread.median:{fmt}} ({spread.low:{fmt}}–{spread.high:{fmt}})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dtlab bench ddp", description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="measured rounds per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="ratios: median and min–max")
    parser.add_argument("--model", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    results = run(None, args.world_size, args.model, args.steps, args.repeats)
    print(
        f"DDP on GPT-{args.model}, {args.world_size} ranks: {args.repeats} repeats × "
        f"{args.steps} steps per variant, interleaved step by step"
    )
    print("vs torch DDP, hidden: median over repeats (min–max); best: fastest step ÷ fastest")
    print(
        f"{'variant':<11}{'step ms':>8}  {'vs torch DDP':<18}{'best':>6}"
        f"{'comm ms':>9}  {'comm hidden':<15}"
    )
    for r in results:
        print(
            f"{r.variant:<11}{r.step_s * 1e3:>8.1f}  {_spread_text(r.vs_torch_ddp, '.2f'):<18}"
            f"{r.best_vs_torch_ddp:>6.2f}{r.comm_s_per_step * 1e3:>9.1f}  "
            f"{_spread_text(r.comm_hidden, '.0%'):<15}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    return 0
