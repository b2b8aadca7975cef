# %% [markdown]
# # Lab 12 — Overlap: what is exposed, where, and what hides it
#
# Every parallelism in labs 02–11 adds communication. Whether it costs step time depends on one
# thing: is the rank *waiting* for it, or computing while it moves? An interviewer for a
# training-infrastructure role asks "what is exposed, where, and what hides it" more often than
# "what is 1F1B". This lab answers it mechanism by mechanism, each time in the same four steps:
# the timeline with communication drawn beside compute, the exposed time **measured**, the model
# beside it, then the technique that hides it and the measured gain.
#
# Sections 2–9:
#
# - 2: exposed vs hidden, read off a timeline;
# - 3: tensor parallelism's backward collective behind the weight-gradient GEMM — then you
#   write it;
# - 4: async TP (collective matmul) and FSDP prefetch;
# - 5: data-parallel sync under pipelining, stage by stage — then you compute it from a
#   schedule;
# - 6: zero-bubble V schedules, and what they do to that sync;
# - 7: micro-batch size against GEMM efficiency;
# - 8: MoE dispatch and combine behind another micro-batch's compute;
# - 9: a worked "where does my step go?" for a 3-D layout.

# %%
import dataclasses
import statistics

import plotly.graph_objects as go
import torch
import torch.distributed as dist
import torch.nn.functional as F

import dtlab
import dtlab.viz
from dtlab import trace
from dtlab.comm import Communicator
from dtlab.config import fast_mode, lab_world_size
from dtlab.parallel.expert.overlap import measure_two_microbatch_overlap
from dtlab.parallel.pipeline import (
    SCHEDULES,
    Costs,
    dp_slack,
    exposed_dp_sync,
    interleaved_1f1b,
    interleaved_zero_bubble,
    one_f_one_b,
    simulate,
    torch_schedule,
    torch_validate,
    validate,
    with_communication,
    zb_h1,
    zbv,
    zero_bubble_idle,
)
from dtlab.parallel.pipeline.dp_sync_run import (
    exposed_per_rank,
    measure_dp_sync,
    one_stage_reduce_s,
)
from dtlab.parallel.pipeline.micro_batch import best_micro_batch, gemm_times, pipeline_steps
from dtlab.parallel.tensor import (
    ColumnParallelLinear,
    column_parallel_linear,
    measure_async_tp,
    measure_tp_backward_overlap,
)
from dtlab.parallel.zero import measure_fsdp_prefetch
from dtlab.plan import ParallelPlan
from dtlab.plan.job import LLAMA_70B
from dtlab.plan.step_time import step_time
from dtlab.quiz import ask, check_exercise
from dtlab.trace import Trace

dtlab.viz.setup_notebook()
FAST = fast_mode()

# %% [markdown]
# ## 1. The cluster <a id="setup"></a>
#
# Two ranks (one per GPU when there are enough) for the tensor-parallel and FSDP sections; the
# pipeline × data-parallel section starts four of its own. Each rank computes on one thread, so
# on this two-core machine the communication threads keep some room beside the compute. A GPU
# gives communication its own stream and SMs; here it shares the cores, and section 3 shows
# what that costs.

# %%
cluster = dtlab.Cluster(lab_world_size(2))
N = cluster.world_size


def one_thread() -> int:
    torch.set_num_threads(1)
    return torch.get_num_threads()


print(f"{N} ranks on {cluster.device_type}; threads per rank: {cluster.run(one_thread)}")

# %% [markdown]
# ## 2. Exposed vs hidden <a id="exposed-vs-hidden"></a>
#
# An asynchronous collective (`async_op=True`) returns at once. The transfer runs on the
# communication library's own threads (on a GPU, its own stream) while the rank goes on
# computing, and `wait()` blocks until it is done. dtlab's communicator records two spans: the
# collective from launch to completion (**comm**), and the time the rank sat blocked in `wait()`
# (**idle**, named `wait:<collective>`). Only the part of the transfer that outlasts the compute
# before the wait costs step time: it is the **exposed** part. Overlap is proved by order, not by
# a stopwatch: the wait comes after the compute that hides it.
#
# Below, each rank launches one 8 MB all-reduce, then runs some matrix multiplications, then
# waits. Three runs: no compute in between, a little, a lot. Look for: the wait shrinking to
# nothing once the compute outlasts the transfer. The timeline shows the last run: its comm
# bar beside the compute.

