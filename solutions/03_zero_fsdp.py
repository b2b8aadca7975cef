# %% [markdown]
# # Lab 03 — ZeRO and FSDP
#
# Data parallelism (lab 02) keeps a *full* copy of everything on every rank: parameters,
# gradients and optimizer state. The ranks hold identical copies, so most of that is redundant.
# ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
# Models", SC 2020) removes the redundancy in three stages, and PyTorch FSDP (Zhao et al., VLDB
# 2023) is stage 3 as a model wrapper.
#
# What you will see:
#
# 1. the 16 bytes per parameter of mixed-precision Adam;
# 2. measured memory per rank for DDP and ZeRO-1/2/3 at N = 2 and 4, next to the formula;
# 3. bytes on the wire per stage — and why ZeRO-3 costs 1.5× DDP;
# 4. you write the ZeRO-1 optimizer step;
# 5. FSDP's wrap units and prefetch on the timeline;
# 6. offloading the optimizer state to the host;
# 7. when to pick DDP and when FSDP, with a memory calculator to play with;
# 8. Muon under ZeRO: whole matrices gathered to every rank, or to one owner each.

# %%
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import dtlab
import dtlab.viz
from dtlab import trace
from dtlab.config import accelerator_count, fast_mode
from dtlab.memory import (
    RECIPES,
    fsdp2_state_bytes,
    model_state_bytes,
    zero_comm_bytes_per_rank,
)
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
from dtlab.optim.muon import (
    STRATEGIES,
    muon_bytes_per_rank,
    muon_flops_per_rank,
    muon_update,
    sharded_muon_updates,
)
from dtlab.parallel import (
    FullyShardedDataParallel,
    MixedPrecision,
    ZeroOptimizer,
    shard_by_zero_stage,
)
from dtlab.quiz import ask, check_exercise
from dtlab.viz.memory_calculator import stage_table

dtlab.viz.setup_notebook()
FAST = fast_mode()
GB = 1e9

# %% [markdown]
# ## 1. The 16 bytes per parameter <a id="recipe"></a>
#
# Mixed-precision training with Adam keeps, for every parameter:
#
# | what | dtype | bytes |
# |---|---|---|
# | parameter (what forward and backward compute with) | bf16 | 2 |
# | gradient | bf16 | 2 |
# | master copy of the parameter (the optimizer updates this) | fp32 | 4 |
# | Adam first moment `m` | fp32 | 4 |
# | Adam second moment `v` | fp32 | 4 |
#
# **2 + 2 + 12 = 16 bytes** — the ZeRO paper's `K = 12` is the optimizer's part. A 7B model needs
# 112 GB of model state before a single activation, not the 14 GB its bf16 weights take. Other
# recipes shift the split (all-fp32 Adam is also 16, but 4 + 4 + 8). Look for the totals.

# %%
for name, recipe in RECIPES.items():
    print(
        f"{name:<20} {recipe.param_bytes} + {recipe.grad_bytes} + {recipe.optimizer_bytes:>2} = "
        f"{recipe.bytes_per_param:>2} B/param → 7B model: "
        f"{model_state_bytes(7_000_000_000, recipe=name).total / GB:6.1f} GB"
    )

# %% [markdown]
# ## 2. What each stage shards, measured <a id="zero-stages"></a>
#
# With `N` data-parallel ranks and `Ψ` parameters (the optimizer-state part `K·Ψ`):
#
# | stage | shards | bytes per rank (mixed Adam) |
# |---|---|---|
# | DDP | nothing | `2Ψ + 2Ψ + 12Ψ` |
# | ZeRO-1 | optimizer state | `2Ψ + 2Ψ + 12Ψ/N` |
# | ZeRO-2 | + gradients | `2Ψ + (2Ψ + 12Ψ)/N` |
# | ZeRO-3 (FSDP) | + parameters | `(2Ψ + 2Ψ + 12Ψ)/N` |
#
# Below, every rank trains the GPT for two steps under each stage and reports what it holds after
# the second backward (Adam's state exists by then), counted tensor by tensor. Fast mode uses
# fp32 Adam (4 + 4 + 8) because DDP here has no bf16 mode; the ZeRO stages in mixed precision
# follow in the next cell. Each panel: measured (solid) beside the formula (hatched) per rank.
# Look for: solid = hatched, every rank the same, the optimizer state shrinking first (ZeRO-1),
# then the gradients (ZeRO-2), then the parameters (ZeRO-3) — and, under DDP, a red
# *communication buffers* block the formula does not have: the gradient buckets.

