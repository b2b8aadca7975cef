# %% [markdown]
# # Lab 14 — Interview capstone
#
# The last lab is practice for the real thing. It has three parts:
#
# 1. **the drill** — how to practise with `dtlab drill` in a terminal, and how it picks questions;
# 2. **a mock interview** — questions mixed across the labs, answered here;
# 3. **the system-design question** every distributed-training interview ends with — *"How would
#    you train a 70B model on 2,048 H100s?"* — worked through in the order a strong answer takes:
#    requirements → back-of-envelope numbers → parallelism plan → failure handling. Each stage
#    ends with a graded checkpoint: you write the calculation, and the grader checks it on the
#    ranks for a 70B, a 13B and a 7B job, so an answer that only fits one job does not pass.
#    Then the numbers a senior interviewer probes next: where each parallelism's communication
#    hides behind compute, how two published runs (Llama 3 405B, DeepSeek-V3) follow from them,
#    what an honest MFU counts, and what the GPU runtime does underneath.
#
# It closes with your mastery per topic, computed from every answer you have recorded.

# %%
import math

import plotly.graph_objects as go

import dtlab
import dtlab.viz
from dtlab.cost import (
    TwoTierCluster,
    bubble_fraction_of_total,
    gpu,
    training_flops,
)
from dtlab.cost.caching_allocator import fragmentation_demo
from dtlab.cost.checkpoint_cost import waste_if_async_is_priced_as_sync
from dtlab.cost.crossover import (
    cp_min_block_tokens,
    critical_intensity,
    dp_min_tokens_per_gpu,
    dp_tokens_per_replica,
    ep_compute_to_comm_ratio,
    pp_compute_to_p2p_ratio,
    tp_max_degree,
)
from dtlab.cost.mesh_reduction import gradient_reduction_ranks
from dtlab.cost.mfu import mfu_report
from dtlab.cost.weight_sync import weight_sync_seconds
from dtlab.memory import model_state_bytes
from dtlab.mesh import Layout
from dtlab.plan import (
    JOBS,
    LLAMA_70B,
    ParallelPlan,
    Requirements,
    activation_bytes_per_gpu,
    pipeline_bubble,
    plan_problems,
)
from dtlab.plan.worked import print_published_steps
from dtlab.quiz import ask, check_exercise, learner_id, load_bank, read_progress
from dtlab.quiz.drill import item_weight, mock_set
from dtlab.quiz.mastery import mastery_by_topic, mastery_chart, mastery_table

dtlab.viz.setup_notebook()

# %% [markdown]
# ## 1. Practising with the drill <a id="drill"></a>
#
# In a terminal:
#
# ```
# dtlab drill                      # 10 questions from every topic
# dtlab drill --topic zero --n 5   # one topic
# dtlab drill --mock               # a timed mock interview mixed across topics, scored by topic
# dtlab progress                   # your mastery per topic (--chart mastery.html for the plot)
# ```
#
# Answer with a choice key (`b`), several keys (`a c`), a number with or without a unit
# (`1.12 TB`), step keys in order, or — for spoken answers — the rubric points you made
# (`1 3`). `skip` moves on, `quit` stops. Every answer is recorded, and the drill **brings back
# what you missed**: an item's chance of being picked is proportional to its weight below.
#
# Look for: a missed item weighs four times a solved one, and an unseen item twice.

# %%
for label, latest in [
    ("never tried", None),
    ("latest missed", 0.0),
    ("half right", 0.5),
    ("solved", 1.0),
]:
    print(f"{label:>13}: weight {item_weight(latest):.1f}")

# %% [markdown]
# A mock interview deals questions round-robin over the topics, so no topic is left out. With a
# fixed seed the set is reproducible; your own history changes which items come first.

# %%
bank = load_bank()
for item in mock_set(bank.values(), 6, seed=12):
    print(f"{item.topic:>16}  {item.kind:<8}  {item.id}")

# %% [markdown]
# ## 2. A mock interview <a id="mock-interview"></a>
#
# Five questions from earlier labs. Give yourself about 90 seconds each — in an interview you
# would answer out loud; say the reason before you click.

# %%
ask("setup.unmatched_collective")

# %%
ask("collectives.latency_or_bandwidth")

# %%
ask("data_parallel.step_order")

# %%
ask("zero.stage_choice")

# %%
ask("data_parallel.overlap_explain")

