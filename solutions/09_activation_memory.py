# %% [markdown]
# # Lab 09 — Activation memory, recomputation and gradient accumulation
#
# After the model state (lab 03), the next thing that runs a GPU out of memory is what the
# forward pass keeps for the backward pass: the **activations**. They grow with the micro-batch,
# with the sequence (and its square), and with every layer. This lab counts them byte by byte
# and then buys them back three ways: recomputing, offloading, and running a big batch as
# several small ones.
#
# One idea at a time:
#
# 1. where the bytes go in one block, per tensor family, measured against the formula;
# 2. the `s²` term, on a sequence sweep; and what tensor and sequence parallelism split;
# 3. recomputation: full and selective, memory saved and compute paid, on the timeline;
# 4. PyTorch's op-level selective checkpointing beside Megatron's;
# 5. where to checkpoint: the measured curve over the segment length;
# 6. offloading saved tensors to host memory;
# 7. gradient accumulation: a global batch that does not fit, and what `no_sync` saves.

# %%
import contextlib
import dataclasses
import time

import plotly.graph_objects as go
import torch
from torch.utils.flop_counter import FlopCounterMode

import dtlab
import dtlab.viz
from dtlab import trace
from dtlab.config import fast_mode, lab_world_size
from dtlab.cost.volumes import dp_bytes_per_optimizer_step
from dtlab.memory import ActivationMeter, activation_bytes_per_layer, peak_bytes_of
from dtlab.memory.activation_families import (
    FAMILIES,
    dropout_mask_bytes,
    korthikanti_families,
    lab_layer_families,
    measured_families,
)
from dtlab.memory.formulas import (
    activation_checkpointing_bytes,
    best_layers_per_checkpoint,
    checkpoint_interval_optimum,
)
from dtlab.mesh import Mesh
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
from dtlab.parallel import BucketedDDP, FullyShardedDataParallel
from dtlab.parallel.activations.gradient_accumulation import accumulate_gradients, split_batch
from dtlab.parallel.activations.offload import OffloadActivations
from dtlab.parallel.activations.op_level_checkpointing import (
    checkpoint_saving_matmuls,
    has_op_level_sac,
)
from dtlab.parallel.activations.recomputation import (
    Recomputed,
    plain_attention_core,
    recompute_attention_core,
)
from dtlab.parallel.tensor import parallelize_gpt
from dtlab.quiz import ask, check_exercise

dtlab.viz.setup_notebook()
FAST = fast_mode()

# %% [markdown]
# ## 1. The cluster and the model <a id="setup"></a>
#
# Every rank builds the same lab GPT, chosen so that its tensors are told apart by shape: width
# `h` = 64, `a` = 4 heads of 16, an MLP of `f` = 256, and a sequence `s` that is neither. It
# trains in fp32 with dropout 0.1. Look for the sizes used throughout: the micro-batch `b`, the
# sequence `s` and the number of layers `L`.

# %%
cluster = dtlab.Cluster(lab_world_size(2))
N = cluster.world_size
B, S, H, HEADS, FF = 4, (48 if FAST else 256), 64, 4, 256
LAYERS = 4 if FAST else 8
CONFIG = GPTConfig(
    vocab_size=256, seq_len=S, d_model=H, n_layers=LAYERS, n_heads=HEADS, d_ff=FF, dropout=0.1
)
print(f"N = {N} ranks on {cluster.device_type}; b={B}, s={S}, h={H}, a={HEADS}, f={FF}, L={LAYERS}")

# %% [markdown]
# ## 2. Where the bytes go in one block <a id="families"></a>
#
# Korthikanti et al. (2022) list what each op of a 16-bit Megatron layer saves for backward and
# sum it to `s·b·h·(34 + 5·a·s/h)` bytes. The same derivation for *this* GPT
# (`dtlab.memory.activation_families`), with `e` bytes per element (4 in fp32) and `k` bytes
# per dropout-mask element, by family:
#
# | family | what is saved | bytes |
# |---|---|---|
# | layernorm | the two LayerNorm inputs | `2·sbh·e` |
# | qkv | the input of q/k/v (saved by all three, stored once), q, k, v | `4·sbh·e` |
# | scores | softmax output; with dropout its mask and its output | `a·s²·b·(e + k + e)` |
# | attention_out | out_proj's input; the residual dropout mask | `sbh·e + sbh·k` |
# | mlp | fc_in's input, GELU's input and output; the dropout mask | `(sbh + 2·sbf)·e + sbh·k` |
# | layernorm_stats | LayerNorm mean and 1/std, fp32 | `16·sb` |
# | causal_mask | one bool per query-key pair | `s²` |
#
# At `e = 2`, `k = 1`, `f = 4h` the first five rows are Korthikanti's `4 + 8 + 5as/h + 3 + 19`.
# One difference is the kernel, not the model: the fused dropout on a GPU saves a bool mask
# (`k = 1`), PyTorch's CPU dropout saves its scaled noise in the activation dtype (`k = e`).
#
# Each rank runs one training block forward under `ActivationMeter` (saved-tensor hooks), and
# `measured_families` sorts every saved storage by the module that saved it, its dtype and
# shape. Look for: the measured bar (solid) equal to the formula (hatched), segment by segment.


