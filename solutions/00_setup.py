# %% [markdown]
# # Lab 00 — Setup and a tour of dtlab
#
# In this lab you check your machine, start a **cluster of real ranks** (separate processes
# joined in one `torch.distributed` process group), run your first collective, and meet the
# three views every later lab uses:
#
# 1. the **timeline** — what each rank was doing, when;
# 2. the **memory chart** — what each rank holds, beside the formula that predicts it;
# 3. **graded checks** — an exercise run on the ranks, and quiz questions.
#
# On a laptop or in CI the lab runs in *fast* mode (2 ranks on the CPU, a tiny model, seconds).
# On a GPU box it runs in *full* mode (one rank per GPU). The code is the same; section 2 shows
# what changes underneath.

# %%
import time

import torch
import torch.distributed as dist

import dtlab
import dtlab.trace
import dtlab.viz
from dtlab.cli.doctor import environment_report, format_report
from dtlab.config import fast_mode
from dtlab.memory import measure_model_state, model_state_bytes
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
from dtlab.quiz import ask, check_exercise

dtlab.viz.setup_notebook()
FAST = fast_mode()

# %% [markdown]
# ## 1. Your environment
#
# The same checks as `dtlab doctor` in a terminal, including its 2-rank self-test (a few
# seconds). Look for `ok` on every line; a `WARN` is something optional (say, no GPU), a `FAIL`
# comes with the command that fixes it. The last line shows the **lab mode**: `fast` here unless
# you are on a machine with two or more GPUs.

# %%
print(format_report(environment_report()))

# %% [markdown]
# ## 2. Start a cluster
# <a id="ranks"></a>
#
# `dtlab.Cluster(n)` starts `n` rank processes once and keeps their process group warm, so every
# later cell runs on the same ranks in milliseconds. With enough GPUs each rank gets one GPU and
# talks NCCL; otherwise the ranks run on the CPU and talk gloo.
#
# Look for the **cold start**: about a second on a laptop — the cost of creating processes,
# importing torch in each and joining the process group. You pay it once per cluster.

# %%
WORLD_SIZE = 2 if FAST else max(2, torch.cuda.device_count())
start = time.perf_counter()
cluster = dtlab.Cluster(WORLD_SIZE)
print(
    f"{WORLD_SIZE} ranks, backend {cluster.backend}, device {cluster.device_type}; "
    f"cold start {time.perf_counter() - start:.1f} s"
)

# %% [markdown]
# <a id="process-groups"></a>
# `cluster.run(fn)` runs `fn` on **every** rank and returns one result per rank, in rank order.
# Inside `fn`, `dtlab.rank()`, `dtlab.world_size()` and `dtlab.device()` say who and where this
# rank is — the same calls work under `torchrun` on a real multi-node job. Expect one tuple per
# rank, ranks `0 … N-1`, each seeing the same world size.

# %%
cluster.run(lambda: (dtlab.rank(), dtlab.world_size(), str(dtlab.device())))

# %% [markdown]
# ## 3. A first all-reduce, traced
# <a id="first-collective"></a>
#
# Each rank fills a tensor with its rank number, does a little compute, then calls
# `dist.all_reduce`: afterwards **every** rank holds the elementwise sum over all ranks,
# `0 + 1 + … + (N-1)`. The `dtlab.trace.span` blocks record when each step ran and how many bytes
# the collective carried; `res.trace` gathers the spans of all ranks on one clock.
#
# Look for: every rank's first element equals N(N-1)/2, and the trace has two spans per rank.


# %%
def traced_all_reduce(numel: int) -> float:
    t = torch.full((numel,), float(dtlab.rank()), device=dtlab.device())
    with dtlab.trace.span("scale", kind="compute"):
        t = t * 1.0 + 0.0
    with dtlab.trace.span("all_reduce", kind="comm", nbytes=t.numel() * t.element_size()):
        dist.all_reduce(t)
    return t[0].item()


res = cluster.run(traced_all_reduce, 1 << 16 if FAST else 1 << 24)
print("per-rank result:", list(res), " expected:", WORLD_SIZE * (WORLD_SIZE - 1) / 2)
res.trace

# %% [markdown]
# ### The timeline
#
# One row per rank, time along x, colour by kind: blue compute, orange communication, grey idle.
# Hover over a bar for its duration and bytes. Look for the **all-reduce starting at nearly the
# same moment on every rank**: a collective cannot finish until every rank has joined, so a rank
# that arrives early shows up as a longer bar (it is waiting for the others).