# %%
ELEMENTS = 2 * 2**20  # 8 MB of fp32


def launch_compute_wait(gemms: list[int]) -> None:
    device = dtlab.device()
    comm = Communicator(None, "torch", "demo")
    buffer = torch.ones(ELEMENTS, device=device)
    a = torch.randn(256, 256, device=device)
    comm.all_reduce(buffer, name="warm-up")
    for run, count in enumerate(gemms):
        dtlab.barrier()
        with trace.labels(run=run):
            pending = comm.all_reduce(buffer, name="all_reduce", async_op=True)
            with trace.cuda_span("gemm", kind="compute"):
                for _ in range(count):
                    a = torch.tanh(a @ a)
            pending.wait()


GEMMS = [0, 2, 40]
demo = cluster.run(launch_compute_wait, GEMMS)
for run, count in enumerate(GEMMS):
    spans = demo.trace.filter(run=run).spans
    rows = []
    for rank in range(N):
        (comm,) = [s for s in spans if s.rank == rank and s.name == "all_reduce"]
        (gemm,) = [s for s in spans if s.rank == rank and s.name == "gemm"]
        exposed = max(0, comm.end_ns - max(gemm.end_ns, comm.start_ns)) / 1e6
        rows.append((gemm.duration_s * 1e3, comm.duration_s * 1e3, exposed))
    gemm_ms, comm_ms, exposed_ms = (max(column) for column in zip(*rows, strict=True))
    print(
        f"{count:>4} GEMMs: compute {gemm_ms:6.1f} ms, all-reduce {comm_ms:6.1f} ms launch to "
        f"completion, exposed (outlasting the compute) {exposed_ms:6.1f} ms"
    )
last = demo.trace.filter(run=len(GEMMS) - 1).spans
start = min(s.start_ns for s in last)
dtlab.viz.timeline(
    Trace(last, start, max(s.end_ns for s in last), start),
    title=f"One all-reduce behind {GEMMS[-1]} GEMMs",
    caption="The comm bar runs beside the compute; the wait after it is (almost) empty.",
)

# %% [markdown]
# ## 3. Tensor parallelism: the backward collective behind wgrad <a id="tp-backward"></a>
#
# A column-parallel Linear `Y_r = X·A_rᵀ` has a two-GEMM backward: **dgrad** `dX_r = dY_r·A_r`
# (this rank's partial input gradient; the full one is their sum, an all-reduce over the TP
# group) and **wgrad** `dA_r = dY_rᵀ·X`, which needs `X` but *not* the reduced `dX`. So the
# all-reduce can be launched right after dgrad and waited for after wgrad. That is Megatron-LM's
# `LinearWithGradAccumulationAndAsyncCommunication`, run with `CUDA_DEVICE_MAX_CONNECTIONS=1`
# so the GPU launches the collective before the wgrad GEMM. Under sequence parallelism the
# backward must all-gather `X` again for wgrad, and that gather overlaps dgrad. Without async TP
# the **forward** collectives are exposed — the next layer needs their result at once — and,
# under sequence parallelism, so is backward's all-gather of the output gradient in front of
# each row-parallel layer, whose dgrad needs it at once. "Every TP collective is on the critical
# path" is wrong for backward.
#
# The timeline: one column-parallel layer's backward, with the overlap off and on (the library's
# `column_parallel_linear`, `backward_overlap=False/True`). Look for: with it on, the
# `tp.input_grad_all_reduce` bar starting before `tp.wgrad` and running beside it, the `wait:`
# after wgrad. With it off, the rank waits right after dgrad and computes wgrad after.

# %%
D_MODEL, D_FF, TOKENS = (512, 2048, 128) if FAST else (1024, 4096, 512)


def one_layer_backward(overlap_flags: list[bool]) -> bool:
    device = dtlab.device()
    comm = Communicator(None, "torch", "tp")
    torch.manual_seed(0)
    layer = ColumnParallelLinear.from_linear(torch.nn.Linear(D_MODEL, D_FF), comm).to(device)
    grads = []
    for on in overlap_flags:
        x = torch.randn(4, TOKENS, D_MODEL, generator=torch.Generator().manual_seed(1))
        x = x.to(device).requires_grad_(True)
        dtlab.barrier()
        with trace.labels(technique_on=on):
            y = column_parallel_linear(x, layer.weight, layer.bias, comm, backward_overlap=on)
            y.sum().backward()
        grads.append((x.grad.clone(), layer.weight.grad.clone()))
        layer.weight.grad = None
    return all(torch.equal(a, b) for a, b in zip(grads[0], grads[-1], strict=True))