# %%
def block_families(config: GPTConfig, seq: int, dropout: bool) -> dict:
    """What one training block saves, by family, measured on this rank, and our formula."""
    device = dtlab.device()
    config = dataclasses.replace(config, seq_len=seq, dropout=0.1 if dropout else 0.0)
    block = GPT(config, seed=0, device=device).blocks[0].train()
    x = torch.randn(B, seq, H, device=device, requires_grad=True)
    with ActivationMeter(block) as meter:
        y = block(x, torch.arange(seq, device=device))
    y.sum().backward()
    mask = dropout_mask_bytes(device, 4)
    return {
        "measured": measured_families(meter.records, seq, H, config.head_dim),
        "formula": lab_layer_families(config, B, seq, mask_bytes=mask),
        "mask_bytes": mask,
    }


one_block = cluster.run(block_families, CONFIG, S, True)
dtlab.viz.memory_bars(
    [r["measured"] for r in one_block],
    one_block[0]["formula"],
    title="What one training block saves for backward, by tensor family",
    caption="Solid: measured by saved-tensor hooks. Hatched: the formula. Equal segment by segment.",
)

# %% [markdown]
# The same numbers as a table, beside Korthikanti's 16-bit layer of the same shape (which
# assumes `f = 4h`, a fused bool mask, and lists neither the statistics nor the causal mask).
# Look for: measured = formula in every row, dropout on and off.

# %%
no_dropout = cluster.run(block_families, CONFIG, S, False)[0]
theirs = korthikanti_families(S, B, H, HEADS)
print(f"{'family':<16}{'measured':>12}{'formula':>12}{'no dropout':>12}{'Korthikanti':>13}")
for family in FAMILIES[:7]:
    m, f = one_block[0]["measured"][family], one_block[0]["formula"][family]
    print(f"{family:<16}{m:>12,}{f:>12,}{no_dropout['measured'][family]:>12,}{theirs[family]:>13,}")
total = sum(one_block[0]["measured"].values())
print(f"{'total':<16}{total:>12,}{sum(one_block[0]['formula'].values()):>12,}")
print(f"Korthikanti's s·b·h·(34 + 5as/h) = {activation_bytes_per_layer(S, B, H, HEADS):,} B")
print(f"dropout mask bytes per element here: k = {one_block[0]['mask_bytes']}")
exact = no_dropout["measured"] == no_dropout["formula"]
print(f"without dropout, measured == formula in every family: {exact}")

# %% [markdown]
# ### Exercise: a layer's activation bytes <a id="exercise-layer-bytes"></a>
#
# Write `layer_bytes(batch, seq, d_model, n_heads, d_ff, dropout, mask_bytes)`: the bytes one
# lab-GPT block (fp32) saves for backward while training, `dropout` a bool, `mask_bytes` the
# bytes per dropout-mask element on the device. Use the table above; mind the three tensors
# Korthikanti does not list.
#
# The grader measures real blocks of three shapes, dropout on and off, on every rank, and
# compares your number with the measurement. Calling the library's counts, or measuring with
# `ActivationMeter` inside your function, is refused.


# %%
def layer_bytes(batch, seq, d_model, n_heads, d_ff, dropout, mask_bytes) -> int:
    # BEGIN SOLUTION
    e, m = 4, 1 if dropout else 0
    sbh, scores = seq * batch * d_model, n_heads * seq * seq * batch
    total = 2 * sbh * e + 16 * seq * batch  # LayerNorm inputs; their fp32 mean and 1/std
    total += 4 * sbh * e  # the q/k/v input once; q, k, v
    total += scores * e + m * scores * (mask_bytes + e) + seq * seq  # scores; causal mask
    total += sbh * e + m * sbh * mask_bytes  # out_proj input; residual dropout mask
    total += (sbh + 2 * seq * batch * d_ff) * e + m * sbh * mask_bytes  # MLP
    return total
    # END SOLUTION


# %%
check_exercise("activations.layer_bytes", layer_bytes, cluster)

