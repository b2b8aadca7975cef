# %% [markdown]
# # Lab 05 — Pipeline parallelism
#
# Tensor parallelism (lab 04) cuts every layer and talks twice per block; it stays inside a
# node. **Pipeline parallelism** cuts the model the other way — by depth. Rank 0 holds the first
# blocks, rank 1 the next, and so on; between two ranks only one activation crosses forward and
# its gradient backward, point to point. The catch is time: a stage can only work on what the
# stage before it has finished, so ranks sit idle — the **bubble**. Every pipeline schedule is an
# answer to one question: how little idle time, for how much memory and how many messages?
#
# Here a schedule is **plain data**: per rank, the ordered list of its actions (`"0F1"`: stage 0,
# forward, micro-batch 1). The library validates it, simulates its timeline, and executes the
# very same list on real ranks — so prediction and measurement sit side by side.
#
# One idea at a time:
#
# 1. the naive split: one stage busy at a time;
# 2. GPipe: micro-batches fill the pipe — bubble `(p-1)/(m+p-1)`, but all `m` in memory;
# 3. 1F1B: the same bubble, at most `p` in memory — then you write it;
# 4. the bubble against `m` and `p` — then you compute it;
# 5. interleaved 1F1B: a smaller bubble for more messages, counted;
# 6. zero bubble (ZB-H1): split the backward into I and W;
# 7. DualPipeV: both ends of the model on one rank, fed from both sides.

# %%
import statistics
import time

import plotly.graph_objects as go
import torch
import torch.distributed as dist

import dtlab
import dtlab.progress
import dtlab.viz
from dtlab import trace
from dtlab.comm import Communicator
from dtlab.config import fast_mode, lab_world_size
from dtlab.cost.bubble import bubble_fraction_of_total, interleaved_bubble_fraction_of_total
from dtlab.memory import ActivationMeter
from dtlab.mesh import Mesh
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, split_into_stages
from dtlab.parallel.pipeline import (
    SCHEDULES,
    Action,
    Costs,
    PipelineExecutor,
    Schedule,
    bytes_sent_per_rank,
    executed_bubble,
    gpipe,
    interleaved_1f1b,
    measured_bubble,
    one_f_one_b,
    simulate,
    validate,
    with_communication,
)
from dtlab.quiz import ask, check_exercise
from dtlab.trace import Trace

dtlab.viz.setup_notebook()
FAST = fast_mode()

# %% [markdown]
# ## 1. The cluster and the model <a id="setup"></a>
#
# `p` pipeline ranks (2 in fast mode, one per GPU otherwise) and `m = 2p` micro-batches per
# step. The GPT has `2p` blocks so that the schedules with two stages per rank (interleaved,
# DualPipeV) still get one block per stage. Its embedding and head are untied here, so the
# timing runs below need no extra all-reduce between the first and the last rank.

# %%
cluster = dtlab.Cluster(lab_world_size(2))
P = cluster.world_size
M = 2 * P
MICRO_BATCH = 2
base = GPTConfig.tiny() if FAST else GPTConfig.small()
CONFIG = GPTConfig.tiny(
    vocab_size=base.vocab_size,
    seq_len=base.seq_len,
    d_model=base.d_model,
    n_heads=base.n_heads,
    n_layers=2 * P,
    tie_embeddings=False,
)
ACTIVATION_BYTES = MICRO_BATCH * CONFIG.seq_len * CONFIG.d_model * 4  # one (b, S, d) fp32 message
print(
    f"p = {P} ranks on {cluster.device_type}, m = {M} micro-batches of {MICRO_BATCH} sequences; "
    f"GPT with {CONFIG.n_layers} blocks, d = {CONFIG.d_model}; one activation message = "
    f"{ACTIVATION_BYTES:,} B"
)