tp_run = cluster.run(one_layer_backward, [False, True])
print(f"input and weight gradients bit-identical with and without overlap: {all(tp_run)}")
for on in (False, True):
    spans = [s for s in tp_run.trace.filter(technique_on=on).spans if s.name.startswith(
        ("tp.dgrad", "tp.wgrad", "tp.input_grad", "wait:tp.input_grad"))]  # fmt: skip
    start = min(s.start_ns for s in spans)
    fig = dtlab.viz.timeline(
        Trace(spans, start, max(s.end_ns for s in spans), start),
        title=f"Column-parallel backward, overlap {'on' if on else 'off'}",
        caption="dgrad, then the input-gradient all-reduce beside (on) or before (off) wgrad.",
        highlight=["tp.input_grad_all_reduce", "tp.wgrad"],
        align="step",
    )
    fig.show()

# %% [markdown]
# Now measured over a stack of layers with `measure_tp_backward_overlap`: per layer, the
# collective's span, the part of it no compute of the same rank covered (exposed), and the
# compute that can hide it. Medians over steps, with and without, interleaved in one run.
#
# The order makes the overlap *possible*. Whether it pays depends on the machine. On a GPU the
# collective runs on its own stream and its own SMs, beside the GEMM. Here both sides of the
# overlap need the same two CPU cores, shared by both ranks, so the transfer's thread competes
# with the GEMM it hides behind. Look for: the gradients bit-identical; the forward collectives
# exposed either way; and what "overlap on" does to the exposed time on *this* machine. The
# last line says, from the numbers.

# %%
TP_SIZE = dict(layers=2, batch=4, seq=64, d_model=256, d_ff=1024) if FAST else {}
for sp in (False, True):
    m = measure_tp_backward_overlap(cluster, sequence_parallel=sp, **TP_SIZE)
    print(f"{'TP + SP' if sp else 'TP'}: bit-identical {m.equal}")
    for side in (m.off, m.on):
        print(
            f"  overlap {'on ' if side.technique_on else 'off'}: collective {side.comm_ms:.2f} "
            f"ms/layer, exposed {side.exposed_ms:.2f}, hiding compute {side.compute_ms:.2f}, "
            f"hidden {side.hidden_share:.0%}"
        )
    print(f"  forward collectives, exposed either way: {m.detail['forward_exposed_ms']:.2f} ms")
    change = m.on.exposed_ms - m.off.exposed_ms
    print(f"  overlap on {'saves' if change < 0 else 'costs'} {abs(change):.2f} ms/layer here")

# %% [markdown]
# ### Exercise: issue the TP backward collective asynchronously <a id="exercise-tp-backward"></a>
#
# Write lab 04's column-parallel Linear again, now with the overlap:
# `async_column_parallel_linear(x, weight, bias, group)`. `x` is the full input `(…, in)`, the
# same on every rank; `weight` `(out/t, in)` and `bias` `(out/t,)` are this rank's rows. It
# returns this rank's `(…, out/t)` columns of `Y`. Forward moves nothing. Backward, in this order:
#
# 1. dgrad: this rank's partial input gradient `dY_r · W_r`;
# 2. launch its all-reduce over `group` with `dist.all_reduce(..., async_op=True)`;
# 3. wgrad: `dW_r = dY_rᵀ · x` and `db_r = Σ dY_r` (over every token), while the transfer runs;
# 4. `wait()` on the handle, and return the reduced input gradient.
#
# The grader checks the output and the three gradients against one process in fp64. It checks
# that backward sends exactly one all-reduce. It checks the **order**: the all-reduce launched
# before the weight-gradient GEMM, its wait after it. A blocking all-reduce fails with a hint.
# The library's `column_parallel_linear` and dtlab's communicator are refused.