# %%
CONFIG = GPTConfig.tiny() if FAST else GPTConfig.small()
PSI = CONFIG.num_params()
STAGE_NAMES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")


def held_after_backward(stage: int, mixed: bool = False) -> dict:
    """Train two steps under ``stage``; bytes held after the second backward, bytes sent in it."""
    rank, world, device = dtlab.rank(), dtlab.world_size(), dtlab.device()
    precision = MixedPrecision(torch.bfloat16) if mixed else None
    model = GPT(CONFIG, seed=0).to(device)
    setup = shard_by_zero_stage(
        model,
        stage,
        torch.optim.AdamW,
        mixed_precision=precision,
        units=list(model.blocks),
        collectives="dtlab",  # our own rings: every byte in `comm_stats` is counted from a message
        lr=1e-3,
    )
    forward, opt, stats = setup.forward, setup.optimizer, setup.comm_stats
    data = SyntheticTokens(CONFIG, n_batches=2, batch_size=4 * world, seed=0)
    for step, batch in enumerate(data):
        x, y = (t.to(device) for t in shard_for_rank(batch, rank, world))
        if step == 1:
            stats.reset()
        opt.zero_grad()
        loss_fn(forward(x), y).backward()
        if step == 1:
            held = setup.held_by_category()
        opt.step()
    return {"held": {k: v for k, v in held.items() if v}, "sent": stats.bytes_sent}


def measure_all_stages(mixed: bool = False) -> list[dict]:
    first = 1 if mixed else 0
    return [held_after_backward(stage, mixed) for stage in range(first, 4)]


two_ranks = dtlab.Cluster(2)
measured = {2: two_ranks.run(measure_all_stages)}
FOUR_RANK_DEVICE = "auto" if accelerator_count() >= 4 else "cpu"
with dtlab.Cluster(4, device=FOUR_RANK_DEVICE) as four_ranks:
    measured[4] = four_ranks.run(measure_all_stages)
    measured_mixed = four_ranks.run(measure_all_stages, True)
print(f"Ψ = {PSI:,} parameters")


# %%
def stages_side_by_side(per_rank: list[list[dict]], n: int, recipe: str) -> go.Figure:
    """One memory_bars panel per stage (measured vs formula, per rank), in one figure."""
    fig = make_subplots(rows=1, cols=4, subplot_titles=STAGE_NAMES, shared_yaxes=True)
    for stage in range(4):
        formula = model_state_bytes(PSI, n, stage, recipe).by_category
        held = [r[stage]["held"] for r in per_rank]
        panel = dtlab.viz.memory_bars(held, formula, compact=n > 2)
        for bar in panel.data:
            bar.showlegend = bar.showlegend is not False and stage == 0
            fig.add_trace(bar, row=1, col=stage + 1)
    fig.update_layout(
        template=dtlab.viz.DTLAB_TEMPLATE, barmode="stack", height=430,
        title=f"Model state per rank, N = {n} ({recipe}); solid measured, hatched formula"
        + (" (m / f)" if n > 2 else ""),
        yaxis={"title": {"text": "model state per rank (MiB)"}},
    )  # fmt: skip
    return dtlab.viz.describe(
        fig,
        x="rank",
        caption="Each stage shards one more kind of state; measured = formula, plus DDP's buffers.",
    )


stages_side_by_side(measured[2], 2, "fp32_adam")

# %%
stages_side_by_side(measured[4], 4, "fp32_adam")