# %% [markdown]
# ## 3. The `s²` term <a id="sequence-sweep"></a>
#
# Double the sequence and every family doubles — except the scores (and the causal mask), which
# quadruple. Each point below is measured on the cluster. Look for: the score family bending
# upward while the rest stays a straight line, and the formula's markers on the measured lines.

# %%
SEQS = (24, 48, 96, 144) if FAST else (96, 192, 384, 768)
sweep = [cluster.run(block_families, CONFIG, s, True)[0] for s in SEQS]
SCORE_LIKE = ("scores", "causal_mask")
fig = go.Figure()
for label, in_group in (
    ("scores + causal mask", lambda family: family in SCORE_LIKE),
    ("everything else", lambda family: family not in SCORE_LIKE),
):
    for which, style in (("measured", "lines"), ("formula", "markers")):
        mib = [sum(b for f, b in r[which].items() if in_group(f)) / 2**20 for r in sweep]
        fig.add_scatter(x=list(SEQS), y=mib, mode=style, name=f"{label} ({which})")
dtlab.viz.describe(
    fig,
    title="Bytes one block saves, by sequence length",
    caption="The score line curves (s²); the rest is a straight line (s). Markers: the formula.",
    x="sequence length s (tokens)",
    y="saved for backward (MiB)",
)

# %% [markdown]
# At real scale, the same formula (Korthikanti, 16-bit) for a 7B-sized layer (`h` = 4096,
# `a` = 32, `b` = 1). Look for the sequence at which the `s²` term overtakes the `34·sbh` one:
# `5as/h > 34`, about `s` = 870 here.

# %%
for s in (512, 1024, 2048, 4096, 8192):
    total = activation_bytes_per_layer(s, 1, 4096, 32)
    linear = activation_bytes_per_layer(s, 1, 4096, 32, recompute="selective")
    print(f"s = {s:>5}: 34·sbh {linear / 1e9:6.2f} GB   5·a·s²·b {(total - linear) / 1e9:6.2f} GB")

# %% [markdown]
# ### What tensor and sequence parallelism split <a id="tp-sp"></a>
#
# With tensor parallelism (lab 04) each rank holds `a/t` heads and `f/t` of the MLP, so the
# scores, q, k, v and the MLP internals divide by `t`. The LayerNorm inputs and the dropout masks
# outside the two regions stay whole; sequence parallelism cuts those along the sequence too. One
# difference from Megatron: this GPT keeps each region's *gathered* input (`sbh·e`), where
# Megatron keeps the shard and gathers it again in backward. Look for: measured = formula on
# every rank, and the LayerNorm and mask rows halving with SP.


# %%
def tp_block(sequence_parallel: bool) -> dict:
    t = dtlab.world_size()
    tp = parallelize_gpt(GPT(CONFIG, seed=0, device=dtlab.device()), Mesh(tp=t), sequence_parallel)
    block = tp.model.blocks[0].train()
    local = S // t if sequence_parallel else S
    x = torch.randn(B, local, H, device=dtlab.device(), requires_grad=True)
    with ActivationMeter(block) as meter:
        y = block(x, torch.arange(S, device=dtlab.device()))
    y.sum().backward()
    mask = dropout_mask_bytes(dtlab.device(), 4)
    return {
        "measured": measured_families(meter.records, S, H, CONFIG.head_dim),
        "formula": lab_layer_families(CONFIG, B, S, t, sequence_parallel, mask_bytes=mask),
    }


split = {sp: cluster.run(tp_block, sp)[0] for sp in (False, True)}
print(f"{f't = {N}':<16}{'TP measured':>12}{'formula':>12}{'TP+SP measured':>16}{'formula':>12}")
for family in FAMILIES[:7]:
    row = [split[sp][w][family] for sp in (False, True) for w in ("measured", "formula")]
    print(f"{family:<16}{row[0]:>12,}{row[1]:>12,}{row[2]:>16,}{row[3]:>12,}")

