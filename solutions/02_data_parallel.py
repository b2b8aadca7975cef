# %% [markdown]
# # Lab 02 — Data parallelism
#
# Data parallelism is the first thing every large training job does: keep a full copy of the
# model on every rank, give each rank a different slice of the batch, and **average the gradients**
# before the optimizer step, so every replica takes the same step and the replicas never drift
# apart. The idea fits in a sentence; the engineering is in *when* the gradients move.
#
# What you will see:
#
# 1. one DDP step taken apart: equal start, different gradients, one average, equal step;
# 2. naive vs overlapped vs bucketed DDP on the timeline — communication hiding behind backward;
# 3. you write the heart of bucketed DDP: one bucket's asynchronous all-reduce;
# 4. a bucket-size sweep: too small pays latency, too big cannot overlap;
# 5. gradient accumulation with and without `no_sync` — bytes and time;
# 6. global batch, learning-rate scaling and warm-up;
# 7. a straggler slowing everyone, and asynchronous SGD trading waiting for staleness;
# 8. the crossover: how many tokens per GPU it takes for the all-reduce to hide behind backward;
# 9. loss normalisation when ranks hold different numbers of tokens: the global count.

# %%
import statistics
import time
from contextlib import nullcontext

import plotly.graph_objects as go
import torch

import dtlab
import dtlab.viz
from dtlab import trace
from dtlab.config import fast_mode, lab_world_size
from dtlab.cost import TwoTierCluster, gpu
from dtlab.cost.crossover import critical_intensity, dp_min_tokens_per_gpu
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
from dtlab.parallel import (
    BucketedDDP,
    NaiveDDP,
    OverlappedDDP,
    Straggler,
    ring_bytes_sent,
    run_async_sgd,
    straggle,
)
from dtlab.parallel.data.equivalence import (
    FP32_STEP_TOLERANCE,
    TiedToyModel,
    lm_loss,
    max_abs_difference,
    parameters_by_name,
    toy_batches,
    train_single_process,
)
from dtlab.parallel.data.loss_normalization import count_bytes_per_rank, single_process_gradient
from dtlab.quiz import ask, check_exercise

dtlab.viz.setup_notebook()
FAST = fast_mode()

# %% [markdown]
# ## 1. Two ranks, one small GPT
#
# Fast mode trains the tiny GPT (about 0.1 M parameters) on 2 CPU ranks; full mode the small one
# (about 3.5 M) on every GPU. `Ψ` below is the parameter count, `N` the number of ranks.

# %%
WORLD_SIZE = lab_world_size(2)
CONFIG = GPTConfig.tiny() if FAST else GPTConfig.small()
MICRO_BATCH = 16 if FAST else 32  # rows per rank per forward
STEPS = 4 if FAST else 10
PSI = CONFIG.num_params()
cluster = dtlab.Cluster(WORLD_SIZE)
print(f"{WORLD_SIZE} ranks on {cluster.backend}; GPT with Ψ = {PSI:,} parameters")

# %% [markdown]
# ## 2. One DDP step, taken apart <a id="ddp-step"></a>
#
# `NaiveDDP` is the whole algorithm with nothing hidden (`dtlab.parallel.data.naive`):
#
# 1. **construction** broadcasts rank 0's parameters, so replicas *start* equal;
# 2. each rank runs forward and backward on **its own rows** of the global batch, so the local
#    gradients differ;
# 3. after backward every gradient is **all-reduced and divided by N**: every rank now holds the
#    gradient of the *global* batch — the same number one process would compute;
# 4. every rank takes the same optimizer step.
#
# Look for: local gradient norms that differ per rank, a synced norm that is the same everywhere,
# bytes sent equal to the ring all-reduce formula `2(N-1)/N · Ψ · 4 bytes`, and parameters after a
# few steps equal to single-process training up to fp32 rounding (the tolerance is explained in
# `dtlab.parallel.data.equivalence`).