# %% [markdown]
# ## 3. System design: training a 70B model <a id="system-design"></a>
#
# A strong answer is a chain of numbers, each one justifying the next decision:
#
# | stage | question | numbers |
# |---|---|---|
# | requirements | what must the job do, on what? | parameters, tokens, GPUs, deadline |
# | back of the envelope | what does it cost? | FLOPs, days at an MFU, bytes per GPU |
# | parallelism plan | how are the GPUs split? | TP within a node, PP across, DP (+ZeRO) for the rest; memory, bubble |
# | failure handling | what happens when a GPU dies? | cluster MTBF, checkpoint cost, Young/Daly interval |
#
# The graders run your functions on the ranks of this cluster (every rank must compute the same
# plan from the same config — in a real job, ranks that disagree build mismatched groups and hang).

# %%
cluster = dtlab.Cluster(2)
print(f"{cluster.world_size} ranks on {cluster.backend}")

# %% [markdown]
# ### 3.1 Requirements <a id="requirements"></a>
#
# The job: a Llama-2-70B-shaped model (80 layers, d = 8192, 64 heads, 4k context), 2 T tokens,
# 4 M tokens per step, on 2,048 H100s. The first number to produce is the compute: training
# costs about **6 FLOPs per parameter per token** (2 forward, 4 backward), so `C ≈ 6·N·D`.

# %%
req = LLAMA_70B
peak = gpu(req.gpu).bf16_dense_flops
flops = training_flops(req.tokens, req.params)
print(req)
print(f"C = 6·N·D = 6 × {req.params:.0e} × {req.tokens:.0e} = {flops:.2e} FLOPs")
print(
    f"peak {peak / 1e12:.0f} TFLOP/s per GPU (dense BF16), {req.n_gpus} GPUs, assumed MFU {req.mfu:.0%}"
)

# %% [markdown]
# Numbers are not the only requirements: an interviewer also listens for the targets you set
# before designing anything.

# %%
ask("system_design.requirements")

# %% [markdown]
# ### Checkpoint 1: how many days?
#
# Write `training_days(req)`: the wall-clock days to train `req.params` parameters on
# `req.tokens` tokens with `req.n_gpus` GPUs of type `gpu(req.gpu)` (use its `bf16_dense_flops`)
# running at model FLOPs utilisation `req.mfu`.


# %%
def training_days(req: Requirements) -> float:
    """Days of training: 6·N·D FLOPs at n_gpus × peak × MFU FLOP/s."""
    # BEGIN SOLUTION
    flop_per_s = req.n_gpus * gpu(req.gpu).bf16_dense_flops * req.mfu
    return 6 * req.params * req.tokens / flop_per_s / 86_400
    # END SOLUTION


# %%
check_exercise("capstone.training_days", training_days, cluster)

# %% [markdown]
# About twelve days at 40% MFU. MFU is the lever to defend: every 10 points of MFU is days of a
# 2,048-GPU cluster. (Meta reports 38–43% MFU for Llama 3's BF16 training on H100s.)
#
# ### 3.2 Back of the envelope: memory per GPU <a id="memory"></a>
#
# Mixed-precision Adam keeps **16 bytes per parameter** (bf16 weights 2 + grads 2, fp32 master
# copy, momentum and variance 4 + 4 + 4): 1.12 TB for 70B, fourteen H100s' worth before one
# activation. Tensor and pipeline parallelism split the *model* over `tp·pp` GPUs; ZeRO then
# shards the *state* of each model shard over the `dp` replicas — stage 1 the optimizer state,
# stage 2 also the gradients, stage 3 also the weights.
#
# ### Checkpoint 2: memory per GPU
#
# Write `memory_per_gpu(params, plan)`: the model-state bytes one GPU holds under `plan`
# (`plan.dp`, `plan.tp`, `plan.pp`, `plan.zero_stage`), using the 2 + 2 + 12 bytes above.


# %%
def memory_per_gpu(params: float, plan: ParallelPlan) -> float:
    """Model-state bytes on one GPU: weights, gradients and Adam state of its shard."""
    # BEGIN SOLUTION fallback=dtlab.plan:state_bytes_per_gpu
    shard = params / (plan.tp * plan.pp)
    weights, grads, optimizer = 2 * shard, 2 * shard, 12 * shard
    if plan.zero_stage >= 1:
        optimizer /= plan.dp
    if plan.zero_stage >= 2:
        grads /= plan.dp
    if plan.zero_stage >= 3:
        weights /= plan.dp
    return weights + grads + optimizer
    # END SOLUTION


# %%
check_exercise("capstone.memory_per_gpu", memory_per_gpu, cluster)