# %%
class AsyncColumnLinear(torch.autograd.Function):
    """``x·W_rᵀ + b_r``; backward overlaps the input-gradient all-reduce with wgrad."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        # BEGIN SOLUTION
        ctx.save_for_backward(x, weight)
        ctx.group = group
        return F.linear(x, weight, bias)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION
        x, weight = ctx.saved_tensors
        grad_x = (grad @ weight).contiguous()  # dgrad: this rank's partial sum
        handle = dist.all_reduce(grad_x, group=ctx.group, async_op=True)
        tokens = grad.reshape(-1, grad.shape[-1])
        grad_w = tokens.t() @ x.reshape(-1, x.shape[-1])  # wgrad, while the sum travels
        grad_b = tokens.sum(0)
        handle.wait()
        return grad_x, grad_w, grad_b, None
        # END SOLUTION


def async_column_parallel_linear(x, weight, bias, group):
    """This rank's output columns, its backward all-reduce hidden behind wgrad."""
    # BEGIN SOLUTION
    return AsyncColumnLinear.apply(x, weight, bias, group)
    # END SOLUTION


# %%
check_exercise("overlap.tp_backward_async", async_column_parallel_linear, cluster)

# %% [markdown]
# ## 4. Async TP and FSDP prefetch <a id="async-tp"></a>
#
# **Async TP** (collective matmul; Wang et al. 2023, and `torch.compile`'s micro-pipeline TP on
# `torch.distributed._symmetric_memory`, GPU only) hides the *forward* collectives too. The
# all-gather before a column-parallel GEMM is cut into one chunk per peer, and each chunk's
# transfer runs under the partial GEMM on the chunk already here. The row-parallel GEMM's
# reduce-scatter is cut the same way. The result equals plain TP. The cost: `t` smaller GEMMs
# instead of one (less efficient), and the first chunk, which nothing hides (pipeline fill).
# Look for: the result equal to plain TP; the GEMM time with chunks against one GEMM (the
# cost); and the exposed time with and without, which on these shared cores is decided by
# the same contention as in section 3.

# %%
a = measure_async_tp(cluster, **{k: v for k, v in TP_SIZE.items() if k != "layers"})
print(f"async TP equals plain TP (max |diff| {a.detail['max_abs_diff']:.1e}): {a.equal}")
for side in (a.off, a.on):
    print(
        f"  {'collective matmul' if side.technique_on else 'plain TP         '}: exposed "
        f"{side.exposed_ms:.2f} ms, GEMMs {side.compute_ms:.2f} ms"
    )

# %% [markdown]
# <a id="fsdp-prefetch"></a>**FSDP prefetch.** FSDP gathers each unit's parameters before the
# unit runs. Prefetch launches the gather of the next unit (depth 1) or the next two (depth 2)
# while the current one computes. `reshard_after_forward=False` keeps the gathered parameters
# from forward to backward: no second gather, more memory. dtlab's FSDP and PyTorch's FSDP2
# (`fully_shard`) run side by side. torch's waits happen inside torch, so only dtlab's exposed
# gather is read. Both peaks are measured. What to expect where the transfer has its own
# engine: exposed gather time falling with depth, and the gathered parameters held (memory)
# rising with depth and with `reshard_after_forward=False`. Look for: how far these small runs
# on shared cores follow that.

# %%
rows = measure_fsdp_prefetch(
    cluster, depths=(0, 1) if FAST else (0, 1, 2), units=4, width=128, batch=32, steps=3
)
print(f"{'impl':<12}{'depth':>6}{'reshard':>9}{'exposed ms/unit':>17}{'peak step MB':>14}")
for r in rows:
    exposed = "—" if r.exposed_ms_per_unit is None else f"{r.exposed_ms_per_unit:.2f}"
    print(
        f"{r.implementation:<12}{r.depth:>6}{str(r.reshard_after_forward):>9}{exposed:>17}"
        f"{r.peak_step_bytes / 2**20:>14.2f}"
    )

# %% [markdown]
# ## 5. Data-parallel sync under pipelining <a id="dp-sync-pp"></a>
#
# With pipeline × data parallelism, each stage all-reduces its weight gradients over its dp
# group once per step. They are final after the stage's **last** gradient action. How much of
# the all-reduce hides depends on what the pipeline still runs after that: the stage's
# **slack**. Under 1F1B the last micro-batch's backward walks from the last stage down to stage
# 0, so stage `s` finishes `s` backward slots before the step ends. Stage 0 has no slack and
# exposes its whole sync. The model (`dp_slack`, read off the simulated timeline) says so.
# Look for: slack `s·t_B` under 1F1B, `s·t_B/v` under interleaving, and none at all under ZB-H1.