# %%
def one_ddp_step_taken_apart(steps: int) -> dict:
    rank, world, device = dtlab.rank(), dtlab.world_size(), dtlab.device()
    model = GPT(CONFIG, seed=rank).to(device)  # deliberately different seeds per rank...
    # ...until the broadcast in the constructor makes them equal. collectives="dtlab" runs the
    # all-reduces on our own send/recv rings, so every byte below is counted from real messages.
    ddp = NaiveDDP(model, collectives="dtlab")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = SyntheticTokens(CONFIG, n_batches=steps, batch_size=MICRO_BATCH * world, seed=0)
    first = model.blocks[0].mlp.fc_in.weight
    start_checksum = sum(p.double().sum().item() for p in model.parameters())
    x, y = (t.to(device) for t in shard_for_rank(data[0], rank, world))
    # The bare model: DDP's gradient hooks do fire, but no DDP forward armed them, so nothing moves.
    loss_fn(model(x), y).backward()
    local_norm = first.grad.norm().item()
    model.zero_grad()
    for step in range(steps):
        x, y = (t.to(device) for t in shard_for_rank(data[step], rank, world))
        opt.zero_grad()
        if step == 0:
            ddp.comm_stats.reset()  # count one step's gradient traffic, not the broadcast
        loss_fn(ddp(x), y).backward()
        if step == 0:
            synced_norm, sent = first.grad.norm().item(), ddp.comm_stats.bytes_sent
        opt.step()
    return {
        "start_checksum": start_checksum,
        "local_norm": local_norm,
        "synced_norm": synced_norm,
        "sent": sent,
        "params": {n: p.detach().cpu() for n, p in parameters_by_name(model).items()},
    }


results = cluster.run(one_ddp_step_taken_apart, STEPS)
for rank, r in enumerate(results):
    print(
        f"rank {rank}: start checksum {r['start_checksum']:.6f}  local |grad| {r['local_norm']:.5f}"
        f"  synced |grad| {r['synced_norm']:.5f}  sent {r['sent']:,.0f} B (counted)"
    )
print(f"formula: 2(N-1)/N · Ψ · 4 B = {ring_bytes_sent('all_reduce', PSI * 4, WORLD_SIZE):,.0f} B")

reference = GPT(CONFIG, seed=0)
data = SyntheticTokens(CONFIG, n_batches=STEPS, batch_size=MICRO_BATCH * WORLD_SIZE, seed=0)
want = train_single_process(
    reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9), list(data)
)
diff = max(max_abs_difference(r["params"], want) for r in results)
print(
    f"after {STEPS} steps: max |DDP - one process| = {diff:.1e} (tolerance {FP32_STEP_TOLERANCE})"
)

# %% [markdown]
# ## 3. When do the gradients move? Naive, overlapped, bucketed <a id="overlap"></a>
#
# Backward produces gradients **last layer first**. Three ways to use that:
#
# - **naive** (`NaiveDDP`): wait for the whole backward, then all-reduce every gradient. The
#   network idles during backward, the compute idles during communication.
# - **overlapped** (`OverlappedDDP`): a hook on each parameter launches an *asynchronous*
#   all-reduce the moment its gradient is ready, so layer `L`'s bytes move while layer `L-1`
#   computes. The cost: one collective per parameter, each paying the latency `α`.
# - **bucketed** (`BucketedDDP`, what `torch.nn.parallel.DistributedDataParallel` does): pack
#   gradients into a few flat buckets (reverse registration order) and launch each bucket's
#   all-reduce when its last gradient arrives: few `α`s *and* overlap.
#
# The bytes are identical; only *when* they move differs. Below, each rank marks its backward
# **compute** from its start to the last gradient hook; communication spans run from launch to
# completion; `wait:` idle spans are the time the rank sat blocked waiting for communication
# after backward — the *exposed* part. Look for orange bars under the blue ones in the
# overlapped and bucketed timelines, and for the exposed time shrinking.


# %%
def train_with(wrapper: str, steps: int, bucket_cap_mb: float = 25.0, straggler=None) -> dict:
    """Train the GPT under one DDP flavour; trace forward, backward compute, optimizer."""
    rank, world, device = dtlab.rank(), dtlab.world_size(), dtlab.device()
    model = GPT(CONFIG, seed=0).to(device)
    if wrapper == "bucketed":
        ddp = BucketedDDP(model, bucket_cap_mb=bucket_cap_mb, first_bucket_mb=None)
    else:
        ddp = {"naive": NaiveDDP, "overlapped": OverlappedDDP}[wrapper](model)
    last_gradient_ns = [0]

    def note_gradient(_p) -> None:  # registered after DDP's hook, so it runs after the launch
        last_gradient_ns[0] = trace.now_ns()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(note_gradient)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = SyntheticTokens(CONFIG, n_batches=steps, batch_size=MICRO_BATCH * world, seed=0)
    ddp.comm_stats.reset()
    step_times = []
    for step in range(steps):
        x, y = (t.to(device) for t in shard_for_rank(data[step], rank, world))
        dtlab.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        straggle(straggler)
        with trace.span("forward", kind="compute", step=step):
            loss = loss_fn(ddp(x), y)
        backward_start = trace.now_ns()
        loss.backward()
        trace.record("backward", "compute", backward_start, last_gradient_ns[0], step=step)
        with trace.span("optimizer", kind="optimizer", step=step):
            opt.step()
        step_times.append(time.perf_counter() - start)
    return {
        "step_s": statistics.median(step_times[1:] or step_times),
        "calls_per_step": ddp.comm_stats.calls // steps,
        "sent_per_step": ddp.comm_stats.bytes_sent / steps,
        "bytes_source": ddp.comm_stats.source,
        "buckets": len(getattr(ddp, "buckets", [])),
    }