# %% [markdown]
# The same function, for the options an interviewer expects you to weigh. Look for: plain DP
# (ZeRO-0) needs the full 1.12 TB on every GPU; ZeRO-3 alone gets state under 1 GB but moves
# 1.5× DDP's bytes per step; TP = 8 within a node cuts everything by 8 with fast NVLink traffic.
# The library's `model_state_bytes` (the formula behind the quiz keys) agrees with yours.

# %%
options = {
    "DP 2048, ZeRO-0": ParallelPlan(dp=2048, tp=1, pp=1, zero_stage=0),
    "DP 2048, ZeRO-1": ParallelPlan(dp=2048, tp=1, pp=1, zero_stage=1),
    "DP 2048, ZeRO-3": ParallelPlan(dp=2048, tp=1, pp=1, zero_stage=3),
    "TP 8 × DP 256, ZeRO-1": ParallelPlan(dp=256, tp=8, pp=1, zero_stage=1),
    "TP 8 × PP 4 × DP 64, ZeRO-1": ParallelPlan(dp=64, tp=8, pp=4, zero_stage=1),
}
for name, plan in options.items():
    mine = memory_per_gpu(req.params, plan)
    shard = math.ceil(req.params / (plan.tp * plan.pp))
    formula = model_state_bytes(shard, plan.dp, plan.zero_stage).total
    print(f"{name:<28} {mine / 1e9:8.1f} GB   (formula {formula / 1e9:8.1f} GB)")

fig = go.Figure(
    go.Bar(x=list(options), y=[memory_per_gpu(req.params, p) / 1e9 for p in options.values()]),
    layout={
        "title": "70B model state per GPU against the 80 GB of an H100 (dotted line)",
        "xaxis": {"title": "parallelism plan (name)"},
        "yaxis": {"title": "model state per GPU (GB, log scale)", "type": "log"},
        "showlegend": False,
        "shapes": [
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": 80,
                "y1": 80,
                "line": {"dash": "dot", "color": "#cf222e"},
            }
        ],
    },
)
dtlab.viz.describe(
    fig, caption="ZeRO-3, or TP (× PP) with ZeRO-1, brings 70B under the line; plain DP does not."
)


# %%
ask("zero.per_gpu_70b_on_64")

# %% [markdown]
# Now be the interviewer: a candidate's 70B arithmetic, with a mistake to spot.

# %%
ask("system_design.dialogue_70b")

# %% [markdown]
# ### 3.3 The parallelism plan <a id="parallelism-plan"></a>
#
# An expert's order of preference, with the reason for each:
#
# 1. **TP within a node** (≤ 8): its forward collectives sit on the critical path of every layer
#    (only async TP hides them), and backward's input-gradient all-reduce hides only behind that
#    layer's weight-gradient GEMM, so they need NVLink; the smallest TP that fits is best (small
#    matmuls lose efficiency).
# 2. **PP across nodes** only if memory still does not fit: its cost is the bubble
#    `(p-1)/(m+p-1)`, so it needs enough micro-batches (interleaving divides the bubble by `v`).
# 3. **DP for the rest**, with the lowest ZeRO stage that fits (ZeRO-3 adds a parameter
#    all-gather in backward).
#
# Memory per GPU now also counts activations: with sequence parallelism and selective
# recomputation one layer keeps `34·s·b·h / t` bytes, and under 1F1B stage `i` holds `pp − i`
# micro-batches of its layers — `L` layers' worth on stage 0 when stages are equal; with uneven
# stages the planner prices every stage and reports the worst. `plan_problems(req, plan)` is the
# interviewer's checklist: GPU count, TP within a node, heads divisible, whole micro-batches, and
# the job's policy — memory ≤ `usable_memory_fraction` of HBM (default 90 %), bubble ≤
# `max_bubble` (default 15 %) — each rejection naming the policy and by how much. Try a plan:

# %%
print(plan_problems(req, ParallelPlan(dp=32, tp=8, pp=8, zero_stage=1)))
print(plan_problems(req, ParallelPlan(dp=128, tp=8, pp=2, zero_stage=1)))

# %%
ask("system_design.planning_order")

# %% [markdown]
# ### Checkpoint 3: choose a plan
#
# Write `choose_plan(req)`: return a `ParallelPlan` that passes `plan_problems(req, plan)` for
# any of the jobs (`JOBS`: 70B on 2,048 H100, 13B on 256 A100-80GB, 7B on 64 H100). Search in the
# expert's order above — smallest TP first, then the fewest pipeline stages, then the lowest
# ZeRO stage — and return the first plan that works.