# %%
dtlab.viz.timeline(
    res.trace,
    title="Compute, then all-reduce, on every rank",
    caption="Each rank computes (blue), then all meet in the all-reduce (orange): it ends together.",
)

# %% [markdown]
# ### When a rank fails
# <a id="failures"></a>
#
# Distributed bugs rarely crash politely. Two kinds matter:
#
# * **A rank raises.** The cluster returns a `RankError` naming the rank, with the traceback
#   from *that* process — not a generic "child failed".
# * **A rank waits forever.** A collective finishes only when every rank of its group calls it,
#   in the same order with matching shapes. If rank 0 skips a broadcast that rank 1 enters,
#   rank 1 blocks inside C++ for good. In production that ends at NCCL's watchdog timeout
#   (minutes) and usually means a rank took another code path, crashed, or is a straggler —
#   not a bug in NCCL. Here the cluster sees that rank 0 has already returned without posting
#   its side, so it does not wait for the timeout: a `ClusterTimeout` at once names each stuck
#   rank, the call and group it is blocked in and your line, and the cluster restarts its ranks.
#
# Look for: the rank number and the `ValueError` line in the first message; `broadcast` and
# the function name in the second.


# %%
def fails_on_last_rank():
    if dtlab.rank() == dtlab.world_size() - 1:
        raise ValueError("this shard has no data")
    return dtlab.rank()


try:
    cluster.run(fails_on_last_rank)
except dtlab.RankError as err:
    print(str(err).splitlines()[0])


def rank0_skips_the_broadcast():
    if dtlab.rank() != 0:
        dist.broadcast(torch.zeros(1, device=dtlab.device()), src=0)


with dtlab.Cluster(2, timeout=3) as fragile:
    try:
        fragile.run(rank0_skips_the_broadcast)
    except dtlab.ClusterTimeout as err:
        print(err)

# %% [markdown]
# ## 4. Memory of the small GPT, on each rank
#
# Every lab trains the same small GPT. Here each rank builds it, takes one Adam step, and
# measures — tensor by tensor — the bytes of parameters, gradients and optimizer state. Next to
# each measured bar is the formula's bar: in fp32 with Adam every parameter costs
# **4 (weight) + 4 (gradient) + 8 (Adam's two moments) = 16 bytes**, on every rank, because
# nothing is sharded yet. Lab 03 (ZeRO) divides the optimizer, gradient and weight parts by N.
#
# Look for: the measured and formula bars are the same height, split 4 : 4 : 8.

# %%
CONFIG = GPTConfig.tiny() if FAST else GPTConfig.small()


def one_adam_step_memory():
    model = GPT(CONFIG, device=dtlab.device())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs, targets = SyntheticTokens(CONFIG, n_batches=1, batch_size=4)[0]
    loss_fn(model(inputs.to(dtlab.device())), targets.to(dtlab.device())).backward()
    optimizer.step()
    return measure_model_state(model, optimizer)


reports = cluster.run(one_adam_step_memory)
formula = model_state_bytes(CONFIG.num_params(), recipe="fp32_adam")
print(f"{CONFIG.num_params():,} parameters × 16 bytes = {formula.total:,} bytes predicted per rank")
print(reports[0].summary())

# %%
dtlab.viz.memory_bars(
    list(reports),
    predicted=formula.by_category,
    title="Model state per rank: measured vs 16 bytes/parameter",
    caption="Solid (measured) and hatched (formula) bars are the same height on every rank.",
)

# %% [markdown]
# ## 5. Exercise: all-reduce your rank
#
# Write `rank_sum()`. It runs on every rank: make a one-element tensor holding this rank's
# number (on `dtlab.device()`), all-reduce it with SUM, and return the result. On N ranks every
# rank should return N(N-1)/2. The next cell runs your function on the cluster and grades it.


# %%
def rank_sum():
    """Return the sum of all ranks' numbers, computed with one all-reduce (on every rank)."""
    # BEGIN SOLUTION
    t = torch.tensor([float(dtlab.rank())], device=dtlab.device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu()
    # END SOLUTION


# %%
check_exercise("setup.rank_sum", rank_sum, cluster)

# %% [markdown]
# ## 6. Check your understanding
#
# Pick an answer and press *Check*: you get the explanation for your choice, right or wrong.

# %%
ask("setup.rank_sum_value")

# %%
ask("setup.world_size")

# %%
ask("setup.unmatched_collective")

# %% [markdown]
# ## 7. Shut the cluster down
#
# `close()` stops every rank process. (Restarting the kernel does it too; a cluster never
# outlives its notebook.)

# %%
cluster.close()
