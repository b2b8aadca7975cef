# %% [markdown]
# # Lab 08 — Mixed precision, from FP32 to FP8
#
# Fewer bits per number mean faster matrix multiplies, fewer bytes on the wire and smaller
# activations. They also mean numbers that overflow, underflow or round away. Every recipe in
# this lab keeps the speed and guards against one of those failures. You will watch each failure
# happen on real gradients, and the guard fix it.
#
# One idea at a time:
#
# 1. the formats: bits, range and resolution of FP32, TF32, BF16, FP16, E4M3, E5M2;
# 2. FP16 on real gradients: what underflows, and what overflows;
# 3. dynamic loss scaling: you write the update rule, then watch it on ZeRO ranks;
# 4. BF16, and why the optimizer keeps FP32 master weights;
# 5. FP8: scale granularity against an outlier; you write per-tile quantisation;
# 6. row-wise and column-wise copies: why backward needs its own quantisation;
# 7. FP8 weight all-gather under FSDP, on the cluster: half the bytes, one agreed scale;
# 8. cast overhead against width: when FP8 pays, and which layers stay in BF16;
# 9. MXFP8, NVFP4 and NVFP4's training recipe on the lab GPT;
# 10. memory per parameter and per activation, recipe by recipe.

# %%
import plotly.graph_objects as go
import torch

import dtlab
import dtlab.viz
from dtlab import trace
from dtlab.config import fast_mode, lab_world_size
from dtlab.memory.formulas import model_state_bytes
from dtlab.memory.precision_bytes import (
    activation_bytes_per_element,
    activation_bytes_per_layer_for,
    bytes_per_param_table,
    model_state_recipe,
)
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
from dtlab.precision import (
    GEMM_PATHS,
    AmaxHistory,
    Fp8Linear,
    Fp8Recipe,
    flushed_to_zero,
    format_table,
    mxfp8_roundtrip,
    number_format,
    nvfp4_roundtrip,
    quantize_fp8,
    relative_error,
)
from dtlab.precision.formats import lost_updates
from dtlab.precision.loss_scaler import ScalerConfig, ScalerState, next_scale_state
from dtlab.precision.recipes import train_recipe
from dtlab.quiz import ask, check_exercise
from dtlab.trace import Trace
from dtlab.viz.chart import describe

dtlab.viz.setup_notebook()
FAST = fast_mode()
STEPS = 16 if FAST else 200
# The single-process runs below multiply tensors of a few thousand elements: a thread pool costs
# more than it saves there, and the cluster's ranks already hold a core each.
torch.set_num_threads(1)

# %% [markdown]
# ## 1. The cluster <a id="setup"></a>
#
# Two ranks in fast mode (one per GPU otherwise). Most of this lab is numerics on one process.
# The cluster comes in where precision meets distribution: the ranks must agree on whether a
# step overflowed.

# %%
cluster = dtlab.Cluster(lab_world_size(2))
print(f"{cluster.world_size} ranks on {cluster.device_type}; training runs of {STEPS} steps")

# %% [markdown]
# ## 2. The formats <a id="formats"></a>
#
# A float is a sign, `e` exponent bits and `m` mantissa bits. The exponent bits set the
# **range**: the largest value and the smallest one before underflow. The mantissa bits set the
# **resolution**: `eps = 2^-m`, the gap between 1.0 and the next number. `dtlab.precision`
# computes both from the bit layout (the tests check them against `torch.finfo`). Look for:
# BF16 has FP32's range with only 7 mantissa bits; FP16 has 3 more mantissa bits but tops out at
# 65,504; E4M3 stops at 448 (it gives up infinities to gain one more binade); E5M2 trades a
# mantissa bit for range. TF32 is the tensor-core format for FP32 inputs: FP32's range, FP16's
# resolution.

# %%
print(f"{'format':>6} {'bits':>4} {'exp':>3} {'man':>3} {'max':>10} {'min normal':>11} "
      f"{'min subnormal':>13} {'eps':>9}")  # fmt: skip
for row in format_table():
    print(
        f"{row['format']:>6} {row['bits']:>4} {row['exponent']:>3} {row['mantissa']:>3} "
        f"{row['max']:>10.3g} {row['smallest_normal']:>11.3g} {row['smallest_subnormal']:>13.3g} "
        f"{row['eps']:>9.3g}"
    )

# %% [markdown]
# The same table drawn on a log scale. Each bar spans the magnitudes a format can hold, from
# its smallest subnormal to its max. Look for the FP8 bars: about 5 (E4M3) and 10 (E5M2)
# decades, where FP32 spans 83. A tensor must be **scaled** into that window before it is cast.

# %%
names = ("fp32", "tf32", "bf16", "fp16", "e4m3", "e5m2")
fig = go.Figure()
for name in names:
    f = number_format(name)
    low, high = torch.tensor([f.smallest_subnormal, f.max]).log10().tolist()
    fig.add_bar(
        y=[name], x=[high - low], base=[low], orientation="h", name=f"{name} (eps {f.eps:g})"
    )
describe(
    fig,
    title="Representable magnitudes per format",
    caption="FP8 spans a few decades; FP32 and BF16 span about eighty",
    x="log10 of the magnitude (decades)",
    y="format (name)",
)
fig

# %% [markdown]
# Resolution in one line: add `0.001` to a weight of `1.0` in each format. Look for BF16
# returning exactly 1.0. Its spacing near 1.0 is `2^-7 ≈ 0.0078`, so any update below half of
# that is rounded away.

# %%
for fmt in ("fp32", "fp16", "bf16"):
    print(f"{fmt}: 1.0 + 0.001 == 1.0 ? {lost_updates(1.0, 0.001, fmt)}")

# %% [markdown]
# ## 3. FP16 on real gradients <a id="fp16-range"></a>
#
# Below are the gradients of the lab GPT at its first step, computed in FP32. The loss is
# divided by 1024, as a loop accumulating 1024 micro-batches does, so every gradient is 1024×
# smaller. The lines mark FP16's limits: values below half of `2^-24` flush to zero, values
# below `2^-14` are subnormal (fewer mantissa bits), values above 65,504 overflow to inf. Look
# for the share of the histogram left of the first line.