# %%
def choose_plan(req: Requirements) -> ParallelPlan:
    """The first plan, in the expert's order of preference, that passes plan_problems."""
    # BEGIN SOLUTION fallback=dtlab.plan:first_plan_that_fits
    for tp in (t for t in (1, 2, 4, 8) if t <= req.gpus_per_node and req.n_heads % t == 0):
        for pp in (p for p in range(1, req.n_layers + 1) if req.n_layers % p == 0):
            if req.n_gpus % (tp * pp):
                continue
            for zero_stage in (1, 2, 3):
                for virtual_stages in (1, 2, 4) if pp > 1 else (1,):
                    dp = req.n_gpus // (tp * pp)
                    plan = ParallelPlan(dp, tp, pp, zero_stage, 1, virtual_stages)
                    if not plan_problems(req, plan):
                        return plan
    raise ValueError(f"no plan fits {req.name}")
    # END SOLUTION


# %%
check_exercise("capstone.choose_plan", choose_plan, cluster)

# %% [markdown]
# Your plans, with the numbers that justify them. Look for: memory under the ~77 GB usable, and
# **no pipeline** in any of them — once ZeRO shards the optimizer state (or, at 70B, everything:
# ZeRO-3, i.e. FSDP) and TP splits the layers, the model fits, so a pipeline would only add its
# bubble. PP earns its place when TP within a node and ZeRO together cannot fit (hundreds of
# billions of parameters, long contexts) or when DP's all-reduce across thousands of GPUs gets too
# slow; the last line shows what pp = 8 would cost this job in idle time.

# %%
for job in JOBS:
    plan = choose_plan(job)
    total = memory_per_gpu(job.params, plan) + activation_bytes_per_gpu(job, plan)
    print(
        f"{job.name:<22} dp={plan.dp:<5} tp={plan.tp} pp={plan.pp} ZeRO-{plan.zero_stage}"
        f"  {total / 1e9:5.1f} GB/GPU  bubble {pipeline_bubble(job, plan):.1%}"
    )
print(f"bubble with pp = 8 and 32 micro-batches: {bubble_fraction_of_total(8, 32):.1%}")

# %% [markdown]
# At 405B the answer changes: the same reasoning, one size up.

# %%
ask("system_design.four_oh_five_b_plan")

# %% [markdown]
# ### 3.4 Failure handling <a id="failure-handling"></a>
#
# With 2,048 GPUs something fails every day: if each GPU fails independently once in
# `M` hours, the job sees a failure every `M / n` hours. The plan an interviewer wants to hear:
#
# - **detect** — NCCL/collective timeouts and a watchdog turn a dead rank into an error, not a hang;
# - **restart** — the launcher (torchrun, Slurm) restarts the job on healthy nodes (spares standing by);
# - **resume** — from the last **sharded checkpoint**, saved asynchronously so training barely pauses;
# - **how often** — Young/Daly: checkpoint every `τ* = sqrt(2·C·MTBF)`, where `C` is what one
#   checkpoint *costs the training loop*. Too rarely wastes redone work; too often wastes time saving.
#
# What `C` is depends on how you save. A checkpoint holds **12 bytes per parameter** (FP32 master
# weights and Adam's two moments: what resuming needs; the BF16 weights are the master rounded, so
# a framework that also saves them writes 14 — this workbench always means 12). A *synchronous*
# save stops training for the whole write, `W = 12·P / storage bandwidth`. An *asynchronous* save
# stops it only while every GPU copies its `1/n` share to pinned host memory over its PCIe link —
# the **stall** `S = 12·P / n / PCIe bandwidth` — then a background thread writes to storage while
# training goes on. So with asynchronous saves `C = S`, not `W`. `W` still matters twice: the next
# snapshot cannot start before the last one is on storage (`τ ≥ W`), and a failure mid-write loses
# the work back to the previous finished checkpoint (expected loss `τ/2 + W` per failure).
#
# ### Checkpoint 4: the checkpoint interval <a id="checkpoint-interval"></a>
#
# Write `checkpoint_interval_s(req)` for **asynchronous** sharded checkpoints: the stall is
# `12·req.params / req.n_gpus` bytes at `gpu(req.gpu).host_link.bandwidth_bytes_per_s`; the write
# is `12·req.params` bytes at `req.storage_write_bytes_per_s`; each GPU's MTBF is
# `req.per_gpu_mtbf_hours`. Return `max(sqrt(2·S·MTBF), W)` in seconds.