def exposed_seconds(run_trace, rank: int = 0) -> float:
    """Time the rank was blocked on gradient communication: blocking collectives + waits."""
    spans = run_trace.filter(rank=rank).spans
    blocking = [s for s in spans if s.kind == "comm" and not s.labels.get("async_op")]
    waits = [s for s in spans if s.kind == "idle" and s.name.startswith("wait:")]
    return sum(s.duration_s for s in blocking + waits if s.name != "broadcast_state")


MODEL_MB = PSI * 4 / 2**20
BUCKET_MB = MODEL_MB / 4  # about 4 buckets: torch's 25 MB would hold this whole model in one
runs = {}
for wrapper in ("naive", "overlapped", "bucketed"):
    runs[wrapper] = cluster.run(train_with, wrapper, STEPS, BUCKET_MB)
formula = ring_bytes_sent("all_reduce", PSI * 4, WORLD_SIZE)
print(
    f"{'wrapper':<11} {'step ms':>8} {'collectives':>12} {'bytes/step':>11} {'hidden':>7} {'exposed ms':>11}"
)
for wrapper, run in runs.items():
    r = run[0]
    print(
        f"{wrapper:<11} {r['step_s'] * 1e3:>8.1f} {r['calls_per_step']:>12} "
        f"{r['sent_per_step']:>11,.0f} {run.trace.hidden_fraction(rank=0):>7.0%} "
        f"{exposed_seconds(run.trace) * 1e3 / STEPS:>11.1f}"
    )
print(f"formula bytes/step for every wrapper: 2(N-1)/N · Ψ · 4 = {formula:,.0f}")
print(
    f"(bytes/step here: {runs['naive'][0]['bytes_source']} — these runs time the backend's own "
    "collectives, which dtlab cannot count; section 1 counted the same bytes message by message)"
)

# %% [markdown]
# The naive timeline: blue backward, *then* a comb of orange all-reduces, one per parameter, while
# nothing computes. Zoom in (drag a box) on one step.

# %%
dtlab.viz.timeline(runs["naive"].trace, title="Naive DDP: all-reduce after backward")

# %% [markdown]
# Overlapped: the orange lane fills *during* backward; what is left after backward is the tail.

# %%
dtlab.viz.timeline(
    runs["overlapped"].trace, title="Overlapped DDP: one async all-reduce per parameter"
)

# %% [markdown]
# Bucketed (the cap set to a quarter of the model, so there are a few buckets): a handful of wide
# orange bars instead of a comb — fewer latencies, and the early buckets still overlap backward.

# %%
dtlab.viz.timeline(
    runs["bucketed"].trace, title=f"Bucketed DDP ({runs['bucketed'][0]['buckets']} buckets)"
)

# %% [markdown]
# ### Exercise: all-reduce one gradient bucket <a id="exercise-bucketed-hook"></a>
#
# This is the piece of `BucketedDDP` that moves bytes. The grader owns the bookkeeping: it assigns
# parameters to buckets (`dtlab.parallel.assign_buckets`, reverse registration order), counts
# gradients in hooks, and calls your function with a bucket's parameters **the moment the last of
# their gradients exists** — backward is still running. Write `reduce_bucket_async(params)`:
#
# 1. flatten the bucket's gradients into **one** tensor (`torch.cat` of `p.grad.reshape(-1)`);
# 2. launch **one asynchronous** all-reduce (`dist.all_reduce(..., async_op=True)`) and return at
#    once, so backward continues while the bytes move;
# 3. return a function `finish()` that waits for it, divides by the world size and copies each
#    slice back into its parameter's `.grad`.
#
# The grader calls every `finish()` after backward, takes 4 SGD-with-momentum steps on 2 ranks and
# compares the parameters with `torch.nn.parallel.DistributedDataParallel` (tolerance 1e-5). It also
# counts your all-reduces: one per bucket, carrying the whole bucket, and still in flight when your
# function returns — waiting inside the hook would serialise backward and communication, and fails.


# %%
import torch.distributed as dist