# %%
P4 = 4
for schedule, costs in (
    (one_f_one_b(P4, 8), Costs()),
    (interleaved_1f1b(P4, 8, 2), Costs(0.5, 0.5, 0.5)),
    (zb_h1(P4, 8), Costs()),
):
    slack = dp_slack(schedule, costs)
    print(f"{schedule.name:<24} slack per stage (t_F = 1): {[round(v, 2) for v in slack.values()]}")

# %% [markdown]
# Now on real ranks: a `pp = 2 × dp = 2` cluster (four ranks), each stage a Linear whose
# compute is fixed by `FixedCost` (it sleeps F = I = W = 20 ms, so the timeline reads like
# the simulator's), and a real all-reduce of its gradient over the dp group. Two modes, one
# step each, alternating:
#
# - `after_step`: `pipe.step()`, then the all-reduce, the plain loop;
# - `per_stage`: the executor's `on_stage_done` hook launches each stage's all-reduce right after
#   its last backward (where torch's `REDUCE_GRAD` action runs; Megatron's
#   `overlap_grad_reduce` starts earlier, bucket by bucket inside that last backward); the
#   rank waits after its last action.
#
# Exposed = how far the slowest replica's sync ends past the pipeline's last action. Look for:
# under 1F1B pipeline rank 1 hides its sync under rank 0's last backward, and rank 0 exposes
# its own. Under interleaving the per-stage sync hides the later chunk's reduction under the
# rank's own remaining backwards, so it exposes less than `after_step` (the model: half).

# %%
cluster4 = dtlab.Cluster(4)
cluster4.run(one_thread)
WIDTH = 512 if FAST else 2048
dp_runs = {
    name: cluster4.run(measure_dp_sync, name, 2, 2, 4, width=WIDTH, stage_s=0.02, steps=2)
    for name in ("1f1b", "interleaved_1f1b")
}
cluster4.close()  # the runs and their traces are here; free the four ranks
print(f"{'schedule':<18}{'mode':<12}{'exposed ms per pipeline rank (median)':<40}{'model':>8}")
for name, run in dp_runs.items():
    schedule = SCHEDULES[name](2, 4)
    chunk = 0.02 * schedule.n_ranks / schedule.n_stages
    reduce_s = one_stage_reduce_s(run)
    for mode in ("after_step", "per_stage"):
        measured = [exposed_per_rank(run, mode, step) for step in range(2)]
        median = {k: statistics.median(m[k] for m in measured) * 1e3 for k in measured[0]}
        model = exposed_dp_sync(
            schedule, Costs(chunk, chunk, chunk), reduce_s, per_stage=mode == "per_stage"
        )
        shown = ", ".join(f"rank {k}: {v:5.1f}" for k, v in median.items())
        print(f"{name:<18}{mode:<12}{shown:<40}{1e3 * max(model.values()):>7.1f}")
    print(f"{'':<18}one stage's all-reduce alone: {1e3 * reduce_s:.1f} ms (the model's input)")

# %% [markdown]
# The interleaved run's per-stage step on the timeline: compute, the pipeline's messages and each
# stage's `dp_sync` all-reduce, from launch to completion, on its rank's row. Look for: the
# `dp_sync stage 2` and `dp_sync stage 3` bars (the later chunks) starting while their ranks
# still run backwards, and `dp_sync stage 0` starting only at the very end.

# %%
spans = dp_runs["interleaved_1f1b"].trace.filter(mode="per_stage", step=0).spans
start = min(s.start_ns for s in spans)
dtlab.viz.timeline(
    Trace(spans, start, max(s.end_ns for s in spans), start),
    title="Interleaved 1F1B on pp=2 × dp=2: per-stage data-parallel sync",
    caption="Each chunk's all-reduce starts as its last backward ends; stage 0's sticks out.",
    highlight=["dp_sync stage 0", "dp_sync stage 2", "dp_sync stage 3"],
)