# %% [markdown]
# ## 4. Recomputation: full and selective <a id="recompute"></a>
#
# Recomputation keeps less in the forward pass and rebuilds the rest in backward
# (`dtlab.parallel.activations.recomputation`, written from scratch beside
# `torch.utils.checkpoint`, same design): a region's saved tensors are replaced by tickets, and
# the first time backward opens one the region runs again — on the same RNG state, so dropout
# draws the same masks — and files what it saves under the tickets.
#
# * **full** (`Recomputed(model)`): every block is a region; the forward keeps each block's input.
#   Price: one more forward of every block, `2Ψ` FLOPs per token on top of `6Ψ` (+33 %).
# * **selective** (`recompute_attention_core(model)`, Korthikanti et al.): only the attention
#   core — `q·kᵀ`, mask, softmax, dropout, `·v` — is a region. The `s²`-sized tensors go; q, k, v
#   stay. Price: the core's two matmuls, `4·s²·h` FLOPs per sequence and layer.
#
# Each rank trains the whole model one step per variant: bytes saved for backward (hooks),
# FLOPs counted by PyTorch's `FlopCounterMode`, and the step on the clock. Look for: full keeps
# the least and costs about a third more FLOPs; selective removes only the `s²` families, for a
# fraction of that (a re-run of `4·s²·h` FLOPs per sequence and layer against a training step's
# `3·(24·s·h² + 4·s²·h)`: a few percent when `h` is much larger than `s`, as in real models, more
# in this narrow one); and the gradients identical to the plain step, bit for bit. (Step times on a busy
# CPU jump around; the FLOP ratio is the stable price.)


# %%
def one_step(variant: str) -> dict:
    device = dtlab.device()
    model = GPT(CONFIG, seed=0, device=device).train()
    tokens, targets = (
        t.to(device) for t in next(iter(SyntheticTokens(CONFIG, 1, batch_size=B, seed=0)))
    )
    run = Recomputed(model) if variant == "full" else model
    (recompute_attention_core if variant == "selective" else plain_attention_core)(model)

    def step(meter=None):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        with trace.span("forward", kind="compute"):
            if meter is None:
                loss = loss_fn(run(tokens), targets)
            else:
                with meter:
                    loss = loss_fn(run(tokens), targets)
        with trace.span("backward", kind="compute"):
            loss.backward()

    meter = ActivationMeter(model)
    step(meter)
    grads = [p.grad.clone() for p in model.parameters()]
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    start = time.perf_counter()
    with trace.labels(variant=variant):
        step()
    return {
        "saved": meter.total_bytes,
        "flops": counter.get_total_flops(),
        "seconds": time.perf_counter() - start,
        "grads": grads,
    }


VARIANTS = ("plain", "selective", "full")
steps = {v: cluster.run(one_step, v) for v in VARIANTS}
plain = steps["plain"][0]
print(f"{'variant':<10}{'saved for backward':>20}{'FLOPs':>16}{'vs plain':>9}{'step ms':>9}")
for v in VARIANTS:
    r = steps[v][0]
    same = all(torch.equal(a, b) for a, b in zip(r["grads"], plain["grads"], strict=True))
    print(
        f"{v:<10}{r['saved']:>18,} B{r['flops']:>16,}{r['flops'] / plain['flops']:>9.3f}"
        f"{r['seconds'] * 1e3:>9.1f}   gradients identical to plain: {same}"
    )

# %% [markdown]
# The savings are exactly the families each variant removes. Selective drops `scores` and
# `causal_mask` per layer and keeps the core's inputs instead of its copies of q, k, v (same
# bytes). Full keeps one block input per layer instead of the layer's families. Both regions
# also keep `positions`, but the position embedding already saved that very tensor: one storage,
# no extra byte. Look for: predicted = measured.

# %%
per_layer = one_block[0]["formula"]
selective_saving = LAYERS * (per_layer["scores"] + per_layer["causal_mask"])
full_keeps_instead = LAYERS * sum(per_layer.values()) - LAYERS * B * S * H * 4
print(
    f"selective: predicted saving {selective_saving:,} B, measured "
    f"{plain['saved'] - steps['selective'][0]['saved']:,} B"
)
print(
    f"full:      predicted saving {full_keeps_instead:,} B, measured "
    f"{plain['saved'] - steps['full'][0]['saved']:,} B"
)

# %% [markdown]
# The compute paid, on the timeline: one step of full recomputation per rank. The ranks do not
# talk during this step and start it at different moments, so each row is aligned to its own
# start (`align="step"`). Each re-run is a `recompute` span, in magenta, drawn over the dimmed
# backward pass that contains it. Look for: the forward, then a backward that carries one re-run
# per block. The table after it compares the variants on rank 0: selective's re-runs are short,
# and the plain backward has none.

# %%
recompute_trace = steps["full"].trace.filter(variant="full").cropped()
dtlab.viz.timeline(
    recompute_trace,
    title="One step with full recomputation",
    align="step",
    highlight="recompute",
    caption="Forward, then backward, with a re-run of each block (magenta, recompute) inside it.",
)