# %% [markdown]
# The same numbers, printed next to the formula (rank 0; every rank holds the same). The ZeRO stages
# in mixed precision (bf16 parameters and gradients, fp32 masters inside the optimizer state) at
# N = 4 follow: ZeRO-1 and -2 hold the paper's 2 / 2 / 12 split. ZeRO-3 holds the same 16Ψ/N in
# torch FSDP2's layout, 4 / 4 / 8: its fp32 shards *are* the master weights (so they count as
# parameters), gradients land as fp32 shards, and the optimizer keeps only Adam's two moments;
# the bf16 copies exist only while a unit is gathered.

# %%
for n, per_rank in measured.items():
    for stage, r in enumerate(per_rank[0]):
        formula = model_state_bytes(PSI, n, stage, "fp32_adam")
        held = r["held"]
        print(
            f"N={n} {STAGE_NAMES[stage]:<7} measured params {held.get('parameters', 0):>8,} "
            f"grads {held.get('gradients', 0):>8,} optimizer {held.get('optimizer_state', 0):>9,}"
            f" | formula {formula.params:>8,} {formula.grads:>8,} {formula.optimizer:>9,}"
            + (f" | +buckets {held['communication_buffers']:,}" if stage == 0 else "")
        )
for stage, r in enumerate(measured_mixed[0], start=1):
    # ZeRO-3 keeps the paper's 16Ψ/N in FSDP2's layout: fp32 shards double as the masters.
    if stage == 3:
        formula = fsdp2_state_bytes(PSI, 4, "mixed_adam")
    else:
        formula = model_state_bytes(PSI, 4, stage, "mixed_adam")
    held = r["held"]
    print(
        f"N=4 {STAGE_NAMES[stage]:<7} mixed: measured {held['parameters']:>8,} "
        f"{held['gradients']:>8,} {held['optimizer_state']:>9,} | formula {formula.params:>8,} "
        f"{formula.grads:>8,} {formula.optimizer:>9,}"
    )

# %% [markdown]
# ## 3. Bytes on the wire per stage <a id="zero-comm"></a>
#
# DDP all-reduces the gradients: `2(N-1)/N · Ψ` elements per rank. ZeRO-1 and ZeRO-2 split that
# all-reduce into its halves — reduce-scatter the gradients (each rank receives the sum of its
# shard), step the shard, all-gather the parameters — so they move **exactly the same bytes**.
# ZeRO-3 holds no full parameters, so it all-gathers each unit in forward *and again* in backward:
# `3(N-1)/N · Ψ`, **1.5×** DDP. Look for the measured bytes of one step equal to the formula.

# %%
for n, per_rank in measured.items():
    ddp = per_rank[0][0]["sent"]
    for stage, r in enumerate(per_rank[0]):
        formula = zero_comm_bytes_per_rank(PSI, n, stage, bytes_per_elem=4)
        print(
            f"N={n} {STAGE_NAMES[stage]:<7} sent {r['sent']:>10,.0f} B counted  formula {formula:>10,}"
            f"  ({r['sent'] / ddp:.2f}× DDP)"
        )

# %% [markdown]
# ### Exercise: the ZeRO-1 step <a id="exercise-zero1-step"></a>
#
# ZeRO-1's whole trick is in the optimizer step. The grader lays the model's parameters end to end
# in one flat buffer `flat_params` (padded to a multiple of N; the parameters are views into it)
# and gives each rank:
#
# - `flat_grad`: this rank's **local** gradient, flattened the same way (not yet averaged);
# - `shard`: this rank's fp32 master copy of chunk `r` of `flat_params` (`flat_params.numel() / N`
#   elements), and `optimizer`, a torch optimizer over `[shard]` only — so its state is `1/N` size.
#
# Write `zero1_step(flat_params, flat_grad, shard, optimizer)`:
#
# 1. **reduce-scatter** `flat_grad`, so this rank receives the *sum* of chunk `r` over all ranks,
#    and divide by the world size;
# 2. make that the shard's gradient and step the optimizer;
# 3. **all-gather** every rank's updated shard into `flat_params`.
#
# Use the helpers `reduce_scatter(shard_out, full_in)` and `all_gather(full_out, shard_in)`: they
# run on dtlab's own send/recv rings, so every byte you move is counted and traced.
# While grading, every collective but reduce-scatter and all-gather is switched off, and each step
# must send exactly `2(N-1)/N · M` bytes per rank (one all-reduce's worth, split in its two halves).
# The grader trains 4 steps of SGD with momentum on 2 ranks and compares the model with one
# process training on the whole batch (tolerance 1e-5).