# %% [markdown]
# ### Exercise: each stage's exposed DP time from a schedule <a id="exercise-dp-exposed"></a>
#
# Write `exposed_dp_per_stage(schedule, costs, reduce_time) -> {stage: exposed}`. Each stage
# all-reduces its gradients on a link of its own, starting the moment they are final. Use
# `simulate(schedule, costs)`: its `timeline[rank]` lists `Timed(rank, action, start, end)`, and
# `makespan` is the step's end. A stage's gradients are final after its **last** B, or its last W
# when the backward is split (I then W). Exposed is what the all-reduce leaves past the step's
# end, never negative.
#
# The grader tries 1F1B, GPipe, interleaved 1F1B, ZB-H1 and ZB-V, with unequal costs and messages
# that take time. Calling the library's `dp_slack` or `exposed_dp_sync` is refused.


# %%
def exposed_dp_per_stage(schedule, costs, reduce_time: float) -> dict[int, float]:
    # BEGIN SOLUTION
    played = simulate(schedule, costs)
    final: dict[int, float] = {}
    for rank in played.timeline:
        for timed in rank:
            if timed.action.kind in ("B", "W"):
                stage = timed.action.stage
                final[stage] = max(final.get(stage, 0.0), timed.end)
    return {s: max(0.0, reduce_time - (played.makespan - end)) for s, end in final.items()}
    # END SOLUTION


# %%
check_exercise("overlap.exposed_dp_per_stage", exposed_dp_per_stage, cluster)

# %% [markdown]
# ## 6. Zero-bubble V schedules <a id="zero-bubble-v"></a>
#
# Lab 05 built ZB-H1 and DualPipeV. Two more zero-bubble schedules complete the set, both split
# the backward into I and W and use the W's to fill the bubble (Qi et al. 2023):
#
# - **ZB-V** (`zbv`, torch's `ScheduleZBVZeroBubble`): two half-stages per rank in a V (rank `r`
#   holds stages `r` and `2p-1-r`);
# - **interleaved zero bubble** (`interleaved_zero_bubble`, torch's
#   `ScheduleInterleavedZeroBubble`): interleaved 1F1B's loop with the backward split.
#
# Each is checked three ways before anything runs: against torch's own generator action for
# action, by torch's schedule validator, and by dtlab's (which also replays it for deadlock).
# Look for: equal orders and both validators passing.

# %%
print(zbv(2, 4))
for ours, theirs in (
    (zbv(4, 8), torch_schedule("ZBVZeroBubble", 4, 8)),
    (interleaved_zero_bubble(4, 8, 2), torch_schedule("InterleavedZeroBubble", 4, 8, 2)),
):
    torch_checked = torch_validate(ours) is not None  # raises if torch refuses it
    validate(with_communication(ours, Costs(p2p=0.1)))  # raises if dtlab's replay deadlocks
    print(f"{ours.name}: equal to torch's order {ours.actions == theirs.actions}; torch's "
          f"validator {'passed' if torch_checked else 'absent in this torch'}; dtlab's "
          "validator and replay (with messages) passed")  # fmt: skip

# %% [markdown]
# The same model (each whole stage F = I = W = 1, so a half-stage chunk costs 0.5) on `p = 4`
# ranks, `m = 16`. For each schedule: idle time per rank against the formula
# `(p-1)(t_F + t_I - t_W)` with per-chunk costs (ZB-V only with equal costs), the activations
# held at the peak on each rank (in (chunk, micro-batch) sets; with two chunks per rank each is
# half a stage), and, from section 5, the data-parallel sync each rank exposes when one whole
# stage's all-reduce takes as long as its backward (2), started per stage. Look for: ZB-V and
# interleaved ZB idling half of ZB-H1 and holding `p` stages' worth on *every* rank; and the DP
# sync exposed on every rank under ZB-H1 and interleaved ZB, where 1F1B exposes it on rank 0
# only; under ZB-V the staircase turns around: the last rank's up-chunk W ends the step, so
# rank 3 exposes the most and rank 0 nothing.