# %%
def checkpoint_interval_s(req: Requirements) -> float:
    """Young/Daly for asynchronous saves: max(sqrt(2·stall·MTBF), write time), in seconds."""
    # BEGIN SOLUTION
    stall_s = 12 * req.params / req.n_gpus / gpu(req.gpu).host_link.bandwidth_bytes_per_s
    write_s = 12 * req.params / req.storage_write_bytes_per_s
    mtbf_s = req.per_gpu_mtbf_hours * 3600 / req.n_gpus
    return max(math.sqrt(2 * stall_s * mtbf_s), write_s)
    # END SOLUTION


# %%
check_exercise("capstone.checkpoint_interval", checkpoint_interval_s, cluster)

# %% [markdown]
# The numbers behind the answer, synchronous against asynchronous. Look for: a failure about
# once a day; synchronous saves every ~20 minutes losing ~1.4% of the run; asynchronous saves
# priced *as if* they were synchronous (the mistake this checkpoint is about) still checkpointing
# every ~20 minutes and losing ~0.7%, mostly to redone work; and at their own interval, about half
# a minute, losing under 0.1%.

# %%
costs = waste_if_async_is_priced_as_sync(
    req.params,
    req.n_gpus,
    req.per_gpu_mtbf_hours * 3600,
    req.storage_write_bytes_per_s,
    gpu(req.gpu).host_link.bandwidth_bytes_per_s,
)
print(
    f"checkpoint {12 * req.params / 1e12:.2f} TB: write W = {costs['write_s']:.1f} s, "
    f"stall S = {costs['stall_s'] * 1e3:.1f} ms; cluster MTBF {costs['mtbf_s'] / 3600:.1f} h"
)
print(
    f"synchronous:            every {costs['sync_interval_s'] / 60:5.1f} min, "
    f"waste {costs['sync_waste']:.2%}"
)
print(
    f"async at that interval: every {costs['sync_interval_s'] / 60:5.1f} min, "
    f"waste {costs['async_at_sync_interval_waste']:.2%}"
)
print(
    f"async at its own:       every {costs['async_interval_s'] / 60:5.1f} min, "
    f"waste {costs['async_waste']:.2%}"
)

# %%
ask("fault_tolerance.recovery_order")

# %%
ask("checkpointing.young_daly")

# %%
ask("system_design.async_checkpoint_interval")

# %% [markdown]
# ### 3.5 Compute against communication, for every parallelism <a id="crossovers"></a>
#
# Every parallelism moves bytes while the GPU computes; the transfer hides when the computation
# beside it takes at least as long: `FLOPs / C ≥ bytes / B`. So the work must do at least `C/B`
# FLOPs per byte moved — the hardware's **critical intensity**: ~2,200 FLOP/B for an H100 on
# NVLink 4, ~19,800 on one 400 Gb/s NIC. Each parallelism's FLOPs-per-byte depends on one size,
# and solving for it gives a threshold (`dtlab.cost.crossover`):
#
# | parallelism | compute | bytes moved | hidden when |
# |---|---|---|---|
# | data | backward `4·P·T` | `2(N-1)/N·b·P` per GPU | tokens per replica `T ≥ 2(N-1)/N·b·C/(4B)` |
# | tensor (MLP, m matrices: 2, or 3 gated) | `2·m·d·F/t` per token | `2(t-1)/t·b·d` per token | `t ≤ 1 + m·F·B/(b·C)` |
# | context (ring) | `4·q·k·d` per block pair | `2·k·d_kv·b` (next K, V) | `q ≥ b·d_kv·C/(2·d·B)` (×2 causal) |
# | expert | `2·3·d·F_e` per routed token | `2·d·b·(ep-1)/ep` | `3·F_e ≥ b·(ep-1)/ep·C/B` |
# | pipeline | `24·L·d²` per token | `b·d` per token | `24·L·d ≥ b·C/B` |
#
# Look for: DP needs only a few thousand tokens per replica on rail-optimised nodes; TP
# hides up to degree ~20 on NVLink for a gated (SwiGLU) 28,672-wide FFN but only 3 across nodes; a ring-attention
# block of a few hundred tokens hides on NVLink (GQA shrinks K and V); fine-grained experts
# (2,048 wide) cannot hide their all-to-all across nodes — the ratio is below 1, which is why
# DeepSeek-V3 overlaps one micro-batch's all-to-all with another's compute — but can inside a
# node; and a pipeline stage out-computes its activation send by ~50× even on the network.