# %%
import torch.distributed as dist

from dtlab.parallel.gradient_sync import all_gather, reduce_scatter


def zero1_step(
    flat_params: torch.Tensor,
    flat_grad: torch.Tensor,
    shard: torch.nn.Parameter,
    optimizer: torch.optim.Optimizer,
) -> None:
    """Reduce-scatter the gradient, step this rank's shard, all-gather the parameters."""
    # BEGIN SOLUTION
    grad_shard = torch.empty_like(shard)
    reduce_scatter(grad_shard, flat_grad)
    shard.grad = grad_shard.div_(dist.get_world_size())
    optimizer.step()
    shard.grad = None
    all_gather(flat_params, shard.detach())
    # END SOLUTION


# %%
check_exercise("zero.zero1_step", zero1_step, two_ranks)

# %% [markdown]
# ## 4. FSDP: wrap units and prefetch on the timeline <a id="fsdp-units"></a>
#
# ZeRO-3 cannot gather the whole model at once — that would bring back the memory it saved. FSDP
# cuts the model into **units** (usually one per transformer block, plus a *root* unit for the
# embeddings, final norm and head) and keeps only one or two of them gathered at a time:
#
# - forward: all-gather unit `k`, run it, free it; meanwhile **prefetch** (launch the all-gather
#   of) unit `k+1` so it arrives while `k` computes;
# - backward: all-gather unit `k` again, compute its gradients, **reduce-scatter** them, free.
#
# First the memory: the peak of parameter bytes held during forward, one unit for the whole model
# vs one per block. Look for: one unit peaks at the full model plus the shards; per-block units
# peak at the root plus one block (two with prefetch) plus the shards.

# %%
FSDP_CONFIG = GPTConfig.tiny(n_layers=4) if FAST else GPTConfig.small()


def peak_parameter_bytes(per_block: bool, prefetch: bool) -> dict:
    rank, world, device = dtlab.rank(), dtlab.world_size(), dtlab.device()
    model = GPT(FSDP_CONFIG, seed=0).to(device)
    units = list(model.blocks) if per_block else []
    fsdp = FullyShardedDataParallel(model, units=units, prefetch=prefetch)
    peak = [fsdp.held_parameter_bytes()]
    for block in model.blocks:  # registered after FSDP's own hook: runs once the block is gathered
        block.register_forward_pre_hook(lambda *_: peak.append(fsdp.held_parameter_bytes()))
    x, y = shard_for_rank(SyntheticTokens(FSDP_CONFIG, 1, 4 * world)[0], rank, world)
    loss_fn(fsdp(x.to(device)), y.to(device)).backward()
    numel = {u.index: u.seg.numel for u in fsdp.units}
    return {"peak": max(peak), "root": numel[0], "block": numel.get(1, 0)}