# %%
gpt_config = GPTConfig.tiny()
x, y = SyntheticTokens(gpt_config, 1, 8)[0]
model = GPT(gpt_config, seed=0)
(loss_fn(model(x), y) / 1024).backward()
grads = torch.cat([p.grad.flatten() for p in model.parameters()])
alive = grads[grads != 0].abs()
fp16 = number_format("fp16")
print(
    f"{alive.numel():,} nonzero gradient elements; flushed to zero in FP16 (below 2^-25): "
    f"{(alive < fp16.smallest_subnormal / 2).float().mean():.1%}; below its smallest normal "
    f"(subnormal, fewer mantissa bits): {(alive < fp16.smallest_normal).float().mean():.1%}"
)
fig = go.Figure(go.Histogram(x=alive.log2().tolist(), nbinsx=80, name="gradients"))
for value, label in ((2.0**-24, "fp16 min subnormal"), (2.0**-14, "fp16 min normal")):
    fig.add_vline(x=torch.tensor(value).log2().item(), line_dash="dash", annotation_text=label)
describe(
    fig,
    title="Gradient magnitudes of the lab GPT (loss / 1024)",
    caption="the mass left of the dashed lines is lost or degraded in FP16",
    x="log2 |gradient| (binades)",
    y="gradient elements (count)",
)
fig

# %% [markdown]
# The same backward run *in* FP16, without and with loss scaling (`2^16`), against the FP32
# backward at the same weights. `train_recipe` measures the fraction of gradient elements that
# are nonzero in FP32 and zero in FP16, then trains on. Look for: without scaling a large share
# flushes and the loss lags; with scaling almost nothing flushes and the loss matches FP32.

# %%
fp16_runs = {
    recipe: train_recipe(recipe, STEPS, accumulation=1024)
    for recipe in ("fp32", "fp16_unscaled", "fp16_scaled")
}
for recipe, run in fp16_runs.items():
    print(
        f"{recipe:>14}: gradient elements flushed to zero {run.underflow_fraction:6.2%}, "
        f"final loss {run.final_loss:.4f}"
    )

# %% [markdown]
# Overflow is the other edge: FP16 holds nothing above 65,504. The same gradients as in the
# histogram, multiplied by a loss scale `2^k` and cast to FP16. Look for the window: too small a
# scale flushes gradients to zero, too large a one turns the biggest into inf. Somewhere in
# between, both counts are near zero; finding that window is the scaler's job.

# %%
nonzero = grads != 0
print(f"{'scale':>6} {'flushed to zero':>16} {'overflowed to inf':>18}")
for exponent in (0, 8, 16, 24, 32, 40):
    in_fp16 = (grads * 2.0**exponent).half()
    flushed = ((in_fp16 == 0) & nonzero).float().mean().item()
    overflowed = torch.isinf(in_fp16).float().mean().item()
    print(f"{'2^' + str(exponent):>6} {flushed:>16.2%} {overflowed:>18.4%}")

# %% [markdown]
# ## 4. Dynamic loss scaling <a id="loss-scaler"></a>
#
# The scale must be large enough to lift small gradients, and small enough not to overflow.
# Nobody knows that value in advance, so the scaler searches for it (Micikevicius et al. 2018;
# `torch.amp.GradScaler`). Every step:
#
# 1. multiply the loss by `S` and run backward;
# 2. divide every gradient by `S` and look for inf/NaN;
# 3. on overflow, **skip** the optimizer step and halve `S`. Otherwise step, and after
#    `growth_interval` clean steps in a row, double `S`.
#
# Under ZeRO-2/3 or FSDP a rank holds only a **shard** of the gradient, so an inf may sit on
# rank 1 alone. If rank 0 stepped and rank 1 skipped, their weights would diverge, and the next
# all-gather would wait forever. The ranks combine their flags with **one all-reduce**.
#
# ### Exercise: write the update rule <a id="exercise-scaler"></a>
#
# Write `scaler_update(grads, scale, clean_steps, growth_interval)`. It is called on every rank
# with the gradients that rank holds, still multiplied by `scale`. It must divide them by
# `scale` in place, decide with one `dist.all_reduce` whether **any** rank overflowed, and
# return `(skip, new_scale, new_clean_steps)`: on overflow `(True, scale / 2, 0)`; otherwise
# count the clean step, and when the count reaches `growth_interval` double the scale and reset
# the count to 0.
#
# The grader runs it on every rank, with an inf on rank 1 only, a NaN on rank 0 only, a step
# that completes the interval, and huge but finite gradients. It refuses any other collective,
# more than one all-reduce, and calls to a ready-made rule: the library's scaler, or
# `torch.amp.GradScaler` and the kernels behind it.


# %%
def scaler_update(grads, scale, clean_steps, growth_interval):
    import torch.distributed as dist

    # BEGIN SOLUTION
    flag = torch.zeros(1)
    for grad in grads:
        grad.div_(scale)
        flag = torch.maximum(flag, (~torch.isfinite(grad)).any().float().reshape(1))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() > 0:
        return True, scale / 2, 0
    if clean_steps + 1 == growth_interval:
        return False, scale * 2, 0
    return False, scale, clean_steps + 1
    # END SOLUTION


# %%
check_exercise("precision.loss_scaler_update", scaler_update, cluster)

# %% [markdown]
# The library's `DynamicLossScaler` follows the same rule. The tests check that its scale,
# skipped steps and parameters equal `torch.amp.GradScaler`'s on a run with planted overflows.
# Here it trains the lab GPT on the cluster under ZeRO-2 with FP16 compute and FP32 master
# shards. It starts at a deliberately absurd scale of `2^24` and grows every 4 clean steps.
# Each rank records, per step, the scale, whether it skipped, and whether *its own* shard held
# an inf. Look for: a run of skipped steps while the scale halves down from `2^24`, then
# occasional skips after a growth. Then look for a step where one rank saw no overflow in its
# shard and still skipped, because the other rank's flag said so.