# %% [markdown]
# ## 2. A schedule is data <a id="schedules-as-data"></a>
#
# An `Action` is (stage, kind, micro-batch): `F` forward, `B` backward, and — later — `I`
# (backward for the input only) and `W` (backward for the weights only). It prints in PyTorch's
# form (`torch.distributed.pipelining` uses the same strings), and a `Schedule` is one list of
# actions per rank. Look for: the strings, and the grid — one row per rank, in the order the
# rank runs them (not yet in time: that is the simulator's job).

# %%
print([str(a) for a in (Action(0, "F", 1), Action(1, "B", 0), Action(0, "I", 3))])
print(gpipe(2, 3))
print(gpipe(2, 3).to_torch_strings())

# %% [markdown]
# The simulator places every action in time, given what each costs (`Costs`: forward `F = 1`,
# backward `B = I + W = 2` by default — a backward does twice a forward's matmuls). It reports
# the bubble in **both** conventions, so name yours in an interview:
#
# - `bubble_fraction_of_total` = idle / (idle + busy): the share of the ranks' time wasted;
# - `bubble_ratio_to_ideal` = idle / busy: how much longer than a bubble-free step (Megatron's).
#
# Two helpers used in every section: `show(schedule)` prints the grid and the simulator's
# summary and returns its simulated timeline (one cost unit drawn as 1 ms).


# %%
def show(schedule: Schedule, costs: Costs | None = None) -> go.Figure:
    sim = simulate(schedule, costs)
    print(schedule)
    print(sim.summary())
    return dtlab.viz.timeline(
        sim.trace(),
        title=f"{schedule.name}: simulated",
        caption="Grey is the bubble: stages idle while the pipeline fills and drains.",
    )


# %% [markdown]
# ## 3. The naive split: one stage busy at a time <a id="naive-split"></a>
#
# Cut the model in `p` and push the whole batch through: stage 1 waits for stage 0's forward,
# stage 0 waits for stage 1's backward. That is GPipe with `m = 1`. Look for: a staircase where
# exactly one rank works at any moment — idle / total `(p-1)/p`, 50% on 2 ranks, 75% on 4. The
# model fits (each rank holds `1/p` of it), but you bought `p` GPUs to run at the speed of one.

# %%
show(gpipe(4, 1))

# %% [markdown]
# ## 4. Run every schedule on the cluster, once <a id="executed"></a>
#
# Each section below compares its schedule's prediction with a run on real ranks. So the cluster
# runs all five schedules now, and the sections read their part of the trace. The bar under the
# cell follows rank 0 through the schedules (`dtlab.progress.track`, reported from the rank).
#
# The formulas assume every stage costs the same. The tiny GPT's compute is a millisecond or two
# and noisy on shared cores, so each stage is wrapped in `FixedCost`
# (`dtlab.parallel.pipeline.fixed_cost`): on top of the real work
# its forward sleeps 30 ms, the input-gradient part of its backward (I) 30 ms and the
# weight-gradient part (W) 30 ms — `F = I = W`, a full backward `B = I + W = 2F` — divided by
# `v` when a rank holds `v` smaller stages. (The first stage has no input to differentiate, so
# its I is empty and its W or B does the whole backward; `measured_costs` below reads the other
# stages.) Every rank runs a warm-up step, then `STEPS` timed ones; the executor labels each
# action's span with its stage, phase and micro-batch, and counts the bytes of every message.
# Each rank also measures, with `ActivationMeter`, the peak bytes its stages hold for backward
# during one step.


# %%
from dtlab.parallel.pipeline.fixed_cost import FixedCost  # the wrapper described above

