# %% [markdown]
# # Lab 12 — Interview capstone
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
#
# It closes with your mastery per topic, computed from every answer you have recorded.

# %%
import math

import plotly.graph_objects as go

import dtlab
import dtlab.viz
from dtlab.cost import (
    bubble_fraction_of_total,
    cluster_mtbf,
    expected_waste_fraction,
    gpu,
    training_flops,
    young_daly_interval,
)
from dtlab.memory import model_state_bytes
from dtlab.plan import (
    JOBS,
    LLAMA_70B,
    ParallelPlan,
    Requirements,
    activation_bytes_per_gpu,
    pipeline_bubble,
    plan_problems,
)
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
    # BEGIN SOLUTION
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

go.Figure(
    go.Bar(x=list(options), y=[memory_per_gpu(req.params, p) / 1e9 for p in options.values()]),
    layout={
        "title": "70B model state per GPU (80 GB H100 line)",
        "yaxis": {"title": "GB", "type": "log"},
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
# 1. **TP within a node** (≤ 8): its all-reduces sit on the critical path of every layer, so
#    they need NVLink; the smallest TP that fits is best (small matmuls lose efficiency).
# 2. **PP across nodes** only if memory still does not fit: its cost is the bubble
#    `(p-1)/(m+p-1)`, so it needs enough micro-batches (interleaving divides the bubble by `v`).
# 3. **DP for the rest**, with the lowest ZeRO stage that fits (ZeRO-3 adds a parameter
#    all-gather in backward).
#
# Memory per GPU now also counts activations: with sequence parallelism and selective
# recomputation one layer keeps `34·s·b·h / t` bytes, and the first pipeline stage holds
# `pp` micro-batches of `L/pp` layers — `L` layers' worth. `plan_problems(req, plan)` is the
# interviewer's checklist: GPU count, TP within a node, divisibility, whole micro-batches,
# memory ≤ 90% of HBM, bubble ≤ 15%. Try a plan:

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
    # BEGIN SOLUTION
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
# Your plans, with the numbers that justify them. Look for: memory under the 72 GB usable, and
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
# - **resume** — from the last **sharded checkpoint**, written asynchronously so training barely pauses;
# - **how often** — Young/Daly: checkpoint every `τ* = sqrt(2·C·MTBF)`, where `C` is the time to
#   write one checkpoint. Too rarely wastes redone work; too often wastes time writing.
#
# ### Checkpoint 4: the checkpoint interval
#
# Write `checkpoint_interval_s(req)`: a checkpoint holds **14 bytes per parameter** (bf16 weights,
# fp32 master copy, Adam's two moments) written at `req.storage_write_bytes_per_s`; each GPU's
# MTBF is `req.per_gpu_mtbf_hours`. Return the Young/Daly interval in seconds.


# %%
def checkpoint_interval_s(req: Requirements) -> float:
    """Young/Daly interval sqrt(2·C·MTBF) for this job, in seconds."""
    # BEGIN SOLUTION
    write_s = 14 * req.params / req.storage_write_bytes_per_s
    mtbf_s = req.per_gpu_mtbf_hours * 3600 / req.n_gpus
    return math.sqrt(2 * write_s * mtbf_s)
    # END SOLUTION


# %%
check_exercise("capstone.checkpoint_interval", checkpoint_interval_s, cluster)

# %% [markdown]
# The numbers behind the answer. Look for: a failure about once a day, a checkpoint every
# ~20 minutes, and about 1.5% of the run lost to writing checkpoints and redoing work, together
# (at the optimum the two halves are equal).

# %%
checkpoint_cost_s = 14 * req.params / req.storage_write_bytes_per_s
mtbf_s = cluster_mtbf(req.per_gpu_mtbf_hours * 3600, req.n_gpus)
tau = young_daly_interval(checkpoint_cost_s, mtbf_s)
print(
    f"checkpoint {14 * req.params / 1e12:.2f} TB takes {checkpoint_cost_s:.1f} s; cluster MTBF {mtbf_s / 3600:.1f} h"
)
print(
    f"Young/Daly interval {tau / 60:.1f} min; expected waste {expected_waste_fraction(tau, checkpoint_cost_s, mtbf_s):.2%}"
)

# %%
ask("fault_tolerance.recovery_order")

# %%
ask("checkpointing.young_daly")

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