# %%
h100, nodes = gpu("h100_sxm"), TwoTierCluster(16, 8)
print(f"critical intensity: NVLink {critical_intensity(h100, 'nvlink4'):,.0f} FLOP/B, "
      f"one NIC {critical_intensity(h100, 'ib_ndr_400'):,.0f} FLOP/B")  # fmt: skip
print(
    f"DP  min tokens per replica, 16 rail-optimised nodes: {dp_min_tokens_per_gpu(h100, nodes):,.0f}"
)
for where, link in (("NVLink", "nvlink4"), ("network", "ib_ndr_400")):
    print(
        f"{where:>8}: TP max degree (gated F=28,672) {tp_max_degree(28672, h100, link, matrices=3):>3};  "
        f"CP min block (d=8,192, GQA d_kv=1,024, causal) {cp_min_block_tokens(8192, 1024, h100, link, causal=True):>7,.0f} tokens;  "
        f"EP compute/comm (F_e=2,048, ep=64, FP8 dispatch, BF16 combine) {ep_compute_to_comm_ratio(2048, 64, h100, link, act_bytes=1, combine_bytes=2):4.2f};  "
        f"PP compute/p2p (10 layers, d=8,192) {pp_compute_to_p2p_ratio(8192, 10, h100, link):7.1f}"
    )

# %% [markdown]
# ### Checkpoint 5: the data-parallel crossover <a id="dp-crossover-exercise"></a>
#
# Write `dp_min_tokens(peak_flops, bus_bytes_per_s, ranks, grad_bytes)`: the fewest tokens a
# data-parallel replica must process per step for its backward pass (`4·P` FLOPs per token, at
# `peak_flops`) to take as long as the ring all-reduce of its gradients (`2(N-1)/N · grad_bytes · P`
# bytes per GPU at `bus_bytes_per_s`). The grader tries an H100 cluster with and without rails,
# an FP32 reduction, and two cases it never shows you.


# %%
def dp_min_tokens(
    peak_flops: float, bus_bytes_per_s: float, ranks: int, grad_bytes: float
) -> float:
    """Tokens per replica at which backward's compute time equals the all-reduce time."""
    # BEGIN SOLUTION
    ring_bytes_per_param = 2 * (ranks - 1) / ranks * grad_bytes
    return ring_bytes_per_param * peak_flops / (4 * bus_bytes_per_s)
    # END SOLUTION


# %%
check_exercise("capstone.dp_crossover", dp_min_tokens, cluster)

# %%
ask("performance.tp_max_degree")

# %%
ask("performance.ep_ratio_across_nodes")

# %% [markdown]
# ### 3.6 Published runs, read through these numbers <a id="case-studies"></a>
#
# **Llama 3 405B** (Llama Team, "The Llama 3 Herd of Models", 2024, Sec. 3.3): 16,384 H100s, eight
# per node, one 400 Gb/s NIC per GPU (RoCE). Layout TP 8 × CP 1 × PP 16 × DP 128 at 8K context,
# a 16M-token batch: TP inside the NVLink domain, PP across nodes, FSDP-style DP outermost. With
# TP filling the node each DP group owns one 50 GB/s NIC per GPU, so the DP crossover is ~20K
# tokens for BF16 gradients and ~39K for FP32; each replica's 16M / 128 ≈ 131K tokens per step sit
# ~3–7× above it, so even the FP32 gradient reduce-scatter they use hides. The first and last stage
# run one layer fewer (stage balancing: it moves the activation peak to stage 1), the FSDP does not
# reshard after forward (one gather and one reduction per step instead of per micro-batch), and
# the 131K stage all-gathers K and V for CP 16 — exposed, but small with 8 K/V heads. Reported:
# 38–43 % BF16 MFU; 466 job interruptions in 54 days, over 90 % effective training time.
#
# **DeepSeek-V3** (DeepSeek-AI, 2024, Sec. 3): 671B parameters, 37B active, 2,048 H800s. No tensor
# parallelism at all: PP 16 with the DualPipe schedule, EP 64 across 8 nodes, ZeRO-1 DP. Experts are
# 2,048 wide, so cross-node all-to-all takes about as long as the experts' compute (the paper:
# "approximately 1:1"). Their answers: route each token to at most 4 nodes (node-limited routing:
# ~3.5 network copies per token instead of 7), FP8 dispatch, overlap one micro-batch's all-to-all
# with another's compute (DualPipe, whose idle time is ~0.4 of 1F1B's), and dedicate 20 of the 132
# SMs to communication kernels.
#
# **Megatron-LM 2021** (Narayanan et al., Tables 1–2): GPT-3 175B with PTD-P (TP 8, PP 12) held
# 153 → 141 TFLOP/s per A100 from 384 to 1,536 GPUs; ZeRO-3 without model parallelism fell 144 → 44:
# its bytes per GPU stay constant while compute per GPU halves with every doubling.
#
# dtlab's planner prices each of these layouts (below: published against predicted step, MFU on 6N
# and on 6N + causal attention). Look for: every row within ±15 % of its published step — Llama 3
# and DeepSeek-V3 a little fast (0.90–0.95), PTD-P within 3 % (0.97–1.00), the 1T run and
# Korthikanti et al.'s measured Selene runs 1.02–1.14, each 2021 layout priced as Megatron-LM of
# 2021 ran it (no sequence parallelism), and the ZeRO-3 rows (0.88–1.07) priced as DeepSpeed ran
# stage 3 in 2021: a collective per parameter tensor behind a device sync, host work growing with
# N (lab 11's published-runs section).