NAMES = ["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "dualpipe_v"]
STEPS = 2 if FAST else 5
STAGE_S = 0.03  # F = I = W, so a full backward B = 2F


def run_every_schedule(names: list[str], p: int, m: int, steps: int) -> dict:
    device, mesh = dtlab.device(), Mesh(pp=p)
    inputs, targets = (v.to(device) for v in SyntheticTokens(CONFIG, 1, MICRO_BATCH * m, seed=0)[0])
    out = {}
    for name in dtlab.progress.track(names, desc="schedules"):  # a bar in the notebook
        schedule = SCHEDULES[name](p, m)
        stages = split_into_stages(GPT(CONFIG, seed=0, device=device), schedule.n_stages)
        scale = p / schedule.n_stages  # v stages per rank: each 1/v of the work
        mine = {
            s: FixedCost(stages[s], *(3 * [STAGE_S * scale])).to(device)
            for s in schedule.stages_of(mesh.pp_rank)
        }
        comm = Communicator.along(mesh, "pp", collectives="dtlab")
        pipe = PipelineExecutor(mine, schedule, comm, hidden_size=CONFIG.d_model, loss_fn=loss_fn)
        for step in range(-1, steps):  # step -1 warms up
            dist.barrier()
            comm.comm_stats.reset()
            with trace.labels(schedule=name, step=step):
                if step == 0:
                    everything = torch.nn.ModuleList(mine.values())
                    with ActivationMeter(everything, exclude=[inputs]) as meter:
                        pipe.step(inputs, targets)
                else:
                    pipe.step(inputs, targets)
            if step == 0:
                out[name] = {"peak_bytes": meter.peak_bytes, "sent": comm.comm_stats.bytes_sent}
    if mesh.pp_rank == 0:  # one micro-batch through stage 0 of a p-stage cut, for scale
        first = split_into_stages(GPT(CONFIG, seed=0, device=device), p)[0]
        with ActivationMeter(first, exclude=[inputs]) as one:
            first(inputs.chunk(m)[0])
        out["one_micro_batch"] = one.total_bytes
    return out


started = time.perf_counter()
run = cluster.run(run_every_schedule, NAMES, P, M, STEPS)
print(
    f"{len(NAMES)} schedules × {STEPS + 1} steps on {P} ranks: "
    f"{time.perf_counter() - started:.1f} s"
)

# %% [markdown]
# Three helpers read that run: `executed(name)` is one timed step's trace (drawn exactly as the
# simulator's); `measured_costs(name)` reads the median F, B, I and W and the lower quartile of
# the messages off the run, so the simulator can replay the same order with the same costs; and
# `compare(name)` prints the measured bubble (median over the steps) next to that replay and the
# formula, and what rank 0 held. One more line, "executed order, equal costs", replays the order
# the ranks really ran (read back from the trace by `executed_bubble`, messages included) with
# `F = I = W = 1`: the bubble of the order itself, whatever the clock said.


# %%
def executed(name: str, step: int = 0) -> Trace:
    spans = run.trace.filter(schedule=name, step=step).spans
    start = min(s.start_ns for s in spans)
    return Trace(spans, start, max(s.end_ns for s in spans), start)


def measured_costs(name: str) -> Costs:
    timed = [s for s in run.trace.filter(schedule=name).spans if s.labels["step"] >= 0]
    median = {}
    for phase in ("F", "B", "I", "W"):
        spans = [
            s.duration_s
            for s in timed
            if s.kind == "compute" and s.labels["phase"] == phase and s.labels["stage"] > 0
        ]
        median[phase] = statistics.median(spans) if spans else 0.0
    messages = [s.duration_s for s in timed if s.kind == "comm"] or [0.0, 0.0]
    split = median["I"] > 0
    return Costs(
        forward=median["F"],
        backward_input=median["I"] if split else median["B"],
        backward_weight=median["W"] if split else 0.0,
        p2p=statistics.quantiles(messages, n=4)[0] if len(messages) > 1 else messages[0],
    )


def compare(name: str, formula: float | None = None) -> None:
    schedule = SCHEDULES[name](P, M)
    measured = statistics.median(
        measured_bubble(executed(name, s))["bubble_fraction_of_total"] for s in range(STEPS)
    )
    replay = simulate(with_communication(schedule), measured_costs(name))
    ideal = simulate(schedule)
    ran = executed_bubble(executed(name), list(range(P)), M)
    print(f"{schedule.name}, p={P}, m={M} — bubble as idle / total:")
    if formula is not None:
        print(f"  formula                         {formula:6.1%}")
    print(f"  simulated, equal costs          {ideal.bubble_fraction_of_total:6.1%}")
    print(f"  executed order, equal costs     {ran.bubble_fraction_of_total:6.1%}")
    print(f"  simulated, the run's costs      {replay.bubble_fraction_of_total:6.1%}")
    print(f"  measured on {P} ranks             {measured:6.1%}")
    held = run[0][name]["peak_bytes"]
    predicted = [ideal.peak_in_flight(s) for s in schedule.stages_of(0)]
    print(
        f"rank 0 held at most {held:,} B of activations = {held / run[0]['one_micro_batch']:.1f} "
        f"micro-batches of a p-stage cut; simulator: stage(s) {schedule.stages_of(0)} hold at "
        f"most {predicted} micro-batches"
    )


# %% [markdown]
# ## 5. GPipe: fill the pipe with micro-batches <a id="gpipe"></a>
#
# GPipe (Huang et al. 2019) cuts the batch into `m` micro-batches: stage 0 starts micro-batch 1
# while stage 1 works on micro-batch 0. All forwards, then all backwards. The idle time is only
# the fill and the drain — `p-1` slots each way beside `m` useful ones:
# idle / total = `(p-1)/(m+p-1)`. The price: when the first backward starts, stage 0 holds the
# activations of **all `m`** micro-batches. Look for: the fill staircase at the start, the drain
# at the end, and a flat top in between.

# %%
show(gpipe(P, M))

# %% [markdown]
# The same schedule executed on the cluster: the lower lane of each rank holds its sends and
# receives. Look for: the same shape as the simulation — the sleeps make stage costs equal —
# with messages (short on CPU) where the simulation had none.

# %%
dtlab.viz.timeline(
    executed("gpipe"),
    title="GPipe: executed on the cluster",
    caption="Grey is idle time: compare the bubble with the simulated schedule above.",
)

# %% [markdown]
# Look for: the measured bubble a few points above the formula — the messages, which the
# formula leaves out, and which the replay with the run's own costs puts back — and rank 0
# holding `m` micro-batches' worth of activations: the simulator says so, the meter measures it.

# %%
compare("gpipe", bubble_fraction_of_total(P, M))

# %% [markdown]
# ## 6. 1F1B: the same bubble, `p` micro-batches in memory <a id="one-f-one-b"></a>
#
# 1F1B (PipeDream-Flush; Narayanan et al. 2021) runs a backward as soon as one is due. Rank `r`
# warms up with `p-1-r` forwards, then alternates **one forward, one backward**, then drains the
# remaining backwards. Each backward frees a micro-batch, so rank `r` never holds more than
# `p-r` — independent of `m`. The idle slots are GPipe's, only moved around. Look for: the same
# bubble as GPipe, F and B interleaved in the middle of the grid, and stage 0 holding `p`.

# %%
show(one_f_one_b(P, M))

# %%
dtlab.viz.timeline(
    executed("1f1b"),
    title="1F1B: executed on the cluster",
    caption="Grey is idle time: compare the bubble with the simulated schedule above.",
)

# %%
compare("1f1b", bubble_fraction_of_total(P, M))

# %% [markdown]
# Why it matters: the memory bound is what lets `m` grow. Below, stage 0's peak for GPipe and
# 1F1B at `p = 4` as `m` grows — GPipe's grows with `m`, 1F1B's stops at `p`.

# %%
for m in (4, 8, 16, 32):
    print(
        f"m = {m:2}: stage 0 holds GPipe {simulate(gpipe(4, m)).peak_in_flight(0):2}, "
        f"1F1B {simulate(one_f_one_b(4, m)).peak_in_flight(0)} micro-batches"
    )

# %% [markdown]
# ### Exercise: write the 1F1B schedule <a id="exercise-1f1b"></a>
#
# Write `my_one_f_one_b(n_ranks, n_micro)`: a list of `n_ranks` lists, rank `r`'s actions in the
# order it runs them. Rank `r` holds stage `r`; build actions with `Action(stage, "F", mb)` and
# `Action(stage, "B", mb)` (or the strings `"0F1"`). Rank `r` warms up with
# `min(p-1-r, m)` forwards, then alternates a forward (the next micro-batch) and a backward (the
# oldest one), then drains. Mind `m < p`.
#
# The grader checks it as 1F1B is defined: the validator accepts it (every F before its B, no
# deadlock), the simulator finds GPipe's bubble `(p-1)/(m+p-1)` and no more, and rank `r` never
# holds more than `p-r` micro-batches — for `p` from 1 to 4 and odd and even `m`. Then it
# **executes** your lists on 2 ranks with the GPT in fp64 and compares the loss and every
# gradient with one process. Calling the library's generators is refused.


# %%
def my_one_f_one_b(n_ranks: int, n_micro: int) -> list[list[Action]]:
    # BEGIN SOLUTION fallback=dtlab.workshop.references:one_f_one_b_actions
    per_rank = []
    for r in range(n_ranks):
        warmup = min(n_ranks - 1 - r, n_micro)
        actions = [Action(r, "F", i) for i in range(warmup)]
        for i in range(n_micro - warmup):
            actions += [Action(r, "F", i + warmup), Action(r, "B", i)]
        actions += [Action(r, "B", i) for i in range(n_micro - warmup, n_micro)]
        per_rank.append(actions)
    return per_rank
    # END SOLUTION


# %% [markdown]
# Before the grader, the validator on your lists (a broken order gets an error naming the rank
# and the action):

# %%
mine = Schedule.from_torch_strings(
    {r: [str(a) for a in actions] for r, actions in enumerate(my_one_f_one_b(3, 5))}, "mine"
)
print(mine)
validate(mine)
print(simulate(mine).summary())

# %%
check_exercise("pipeline.one_f_one_b", my_one_f_one_b, cluster)

# %% [markdown]
# ## 7. The bubble against `m` and against `p` <a id="bubble-sweep"></a>
#
# The simulator's bubble for 1F1B at `p = 4` as `m` grows, with the formula `(p-1)/(m+p-1)`
# drawn through it. Look for: the points on the curve, 75% at `m = 1` (the naive split), under
# 10% only from `m = 28` — the reason real pipelines run dozens of micro-batches per step
# (and why 1F1B's bounded memory matters: GPipe would hold them all).

# %%
ms = list(range(1, 33))
fig = go.Figure()
fig.add_scatter(
    x=ms, y=[100 * bubble_fraction_of_total(4, m) for m in ms], mode="lines", name="(p-1)/(m+p-1)"
)
fig.add_scatter(
    x=ms,
    y=[100 * simulate(one_f_one_b(4, m)).bubble_fraction_of_total for m in ms],
    mode="markers",
    name="1F1B simulated",
)
fig.update_layout(
    title="Bubble against micro-batches, p = 4",
    xaxis_title="micro-batches m (count)",
    yaxis_title="idle / total (%)",
)
dtlab.viz.describe(fig, caption="The bubble falls as 1/m: below 10% only from m = 28.")

# %% [markdown]
# And against `p` at a fixed `m = 8`: deeper pipelines idle more, since fill and drain grow with
# `p` while the useful work per rank does not. Look for: 0% at `p = 1`, 48% at `p = 8`.

# %%
ps = list(range(1, 17))
fig = go.Figure()
fig.add_scatter(
    x=ps, y=[100 * bubble_fraction_of_total(p, 8) for p in ps], mode="lines", name="(p-1)/(m+p-1)"
)
fig.add_scatter(
    x=ps,
    y=[100 * simulate(one_f_one_b(p, 8)).bubble_fraction_of_total for p in ps],
    mode="markers",
    name="1F1B simulated",
)
fig.update_layout(
    title="Bubble against pipeline ranks, m = 8",
    xaxis_title="pipeline ranks p (count)",
    yaxis_title="idle / total (%)",
)
dtlab.viz.describe(fig, caption="Deeper pipelines idle more: 0% at p = 1, 48% at p = 8.")

# %% [markdown]
# ### Exercise: compute the bubble <a id="exercise-bubble"></a>
#
# Write `bubble_fraction(p, m, v=1)`: the share of the step a 1F1B pipeline idles
# (idle / total), with `v` model chunks per rank (section 8: interleaving; `v = 1` is plain
# 1F1B). Count it yourself: per rank, `m` micro-batches of useful work, and fill-and-drain slots
# that are `v` times shorter when each chunk is `1/v` of the rank's layers. The grader compares it
# with the simulator's measurement of the library's schedules for `p` up to 8, `m` up to 32,
# `v` = 1, 2, 4 (evaluated on every rank), and refuses `dtlab.cost.bubble` and the simulator.


# %%
def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    # BEGIN SOLUTION
    return (p - 1) / (v * m + p - 1)
    # END SOLUTION


# %%
check_exercise("pipeline.bubble_fraction", bubble_fraction, cluster)

# %% [markdown]
# ## 8. Interleaved 1F1B: a smaller bubble, more messages <a id="interleaved"></a>
#
# Give each rank `v` non-adjacent chunks (Narayanan et al. 2021, §2.2.2): with `v = 2` and
# `p = 2`, rank 0 holds stages 0 and 2, rank 1 stages 1 and 3. A micro-batch loops around the
# ranks `v` times, each visit `1/v` of the work, so each fill/drain slot is `v` times shorter:
# idle / total = `(p-1)/(v·m+p-1)`. Look for: twice as many, half as long actions, and a smaller
# bubble — and more in flight on rank 0.

# %%
show(interleaved_1f1b(P, M, 2))

# %%
dtlab.viz.timeline(
    executed("interleaved_1f1b"),
    title="Interleaved 1F1B (v=2): executed",
    caption="Grey is idle time: compare the bubble with the simulated schedule above.",
)

# %%
compare("interleaved_1f1b", interleaved_bubble_fraction_of_total(P, M, 2))

# %% [markdown]
# ### p2p bytes per step <a id="p2p-bytes"></a>
#
# The price of interleaving is on the wire. Each stage boundary that crosses ranks carries, per
# micro-batch, one activation forward and one gradient back, each `b·S·d·4` bytes. A plain
# pipeline has `p-1` such boundaries; interleaved has `v·p-1`; DualPipeV's V turns on the last
# rank, so it has `2(p-1)`. Look for: the bytes each rank sent in one step, counted from the real
# messages, equal to `bytes_sent_per_rank`, and interleaving's total 3× 1F1B's on 2 ranks.

# %%
for name in NAMES:
    counted = [r[name]["sent"] for r in run]
    formula = bytes_sent_per_rank(SCHEDULES[name](P, M), ACTIVATION_BYTES)
    print(f"{name:<17} counted {counted} B per rank, formula {formula}, total {sum(counted):,} B")

# %% [markdown]
# ## 9. Zero bubble: split the backward <a id="zero-bubble"></a>
#
# A backward computes two things: the gradient of the stage's **input** (`I`), which the previous
# stage is waiting for, and the gradient of its **weights** (`W`), which nobody needs until the
# optimizer step. ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism") runs `I` at once
# and defers `W` into the slots 1F1B leaves idle during the drain. With `F = I = W` its bubble is
# about a third of 1F1B's, at 1F1B's memory (activations are freed after `W`). Look for: `I`s
# early, `W`s filling the end of the grid.

# %%
show(SCHEDULES["zb_h1"](P, M))

# %% [markdown]
# On the cluster, look for the `W`s (their own colour on hover: phase W) filling what 1F1B left
# idle, and a measured bubble well below 1F1B's. Rank 0 is the exception the simulator does not
# know: its I is empty, so its W carries the whole backward.

# %%
dtlab.viz.timeline(
    executed("zb_h1"),
    title="ZB-H1: executed on the cluster",
    caption="Grey is idle time: compare the bubble with the simulated schedule above.",
)

# %%
compare("zb_h1")

# %% [markdown]
# ## 10. DualPipeV: feed the pipe from both ends <a id="dualpipe"></a>
#
# DeepSeek-V3's DualPipe, in its V form: rank `r` holds stages `r` and `2p-1-r`, so rank 0 holds
# both the embedding and the head, and the turn of the V sits on the last rank (no message there).
# Micro-batches enter the second half while the first is still filling, and the split backward
# fills the rest. Look for: the smallest bubble of the five, at the price of up to `2p`
# micro-batches in flight on rank 0's first stage.
#
# In `compare` below, look also at "executed order, equal costs": above the simulated bubble,
# for DualPipeV alone. The simulation lets a send go without waiting; the executor's sends are
# blocking (a send returns once its receive is posted), and with activations and gradients
# crossing in both directions at once, DualPipeV's ranks wait for each other in the steady
# state — `simulate(with_communication(schedule))`, which plays blocking messages, predicts it.

# %%
show(SCHEDULES["dualpipe_v"](P, M))

# %%
dtlab.viz.timeline(
    executed("dualpipe_v"),
    title="DualPipeV: executed on the cluster",
    caption="Grey is idle time: compare the bubble with the simulated schedule above.",
)

# %%
compare("dualpipe_v")

# %% [markdown]
# ## 11. The five side by side <a id="compare"></a>
#
# At `p = 4`, `m = 8`, `F = I = W = 1`: bubble in both conventions, the micro-batches stage 0
# holds at its peak, and point-to-point messages per step (activations forward plus gradients
# back, all ranks). No free lunch — every step down in the bubble is paid in memory, messages
# or both.

# %%
print(f"{'schedule':<26}{'idle/total':>11}{'idle/ideal':>11}{'stage-0 peak':>14}{'messages':>10}")
for name in NAMES:
    schedule = SCHEDULES[name](4, 8)
    sim = simulate(schedule)
    messages = sum(bytes_sent_per_rank(schedule, 1))  # one unit per message
    print(
        f"{schedule.name:<26}{sim.bubble_fraction_of_total:>11.1%}"
        f"{sim.bubble_ratio_to_ideal:>11.1%}{sim.peak_in_flight(0):>14}{messages:>10}"
    )

# %% [markdown]
# ## 12. Check your understanding

# %%
ask("pipeline.naive_split_idle")

# %%
ask("pipeline.bubble_fraction_of_total")

# %%
ask("pipeline.bubble_ratio_to_ideal")

# %%
ask("pipeline.conventions")

# %%
ask("pipeline.micro_batches_for_5_percent")

# %%
ask("pipeline.gpipe_vs_1f1b")

# %%
ask("pipeline.one_f_one_b_order")

# %%
ask("pipeline.one_f_one_b_stage_memory")

# %%
ask("pipeline.interleaved_bubble")

# %%
ask("pipeline.interleaved_p2p_ratio")

# %%
ask("pipeline.zero_bubble")

# %%
ask("pipeline.zb_h1_bubble")

# %%
ask("pipeline.dualpipe")

# %%
ask("pipeline.p2p_bytes")

# %%
ask("pipeline.cross_node")

# %%
ask("pipeline.what_it_solves")

# %%
ask("pipeline.explain")

# %% [markdown]
# ## 13. Shut the cluster down

# %%
cluster.close()