def reduce_bucket_async(params: list[torch.nn.Parameter]):
    """Launch one async all-reduce of the bucket's gradients; give back a finish() to call later."""
    # BEGIN SOLUTION
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    work = dist.all_reduce(flat, async_op=True)

    def finish() -> None:
        work.wait()
        flat.div_(dist.get_world_size())
        for p, averaged in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(averaged.view_as(p))

    return finish
    # END SOLUTION


# %%
check_exercise("data_parallel.bucketed_hook", reduce_bucket_async, cluster)

# %% [markdown]
# ## 4. The bucket-size sweep <a id="bucket-sweep"></a>
#
# One knob, two costs. A collective of `M` bytes costs about `α + M·β`. With `k` buckets a step
# pays `k·α` of latency; with one huge bucket nothing can launch until backward ends, so nothing
# overlaps. torch's default is 25 MB (and a 1 MB first bucket, so communication starts early).
#
# Look for: bytes per step constant (the formula), collectives per step falling as the cap grows,
# and the hidden fraction falling with it. On a busy CPU the step time is noisy; on GPUs the
# U-shape (too small: latency-bound; too big: exposed) is the classic result.

# %%
caps = [MODEL_MB / k for k in (64, 16, 4, 1)] + [25.0]
sweep = []
for cap in caps:
    run = cluster.run(train_with, "bucketed", STEPS, cap)
    sweep.append((cap, run[0], run.trace.hidden_fraction(rank=0)))
print(f"model gradients: {MODEL_MB:.2f} MiB; formula bytes/step {formula:,.0f}")
print(f"{'cap MiB':>8} {'buckets':>8} {'bytes/step':>11} {'step ms':>8} {'hidden':>7}")
for cap, r, hidden in sweep:
    print(
        f"{cap:>8.3f} {r['buckets']:>8} {r['sent_per_step']:>11,.0f} {r['step_s'] * 1e3:>8.1f} "
        f"{hidden:>7.0%}"
    )

# %% [markdown]
# The same numbers as a figure: step time (left axis) and the share of communication hidden
# behind backward (right axis) against the number of buckets. What to see: the hidden share
# rises as buckets multiply (communication starts during backward) while each extra bucket adds a
# latency; the legend sits under the plot.

# %%
fig = go.Figure()
fig.add_scatter(
    x=[r["buckets"] for _, r, _ in sweep], y=[r["step_s"] * 1e3 for _, r, _ in sweep],
    name="step ms", mode="lines+markers",
)  # fmt: skip
fig.add_scatter(
    x=[r["buckets"] for _, r, _ in sweep], y=[h for *_, h in sweep], name="hidden fraction",
    mode="lines+markers", yaxis="y2",
)  # fmt: skip
counts = sorted({r["buckets"] for _, r, _ in sweep})
fig.update_layout(
    template=dtlab.viz.DTLAB_TEMPLATE,
    title="Bucket-size sweep: step time and hidden communication",
    xaxis={"title": {"text": "buckets per step (log scale)"}, "type": "log", "tickvals": counts},
    yaxis={"title": {"text": "step time (ms)"}, "rangemode": "tozero"},
    yaxis2={
        "title": {"text": "communication hidden behind backward (%)"}, "overlaying": "y",
        "side": "right", "range": [0, 1], "tickformat": ".0%", "dtick": 0.25,
    },
    legend={"orientation": "h", "x": 0, "y": -0.25, "yanchor": "top"},
    margin={"b": 110},
)  # fmt: skip
dtlab.viz.describe(
    fig,
    caption="More buckets hide more communication behind backward; each extra bucket adds a latency.",
)


# %% [markdown]
# ## 5. Gradient accumulation and `no_sync` <a id="no-sync"></a>
#
# To reach a global batch bigger than memory allows, each rank runs `k` micro-batches and sums
# their gradients before one optimizer step (divide each loss by `k` so the sum is a mean). Naively
# every backward all-reduces, `k` times per step. Inside `ddp.no_sync()` the gradients only
# accumulate locally; the last micro-batch's backward, outside it, all-reduces the total once.
# Same gradients, `1/k` of the bytes.
#
# Look for: bytes per optimizer step `k·` vs `1·` the all-reduce formula, and parameters equal
# whichever way you accumulate.

# %%
ACCUM = 4