# %%
print_published_steps()

# %%
print(f"Llama 3 405B tokens per DP replica: {dp_tokens_per_replica(16 * 2**20, 128):,.0f}")

# %%
ask("system_design.llama3_layout")

# %%
ask("system_design.deepseek_v3_layout")

# %%
ask("system_design.llama3_allgather_cp_exposed")

# %%
ask("system_design.deepseek_node_limited_copies")

# %% [markdown]
# ### 3.7 An honest MFU <a id="honest-mfu"></a>
#
# One run, four utilisation numbers, depending on which FLOPs are counted: `6N` only; plus causal
# attention `6·L·s·d`; plus full-square attention `12·L·s·d` (PaLM's appendix B); or the hardware
# FLOPs with full recomputation `8N + 16·L·s·d` (an HFU — PaLM reports 46.2% MFU beside 57.8% HFU;
# Megatron-LM's `96·B·s·l·h²` counts the recomputed forward too). MFU counts what the model needs,
# against the dense peak. Below, an illustrative throughput for a 405B model at 8K context on
# 16,384 H100s, chosen so that the `6N` count gives 40% (near Llama 3's reported 38–43%). Look
# for: the same run reading anywhere from 40% to ~58% depending on what is counted.

# %%
tokens_per_s = 0.40 * 16384 * h100.bf16_dense_flops / (6 * 405e9)
report = mfu_report(
    tokens_per_s=tokens_per_s, n_gpus=16384, peak_flops=h100.bf16_dense_flops,
    n_params=405e9, n_layers=126, seq_len=8192, d_model=16384,
)  # fmt: skip
print(f"{tokens_per_s:,.0f} tokens/s")
for name, value in report.items():
    print(f"{name:<30} {value:.1%}")

# %%
ask("performance.honest_mfu")

# %% [markdown]
# ### 3.8 What the GPU runtime does underneath <a id="gpu-runtime"></a>
#
# Three things an interviewer probes once the plan is on the board:
#
# - **The caching allocator.** PyTorch keeps freed blocks for reuse instead of returning them to
#   the driver: `memory_allocated()` counts live tensors, `memory_reserved()` what the
#   allocator holds. Reserved minus allocated is cache, and part of it may be *fragmented* — free
#   blocks too small or in the wrong segments for the next large request, so an OOM can say
#   "X GiB reserved but unallocated". `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` maps
#   growing segments in virtual memory so blocks can be extended instead of carved into pieces.
#   `memory._record_memory_history()` and `memory._dump_snapshot()` record every allocation
#   with its stack, viewable at pytorch.org/memory_viz.
# - **Streams and launch order.** Kernels on one stream run in order; across streams only events
#   order them. NCCL runs on its own streams so communication overlaps compute. The host launches
#   kernels into a few hardware queues; Megatron-LM sets `CUDA_DEVICE_MAX_CONNECTIONS=1` so there
#   is one queue and the GPU starts kernels in launch order — the communication kernel launched
#   before the GEMM it must overlap really is scheduled first.
# - **Communication kernels use SMs.** An NCCL collective runs as a kernel whose blocks (one per
#   channel) occupy SMs while they copy and add; a GEMM beside it gets fewer SMs and runs slower,
#   so "overlapped" communication is not free. Fewer channels (`NCCL_MAX_NCHANNELS`), copy-engine
#   or switch-based (NVLS/SHARP) transfers leave more SMs for compute; DeepSeek-V3 caps its
#   communication at 20 SMs.