# %%
for v in VARIANTS:
    t = steps[v].trace.filter(variant=v, rank=0)
    rerun = sum(s.end_ns - s.start_ns for s in t.spans if s.name == "recompute") / 1e6
    backward = sum(s.end_ns - s.start_ns for s in t.spans if s.name == "backward") / 1e6
    print(f"{v:<10} backward {backward:7.1f} ms, of which re-running {rerun:6.1f} ms")

# %% [markdown]
# ## 5. Op-level selective checkpointing <a id="op-level-sac"></a>
#
# PyTorch offers a third policy: checkpoint a block, but let a per-op policy decide what to save
# (`torch.utils.checkpoint` with `create_selective_checkpoint_contexts`). The usual one saves
# every matmul output (the FLOP-heavy ops) and recomputes the pointwise ones (LayerNorm, GELU,
# softmax, dropout): no matmul runs twice. What it keeps differs from Megatron's choice: the raw
# `q·kᵀ` scores are a matmul output, so one of the three `s²`-sized tensors stays, while most
# linear-in-`s` tensors (LayerNorm and GELU inputs, dropout masks) go. Which keeps less depends on
# `s` against `h`; what it never pays is a re-run matmul. The tensors it keeps live in
# checkpoint's own cache, out of the hooks' sight, so this comparison reads the allocator: the
# bytes a forward pass leaves allocated. Look for: op-level SAC at exactly the plain backward
# FLOPs (the counter counts matmul-like ops; the re-run pointwise ops add none), selective a few
# percent above, full about half again.


# %%
def forward_bytes_and_flops(variant: str) -> dict:
    device = dtlab.device()
    model = GPT(CONFIG, seed=0, device=device).train()
    tokens, targets = (
        t.to(device) for t in next(iter(SyntheticTokens(CONFIG, 1, batch_size=B, seed=0)))
    )
    positions = torch.arange(S, device=device)

    def forward():
        if variant == "op-level SAC":
            h = model.embed_tokens(tokens)
            for block in model.blocks:
                h = checkpoint_saving_matmuls(block, h, positions)
            return model.lm_logits(h)
        run = Recomputed(model) if variant == "full" else model
        (recompute_attention_core if variant == "selective" else plain_attention_core)(model)
        return run(tokens)

    held = {}
    after_forward = peak_bytes_of(lambda: held.setdefault("logits", forward()), device)
    counter = FlopCounterMode(display=False)
    with counter:
        loss_fn(held.pop("logits"), targets).backward()
    return {"held": after_forward.end_bytes, "backward_flops": counter.get_total_flops()}


policies = ["plain", "selective", "full"] + (["op-level SAC"] if has_op_level_sac() else [])
sac = {p: cluster.run(forward_bytes_and_flops, p)[0] for p in policies}
for p in policies:
    print(
        f"{p:<13} held after forward {sac[p]['held']:>10,} B   backward FLOPs "
        f"{sac[p]['backward_flops']:>13,} ({sac[p]['backward_flops'] / sac['plain']['backward_flops']:.2f}×)"
    )

# %% [markdown]
# ## 6. Where to checkpoint <a id="where-to-checkpoint"></a>
#
# Checkpoint every `k`-th block and a segment of `k` blocks becomes one region: the forward keeps
# `L/k` segment inputs (`a` bytes each), and backward re-runs one segment at a time, holding its
# `k` layers' activations (`b` each): `(L/k)·a + k·b`, minimal at `k* = √(L·a/b)`. The often
# quoted `√L` assumes `a = b`. When the attention scores are stored (this lab's model,
# Korthikanti's count), a block's `b` is `17 + 2.5·a_heads·s/h` times its input `a`, and the
# optimum is every block until `L` passes `2·b/a` (`k = 2` needs `(L/2)·a + 2b < L·a + b`).
# With flash attention (or selective recomputation) the scores are not stored, `b/a ≈ 17`, and
# every *second* block wins past about 34 layers: an 80-layer model's `k* = √(80/17) ≈ 2.2`.
# Each rank measures the peak bytes of one training step (allocator) for each `k`. Look for: the
# minimum at `k = 1`, and the measured curve a near-constant distance above the formula's (what
# every `k` holds besides activations: the logits, the loss's buffers).


# %%
def peak_with_segments(every: int | None) -> int:
    device = dtlab.device()
    model = GPT(CONFIG, seed=0, device=device).train()
    tokens, targets = (
        t.to(device) for t in next(iter(SyntheticTokens(CONFIG, 1, batch_size=B, seed=0)))
    )
    run = model if every is None else Recomputed(model, every=every)

    def step():
        model.zero_grad(set_to_none=False)
        loss_fn(run(tokens), targets).backward()

    step()  # gradients allocated once, outside the measurement
    return peak_bytes_of(step, device).peak_bytes