def accumulate(use_no_sync: bool, steps: int) -> dict:
    rank, world, device = dtlab.rank(), dtlab.world_size(), dtlab.device()
    model = GPT(CONFIG, seed=0).to(device)
    ddp = BucketedDDP(model, collectives="dtlab")  # bytes counted from real messages
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = SyntheticTokens(CONFIG, n_batches=steps * ACCUM, batch_size=MICRO_BATCH * world, seed=0)
    ddp.comm_stats.reset()
    dtlab.barrier()
    start = time.perf_counter()
    for step in range(steps):
        opt.zero_grad()
        for k in range(ACCUM):
            x, y = (t.to(device) for t in shard_for_rank(data[step * ACCUM + k], rank, world))
            skip_sync = use_no_sync and k < ACCUM - 1
            with ddp.no_sync() if skip_sync else nullcontext():
                (loss_fn(ddp(x), y) / ACCUM).backward()
        opt.step()
    return {
        "sent_per_step": ddp.comm_stats.bytes_sent / steps,
        "calls_per_step": ddp.comm_stats.calls / steps,
        "step_s": (time.perf_counter() - start) / steps,
        "params": {n: p.detach().cpu() for n, p in parameters_by_name(model).items()},
    }


every, once = (cluster.run(accumulate, flag, 2)[0] for flag in (False, True))
for label, r in (("sync every micro-batch", every), ("no_sync until the last", once)):
    print(
        f"{label:<24} {r['sent_per_step']:>11,.0f} B/step counted, in {r['calls_per_step']:.0f} "
        f"collective{'s' if r['calls_per_step'] != 1 else ''},"
        f" {r['step_s'] * 1e3:6.1f} ms/step"
    )
print(f"formula: k · 2(N-1)/N·Ψ·4 = {ACCUM * formula:,.0f}  vs  2(N-1)/N·Ψ·4 = {formula:,.0f}")
print(f"max |Δparam| between the two: {max_abs_difference(every['params'], once['params']):.1e}")

# %% [markdown]
# ## 6. Global batch, learning-rate scaling and warm-up <a id="lr-scaling"></a>
#
# **Global batch** = micro-batch × accumulation steps × N. Growing N at a fixed per-rank batch
# grows the global batch, and the step count per epoch shrinks by the same factor. To make the
# same progress per *sample*, each step must move further:
#
# - **linear scaling** (Goyal et al., "Accurate, Large Minibatch SGD", 2017): `k×` the batch,
#   `k×` the learning rate — derived for SGD, where a step is proportional to the gradient;
# - **square-root scaling** is the usual rule for Adam, whose step size is already normalised;
# - **warm-up**: ramp the learning rate up over the first steps, because early gradients are
#   large and a scaled-up rate from step 0 can blow up (watch for a loss *rising* at the start).
#
# Below, the same number of samples (`SAMPLES`) at global batch 32 and 128 (4 × accumulation),
# with AdamW. Look for: the big batch at the *same* rate lags per sample (a quarter of the steps);
# a scaled-up rate closes part of the gap. Compare the first losses too: the 4× rate from step 0
# moves fastest at first; on real models that is where an un-warmed large rate diverges, and even
# here the gentler √4 rate with warm-up usually ends ahead of it.

# %%
SAMPLES = 1024 if FAST else 8192
EVAL_BATCH = SyntheticTokens(CONFIG, n_batches=1, batch_size=64, seed=99)[0]


def lr_at(step: int, peak: float, warmup_steps: int) -> float:
    """Linear warm-up to ``peak`` over ``warmup_steps`` optimizer steps, then constant."""
    return peak * min(1.0, (step + 1) / warmup_steps) if warmup_steps else peak