# %% [markdown]
# The allocator's rules are simple enough to replay: `dtlab.cost.caching_allocator` models them
# (best fit, split, merge only inside a segment, release free segments before giving up). Below,
# each step frees a 150 MiB workspace and keeps a 100 MiB tensor carved out of the cached block,
# stranding 50 MiB beside it; then a 200 MiB request arrives on a 1 GiB device. Look for: the OOM
# with over 400 MiB of the device unused and 300 MiB "reserved but unallocated", and the same
# sequence fitting with expandable segments.

# %%
for expandable in (False, True):
    state = fragmentation_demo(capacity_mib=1024, expandable_segments=expandable)
    print(
        f"expandable_segments={expandable!s:<5}: allocated {state['allocated_mib']:.0f} MiB, "
        f"reserved {state['reserved_mib']:.0f} MiB, largest free block "
        f"{state['largest_free_mib']:.0f} MiB -> 200 MiB request "
        f"{'fits' if state['request_fits'] else 'OOM: ' + state['error']}"
    )

# %%
ask("performance.reserved_vs_allocated")

# %%
ask("nccl.cuda_device_max_connections")

# %% [markdown]
# ### 3.9 Beyond one job: meshes, restarts, weight sync <a id="at-scale"></a>
#
# - **N-D meshes.** Ranks sit on a grid `(pp, dp, cp, tp)`, `tp` innermost so a TP group is one
#   node's consecutive GPUs. Each kind of parameter reduces its gradient over a different slice:
#   dense TP shards over `dp × cp`; LayerNorm weights replicated across TP also over `tp` when
#   sequence parallelism split the sequence among them; experts over the expert-data-parallel
#   group. Global gradient-norm clipping sums each rank's squared norm over the model-parallel
#   ranks, counting replicated parameters once. **Hybrid sharding** (HSDP) is a 2-D DP mesh: shard
#   inside a node, replicate across nodes.
# - **Elastic and in-job recovery.** `torchrun --nnodes=MIN:MAX` restarts every worker from the
#   last checkpoint when membership changes; in-job fault tolerance (e.g. torchft) lets the
#   surviving replicas of a replicated dimension finish a step without the failed one, then
#   brings a replacement back by copying a peer's state.
# - **Resharding checkpoints.** Distributed checkpoints save each shard with its global offsets,
#   so a job with a different layout reads exactly the slices it now owns.
# - **RL weight sync.** In on-policy RL post-training the trainer's new weights must reach the
#   inference engine each step: `2·P` bytes in BF16, resharded to the engine's layout.
# - **Local SGD / DiLoCo.** Where links are slow (across data centres), replicas take `H` steps
#   alone and then average the change in weights, applied by an outer optimizer: one all-reduce
#   per `H` steps instead of every step, at a cost in optimisation that must be measured.
# - **Numerics at scale.** Long runs meet loss spikes: output logits or attention logits drift
#   large and the softmax becomes ill-conditioned in low precision. Guards chosen before the run —
#   z-loss (a `10⁻⁴·log²Z` penalty on the softmax normaliser, PaLM), QK-norm (normalise queries and
#   keys, ViT-22B, OLMo 2), gradient clipping — and a response during it: rewind to a checkpoint
#   before the spike and skip the batches around it (PaLM).

# %%
layout = Layout(dp=4, tp=8, pp=2)
for kind in ("dense", "tp_replicated", "tp_replicated_sp"):
    print(f"{kind:<17} rank 0 reduces with ranks {gradient_reduction_ranks(layout, kind, 0)}")
print(
    f"70B BF16 weights over one node's 400 GB/s: {weight_sync_seconds(70e9, 400e9):.2f} s per sync"
)

# %%
ask("data_parallel.reduce_groups_mesh")

# %% [markdown]
# ### Put it all together
#
# The whole answer, out loud, in five minutes: requirements, numbers, plan, failures. Then tick
# the rubric points you made.

# %%
ask("system_design.plan_out_loud")

# %% [markdown]
# ## 4. Your mastery <a id="mastery"></a>
#
# Every quiz cell, exercise and drill answer you gave is in your progress file. Mastery per topic
# weights each item's latest attempt most (then 1/2, 1/4, … for older ones) and counts items you
# have not tried as 0 — so the bars show what is left to study. `dtlab progress` prints the same.

# %%
progress = read_progress(learner=learner_id())
rows = mastery_by_topic(progress.records, bank)
print(mastery_table(rows))
mastery_chart(rows, title="Your mastery per topic")

# %% [markdown]
# ## 5. Shut the cluster down

# %%
cluster.close()