psi = FSDP_CONFIG.num_params()
shards = -(-psi // 2) * 4
for per_block, prefetch in ((False, False), (True, False), (True, True)):
    r = two_ranks.run(peak_parameter_bytes, per_block, prefetch)[0]
    if not per_block:
        formula, label = shards + psi * 4, "one unit            : shards + Ψ·4"
    else:
        blocks = 2 if prefetch else 1
        formula = shards + (r["root"] + blocks * r["block"]) * 4
        label = f"per block, prefetch={prefetch!s:<5}: shards + (root + {blocks} block)·4"
    print(f"{label:<56} measured {r['peak']:>9,} B   formula {formula:>9,} B")

# %% [markdown]
# Now the time. Forward and backward are traced as compute; each unit's all-gather and
# reduce-scatter is a comm span; a prefetched all-gather runs from launch to completion and any
# time spent blocked on it is a `wait:` idle span. Look for, with prefetch, the next unit's
# all-gather (orange, lower lane) running under the current unit's compute, and the exposed
# communication falling. Count the all-gathers: 2 per unit per step (forward and backward). On
# ranks that share a couple of CPU cores the prefetched transfer competes with the compute for
# the same cores, so the exposed time may barely move; on GPUs the copy engines and NCCL's
# streams run beside the kernels and the saving shows.


# %%
def fsdp_steps(prefetch: bool, steps: int = 3) -> dict:
    rank, world, device = dtlab.rank(), dtlab.world_size(), dtlab.device()
    model = GPT(FSDP_CONFIG, seed=0).to(device)
    fsdp = FullyShardedDataParallel(model, units=list(model.blocks), prefetch=prefetch)
    opt = fsdp.build_optimizer(torch.optim.AdamW, lr=1e-3)
    data = SyntheticTokens(FSDP_CONFIG, n_batches=steps, batch_size=8 * world, seed=0)
    for step, batch in enumerate(data):
        x, y = (t.to(device) for t in shard_for_rank(batch, rank, world))
        dtlab.barrier()
        opt.zero_grad()
        with trace.span("forward", kind="compute", step=step):
            loss = loss_fn(fsdp(x), y)
        with trace.span("backward", kind="compute", step=step):
            loss.backward()
        opt.step()
    return {"units": len(fsdp.units)}


def exposed_seconds(run_trace, rank: int = 0) -> float:
    """Time blocked on communication: blocking collectives plus waits on async ones."""
    spans = run_trace.filter(rank=rank).spans
    blocking = [s for s in spans if s.kind == "comm" and not s.labels.get("async_op")]
    waits = [s for s in spans if s.kind == "idle" and s.name.startswith("wait:")]
    return sum(s.duration_s for s in blocking + waits)


fsdp_runs = {prefetch: two_ranks.run(fsdp_steps, prefetch) for prefetch in (False, True)}
for prefetch, run in fsdp_runs.items():
    spans = run.trace.filter(rank=0, kind="comm").spans
    gathers = sum(s.name.endswith("all_gather") for s in spans)
    scatters = sum(s.name.endswith("grad_rs") for s in spans)
    units = run[0]["units"]
    print(
        f"prefetch={prefetch!s:<5}: {gathers} all-gathers, {scatters} reduce-scatters in 3 steps "
        f"(formula 2·{units}·3 = {6 * units}, {units}·3 = {3 * units}); "
        f"exposed comm {exposed_seconds(run.trace) * 1e3:.1f} ms"
    )
dtlab.viz.timeline(
    fsdp_runs[True].trace,
    title="FSDP, one unit per block, with prefetch",
    caption="Each block's all-gather (orange) runs while the previous block computes (blue).",
)

# %% [markdown]
# ## 5. Offload: the optimizer state goes to the host <a id="offload"></a>
#
# ZeRO-Offload (Ren et al., USENIX ATC 2021) moves the biggest item, the `12Ψ/N` bytes of fp32
# master + Adam state, to CPU memory, and runs the optimizer step there. Per step each rank copies
# its gradient shard to the host (`Ψ/N` fp32 elements here) and the updated parameter shard back.
# The report below lists every byte under the device that really holds it. On a machine whose
# ranks compute on the host, offloading therefore moves nothing — both columns are the host — and
# only adds the two copies, which the timeline shows as `memcpy` spans. On GPUs the optimizer
# state leaves the device and the copies become pinned, asynchronous DMA transfers.
#
# Look for: the bytes per device with and without offload, and the copies' time per step.


# %%
def held_with_offload(offload: bool) -> dict:
    rank, world, device = dtlab.rank(), dtlab.world_size(), dtlab.device()
    precision = MixedPrecision(torch.bfloat16)
    model = GPT(CONFIG, seed=0).to(device)
    opt = ZeroOptimizer(
        model.parameters(), torch.optim.AdamW, stage=2, mixed_precision=precision,
        offload=offload, lr=1e-3,
    )  # fmt: skip
    model.to(precision.param_dtype)
    x, y = shard_for_rank(SyntheticTokens(CONFIG, 1, 4 * world)[0], rank, world)
    for _ in range(2):
        opt.zero_grad()
        loss_fn(model(x.to(device)), y.to(device)).backward()
        opt.step()
    loss_fn(model(x.to(device)), y.to(device)).backward()  # gradient shards exist again
    return {"held": opt.held_bytes(), "compute_device": str(device)}


state = model_state_bytes(PSI, 2, 2, "mixed_adam")
for offload in (False, True):
    run = two_ranks.run(held_with_offload, offload)
    held, where = run[0]["held"], run[0]["compute_device"]
    copies = run.trace.filter(rank=0, kind="memcpy")
    print(
        f"offload={offload!s:<5}: compute device {where}; bytes by device {held['by_device']}; "
        f"optimizer state {held['optimizer_state']:,} B; copies {len(copies.spans)} "
        f"taking {copies.total_seconds('memcpy') * 1e3:.2f} ms"
    )
print(
    f"formula (ZeRO-2, mixed, N=2): 2Ψ + 2Ψ/N = {state.params + state.grads:,} B of parameters and "
    f"gradients stay on the compute device; 12Ψ/N = {state.optimizer:,} B can leave it"
)

# %% [markdown]
# ## 6. DDP or FSDP? <a id="ddp-or-fsdp"></a>
#
# - **DDP** when the model state (`16Ψ`) plus activations fits one device with room to spare: the
#   least communication (`2(N-1)/N·Ψ`), the simplest code, and all of it overlaps backward.
# - **ZeRO-1/2** when it *almost* fits: the same bytes as DDP, the optimizer state (and gradients)
#   divided by N. ZeRO-2 is the usual first step.
# - **FSDP / ZeRO-3** when even the parameters must be split: 1.5× the bytes, and the all-gathers
#   must hide behind compute (prefetch, units neither too small nor too large). Combine with
#   tensor/pipeline parallelism (labs 04–05) when a single layer or the activations do not fit.
#
# Eight 80 GB GPUs, mixed Adam, model state only (activations come on top — lab 09). A
# datasheet's "80 GB" of HBM is about 80 GiB: 85.9 GB in the decimal GB printed here on an
# A100 (81,920 MiB), 85.5 on an H100.

# %%
for billions in (1.3, 7, 70):
    rows = stage_table(int(billions * 1e9), 8)
    cells = "  ".join(f"{row['name']} {row['total'] / GB:7.1f}" for row in rows)
    fits = [row["name"] for row in rows if row["total"] <= 80 * 2**30]
    print(f"{billions:>5}B: {cells} GB/rank → fits: {', '.join(fits) or 'none'}")

# %% [markdown]
# ## 7. A memory calculator <a id="memory-calculator"></a>
#
# Change the model size, the number of ranks, the stage and the precision recipe; the table and
# bars are `dtlab.memory.model_state_bytes`. Try: the smallest N at which a 70B model's ZeRO-3
# state fits 80 GB; how much ZeRO-1 saves at N = 2 vs N = 64; why pure-bf16 Adam without masters
# (`bf16_adam_no_master`) is tempting and what it gives up (lab 08).

# %%
dtlab.viz.memory_calculator(num_params=7e9, world_size=8, zero_stage=2)

# %% [markdown]
# ## 8. Muon under ZeRO: an update that needs whole matrices <a id="distributed-muon"></a>
#
# Adam's update is elementwise, so ZeRO lets each rank update its own flat slice of each matrix.
# **Muon** (Jordan et al. 2024; Liu et al. 2025) steps along the *orthogonalised* momentum, the
# `U Vᵀ` of `M = U Σ Vᵀ`, approximated by five Newton–Schulz iterations that multiply whole
# matrices (`4m²n + 2m³` FLOPs each, `m ≤ n`). The momentum update still runs on the shard; the
# orthogonalisation cannot. Either **every rank** all-gathers every momentum matrix and
# orthogonalises all of them (each keeps its slice), or each matrix has **one owner** that
# gathers the slices, orthogonalises and scatters the result back (`dtlab.optim.muon`). On four
# ranks, look for: both equal to one process's update bit for bit, the counted bytes equal to the
# formula, the owner strategy sending fewer bytes in total, and its FLOPs (counted by torch's
# `FlopCounterMode` on each rank, beside the formula) split over the ranks.

# %%
MUON_SHAPES = (
    [(96, 32), (32, 32), (128, 32), (32, 128)]
    if FAST
    else [(768, 256), (256, 256), (1024, 256), (256, 1024)]
)


def momenta() -> list:
    g = torch.Generator().manual_seed(5)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in MUON_SHAPES]