def train_for_samples(micro: int, accum: int, peak: float, warmup_steps: int) -> list:
    rank, world, device = dtlab.rank(), dtlab.world_size(), dtlab.device()
    model = GPT(CONFIG, seed=0).to(device)
    ddp = BucketedDDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=peak)
    global_batch = micro * accum * world
    data = SyntheticTokens(CONFIG, n_batches=SAMPLES // micro // world, batch_size=micro * world)
    eval_x, eval_y = (t.to(device) for t in EVAL_BATCH)
    curve = []
    for step in range(SAMPLES // global_batch):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, peak, warmup_steps)
        opt.zero_grad()
        for k in range(accum):
            x, y = (t.to(device) for t in shard_for_rank(data[step * accum + k], rank, world))
            with ddp.no_sync() if k < accum - 1 else nullcontext():
                (loss_fn(ddp(x), y) / accum).backward()
        opt.step()
        with torch.no_grad():
            curve.append(((step + 1) * global_batch, loss_fn(model(eval_x), eval_y).item()))
    return curve


BASE_LR = 3e-3
SETTINGS = {
    "B=32, lr η": (16, 1, BASE_LR, 0),
    "B=128, lr η": (16, 4, BASE_LR, 0),
    "B=128, lr 2η (√4), warm-up 3": (16, 4, 2 * BASE_LR, 3),
    "B=128, lr 4η (linear), no warm-up": (16, 4, 4 * BASE_LR, 0),
}
curves = {name: cluster.run(train_for_samples, *s)[0] for name, s in SETTINGS.items()}
for name, curve in curves.items():
    first = ", ".join(f"{loss:.2f}" for _, loss in curve[:3])
    print(f"{name:<34} first losses {first};  after {curve[-1][0]} samples: {curve[-1][1]:.3f}")
print(f"warm-up schedule, peak 2η: {[round(lr_at(s, 2 * BASE_LR, 3), 4) for s in range(5)]}")

# %% [markdown]
# Loss on a held-out batch against samples seen: same x-axis, so equal progress means overlapping
# curves. What to see: the larger batch with a scaled learning rate and warm-up tracks the small
# batch per sample; the one without warm-up starts worse.

# %%
fig = go.Figure()
for name, curve in curves.items():
    fig.add_scatter(x=[s for s, _ in curve], y=[loss for _, loss in curve], name=name)
fig.update_layout(
    template=dtlab.viz.DTLAB_TEMPLATE,
    title="Same samples, different global batch",
    xaxis={"title": {"text": "samples seen (sequences)"}},
    yaxis={"title": {"text": "held-out loss (nats per token)"}},
    legend={"orientation": "h", "x": 0, "y": -0.25, "yanchor": "top"},
    margin={"b": 130},
)
dtlab.viz.describe(
    fig,
    caption="With a scaled learning rate and warm-up the big batch tracks the small one per sample.",
)


# %% [markdown]
# ## 7. A straggler <a id="straggler"></a>
#
# Synchronous data parallelism cannot finish an all-reduce until *every* rank has contributed, so
# each step lasts as long as the slowest rank: `t_step ≈ max_r(t_compute[r]) + t_comm`. One slow
# GPU, a noisy neighbour or a throttled node slows the whole job.
#
# Below rank 1 sleeps `DELAY` seconds at the start of every step (`dtlab.parallel.straggle`).
# Look for the brown `straggler_delay` (kind "other") on rank 1 and, on rank 0, a long grey
# `wait:` for the bucket whose all-reduce cannot finish until rank 1 joins: both ranks' step times
# grow by `DELAY`.

# %%
DELAY = 0.05
baseline = runs["bucketed"][0]["step_s"]
slow = cluster.run(train_with, "bucketed", STEPS, BUCKET_MB, Straggler(slow_rank=1, delay_s=DELAY))
for rank, r in enumerate(slow):
    print(
        f"rank {rank}: {r['step_s'] * 1e3:6.1f} ms/step; "
        f"predicted ≈ baseline {baseline * 1e3:.1f} + delay {DELAY * 1e3:.0f} = "
        f"{(baseline + DELAY) * 1e3:.1f} ms"
    )
dtlab.viz.timeline(slow.trace, title=f"Rank 1 straggles by {DELAY * 1e3:.0f} ms per step")

# %% [markdown]
# ## 8. Synchronous vs asynchronous SGD <a id="sync-async"></a>
#
# A parameter server (Dean et al., "Large Scale Distributed Deep Networks", 2012) removes the
# waiting: rank 0 owns the parameters and applies each worker's gradient the moment it arrives
# (`dtlab.parallel.run_async_sgd`). The price is **staleness**: a gradient computed at version `v`
# is applied at version `v + s`, to parameters it no longer describes.
#
# Same toy model, same number of updates (`UPDATES`), same learning rates, each update one worker's
# batch: 1 worker (staleness 0: exactly sequential SGD) against 3 workers on 4 ranks. Look for:
# equal loss at a small rate, and the stale run falling apart (or going `nan`) at rates where the
# fresh one still converges. Staleness shrinks the usable learning rate; that and the lost
# determinism are why large-scale LLM training stays synchronous.

# %%
UPDATES = 24
RATES = (0.1, 0.3, 0.6)


def async_sgd_loss(lr: float) -> tuple[float, float]:
    workers = dtlab.world_size() - 1
    batches = toy_batches(UPDATES, global_batch=8, seed=3)

    def loss_on_batch(model, step):
        tokens, targets = batches[step * workers + dtlab.rank() - 1]
        return lm_loss(model(tokens), targets)

    model = TiedToyModel(seed=0)
    result = run_async_sgd(model, loss_on_batch, steps_per_worker=UPDATES // workers, lr=lr)
    eval_tokens, eval_targets = toy_batches(1, global_batch=64, seed=77)[0]
    with torch.no_grad():
        return result.mean_staleness, lm_loss(model(eval_tokens), eval_targets).item()


def rank0_on_cpu_ranks(n: int, fn, *args):
    """Rank 0's result of ``fn`` on ``n`` CPU ranks (the parameter server exchanges CPU tensors)."""
    if n == WORLD_SIZE and cluster.device_type == "cpu":
        return cluster.run(fn, *args)[0]
    with dtlab.Cluster(n, device="cpu") as ranks:
        return ranks.run(fn, *args)[0]


def async_sgd_at_rates(rates: tuple) -> dict:
    return {lr: async_sgd_loss(lr) for lr in rates}


fresh = rank0_on_cpu_ranks(2, async_sgd_at_rates, RATES)
stale = rank0_on_cpu_ranks(4, async_sgd_at_rates, RATES)
print(f"{'lr':>5} {'1 worker: staleness, loss':>28} {'3 workers: staleness, loss':>30}")
for lr in RATES:
    (s1, l1), (s3, l3) = fresh[lr], stale[lr]
    print(f"{lr:>5} {s1:>16.2f} {l1:>11.3f} {s3:>18.2f} {l3:>11.3f}")

# %% [markdown]
# ## 9. When does the all-reduce hide? The data-parallel crossover <a id="dp-crossover"></a>
#
# Overlap only hides the gradient all-reduce if backward takes at least as long. Backward does
# `4·P·T` FLOPs for `T` tokens per GPU; the ring moves `2(N-1)/N·b·P` bytes per GPU (`b` = 2 for
# BF16 gradients, 4 for FP32) at the bus bandwidth `B`. Setting the times equal, `P` cancels:
# `T_min = 2(N-1)/N·b·C / (4·B)` — the GPU's FLOP/s over the link's bytes/s, the *critical
# intensity*. `B` depends on the topology: NVLink inside a node; across rail-optimised nodes the
# node's eight 400 Gb/s NICs (8 × 50 = 400 GB/s; NCCL runs one ring per NIC); with one NIC per
# node, 50 GB/s. Look for: about 2,200 tokens per GPU inside a node, about 2,500 across
# rail-optimised nodes, eight times that with one NIC per node, and twice as many for an FP32
# reduction or FSDP's extra all-gather (×1.5). Below the threshold, add tokens per GPU (micro-batch
# or accumulation) or expect exposed communication.

# %%
h100 = gpu("h100_sxm")
print(f"{'topology':<34} {'BF16 grads':>11} {'FP32 grads':>11} {'FSDP BF16':>10}")
for label, topo in (
    ("1 node × 8 (NVLink)", TwoTierCluster(1, 8)),
    ("16 nodes × 8, one NIC per GPU", TwoTierCluster(16, 8)),
    ("16 nodes × 8, one NIC per node", TwoTierCluster(16, 8, nics_per_node=1)),
):
    bf16, fp32 = (dp_min_tokens_per_gpu(h100, topo, grad_bytes=b) for b in (2, 4))
    fsdp = dp_min_tokens_per_gpu(h100, topo, grad_bytes=2, volume_factor=1.5)
    print(f"{label:<34} {bf16:>11,.0f} {fp32:>11,.0f} {fsdp:>10,.0f}")
print(f"critical intensity H100 on NVLink 4: {critical_intensity(h100, 'nvlink4'):,.0f} FLOP/B")

# %%
ask("data_parallel.dp_crossover_tokens")

# %% [markdown]
# ## 10. Loss normalisation when ranks hold different numbers of tokens <a id="loss-normalization"></a>
#
# The loss we mean is the mean over every real token of the global batch, `(1/T) Σ ℓ_t`. With
# padding masked out or packed documents, rank `r` holds `n_r` tokens and the `n_r` differ. If each
# rank takes its own mean and DDP averages the gradients, a token on rank `r` weighs `1/(N·n_r)`:
# tokens on short ranks count more. The fix all-reduces the token count first (one int64,
# `2(N−1)/N · 8` bytes per rank on average) and divides each rank's *sum* by it, times `N`
# because DDP averages (`dtlab.parallel.data.loss_normalization`).
#
# Look for: the global count matching the single-process gradient to rounding at every length
# ratio, the per-rank mean exact only at equal lengths and off by far more than rounding at every
# other ratio (how far depends on the tokens that got misweighted, so it need not grow with the
# ratio), and the count costing a few bytes next to the gradient's.


# %%
def token_batch(total: int):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(total, 4, generator=g, dtype=torch.float64)
    return x, torch.randn(total, generator=g, dtype=torch.float64)


def normalised_step(how: str, lengths: tuple) -> dict:
    from dtlab.parallel.data.loss_normalization import ddp_gradient

    x, y = (t.to(dtlab.device()) for t in token_batch(sum(lengths)))
    start = sum(lengths[: dtlab.rank()])
    return ddp_gradient(
        x[start : start + lengths[dtlab.rank()]], y[start : start + lengths[dtlab.rank()]], how
    )


RATIOS = (1, 2, 4, 8)
errors = {"per_rank": [], "global": []}
for ratio in RATIOS:
    lengths = tuple(4 * ratio**r for r in range(WORLD_SIZE))  # rank r holds 4·ratio^r tokens
    reference = single_process_gradient(*token_batch(sum(lengths)))
    for how in errors:
        result = cluster.run(normalised_step, how, lengths)[0]
        errors[how].append((result["grad"] - reference).abs().max().item())
count_sent = sum(r["count_bytes"] for r in cluster.run(normalised_step, "global", lengths))
print(f"{'n_max/n_min':>11} {'per-rank mean: max |Δgrad|':>27} {'global count: max |Δgrad|':>26}")
for i, ratio in enumerate(RATIOS):
    shown = ratio ** (WORLD_SIZE - 1)
    print(f"{shown:>11} {errors['per_rank'][i]:>27.2e} {errors['global'][i]:>26.2e}")
print(
    f"token count all-reduce: {count_sent / WORLD_SIZE:.1f} B per rank counted (average over ranks)"
    f"  vs  2(N-1)/N·8 = {count_bytes_per_rank(WORLD_SIZE):.1f} B"
)

# %%
fig = go.Figure()
for how, label in (
    ("per_rank", "per-rank mean, then DDP average"),
    ("global", "global token count"),
):
    fig.add_scatter(
        x=[r ** (WORLD_SIZE - 1) for r in RATIOS], y=[max(e, 1e-17) for e in errors[how]],
        name=label, mode="lines+markers",
    )  # fmt: skip
fig.update_layout(template=dtlab.viz.DTLAB_TEMPLATE, xaxis={"type": "log"}, yaxis={"type": "log"})
dtlab.viz.describe(
    fig,
    title="Gradient error against one process over all tokens, by token imbalance",
    x="tokens on the longest rank / on the shortest (log)",
    y="max |Δ gradient| (log; 1e-17 = exact)",
    caption="Equal lengths make both exact; past that only the all-reduced token count stays exact.",
)

# %% [markdown]
# ### Exercise: normalise by the global token count <a id="exercise-token-normalised-loss"></a>
#
# Write `token_normalised_loss(loss_sum, n_tokens)`: `loss_sum` is this rank's summed token
# losses (a tensor that requires grad), `n_tokens` its number of real tokens. Return the loss to
# call `backward` on so that DDP's **averaged** gradient is the gradient of the mean over every
# rank's tokens: all-reduce the count (a small integer tensor on `loss_sum`'s device), then scale
# the sum. The grader runs it on ranks holding different numbers of tokens, twice, averages the
# gradients as DDP does, and compares with one process over all tokens (1e-12, fp64); it also
# checks that a small all-reduce of the count was what moved.


# %%
def token_normalised_loss(loss_sum: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """This rank's loss such that DDP's gradient average weighs every token 1/T."""
    import torch.distributed as dist

    # BEGIN SOLUTION
    count = torch.tensor([n_tokens], dtype=torch.int64, device=loss_sum.device)
    dist.all_reduce(count)
    return loss_sum * dist.get_world_size() / count.item()
    # END SOLUTION


# %%
check_exercise("data_parallel.token_normalised_loss", token_normalised_loss, cluster)

# %%
ask("data_parallel.loss_norm_token_weight")

# %%
ask("data_parallel.loss_norm_fix")

# %% [markdown]
# ## 11. Check your understanding

# %%
ask("data_parallel.step_order")

# %%
ask("data_parallel.why_gradients")

# %%
ask("data_parallel.bucket_tradeoffs")

# %%
ask("data_parallel.overlap_explain")

# %%
ask("data_parallel.allreduce_bytes_7b")

# %%
ask("data_parallel.accumulation_steps")

# %%
ask("data_parallel.scale_out_batch")

# %%
ask("data_parallel.limits")

# %%
ask("sync_async.compare")

# %%
ask("sync_async.stragglers")

# %% [markdown]
# ## 12. Shut the cluster down

# %%
cluster.close()