# %%
M16 = 16
whole, half = Costs(1, 1, 1), Costs(0.5, 0.5, 0.5)
cases = [
    (one_f_one_b(P4, M16), whole, None),
    (interleaved_1f1b(P4, M16, 2), half, None),
    (zb_h1(P4, M16), whole, zero_bubble_idle(P4, 1, 1, 1)),
    (zbv(P4, M16), half, zero_bubble_idle(P4, 0.5, 0.5, 0.5)),
    (interleaved_zero_bubble(P4, M16, 2), half, zero_bubble_idle(P4, 0.5, 0.5, 0.5)),
    (SCHEDULES["dualpipe_v"](P4, M16), half, None),
]
print(f"{'schedule':<24}{'idle/rank':>10}{'formula':>9}{'peak held per rank':>20}  DP exposed")
for schedule, costs, formula in cases:
    sim = simulate(schedule, costs)
    peaks = [sim.peak_rank_in_flight(r) for r in range(P4)]
    shown = "—" if formula is None else f"{formula:g}"
    reduce = 2.0 * schedule.n_ranks / schedule.n_stages  # one chunk's share of a stage's
    exposed = exposed_dp_sync(schedule, costs, reduce).values()
    print(f"{schedule.name:<24}{sim.idle(0):>10g}{shown:>9}{str(peaks):>20}  "
          f"{[round(e, 2) for e in exposed]}")  # fmt: skip

# %%
sim = simulate(zbv(P4, 8), half)
dtlab.viz.timeline(
    sim.trace(),
    title="ZB-V, p = 4, m = 8: simulated",
    caption="Two half-stages per rank in a V; the W's fill the drain where 1F1B sat idle.",
)

# %% [markdown]
# ## 7. Micro-batch size against GEMM efficiency <a id="micro-batch-size"></a>
#
# For a fixed batch per pipeline, smaller micro-batches `b` mean more of them (`m = B/b`) and a
# smaller bubble, but thinner GEMMs. A thin GEMM runs below the device's peak. The step is
# `(m + p - 1)·t(b)` under 1F1B and `(m + (p-1)/v)·t(b)` interleaved. If `t(b)` were linear in
# `b`, `b = 1` would always win. The measured `t(b)` is not linear. `gemm_times` times the six
# GEMMs of one MLP block's forward and backward at each `b` on this machine (fastest of several
# repeats, one thread). Look for: throughput (GFLOP/s) rising with `b` before it flattens. The
# best `b` under each schedule is printed. Interleaving never moves it down.

# %%
B_GLOBAL, SEQ, D = 64, 8, 256
times = gemm_times([1, 2, 4, 8, 16, 32, 64], seq_len=SEQ, d_model=D, repeats=5,
                   device=cluster.device_type)  # fmt: skip
steps = pipeline_steps(times, B_GLOBAL, p=P4, v=2)
print(f"{'b':>4}{'m':>5}{'t(b) ms':>10}{'GFLOP/s':>9}{'1F1B step ms':>14}{'interleaved ms':>16}")
for t, row in zip([t for t in times if B_GLOBAL % t.micro_batch == 0], steps, strict=True):
    print(f"{row.micro_batch:>4}{row.n_micro:>5}{1e3 * t.seconds:>10.3f}"
          f"{t.flop_per_s / 1e9:>9.1f}{1e3 * row.one_f_one_b:>14.2f}{1e3 * row.interleaved:>16.2f}")  # fmt: skip
print(f"best b: 1F1B {best_micro_batch(steps)}, interleaved (v=2) "
      f"{best_micro_batch(steps, 'interleaved')}")  # fmt: skip
fig = go.Figure(
    go.Scatter(
        x=[t.micro_batch for t in times],
        y=[t.flop_per_s / 1e9 for t in times],
        mode="lines+markers",
        name="measured",
    )
)
fig.update_xaxes(type="log", tickvals=[t.micro_batch for t in times])
dtlab.viz.describe(
    fig,
    title="MLP-block GEMM throughput against micro-batch size (measured, this machine)",
    caption="Where throughput still rises with b, a bigger micro-batch buys efficiency.",
    x="micro-batch size b (sequences)",
    y="throughput (GFLOP/s)",
)

# %% [markdown]
# ## 8. MoE dispatch and combine behind compute <a id="moe-overlap"></a>
#
# An MoE block's forward is attention → route → dispatch (all-to-all) → experts → combine
# (all-to-all). One micro-batch after another, every all-to-all is exposed: the rank has nothing
# to do while its rows travel. With two micro-batches in flight, one's dispatch runs under the
# other's attention, and one's combine under the other's experts. That is the idea DeepSeek-V3's
# DualPipe builds its schedule on (Sec. 3.2.1), and the reason DualPipeV pairs one chunk's
# forward with the other's backward (`OVERLAP_F_B`). Lab 07 built the all-to-alls.
# `measure_two_microbatch_overlap` runs one MoE block's forward on two micro-batches both ways,
# interleaved, and reads each rank's posting and waiting time off the clock. The count exchanges
# stay blocking (a receiver needs them to size its buffers). As in section 3, the transfer's
# thread shares two cores with the compute here, so the overlap can hide little or even cost.
# On GPUs the copy engines and the NIC move the bytes without the SMs. Look for: equal outputs,
# the same bytes, and the exposed all-to-all time with and without the second micro-batch to
# hide under.