def muon_on_ranks(strategy: str) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    from dtlab.comm import Communicator

    comm = Communicator(collectives="dtlab")
    shards = [m.reshape(-1).chunk(comm.world_size)[comm.rank].clone() for m in momenta()]
    with FlopCounterMode(display=False) as counter:  # torch counts each matmul this rank runs
        updates = sharded_muon_updates(shards, MUON_SHAPES, comm, strategy)
    return {
        "updates": updates,
        "bytes": comm.comm_stats.bytes_sent,
        "flops": counter.get_total_flops(),
    }


with dtlab.Cluster(4, device="cpu") as muon_ranks:
    muon = {s: muon_ranks.run(muon_on_ranks, s) for s in STRATEGIES}
whole = [muon_update(m).reshape(-1).chunk(4) for m in momenta()]
print(
    f"{'strategy':<11} {'equal to one process':>20} {'bytes per rank (counted)':>34} {'formula':>34}"
)
for s in STRATEGIES:
    equal = all(
        torch.equal(u, whole[i][r])
        for r, out in enumerate(muon[s])
        for i, u in enumerate(out["updates"])
    )
    counted = [out["bytes"] for out in muon[s]]
    formula = [int(b) for b in muon_bytes_per_rank(MUON_SHAPES, 4, s, bytes_per_elem=8)]
    print(f"{s:<11} {equal!s:>20} {str(counted):>34} {str(formula):>34}")