# %%
def zero2_fp16(steps: int) -> dict:
    import torch.distributed as dist

    from dtlab.models import shard_for_rank
    from dtlab.parallel import MixedPrecision, ZeroOptimizer
    from dtlab.precision import DynamicLossScaler, ScalerConfig

    model = GPT(gpt_config, seed=0)
    opt = ZeroOptimizer(
        model.parameters(), torch.optim.AdamW, stage=2, lr=3e-3,
        mixed_precision=MixedPrecision(torch.float16),
    )  # fmt: skip
    model.to(torch.float16)
    scaler = DynamicLossScaler(ScalerConfig(init_scale=2.0**24, growth_interval=4))
    losses = []
    for step, batch in enumerate(SyntheticTokens(gpt_config, steps, 8)):
        x, y = shard_for_rank(batch, dist.get_rank(), dist.get_world_size())
        with trace.labels(step=step):
            loss = loss_fn(model(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        losses.append(loss.item())
    return {"history": [(s.scale, s.skipped, s.local_overflow) for s in scaler.history],
            "losses": losses}  # fmt: skip


scaled = cluster.run(zero2_fp16, 20 if FAST else 60)
history = scaled[0]["history"]
for step, per_rank in enumerate(zip(*(r["history"] for r in scaled), strict=True)):
    scale, skipped, _ = per_rank[0]
    local = ", ".join(f"rank {r}: {'inf' if s[2] else 'ok'}" for r, s in enumerate(per_rank))
    print(f"step {step:>2}: scale 2^{torch.tensor(scale).log2().item():.0f} "
          f"{'SKIPPED' if skipped else 'stepped'} ({local})")  # fmt: skip

# %% [markdown]
# The scale over the steps, skipped steps marked.

# %%
steps_axis = list(range(len(history)))
fig = go.Figure()
fig.add_scatter(x=steps_axis, y=[h[0] for h in history], mode="lines+markers", name="loss scale")
skips = [i for i, h in enumerate(history) if h[1]]
fig.add_scatter(x=skips, y=[history[i][0] for i in skips], mode="markers", name="skipped step",
                marker={"symbol": "x", "size": 12})  # fmt: skip
fig.update_yaxes(type="log")
describe(
    fig,
    title="Dynamic loss scale, ZeRO-2 with FP16 compute",
    caption="halving on every overflow, doubling after 4 clean steps",
    x="training step (index)",
    y="loss scale (multiplier)",
)
fig

# %% [markdown]
# On the timeline, every step has one `overflow_flag` all-reduce (4 bytes). Skipped steps have
# no `optimizer_step` span and no parameter all-gather: the ranks agreed to do nothing. Look
# for the gaps where those spans are missing in the first steps.

# %%
first_steps = Trace([s for s in scaled.trace.spans if s.labels.get("step", 99) < 8])
dtlab.viz.timeline(first_steps, title="Loss scaling under ZeRO-2, first 8 steps")

# %% [markdown]
# Two details of that run. First, where the unscaling happens: ZeRO-2 reduce-scatters FP16
# gradient shards, and the scaler upcasts each shard to FP32 *before* dividing by `S`, as
# DeepSpeed does. Divided in FP16, the true gradients (`S` times smaller) would flush to zero
# all over again, so `torch.amp.GradScaler` refuses FP16 gradients outright.
#
# Second, **hysteresis** (DeepSpeed's `hysteresis`, also called `delayed_shift`). A single spike
# halves GradScaler's scale, and the scale then needs a whole growth interval to recover.
# With hysteresis `h`, the first `h − 1` overflows in a row only skip the step. The `h`-th one
# halves the scale, and the allowance refills when the scale next grows. Below, the same
# pattern of clean (`c`) and overflowing (`o`) steps under both rules (`next_scale_state`, the
# rule the tests check against a line-by-line copy of DeepSpeed's). Look for the isolated
# overflows: each costs GradScaler a halving and hysteresis 2 nothing. Two overflows in a row
# halve the scale under both rules.

# %%
events = "cccocccccocccccoocccc"
rows = {"event": list(events)}
for h in (1, 2):
    config = ScalerConfig(init_scale=2.0**16, growth_interval=4, hysteresis=h)
    state, rows[f"log2 S, h={h}"] = ScalerState.start(config), []
    for event in events:
        state = next_scale_state(state, event == "o", config)
        rows[f"log2 S, h={h}"].append(f"{torch.tensor(state.scale).log2().item():.0f}")
for name, cells in rows.items():
    print(f"{name:>12}: " + " ".join(f"{c:>2}" for c in cells))

# %% [markdown]
# Last, the scale is an **FP32 number**: GradScaler keeps it in a float32 tensor, and the library
# rounds every new scale to FP32 the same way, so the two move bit for bit. At FP32's ceiling
# this matters. From `2^127`, doubling gives `2^128`: finite as a Python float, inf in FP32, and
# a scale of inf turns every gradient into inf. So the growth is refused: the scale stays, and
# the clean count still restarts. Look for: `S` staying at `2^127` on every clean step.

# %%
print("2^127 * 2 as a Python float:", 2.0**127 * 2, "| in FP32:", torch.tensor(2.0**127) * 2)
config = ScalerConfig(init_scale=2.0**127, growth_interval=1)
state = ScalerState.start(config)
for step in range(3):
    state = next_scale_state(state, False, config)
    print(
        f"clean step {step}: S = 2^{torch.tensor(state.scale).log2().item():.0f}, "
        f"clean count {state.clean_steps}"
    )

# %% [markdown]
# ## 5. BF16, and why master weights <a id="bf16-master"></a>
#
# BF16 has FP32's range, so nothing underflows and no loss scale is needed. It has 7 mantissa
# bits, so a weight cannot absorb a small update. Three runs of the same model:
#
# - `fp32`: the reference;
# - `bf16_master`: a BF16 copy computes; its gradients accumulate into FP32 `.grad` of FP32
#   master weights; AdamW steps the masters, and the copy is re-rounded from them;
# - `bf16_pure`: the BF16 weights *are* what AdamW steps.
#
# `lost_update_fraction` counts, from the tensors, the elements whose value did not change
# although their gradient was nonzero. Look for: `bf16_master` on top of FP32, and `bf16_pure`
# losing a few percent of its updates and lagging.

# %%
bf16_runs = {recipe: train_recipe(recipe, STEPS) for recipe in ("fp32", "bf16_master", "bf16_pure")}
fig = go.Figure()
for recipe, run in bf16_runs.items():
    lost = run.lost_update_fraction
    print(f"{recipe:>11}: final loss {run.final_loss:.4f}, updates lost {lost:.2%}")
    fig.add_scatter(y=run.losses, mode="lines", name=recipe)
describe(
    fig,
    title="Training loss: FP32, BF16 with FP32 masters, pure BF16",
    caption="the masters keep BF16 on the FP32 curve; pure BF16 loses small updates",
    x="training step (index)",
    y="loss (nats)",
)
fig

# %% [markdown]
# At a fine-tuning learning rate the loss is worse than a lag: it stalls. With `lr = 1e-5`,
# Adam's steps (about `lr` each) are below half the BF16 spacing of most weights. Progress is
# measured against a run with `lr = 0`, which shows how much the loss moves from the data
# alone. Look for: pure BF16 dropping most of its updates and making a fraction of FP32's
# progress, while BF16 with FP32 masters matches FP32.

# %%
untrained = train_recipe("fp32", STEPS, lr=0.0).final_loss
for recipe in ("fp32", "bf16_master", "bf16_pure"):
    run = train_recipe(recipe, STEPS, lr=1e-5)
    print(
        f"{recipe:>11}: progress {untrained - run.final_loss:.4f} nats, "
        f"updates lost {run.lost_update_fraction:.0%}"
    )

# %% [markdown]
# ### Without FP32 masters: stochastic rounding and Kahan summation <a id="bf16-without-masters"></a>
#
# Two ways to keep the small updates while storing the weight in BF16:
#
# - **stochastic rounding** (SR): round `w + u` up or down at random, up with probability equal
#   to the distance from the lower neighbour over the spacing, so the *expected* result is exact.
#   `stochastic_round_to_bf16` does it bit-exactly: add 16 random bits below BF16's mantissa to
#   the FP32 pattern and cut them off. Weight state: the BF16 weight, **2 B** per parameter.
# - **Kahan summation**: a BF16 compensation buffer per weight collects what each addition
#   rounded away and feeds it back into the next one (`kahan_add_`). Weight state: **2 + 2 = 4 B**.
# - The **FP32 master** keeps 4 B beside the 2 B BF16 copy the forward reads: **6 B**.
#   (FSDP2 keeps only the FP32 shard and casts a passing BF16 copy, so there the master costs
#   4 B, the same as Kahan.) Optimizer moments come on top in all three.
#
# Below, the updates-lost setting above reduced to one tensor of 4096 weights at the GPT's init
# scale: every step moves a weight by exactly `lr = 1e-5` toward a target (SGD on an L1 loss, the
# size of an Adam step), below half the BF16 spacing of most weights. Each mode's distance from
# the FP32 master's trajectory is printed and plotted. Look for: pure BF16 as far from the
# master as the master has travelled (it has not moved), SR off only by its rounding noise, and
# Kahan more than ten times closer still.

# %%
from dtlab.precision import UPDATE_MODES, updates_lost_demo, weight_bytes_per_parameter

lost_run = updates_lost_demo(steps=400 if FAST else 2000, lr=1e-5)
print(f"the FP32 master travelled {lost_run.master_travel[-1]:.2e} (RMS)")
fig = go.Figure()
for mode in UPDATE_MODES[1:]:
    print(
        f"{mode:>10} ({weight_bytes_per_parameter(mode)} B/param): "
        f"final distance from the master {lost_run.final(mode):.2e} (RMS)"
    )
    fig.add_scatter(y=lost_run.distance[mode], mode="lines", name=mode)
fig.update_yaxes(type="log")
describe(
    fig,
    title="BF16 weights without FP32 masters: distance from the master's trajectory",
    caption="pure BF16 stalls and drifts away; stochastic rounding stays near; Kahan tracks it",
    x="SGD step (index)",
    y="RMS distance from the FP32 master (weight units)",
)
fig

# %% [markdown]
# ## 6. FP8 and scale granularity <a id="fp8-granularity"></a>
#
# FP8 needs a scale per block of values: `scale = amax / 448` for E4M3, so the block's largest
# value lands on 448. How many values share one scale decides what an outlier destroys. One
# scale per **tensor** lets a single huge value push every other value into E4M3's subnormals.
# One per **row** (token), or per **tile** (1×128 for activations, 128×128 for weights, as in
# DeepSeek-V3), confines the damage to the outlier's own block.
#
# Below, a 256×512 tensor of standard normals with one outlier, of growing size. The error is
# measured on the *other* values. MXFP8 (E4M3 with a power-of-two scale per 32 values) and NVFP4
# (4-bit E2M1 with an E4M3 scale per 16 values, plus a tensor scale) are simulated beside them.
# Look for: per-tensor error rising once the outlier passes about `448 / 2^-6 ≈ 3·10^4` times
# the typical value (E4M3's normal range). The finer granularities stay at E4M3's own rounding,
# about 2.6%, and MXFP8 just above it. NVFP4 sits near 10% (its values have one mantissa bit).
# Its per-tensor scale also ties it to the outlier: at `10^6` the E4M3 block scales
# (`amax_block · 448 / amax`) fall below E4M3's normal range and NVFP4 breaks too.

# %%
outliers = [1e1, 1e2, 1e3, 1e4, 3e4, 1e5, 1e6]
errors = {k: [] for k in ("tensor", "row", "tile", "mxfp8", "nvfp4")}
base = torch.randn(256, 512, generator=torch.Generator().manual_seed(0))
for size in outliers:
    t = base.clone()
    t[3, 7] = size
    ordinary = t.abs() < 100
    for gran in ("tensor", "row", "tile"):
        errors[gran].append(relative_error(t, quantize_fp8(t, "e4m3", gran).dequantize(), ordinary))
    errors["mxfp8"].append(relative_error(t, mxfp8_roundtrip(t), ordinary))
    errors["nvfp4"].append(relative_error(t, nvfp4_roundtrip(t), ordinary))
t = base.clone()
t[3, 7] = 1e5
print(
    f"outlier 1e5: values flushed to zero per tensor "
    f"{flushed_to_zero(t, quantize_fp8(t, 'e4m3', 'tensor').dequantize()):.1%}, "
    f"per tile {flushed_to_zero(t, quantize_fp8(t, 'e4m3', 'tile').dequantize()):.2%}"
)
fig = go.Figure()
for name, values in errors.items():
    fig.add_scatter(x=outliers, y=values, mode="lines+markers", name=name)
fig.update_xaxes(type="log", dtick=1)
fig.update_yaxes(type="log", dtick=1)
describe(
    fig,
    title="Quantisation error on ordinary values next to one outlier",
    caption="per-tensor FP8 breaks once the outlier leaves E4M3's range; per-tile and MXFP8 "
    "barely move; NVFP4's scales underflow at 1e6",
    x="outlier magnitude (× a standard normal)",
    y="relative error (others)",
)
fig

# %% [markdown]
# ### Exercise: per-tile FP8 quantisation <a id="exercise-tiles"></a>
#
# Write `quantize_tiles(x, tile)`. `x` is (R, C) and `tile = (tr, tc)` divides it. Return
# `(q, scales)`: `q` is `x` in `torch.float8_e4m3fn`, and `scales` (R/tr, C/tc) holds one fp32
# scale per tile, `amax(tile) / 448` (1 for an all-zero tile), so that `x ≈ q · scale`. Clamp to
# ±448 before the cast: what a cast does beyond the range differs between formats and builds.
#
# The grader runs on every rank with 1×128 and 128×128 tiles, with an outlier and with an
# all-zero tile. It checks your scales and that your error is as low as the library's. Calling
# the library's quantiser is refused.


# %%
def quantize_tiles(x, tile):
    # BEGIN SOLUTION
    tr, tc = tile
    rows, cols = x.shape
    blocks = x.reshape(rows // tr, tr, cols // tc, tc)
    amax = blocks.abs().amax(dim=(1, 3))
    scales = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    scaled = (blocks / scales[:, None, :, None]).clamp(-448.0, 448.0)
    return scaled.reshape(rows, cols).to(torch.float8_e4m3fn), scales
    # END SOLUTION


# %%
check_exercise("precision.quantize_tiles", quantize_tiles, cluster)

# %% [markdown]
# **Current vs delayed scaling.** Computing the amax needs a pass over the tensor before it is
# cast. *Delayed* scaling (Transformer Engine) takes the scale from the amaxes of earlier steps
# instead. It works while the amax drifts slowly, and saturates when it jumps. Look for the
# number of saturated values when the tensor suddenly grows 100×.

# %%
history_amax = AmaxHistory(length=4)
gen = torch.Generator().manual_seed(1)
for _ in range(4):
    history_amax.quantize(torch.randn(64, 64, generator=gen) * 0.5)
jump = torch.randn(64, 64, generator=gen) * 50
delayed = history_amax.quantize(jump)
current = quantize_fp8(jump, "e4m3")
print(
    f"delayed: {delayed.saturated} of {jump.numel()} values saturated, error "
    f"{relative_error(jump, delayed.dequantize()):.2f}; current: {current.saturated} saturated, "
    f"error {relative_error(jump, current.dequantize()):.3f}"
)

# %% [markdown]
# **The FP8 linear layer.** `Fp8Linear` quantises its input and weight to E4M3 in forward and
# the output gradient to E5M2 in backward, then multiplies. Where this build's
# `torch._scaled_mm` accepts the scale layout (it is probed once and checked against the
# simulation), it runs. Otherwise the layer *simulates*: the same FP8 values, dequantised and
# multiplied in fp32. `GEMM_PATHS` counts which one ran, per GEMM. Look for which paths ran
# here. A simulated GEMM is a numerics check, not an FP8 speed-up.

# %%
layer = torch.nn.Linear(256, 128)
inputs = torch.randn(64, 256, requires_grad=True)
for recipe in (Fp8Recipe("tensor"), Fp8Recipe("row"), Fp8Recipe("tile")):
    GEMM_PATHS.clear()
    Fp8Linear.from_linear(layer, recipe)(inputs).sum().backward()
    print(f"{recipe.granularity:>6}: {dict(GEMM_PATHS)}")

# %% [markdown]
# Now the lab GPT trained with every block's linears in FP8 (the output head stays in high
# precision). We plant a **massive activation**, as LLMs grow them (Sun et al. 2024): token 0's
# input to every linear is multiplied by `2^16` and its output divided back. In exact arithmetic
# nothing changes, so the FP32 run is unaffected. Look for: per-tensor FP8 falling behind FP32,
# per-tile FP8 on top of it.

# %%
fp8_runs = {
    recipe: train_recipe(recipe, STEPS, massive_activation=2.0**16)
    for recipe in ("fp32", "fp8_tensor", "fp8_tile")
}
for recipe, run in fp8_runs.items():
    gap = run.final_loss - fp8_runs["fp32"].final_loss
    print(f"{recipe:>10}: final loss {run.final_loss:.4f} ({gap:+.4f} vs fp32)")

# %% [markdown]
# ## 7. Row-wise and column-wise copies <a id="directional-quantisation"></a>
#
# A block scale multiplies a partial sum, so its block must run along the GEMM's **reduction**
# dimension. The three GEMMs of a linear layer reduce over three different dimensions. Forward
# (`x Wᵀ`) reduces over the input features, so `x` is quantised in 1×32 blocks along its rows.
# The weight gradient (`dyᵀ x`) reduces over the **tokens**, so it needs `x` in 32×1 blocks down
# its columns. With 1-D blocks (MXFP8 here: E4M3 values and a power-of-two E8M0 scale per 32)
# every operand is quantised twice: a row-wise copy and a column-wise copy, stored transposed.
#
# Backward can make its column-wise copy *fresh* from the high-precision `x` (which means
# keeping both copies, or BF16 `x`, until backward), or *from the forward copy*: dequantise the
# saved row-wise copy and quantise it again. Below, a 1024×1024 activation, first plain
# Gaussian, then with one outlier channel (×50). The bytes come from the tensors, the cast times
# from the clock on this machine. Look for: both copies cost twice the bytes of one and at
# least twice the cast time (the column-wise cast also transposes). Re-using the forward copy costs almost nothing on the Gaussian, where the
# grids mostly agree. With an outlier channel it carries the row-wise blocks' damage into the
# weight gradient: in the row-wise copy every block holding channel 5 is scaled to the outlier.

# %%
import time

from dtlab.precision.directional import (
    both_directions,
    quantize_rowwise,
    requantize_error,
    saved_bytes_per_element,
)

gen = torch.Generator().manual_seed(2)
acts = torch.randn(1024, 1024, generator=gen)
grads_out = torch.randn(1024, 256, generator=gen) * 1e-3
row_copy, col_copy = both_directions(acts)
print(
    f"saved for backward, bytes per element (measured | formula): BF16 x 2.00 | "
    f"{saved_bytes_per_element('bf16'):.2f}; row-wise only {row_copy.nbytes / acts.numel():.4f}"
    f" | {saved_bytes_per_element('rowwise_only'):.4f}; both copies "
    f"{(row_copy.nbytes + col_copy.nbytes) / acts.numel():.4f} | "
    f"{saved_bytes_per_element('both'):.4f}"
)


def fastest_seconds(fn, repeats=10):
    """The fastest of ``repeats`` runs: the least disturbed by whatever else the machine runs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


one = fastest_seconds(lambda: quantize_rowwise(acts))
two = fastest_seconds(lambda: both_directions(acts))
print(f"cast time on this CPU (fastest of 10): one copy {one * 1e3:.1f} ms, both {two * 1e3:.1f} "
      f"ms ({two / one:.1f}×)")  # fmt: skip
with_outlier = acts.clone()
with_outlier[:, 5] *= 50
direction_errors = {
    "gaussian": requantize_error(acts, grads_out),
    "outlier channel": requantize_error(with_outlier, grads_out),
}
for case, report in direction_errors.items():
    print(f"{case:>16}: " + ", ".join(f"{k} {v:.4f}" for k, v in report.items()))

# %% [markdown]
# The same errors as bars: the column-wise `x` and the weight gradient computed from it, made
# fresh or from the forward copy.

# %%
fig = go.Figure()
for source, keys in (("fresh", ("x_fresh", "wgrad_fresh")),
                     ("from the forward copy", ("x_from_forward", "wgrad_from_forward"))):  # fmt: skip
    fig.add_bar(
        x=[f"{case}: {what}" for case in direction_errors for what in ("x", "wgrad")],
        y=[direction_errors[case][k] for case in direction_errors for k in keys],
        name=source,
    )
describe(
    fig,
    title="Column-wise MXFP8 copy: made fresh vs made from the forward copy",
    caption="re-using the forward copy is nearly free on Gaussian data and costs accuracy "
    "next to an outlier channel",
    x="tensor (case: quantity)",
    y="relative error (Frobenius)",
)
fig

# %% [markdown]
# A per-tensor scale, or a **2-D** weight block (DeepSeek-V3's 128×128, NVFP4's 16×16), reads
# the same in both directions, so one copy serves forward and backward. That is why the
# recipes use square blocks for weights; activations and gradients still need both copies.
#
# ## 8. FP8 weight all-gather under FSDP <a id="fp8-all-gather"></a>
#
# Under FSDP each rank holds a shard of every weight and all-gathers the rest before a layer
# runs. If the layer computes in FP8 it casts the gathered weight to E4M3 anyway, so the cast
# can move **before** the gather: the wire carries 1 byte per element instead of BF16's 2.
# The scale must be the same on every rank, yet each rank sees only its shard. So the ranks
# first all-reduce (MAX) the amax of every FP8 weight's shard, **one** small message for all of
# them, and then all scale by `amax / 448` (`dtlab.precision.fp8_all_gather`).
#
# Below, the lab GPT trained FSDP-style on the cluster, once with every weight gathered in BF16
# and once with the block linears' weights gathered in FP8. In both runs the linears compute
# in FP8; embeddings, norms and biases travel in BF16. Bytes are counted from the messages with
# `collectives="dtlab"`, per bucket, beside the formula. Look for: the FP8 bucket at exactly half
# the bytes the same weights take in BF16, an amax all-reduce of a few dozen bytes, and the two
# loss curves within the stated tolerance of each other. The one-process reference, which plays
# every rank, matches the FP8 run to float rounding.

# %%
from dtlab.precision.fp8_gather_training import (
    GATHER_LOSS_TOLERANCE,
    train_one_process,
    train_with_gather,
)

GATHER_STEPS = 8 if FAST else 60
gathered = {d: cluster.run(train_with_gather, d, GATHER_STEPS) for d in ("bf16", "fp8")}
for dtype, per_rank in gathered.items():
    rank0 = per_rank[0]
    print(f"{dtype} all-gather, rank 0, per step ({'counted' if rank0['counted'] else 'convention'}"
          " | formula):")  # fmt: skip
    for bucket, sent in rank0["bytes_by_bucket"].items():
        print(
            f"  {bucket:>24}: {sent / GATHER_STEPS:>9,.0f} | {rank0['formula_per_step'][bucket]:>9,}"
        )
    amax_bytes = rank0["bytes_by_op"].get("all_reduce", 0) / GATHER_STEPS
    print(f"  {'amax all-reduce':>24}: {amax_bytes:>9,.0f} | "
          f"{rank0['formula_per_step']['amax_all_reduce']:>9,}")  # fmt: skip
bf16_fp8_bytes = (gathered["bf16"][0]["bytes_by_bucket"]["bf16_weights"]
                  - gathered["fp8"][0]["bytes_by_bucket"]["bf16_weights"])  # fmt: skip
print(f"rank 0 sent for the block linears' weights over {GATHER_STEPS} steps: "
      f"{gathered['fp8'][0]['bytes_by_bucket']['fp8_weights']:,} B in FP8 vs {bf16_fp8_bytes:,} B "
      "in BF16")  # fmt: skip
gather_losses = {d: r[0]["losses"] for d, r in gathered.items()}
gap = max(abs(a - b) for a, b in zip(*gather_losses.values(), strict=True))
reference = train_one_process("fp8", cluster.world_size, GATHER_STEPS)
print(f"largest loss gap FP8 vs BF16 all-gather: {gap:.4f} nats (tolerance {GATHER_LOSS_TOLERANCE}); "
      f"FP8 run vs one process: {max(abs(a - b) for a, b in zip(gather_losses['fp8'], reference, strict=True)):.1e}")  # fmt: skip

# %%
fig = go.Figure()
for dtype, losses in gather_losses.items():
    fig.add_scatter(y=losses, mode="lines+markers", name=f"{dtype} all-gather")
describe(
    fig,
    title="FSDP-style training of the lab GPT: weights gathered in BF16 vs in FP8",
    caption="half the weight bytes on the wire, the same loss curve within the tolerance",
    x="training step (index)",
    y="loss (nats)",
)
fig

# %% [markdown]
# Why the curves agree: the FP8 layer would cast the gathered weight with the same scale anyway.
# Cast before or after the gather, the GEMM sees the same E4M3 grid. Only the BF16 rounding in
# between is skipped, which moves a few weights by one E4M3 step.
#
# ## 9. Cast overhead against width <a id="cast-overhead"></a>
#
# FP8 tensor cores run twice as fast as BF16, but every FP8 operand is first **cast**, a
# memory-bound pass. Per linear layer and step, each of `x`, `W` and `dy` is read for its amax,
# read again and written as two FP8 copies: `6` bytes per element at HBM bandwidth. The GEMM
# time saved grows as `M·N·K`; the cast bytes grow as `M·K + N·K + M·N`. So there is a width below
# which FP8 is *slower* (`dtlab.precision.cast_overhead`, roofline terms, H100 and B200 peaks).
# Look for: the break-even hidden size, speed-ups below 2× even at width 16k, and a
# whole-model figure lower still, because attention and the LM head stay in BF16.

# %%
from dtlab.cost.hardware import gpu
from dtlab.precision.cast_overhead import (
    KEPT_IN_BF16,
    block_speedup,
    break_even_hidden,
    model_speedup,
)

widths = [256, 512, 1024, 2048, 4096, 8192, 16384]
fig = go.Figure()
for hardware in ("h100_sxm", "b200"):
    for tokens in (2048, 16384):
        fig.add_scatter(
            x=widths, y=[block_speedup(h, tokens, hardware) for h in widths], mode="lines+markers",
            name=f"{gpu(hardware).name}, {tokens} tokens",
        )  # fmt: skip
    print(f"{gpu(hardware).name}: FP8 pays off from hidden {break_even_hidden(2048, hardware)} at "
          f"2048 tokens per micro-batch, {break_even_hidden(16384, hardware)} at 16384")  # fmt: skip
fig.add_hline(y=1.0, line_dash="dash", annotation_text="no gain")
fig.update_xaxes(type="log")
describe(
    fig,
    title="FP8 speed-up of a transformer block's linears against hidden size",
    caption="the cast is a fixed tax: narrow layers lose, wide ones approach but never reach 2×",
    x="hidden size (features)",
    y="speed-up over BF16 (×)",
)
fig

# %% [markdown]
# The whole step, by Amdahl's law: only the block linears speed up. Look for how much of the
# block's gain survives in an 8B-class model (`h = 4096`, 32 layers, 128k vocabulary) and how
# little in a small one. Then the layers that stay in BF16, and why.

# %%
for name, (hidden, layers, vocab) in {"1B-class": (2048, 16, 128256),
                                      "8B-class": (4096, 32, 128256),
                                      "70B-class": (8192, 80, 128256)}.items():  # fmt: skip
    print(f"{name:>9}: block linears {block_speedup(hidden, 8192):.2f}×, whole step "
          f"{model_speedup(hidden, layers, 8192, vocab, 8192):.2f}× (H100, 8192 tokens)")  # fmt: skip
print()
for layer, reason in KEPT_IN_BF16.items():
    print(f"{layer:>15}: {reason}")

# %% [markdown]
# ## 10. Microscaling and NVFP4 <a id="nvfp4"></a>
#
# Blackwell's tensor cores read a scale per small block, so fine-grained scaling is free in the
# GEMM. **MXFP8**: E4M3 values with one E8M0 (power-of-two) scale per 32. **NVFP4**: E2M1
# values (±{0, 0.5, 1, 1.5, 2, 3, 4, 6}) with one E4M3 scale per 16, plus one FP32 scale per
# tensor. Below, their bits per value read from the tensors the simulators return, against
# `8 + 8/32` and `4 + 8/16`.

# %%
from dtlab.precision.microscaling import bits_per_value, nvfp4_quantize

sample = torch.randn(256, 512, generator=torch.Generator().manual_seed(3))
mx_bits = quantize_rowwise(sample).nbytes * 8 / sample.numel()
nv_bits = nvfp4_quantize(sample).nbytes * 8 / sample.numel()
print(f"MXFP8: {mx_bits:.4f} bits per value (formula {bits_per_value('mxfp8')})")
print(f"NVFP4: {nv_bits:.4f} bits per value (formula {bits_per_value('nvfp4')} + 32 bits per "
      f"tensor = {bits_per_value('nvfp4') + 32 / sample.numel():.4f})")  # fmt: skip

# %% [markdown]
# Four bits are too few to train with plain round-to-nearest. NVIDIA's recipe ("Pretraining
# Large Language Models with NVFP4", 2025) adds three things, each simulated here bit for bit
# (`dtlab.precision.nvfp4_linear`):
#
# - **2-D 16×16 weight blocks**: a square block reads the same in `W` and `Wᵀ`, so dgrad
#   multiplies by exactly the weight forward used. With 1×16 blocks, dgrad needs a second,
#   column-wise quantisation, and backward differentiates a different function than forward ran;
# - **random Hadamard transforms** on wgrad's inputs: every 16 tokens are rotated by
#   `H₁₆·diag(random signs)/4` before quantising. The product is unchanged, but a spike is spread
#   over its 16-token block;
# - **stochastic rounding** of gradients: unbiased, where round-to-nearest rounds a value that
#   sits 0.4 of the way between two codes down every time.
#
# Look for: the share of weights that differ between forward and dgrad (zero with 2-D blocks),
# the mean of a constant 0.2 under each rounding, and the rotation flattening a 16-token block
# that holds a spike (max/rms from `√16 = 4` to about 1). Then wgrad's error with and without
# the rotation, measured: on these small tensors it does **not** drop. A lone spike keeps its
# own block's scale almost exactly, and once rotated its energy sits in 16 values that each
# round. The paper reports the transform's benefit at scale (12B parameters, 10T tokens).

# %%
from dtlab.precision.microscaling import round_to_e2m1
from dtlab.precision.nvfp4_linear import (
    NVFP4_NAIVE,
    NVFP4_RECIPE,
    Nvfp4Recipe,
    random_hadamard,
    rotate_tokens,
    weight_mismatch,
    wgrad,
)

weight = GPT(gpt_config, seed=0).blocks[0].mlp.fc_in.weight.detach()
for blocks in (True, False):
    share = weight_mismatch(weight, Nvfp4Recipe(two_d_weights=blocks))
    print(f"{'16×16' if blocks else '1×16'} weight blocks: {share:.1%} of weights differ between "
          "forward and dgrad")  # fmt: skip
constant = torch.full((10000,), 0.2)
sr_mean = round_to_e2m1(constant, True, torch.Generator().manual_seed(0)).mean()
print(f"0.2 in E2M1: nearest gives {round_to_e2m1(constant).mean():.3f}, "
      f"stochastic rounding averages {sr_mean:.3f}")  # fmt: skip
spiky = torch.randn(256, 64, generator=torch.Generator().manual_seed(4))
spiky[5] *= 200
rotated = rotate_tokens(spiky, random_hadamard(seed=0))
block0 = {name: t[:16] for name, t in (("as is", spiky), ("rotated", rotated))}
for name, t in block0.items():
    print(f"16-token block holding the spike, {name}: max/rms "
          f"{(t.abs().amax(0) / t.pow(2).mean(0).sqrt()).mean():.2f}")  # fmt: skip
dy_small = torch.randn(256, 32, generator=torch.Generator().manual_seed(5))
for case, x_case in (("gaussian", torch.randn(256, 64, generator=torch.Generator().manual_seed(6))),
                     ("one spiky token", spiky)):  # fmt: skip
    exact = dy_small.double().t() @ x_case.double()
    errs = []
    for rht in (False, True):
        got = wgrad(x_case, dy_small, Nvfp4Recipe(rht=rht, stochastic_rounding=False),
                    torch.Generator().manual_seed(0)).double()  # fmt: skip
        errs.append(float((got - exact).norm() / exact.norm()))
    print(f"wgrad error, {case}: without RHT {errs[0]:.3f}, with RHT {errs[1]:.3f}")

# %% [markdown]
# Now the lab GPT trained with every block linear in NVFP4 (the LM head stays out), under the
# full recipe, under plain round-to-nearest with 1-D blocks ("naive"), and with each part of
# the recipe switched off in turn. The FP32 run is section 5's, reused. Look for: the naive
# recipe trailing FP32 several times further than the full one, and the 2-D weight blocks as
# the part whose absence costs most. At this size, switching off RHT or stochastic rounding
# does not hurt (it may even help a little): their benefit in the paper shows at scale, over
# long runs.

# %%
nvfp4_variants = {
    "full recipe": NVFP4_RECIPE,
    "naive (1×16, nearest, no RHT)": NVFP4_NAIVE,
    "without 2-D weights": Nvfp4Recipe(two_d_weights=False),
    "without RHT": Nvfp4Recipe(rht=False),
    "without SR": Nvfp4Recipe(stochastic_rounding=False),
}
fp32_reference = bf16_runs["fp32"]
nvfp4_runs = {name: train_recipe("nvfp4", STEPS, nvfp4=r) for name, r in nvfp4_variants.items()}
nvfp4_gaps = {name: run.final_loss - fp32_reference.final_loss for name, run in nvfp4_runs.items()}
for name, gap in nvfp4_gaps.items():
    print(f"{name:>30}: final loss {nvfp4_runs[name].final_loss:.4f} ({gap:+.4f} vs fp32)")
fig = go.Figure(go.Bar(x=list(nvfp4_gaps), y=list(nvfp4_gaps.values())))
describe(
    fig,
    title="NVFP4 on the lab GPT: final-loss gap to FP32 by recipe",
    caption="naive NVFP4 trails FP32 most; of the recipe's parts, 2-D weight blocks matter here",
    x="NVFP4 recipe (variant)",
    y="final loss − FP32's (nats)",
)
fig

# %% [markdown]
# ## 11. Memory per parameter <a id="memory"></a>
#
# Mixed precision does **not** shrink the model state. The 16-bit copy comes *on top* of the
# FP32 master: 2 + 2 + 12 = 16 bytes per parameter with Adam, the same as pure FP32 (4 + 4 + 8).
# Megatron's FP32 gradient accumulation buffer makes it 18. Only dropping the master (pure BF16)
# halves it, at the price section 5 showed. What mixed precision does shrink is activations,
# communication and GEMM time. The table is from `dtlab.memory.precision_bytes`; the tests
# measure it from the tensors of a real step. Look for the 7B column against the
# 16 B/param baseline (112 GB).

# %%
for row in bytes_per_param_table():
    total = model_state_bytes(7_000_000_000, recipe=model_state_recipe(row["recipe"])).total
    sum_of_parts = f"{row['param']} + {row['grad']} + {row['optimizer']:>2} = {row['total']:>2}"
    print(
        f"{row['recipe']:>24}: {sum_of_parts} B/param ({row['vs_baseline']:.2f}× baseline); "
        f"7B: {total / 1e9:.0f} GB"
    )
print()
for storage, gran in (("fp32", ""), ("bf16", ""), ("fp8", "tensor"), ("fp8", "tile"),
                      ("mxfp8", ""), ("nvfp4", "")):  # fmt: skip
    per = activation_bytes_per_element(storage, gran or "tensor")
    print(f"saved activation in {storage} {gran:>6}: {per:.4f} B/element")

# %% [markdown]
# Per layer, FP8 changes only what the GEMMs save: their inputs (`14·sbh` bytes of the `34·sbh`
# in Korthikanti's 16-bit formula) become 1 byte per element plus scales. But an FP8 layer also
# keeps its FP8 weights for backward, `12h²` bytes per layer. Below, a layer with `h = 4096`,
# sequences of 4096 tokens and flash attention (no `s²` scores kept), BF16 against per-tile
# FP8. Look for where FP8 starts to save memory: past about `12h/7 ≈ 1.7·h` tokens per
# micro-batch. Its GEMM-input part is checked, byte for byte, against what the lab GPT saves.

# %%
h, heads, seq = 4096, 32, 4096
for micro_batch in (1, 2, 4, 8):
    per_layer = {
        storage: activation_bytes_per_layer_for(
            storage, seq, micro_batch, h, heads, "tile", recompute="selective"
        )
        for storage in ("bf16", "fp8")
    }
    print(
        f"{micro_batch * seq:>6} tokens per micro-batch: bf16 {per_layer['bf16'] / 2**20:,.0f} "
        f"MiB, fp8 per tile {per_layer['fp8'] / 2**20:,.0f} MiB per layer "
        f"({per_layer['fp8'] / per_layer['bf16']:.2f}×)"
    )

# %% [markdown]
# ## 12. Quiz <a id="quiz"></a>
#
# Graded questions from the bank on what this lab showed.

# %%
ask("precision.bf16_vs_fp16")

# %%
ask("precision.master_weights")

# %%
ask("precision.loss_scaling")

# %%
ask("precision.scaler_trajectory")

# %%
ask("precision.hysteresis_trajectory")

# %%
ask("precision.unscale_in_fp32")

# %%
ask("precision.sharded_overflow_flag")

# %%
ask("precision.fp8_formats")

# %%
ask("precision.fp8_outlier_granularity")

# %%
ask("precision.microscaling")

# %%
ask("precision.columnwise_copy")

# %%
ask("precision.both_copies_bytes")

# %%
ask("precision.fp8_gather_scale")

# %%
ask("precision.fp8_gather_bytes")

# %%
ask("precision.fp8_block_speedup")

# %%
ask("precision.kept_in_bf16")

# %%
ask("precision.nvfp4_bits")

# %%
ask("precision.nvfp4_recipe")

# %%
ask("precision.nvfp4_2d_weights")

# %%
ask("precision.fp32_accum_bytes")

# %%
ask("precision.fp8_activation_memory")

# %%
cluster.close()