# %%
moe = measure_two_microbatch_overlap(cluster, tokens=512, dim=64, rounds=3)
print(f"outputs bit-identical: {moe.equal}; bytes per rank, each schedule: {moe.bytes_per_rank}")
for name in ("sequential", "overlapped"):
    print(
        f"  {name:<11}: exposed all-to-all {1e3 * moe.exposed_s[name]:6.1f} ms, "
        f"MoE block forward {1e3 * moe.step_s[name]:6.1f} ms"
    )
print(f"  hidden by the second micro-batch: {moe.hidden_share:.0%}")

# %% [markdown]
# ## 9. Where does my step go? <a id="step-breakdown"></a>
#
# A 70B model on 2,048 H100s: TP = 8 inside a node, PP = 4 with two chunks per rank, DP = 64,
# ZeRO-1. The step-time model (`dtlab.plan.step_time`) adds up, on the slowest pipeline device:
# compute, the exposed part of each mechanism and the pipeline's idle time. It applies the rules
# measured above: TP's backward reductions hide behind wgrad and SP's re-gathers behind dgrad,
# its forward collectives and SP's gathers of the output gradient are exposed unless async TP is
# on; the DP sync is exposed on stage 0 beyond what its last backward
# covers. This is a **model** at production scale, not a run. Look for: where the seconds go,
# and what each technique buys.

# %%
base = ParallelPlan(dp=64, tp=8, pp=4, zero_stage=1, virtual_stages=2)
variants = {
    "TP 8 × PP 4 (v=2) × DP 64": base,
    "+ async TP": dataclasses.replace(base, async_tp=True),
    "no interleaving (v=1)": dataclasses.replace(base, virtual_stages=1),
    "ZB-H1 instead of 1F1B": dataclasses.replace(base, schedule="zb-h1", virtual_stages=1),
}
print(f"{'plan':<28}{'step s':>7}{'compute':>8}{'TP exp.':>8}{'of TP':>7}{'idle':>7}"
      f"{'DP exp.':>8}{'of DP':>7}{'MFU':>6}")  # fmt: skip
for label, plan in variants.items():
    t = step_time(LLAMA_70B, plan)
    print(f"{label:<28}{t.step_s:>7.2f}{t.compute_s:>8.2f}{t.tp_exposed_s:>8.2f}{t.tp_s:>7.2f}"
          f"{t.idle_s:>7.2f}{t.dp_exposed_s:>8.2f}{t.dp_s:>7.2f}{t.mfu:>6.0%}")  # fmt: skip

# %% [markdown]
# Read the first row as an interviewer would. Of TP's communication ("of TP") 0.6 is exposed
# ("TP exp."): forward's 4 collectives of a layer's 10 and backward's 2 all-gathers of the output
# gradient; the other 4 hide behind the backward GEMMs, and async TP removes the rest. The idle
# time is the bubble; interleaving and ZB-H1 shrink it. Of the DP sync ("of DP") the model exposes
# what stage 0's last backward cannot cover, reducing bucket by bucket inside that backward as
# DDP does. Section 5's rule is stricter: a stage's sync starts once all its
# gradients are final. Under that rule ZB-H1's W's, which fill the drain, leave no stage any
# slack. The two rules differ by what one backward's buckets can hide.

# %% [markdown]
# ## 10. Quiz <a id="quiz"></a>

# %%
ask("overlap.exposed_is_measured")

# %%
ask("overlap.tp_backward_hides")

# %%
ask("overlap.which_stage_exposes")

# %%
ask("overlap.dp_slack_last_stage")

# %%
ask("overlap.dp_exposed_stage_one")

# %%
ask("overlap.interleaved_per_stage")

# %%
ask("overlap.zero_bubble_eats_slack")

# %%
ask("overlap.zbv_idle")

# %%
ask("overlap.zbv_memory")

# %%
ask("overlap.micro_batch_step")

# %%
ask("overlap.best_micro_batch_interleaved")