for s in STRATEGIES:
    counted = [round(out["flops"] / 1e6, 2) for out in muon[s]]
    formula = [round(f / 1e6, 2) for f in muon_flops_per_rank(MUON_SHAPES, 4, s)]
    print(f"{s:<11} Newton–Schulz MFLOP per rank (counted) {counted}  formula {formula}")

# %%
fig = make_subplots(
    rows=1,
    cols=2,
    subplot_titles=("kB sent per rank (counted)", "Newton–Schulz MFLOP per rank (counted)"),
)
for s in STRATEGIES:
    fig.add_bar(
        x=[f"rank {r}" for r in range(4)],
        y=[out["bytes"] / 1e3 for out in muon[s]],
        name=s,
        legendgroup=s,
        row=1,
        col=1,
    )
    fig.add_bar(
        x=[f"rank {r}" for r in range(4)],
        y=[out["flops"] / 1e6 for out in muon[s]],
        name=s,
        legendgroup=s,
        showlegend=False,
        row=1,
        col=2,
    )
fig.update_layout(template=dtlab.viz.DTLAB_TEMPLATE, barmode="group", height=340)
fig.update_yaxes(title_text="kB sent", row=1, col=1)
fig.update_yaxes(title_text="MFLOP (counted)", row=1, col=2)
dtlab.viz.describe(
    fig,
    title="Distributed Muon on four ranks: replicated vs one owner per matrix",
    x="rank",
    caption=(
        "Owners send fewer bytes in all; each owner runs Newton–Schulz on its own matrix only, "
        "so the work is split as unevenly as the matrices' sizes (11–32 % each here)."
    ),
)
fig.show()

# %%
ask("zero.muon_owner_bytes")

# %%
ask("zero.muon_why_gather")

# %% [markdown]
# ## 9. Check your understanding

# %%
ask("zero.bytes_per_param")

# %%
ask("zero.what_each_stage_shards")

# %%
ask("zero.stage1_per_rank_7b")

# %%
ask("zero.stage2_per_rank_7b")

# %%
ask("zero.stage3_per_rank_7b")

# %%
ask("zero.zero3_comm")

# %%
ask("zero.fsdp_unit_order")

# %%
ask("zero.offload")

# %%
ask("zero.stage_choice")

# %%
ask("data_parallel.when_ddp")

# %%
ask("zero.ddp_or_fsdp")

# %% [markdown]
# ## 10. Shut the cluster down

# %%
two_ranks.close()