KS = [k for k in range(1, LAYERS + 1) if LAYERS % k == 0]
measured_peak = [cluster.run(peak_with_segments, k)[0] for k in KS]
input_bytes, layer_total = B * S * H * 4, sum(per_layer.values())
formula_peak = [-(-LAYERS // k) * input_bytes + k * layer_total for k in KS]
for k, m, f in zip(KS, measured_peak, formula_peak, strict=True):
    print(f"k = {k}: measured peak {m:>10,} B   (L/k)·a + k·b = {f:>10,} B")
k_star = checkpoint_interval_optimum(LAYERS, input_bytes, layer_total)
print(
    f"this model: b/a = {layer_total / input_bytes:.1f}, k* = √(L·a/b) = {k_star:.2f} "
    f"(√L = {LAYERS**0.5:.1f}); measured minimum at k = {KS[measured_peak.index(min(measured_peak))]}"
)
fig = go.Figure()
fig.add_scatter(x=KS, y=[m / 2**20 for m in measured_peak], name="measured peak of a step")
fig.add_scatter(x=KS, y=[f / 2**20 for f in formula_peak], name="(L/k)·a + k·b", mode="markers")
dtlab.viz.describe(
    fig,
    title=f"Peak bytes of a training step, checkpointing every k of {LAYERS} blocks",
    caption="Both rise with k: the fewest bytes at k = 1, every block, not at √L.",
    x="blocks per checkpointed segment k (count)",
    y="peak (MiB)",
)

# %% [markdown]
# The optimum for real models, from the library: a = `2·s·b·h` (16-bit input), b = Korthikanti's
# layer, scores stored. Look for: `k*` below 2 everywhere, where `√L` would say 5 to 11.

# %%
for name, (layers, s, h, a) in {
    "GPT-3 175B": (96, 2048, 12288, 96),
    "7B": (32, 4096, 4096, 32),
    "GPT-2 small": (12, 1024, 768, 12),
}.items():
    a_bytes, b_bytes = 2 * s * h, activation_bytes_per_layer(s, 1, h, a)
    k_star = checkpoint_interval_optimum(layers, a_bytes, b_bytes)
    best = best_layers_per_checkpoint(layers, s, 1, h, a)
    gb = activation_checkpointing_bytes(layers, s, 1, h, a, best) / 1e9
    print(
        f"{name:<12} L={layers:>3}: √L = {layers**0.5:4.1f}, k* = √(L·a/b) = {k_star:4.2f}, "
        f"best integer k = {best} ({gb:.2f} GB)"
    )

# %% [markdown]
# ### Exercise: recomputation from scratch <a id="exercise-recompute"></a>
#
# Write `recompute(function, *args)`: run `function(*args)` keeping only the inputs for backward,
# and re-run it in backward to get the gradients. The classic way is a `torch.autograd.Function`
# (Megatron's `CheckpointFunction`): `forward` saves the inputs and the RNG state and runs the
# function under `no_grad`; `backward` re-runs it with grad enabled on detached copies of the
# inputs, with the RNG state restored inside `torch.random.fork_rng()`, backpropagates the
# incoming gradient through the re-run (so parameters get theirs) and returns the inputs'.
#
# The grader chains two lab-GPT blocks with dropout, one region each, on every rank: gradients
# equal to plain autograd's bit for bit, the global RNG left where plain training leaves it,
# nothing but the inputs saved, each block re-run in backward. `torch.utils.checkpoint` and
# dtlab's `recompute` are refused.


# %%
def recompute(function, *args):
    # BEGIN SOLUTION
    class Recompute(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            ctx.rng_state = torch.get_rng_state()
            ctx.save_for_backward(*inputs)
            with torch.no_grad():
                return function(*inputs)

        @staticmethod
        def backward(ctx, grad_output):
            inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
            devices = [t.device.index or 0 for t in inputs if t.is_cuda][:1]
            with torch.random.fork_rng(devices=devices):
                torch.set_rng_state(ctx.rng_state)
                with torch.enable_grad():
                    output = function(*inputs)
            torch.autograd.backward(output, grad_output)
            return tuple(t.grad if t.requires_grad else None for t in inputs)

    return Recompute.apply(*args)
    # END SOLUTION


# %%
check_exercise("activations.recompute", recompute, cluster)

# %% [markdown]
# ## 7. Offloading saved tensors <a id="offload"></a>
#
# The third way out: keep what backward needs, but in host memory. `OffloadActivations` is a
# pair of saved-tensor hooks: `pack` copies each saved tensor to the host (once, however many
# ops save it) and the graph keeps only the host copy; `unpack` brings it back when backward
# reaches the op. Every copy is a `memcpy` span named `offload`, with its bytes. The device
# saves every byte it offloads and pays twice those bytes over the host link per step. On a
# cluster without accelerators the device *is* the host: the copies happen (and show on the
# timeline), but nothing is saved and nothing comes back. Look for: the offloaded bytes equal
# to the bytes saved for backward, and the copies (magenta ticks, each drawn at least a few
# pixels wide; hover for the true duration) all inside the forward pass; on GPUs the copies back,
# `reload` spans, follow in the backward. Each rank's row starts at its own first span, as in
# section 4's timeline.


# %%
def offloaded_step() -> dict:
    device = dtlab.device()
    model = GPT(CONFIG, seed=0, device=device).train()
    tokens, targets = (
        t.to(device) for t in next(iter(SyntheticTokens(CONFIG, 1, batch_size=B, seed=0)))
    )
    with ActivationMeter(model) as meter:
        loss_fn(model(tokens), targets).backward()
    held = {}
    plain_forward = peak_bytes_of(lambda: held.setdefault("plain", model(tokens)), device)
    del held["plain"]
    with trace.labels(variant="offload"):
        offload = OffloadActivations(exclude=list(model.parameters()))
        with offload, trace.span("forward", kind="compute"):
            offloaded_forward = peak_bytes_of(
                lambda: held.setdefault("loss", loss_fn(model(tokens), targets)), device
            )
        with trace.span("backward", kind="compute"):
            held.pop("loss").backward()
    return {
        "saved": meter.total_bytes,
        "to_host": offload.stats.bytes_to_host,
        "to_device": offload.stats.bytes_to_device,
        "device_after_forward": (plain_forward.end_bytes, offloaded_forward.end_bytes),
    }


offloaded = cluster.run(offloaded_step)
r = offloaded[0]
print(
    f"saved for backward {r['saved']:,} B; copied to host {r['to_host']:,} B, back {r['to_device']:,} B"
)
print(
    "bytes left allocated on the device after the forward pass: plain "
    f"{r['device_after_forward'][0]:,} B, offloaded {r['device_after_forward'][1]:,} B"
)
dtlab.viz.timeline(
    offloaded.trace.filter(variant="offload").cropped(),
    title="Offloading saved tensors: one training step",
    align="step",
    highlight=("offload", "reload"),
    caption="Magenta (second lane): each saved tensor's copy to host memory, all in the forward.",
)

# %% [markdown]
# ## 8. Gradient accumulation <a id="accumulation"></a>
#
# A global batch too big for one step runs as `K` micro-batches: each loss scaled by `1/K`, each
# backward adding into `.grad`, one optimizer step at the end. Activations are those of one
# micro-batch; the time is `K` forwards and backwards. Below, each rank measures the peak bytes
# of one step at the full per-rank batch and at one micro-batch: say the device holds only the
# latter. Then it runs the `K` micro-batches under our DDP and under our FSDP, each with and
# without `no_sync()`: the gradients must equal the big batch's (one process), the bytes each
# rank sends are counted, and for FSDP so are the gradient bytes a rank holds between
# micro-batches. Look for: DDP's no_sync sending `1/K` of the bytes for free; FSDP's no_sync
# saving `K−1` reduce-scatters but holding a whole unsharded gradient (`Ψ·4` bytes instead of
# `Ψ·4/N`); the formulas beside the counts.

# %%
K = 4
GLOBAL_BATCH = N * K * B


def accumulation_on_rank() -> dict:
    device = dtlab.device()
    rank, world = dtlab.rank(), dtlab.world_size()
    config = dataclasses.replace(CONFIG, dropout=0.0)  # the same batch, the same math
    tokens, targets = (
        t.to(device)
        for t in next(iter(SyntheticTokens(config, 1, batch_size=GLOBAL_BATCH, seed=0)))
    )
    mine = shard_for_rank((tokens, targets), rank, world)
    micro = split_batch(*mine, K)
    probe = GPT(config, seed=0, device=device)

    def peak(x, y):
        def step():
            probe.zero_grad(set_to_none=False)
            loss_fn(probe(x), y).backward()

        step()
        return peak_bytes_of(step, device).peak_bytes

    out = {"peak_full": peak(*mine), "peak_micro": peak(*micro[0])}
    reference = GPT(config, seed=0, device=device)
    loss_fn(reference(tokens), targets).backward()
    for no_sync in (True, False):
        ddp = BucketedDDP(GPT(config, seed=0, device=device), collectives="dtlab")
        start = time.perf_counter()
        step = accumulate_gradients(ddp, micro, loss_fn, no_sync=no_sync)
        seconds = time.perf_counter() - start
        gap = max(
            (p.grad - q.grad).abs().max().item()
            for p, q in zip(ddp.module.parameters(), reference.parameters(), strict=True)
        )
        out[no_sync] = {"bytes": step.comm_bytes, "seconds": seconds, "gap": gap}
    out["params"] = probe.num_params()
    big = dict(reference.named_parameters())
    for no_sync in (True, False):
        fsdp = FullyShardedDataParallel(GPT(config, seed=0, device=device), collectives="dtlab")
        held = 0
        for i, (x, y) in enumerate(micro):
            skip = no_sync and i < K - 1
            with fsdp.no_sync() if skip else contextlib.nullcontext():
                (loss_fn(fsdp(x), y) / K).backward()
            held = max(held, fsdp.held_bytes()["grads"])  # between micro-batches
        sent = fsdp.comm_stats.bytes_sent  # before full_gradients(), which all-gathers too
        grads = fsdp.full_gradients()
        gap = max((g.to(device) - big[n].grad).abs().max().item() for n, g in grads.items())
        out["fsdp", no_sync] = {"bytes": sent, "held": held, "gap": gap}
    out["fsdp_params"] = sum(u.seg.padded_numel for u in fsdp.units)  # padded to split by N
    return out


acc = cluster.run(accumulation_on_rank)[0]
print(
    f"peak of one step: per-rank batch of {K * B} {acc['peak_full']:,} B, micro-batch of {B} "
    f"{acc['peak_micro']:,} B ({acc['peak_full'] / acc['peak_micro']:.1f}×)"
)
for no_sync in (True, False):
    r = acc[no_sync]
    formula = dp_bytes_per_optimizer_step(acc["params"], N, K, no_sync, 4)
    print(
        f"no_sync={no_sync!s:<5}: sent {r['bytes']:>10,.0f} B per optimizer step "
        f"(formula {formula:,.0f}), {r['seconds'] * 1e3:6.1f} ms, "
        f"max |grad − big batch| {r['gap']:.1e}"
    )
psi = acc["fsdp_params"]
for no_sync in (True, False):
    r = acc["fsdp", no_sync]
    collectives = 2 * K + 1 if no_sync else 3 * K  # 2 all-gathers per micro-batch + the RS
    print(
        f"FSDP no_sync={no_sync!s:<5}: sent {r['bytes']:>10,.0f} B "
        f"(formula {collectives}·(N−1)/N·Ψ·4 = {collectives * (N - 1) / N * psi * 4:,.0f}), "
        f"gradients held {r['held']:>8,} B (formula {psi * 4 // (1 if no_sync else N):,}), "
        f"max |grad − big batch| {r['gap']:.1e}"
    )

# %% [markdown]
# The counted bytes equal the formula, `2(N−1)/N·Ψ·4` per all-reduce (this model's parameter
# count divides evenly). The gradient gap is float32 rounding: `K` partial sums of scaled means
# against one mean. For DDP, `no_sync` is free: it holds the full gradient anyway. For ZeRO-2
# and FSDP, skipping the reduction is a trade, not an impossibility. Reduce-scatter every
# micro-batch and a rank keeps only its `Ψ/N` gradient shard (the memory they exist to save), at
# `K` reduce-scatters per step; or skip it, as torch's FSDP `no_sync()`, FSDP2's
# `set_requires_gradient_sync(False)` and our `FullyShardedDataParallel.no_sync()` do, and each
# rank holds a whole unsharded gradient until the last micro-batch reduces once. The all-gathers
# are not saved either way: FSDP re-gathers the parameters for every micro-batch's forward and
# backward. ZeRO-2's version of the same trade is ZeRO-1 (full `.grad`, reduced at `step()`).
# Pick skipping when the full gradient fits and bandwidth is the bottleneck. A pipeline's
# micro-batches are accumulation already (lab 05): DP reduces once after the flush.

# %% [markdown]
# ## 9. Check yourself <a id="quiz"></a>
#
# Graded questions from the bank on what this lab showed.

# %%
ask("activations.per_layer_bytes")

# %%
ask("activations.lab_scores_bytes")

# %%
ask("activations.selective")

# %%
ask("activations.full_recompute_flops")

# %%
ask("activations.op_level_sac")

# %%
ask("activations.sqrt_claim")

# %%
ask("activations.best_interval")

# %%
ask("activations.offload_cost")

# %%
ask("activations.accumulation_vs_batch")

# %%
ask("activations.forgot_no_sync")

# %%
ask("activations.zero2_accumulation")

# %%
cluster.close()
