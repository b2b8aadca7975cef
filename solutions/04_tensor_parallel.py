# %% [markdown]
# # Lab 04 — Tensor and sequence parallelism
#
# Data parallelism and ZeRO (labs 02–03) give every rank whole layers. When one layer's weights,
# its matmuls or its activations are too big for one device, the layer itself must be cut.
# Megatron-LM (Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models
# Using Model Parallelism", 2019) cuts every weight matrix of a transformer block over the `t`
# ranks of a **tensor-parallel group**, so that each block talks only twice per pass; sequence
# parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
# Models", 2022) then cuts what is left replicated.
#
# What you will see, one idea at a time:
#
# 1. one matmul split by columns, then by rows — and what each split owes the others;
# 2. why column-then-row needs one all-reduce, and Megatron's `f` and `g` operators — then you
#    write both layers;
# 3. a whole GPT on 2 and 4 ranks: equal to one process, two collectives per block per pass,
#    on the timeline;
# 4. the loss from logits split by vocabulary — never gathered — and you write it;
# 5. attention split by heads, and the limit grouped-query attention puts on `t`;
# 6. sequence parallelism: the same bytes, activation memory per rank against the formula;
# 7. the price of the all-reduces on NVLink and on InfiniBand — why TP stays inside a node;
# 8. when TP beats FSDP, and when it does not.

# %%
import plotly.graph_objects as go
import torch
import torch.distributed as dist
import torch.nn.functional as F
from plotly.subplots import make_subplots

import dtlab
import dtlab.viz
from dtlab import trace
from dtlab.comm import Communicator, ring_bytes_sent
from dtlab.config import accelerator_count, fast_mode
from dtlab.cost import collective_time, flops_per_token
from dtlab.cost.hardware import H100_SXM, IB_NDR_400, NVLINK4_H100
from dtlab.cost.volumes import tp_allreduce_volume_per_layer
from dtlab.memory import ActivationMeter, zero_comm_bytes_per_rank
from dtlab.memory import activation_bytes_per_layer as korthikanti_bytes
from dtlab.mesh import Layout, Mesh
from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn, shard_for_rank
from dtlab.parallel import shard_by_zero_stage
from dtlab.parallel import tensor as tensor_parallel
from dtlab.parallel.tensor import (
    parallelize_attention,
    parallelize_gpt,
    parallelize_mlp,
    tensor_parallel_check,
)
from dtlab.parallel.tensor.accounting import (
    activation_bytes_per_layer,
    comm_bytes_per_layer,
    params_per_rank,
)
from dtlab.quiz import ask, check_exercise

dtlab.viz.setup_notebook()
FAST = fast_mode()
MB = 1e6

# %% [markdown]
# ## 1. Two ranks, one small GPT
#
# Fast mode uses the tiny GPT (d = 64, 4 heads, 2 blocks) on 2 CPU ranks; full mode the small one
# (d = 256, 8 heads, 4 blocks) on GPUs. Every rank builds the **same** full model from the same
# seed; tensor parallelism then keeps only this rank's slices. `t` is the tensor-parallel degree,
# and activations are `(b, s, h)`: micro-batch, sequence, hidden width.

# %%
CONFIG = GPTConfig.tiny() if FAST else GPTConfig.small()
BATCH = 4 if FAST else 16
B, S, H = BATCH, CONFIG.seq_len, CONFIG.d_model
cluster = dtlab.Cluster(2)
FOUR_RANK_DEVICE = "auto" if accelerator_count() >= 4 else "cpu"
print(
    f"{cluster.world_size} ranks on {cluster.device_type}; GPT with {CONFIG.num_params():,} "
    f"parameters, h = {H}, {CONFIG.n_heads} heads, d_ff = {CONFIG.d_ff}; b·s·h = {B * S * H:,}"
)

# %% [markdown]
# ## 2. One matmul, split by columns <a id="column-split"></a>
#
# Take the MLP's first layer, `Y = X·Wᵀ` with `W` of shape `(d_ff, h)`. Give rank `r` the rows
# `W_r` of `W` — a contiguous `d_ff/t` of the output features. Every rank holds the whole `X`,
# so `Y_r = X·W_rᵀ` is exactly **columns** `r·d_ff/t …` of `Y`: no communication in forward.
#
# Backward is another matter. `dL/dX = Σ_r dL/dY_r · W_r`: every rank's rows contributed to
# every element of `X`, so each rank holds only a **partial** `dL/dX`. Look for: the columns
# concatenated equal `X·Wᵀ` exactly, one rank's `dL/dX` far off, the sum over ranks right.


# %%
def mlp_tensors(seed: int = 0) -> dict:
    """The MLP's two weights, an input and an upstream gradient — the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    d, ff = H, CONFIG.d_ff
    return {
        "x": torch.randn(B, S, d, generator=g),
        "w_in": torch.randn(ff, d, generator=g) / d**0.5,  # fc_in: h -> d_ff
        "w_out": torch.randn(d, ff, generator=g) / ff**0.5,  # fc_out: d_ff -> h
        "dy_in": torch.randn(B, S, ff, generator=g),  # dL/dY for fc_in alone
        "dy_out": torch.randn(B, S, d, generator=g),  # dL/dY for fc_out (or the whole MLP)
    }


def column_split() -> dict:
    rank, t = dtlab.rank(), dtlab.world_size()
    m = mlp_tensors()
    x = m["x"].requires_grad_()
    w_r = m["w_in"].chunk(t, dim=0)[rank]  # this rank's d_ff/t rows of W
    y_r = x @ w_r.T  # (b, s, d_ff/t): this rank's columns of Y — nothing moved
    y_r.backward(m["dy_in"].chunk(t, dim=-1)[rank])
    return {"w_shape": tuple(w_r.shape), "y": y_r.detach(), "dx": x.grad}


per_rank = cluster.run(column_split)
m = mlp_tensors()
x = m["x"].requires_grad_()
y = x @ m["w_in"].T
y.backward(m["dy_in"])
for rank, r in enumerate(per_rank):
    print(f"rank {rank}: W rows {r['w_shape']} -> Y columns {tuple(r['y'].shape)}")
columns = torch.cat([r["y"] for r in per_rank], dim=-1)
print(f"[Y_0 | Y_1] vs X·Wᵀ:          max |Δ| = {(columns - y).abs().max():.1e}")
print(f"dL/dX of rank 0 alone:        max |Δ| = {(per_rank[0]['dx'] - x.grad).abs().max():.1e}")
summed = sum(r["dx"] for r in per_rank)
print(f"dL/dX summed over the ranks:  max |Δ| = {(summed - x.grad).abs().max():.1e}")

# %% [markdown]
# ## 3. The same matmul, split by rows <a id="row-split"></a>
#
# Now the MLP's second layer, `Z = Y·Wᵀ` with `W` of shape `(h, d_ff)`, split the other way: rank
# `r` holds the **columns** `W[:, r·d_ff/t …]` — a slice of the *input* features — and the matching
# slice `Y_r` of its input. `Y_r·W_rᵀ` has the full output shape but is only a **partial sum**:
# `Z = Σ_r Y_r·W_rᵀ`. Forward owes one sum over the ranks; backward owes nothing, since
# `dL/dY_r = dL/dZ · W_r` needs only this rank's columns.
#
# Look for: one rank's partial far from `Z`, the sum exact up to rounding, and each rank's `dL/dY_r`
# equal to its slice of the one-process gradient with no communication at all.


# %%
def row_split() -> dict:
    rank, t = dtlab.rank(), dtlab.world_size()
    m = mlp_tensors()
    y_full = m["x"] @ m["w_in"].T  # the input of fc_out, (b, s, d_ff)
    y_r = y_full.chunk(t, dim=-1)[rank].clone().requires_grad_()  # this rank's input features
    w_r = m["w_out"].chunk(t, dim=1)[rank]  # this rank's d_ff/t columns of W
    partial = y_r @ w_r.T  # (b, s, h): full shape, partial sum
    partial.backward(m["dy_out"])  # every rank holds the whole dL/dZ
    return {"partial": partial.detach(), "dy": y_r.grad}


per_rank = cluster.run(row_split)
m = mlp_tensors()
y_full = (m["x"] @ m["w_in"].T).requires_grad_()
z = y_full @ m["w_out"].T
z.backward(m["dy_out"])
print(f"rank 0's partial vs Z:         max |Δ| = {(per_rank[0]['partial'] - z).abs().max():.1e}")
summed = sum(r["partial"] for r in per_rank)
print(f"partials summed over ranks:    max |Δ| = {(summed - z).abs().max():.1e}")
slices = torch.cat([r["dy"] for r in per_rank], dim=-1)
print(f"[dL/dY_0 | dL/dY_1] vs one process: max |Δ| = {(slices - y_full.grad).abs().max():.1e}")

# %% [markdown]
# ## 4. Column, then row: one all-reduce each way <a id="column-then-row"></a>
#
# Put the two together as the MLP does: `Z = GELU(X·W_inᵀ)·W_outᵀ`. The column split leaves rank
# `r` with columns `r·d_ff/t …` of `X·W_inᵀ`; GELU acts element by element, so it runs on them
# locally; and those columns are **exactly** the input slice the row split of `W_out` wants. No
# communication between the two matmuls — only the sum at the end (forward) and the partial
# `dL/dX` at the start (backward). Attention has the same shape: q, k, v column-parallel (whole
# heads per rank), the output projection row-parallel.
#
# The other order would not work: splitting `W_in` by rows makes `X·W_inᵀ` a partial sum, and
# GELU of a sum is not the sum of GELUs, so an all-reduce would be needed *before* GELU too:

# %%
a, b = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 1.5])
print(
    f"GELU(a + b) = {[round(v, 4) for v in F.gelu(a + b).tolist()]}   "
    f"GELU(a) + GELU(b) = {[round(v, 4) for v in (F.gelu(a) + F.gelu(b)).tolist()]}"
)

# %% [markdown]
# The library's `parallelize_mlp` does exactly this to the GPT's MLP, in place. Below the
# communicator runs on dtlab's own rings (`collectives="dtlab"`), so every byte is counted from
# a real message. Look for: one all-reduce in forward and one in backward, each `2(t-1)/t · b·s·h`
# fp32 elements per rank, and output and input gradient equal to the unsplit MLP.


# %%
def parallel_mlp_counted() -> dict:
    t, device = dtlab.world_size(), dtlab.device()
    mlp = GPT(CONFIG, seed=0, device=device).blocks[0].mlp
    comm = Communicator.along(Mesh(tp=t), "tp", collectives="dtlab")
    parallelize_mlp(mlp, comm)
    m = {name: v.to(device) for name, v in mlp_tensors().items()}
    x = m["x"].requires_grad_()
    comm.comm_stats.reset()
    z = mlp(x)
    forward = comm.comm_stats.snapshot()
    z.backward(m["dy_out"])
    backward = comm.comm_stats - forward
    return {
        "passes": [(s.calls, s.bytes_by_op) for s in (forward, backward)],
        "z": z.detach().cpu(),
        "dx": x.grad.cpu(),
    }


per_rank = cluster.run(parallel_mlp_counted)
reference = GPT(CONFIG, seed=0).blocks[0].mlp
x = mlp_tensors()["x"].requires_grad_()
z = reference(x)
z.backward(mlp_tensors()["dy_out"])
formula = ring_bytes_sent("all_reduce", B * S * H * 4, cluster.world_size)
for name, (calls, by_op) in zip(("forward", "backward"), per_rank[0]["passes"], strict=True):
    print(f"{name:<8}: {calls} collective(s), {by_op} B counted")
print(f"formula : 1 all-reduce each way, 2(t-1)/t·b·s·h·4 = {formula:,.0f} B")
for rank, r in enumerate(per_rank):
    print(
        f"rank {rank}: max |Z - one process| = {(r['z'] - z).abs().max():.1e}, "
        f"max |dX - one process| = {(r['dx'] - x.grad).abs().max():.1e}"
    )

# %% [markdown]
# ## 5. Megatron's `f` and `g` <a id="f-and-g"></a>
#
# The two communications above are a pair of **conjugate operators** around every tensor-parallel
# region (Megatron-LM, §3):
#
# | operator | where | forward | backward |
# |---|---|---|---|
# | `f` | entering the region (before the column layer) | identity | all-reduce `dL/dX` |
# | `g` | leaving it (after the row layer) | all-reduce the partial sums | identity |
#
# Each is the other's transpose: copying `X` to `t` ranks in forward means summing `t` gradient
# pieces in backward; summing `t` pieces in forward means handing the same `dL/dZ` to each in
# backward. A plain `dist.all_reduce` inside a module's forward is **invisible to autograd** —
# backward would skip `f`'s all-reduce and every layer below would train on a partial gradient.
# So `f` and `g` are `torch.autograd.Function`s whose `backward` says what moves. In the library
# they are `dtlab.comm.copy_to_group` and `reduce_from_group`.
#
# ### Exercise: column- and row-parallel Linear <a id="exercise-column-row"></a>
#
# Write Megatron's two operators and the two layers built on them:
#
# - `CopyToGroup` (`f`): forward returns `x` unchanged; backward all-reduces the gradient over
#   `group` (work on a copy: `grad.contiguous().clone()`). `ReduceFromGroup` (`g`): the reverse.
#   A `backward` returns one gradient per `forward` input: `None` for `group`.
# - `column_parallel_linear(x, weight, bias, group)`: `x` is the full input `(…, in)`, the same
#   on every rank; `weight` `(out/t, in)` and `bias` `(out/t,)` are this rank's rows. Return this
#   rank's `(…, out/t)` columns of `x·Wᵀ + b`, entering the region through `f`.
# - `row_parallel_linear(x, weight, bias, group)`: `x` is this rank's `(…, in/t)` slice of the
#   input features; `weight` `(out, in/t)` this rank's columns; `bias` `(out,)` is replicated.
#   Return the full `(…, out)` on every rank: local matmul, leave through `g`, then the bias —
#   **once**, after the sum.
#
# Use `dist.all_reduce(tensor, group=group)`; `F.linear(x, w, b)` computes `x·wᵀ + b`.
# The graders run each layer on 2 ranks in fp64 and compare the output and the gradients of `x`,
# `weight` and `bias` with one process computing the whole layer (tolerance 1e-12). They also
# watch the wire: every collective but all-reduce is refused, the library's own layers and
# operators are refused, and each pass must move exactly its bytes — the column layer nothing in
# forward and one all-reduce of `dL/dx` in backward, the row layer one all-reduce of the partial
# product in forward and nothing in backward.


# %%
class CopyToGroup(torch.autograd.Function):
    """Megatron's f: identity in forward, all-reduce (sum) of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group):
        # BEGIN SOLUTION
        ctx.group = group
        return x.view_as(x)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None
        # END SOLUTION


class ReduceFromGroup(torch.autograd.Function):
    """Megatron's g: all-reduce (sum) in forward, identity in backward."""

    @staticmethod
    def forward(ctx, x, group):
        # BEGIN SOLUTION
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION
        return grad, None
        # END SOLUTION


def column_parallel_linear(x, weight, bias, group):
    """This rank's output columns: f(x)·W_rᵀ + b_r."""
    # BEGIN SOLUTION
    return F.linear(CopyToGroup.apply(x, group), weight, bias)
    # END SOLUTION


def row_parallel_linear(x, weight, bias, group):
    """The full output on every rank: g(x_r·W_rᵀ) + b."""
    # BEGIN SOLUTION
    return ReduceFromGroup.apply(F.linear(x, weight), group) + bias
    # END SOLUTION


# %%
check_exercise("tensor_parallel.column_parallel_linear", column_parallel_linear, cluster)

# %%
check_exercise("tensor_parallel.row_parallel_linear", row_parallel_linear, cluster)

# %% [markdown]
# ## 6. A whole GPT, split over the ranks <a id="whole-model"></a>
#
# `parallelize_gpt(model, mesh)` applies the split to every block from outside (the model's code
# knows nothing of ranks): attention and MLP become column-then-row regions, the embedding and
# LM head are split by vocabulary (section 7), LayerNorms stay replicated. Per block that is
# **two regions, so two collectives per pass**: `g` leaving attention and `g` leaving the MLP in
# forward, `f` entering each in backward.
#
# Below, one block's forward and backward with counted bytes, then the whole model in fp64 against
# one process: logits (gathered along the vocabulary, only to compare), loss and every gradient.
# Look for: 2 all-reduces per block per pass, bytes equal to
# `comm_bytes_per_layer` = `2 · 2(t-1)/t · b·s·h · 4`, parameters per rank equal to
# `params_per_rank`, and differences at fp64 rounding (~1e-16). On 4 ranks the bytes per rank
# grow by `2(t-1)/t`: from 1× to 1.5× `b·s·h` per all-reduce — more ranks, more traffic each.


# %%
def whole_model_counted() -> dict:
    t, device = dtlab.world_size(), dtlab.device()
    model = GPT(CONFIG, seed=0, device=device, dtype=torch.float64)
    tp = parallelize_gpt(model, Mesh(tp=t), collectives="dtlab")
    batch = SyntheticTokens(CONFIG, n_batches=1, batch_size=B, seed=0)[0]
    tokens, targets = (v.to(device) for v in batch)
    block, stats = tp.model.blocks[0], tp.comm.comm_stats
    x = torch.randn(B, S, H, dtype=torch.float64, device=device, requires_grad=True)
    stats.reset()
    y = block(x)
    forward = stats.snapshot()
    y.backward(torch.randn_like(y))
    backward = stats - forward
    tp.model.zero_grad()
    logits = tp.model(tokens)  # (b, s, vocab/t): this rank's vocabulary slice
    loss = tp.loss(logits, targets)
    loss.backward()
    tp.finish_gradients()
    return {
        "block": [(s.calls, s.bytes_by_op) for s in (forward, backward)],
        "param_bytes": tp.parameter_bytes(),
        "local_logits": tuple(logits.shape),
        "logits": tp.gather_logits(logits).cpu(),
        "loss": loss.item(),
        "grads": {name: g.cpu() for name, g in tp.full_gradients().items()},
    }


def compare_with_one_process(per_rank, t: int) -> None:
    ref = GPT(CONFIG, seed=0, dtype=torch.float64)
    tokens, targets = SyntheticTokens(CONFIG, n_batches=1, batch_size=B, seed=0)[0]
    ref_logits = ref(tokens)
    ref_loss = loss_fn(ref_logits, targets)
    ref_loss.backward()
    per_layer = comm_bytes_per_layer(B, S, H, t, sequence_parallel=False, bytes_per_element=8)
    print(
        f"t = {t}: formula per block per pass 2 all-reduces, {per_layer['all_reduce']:,} B; "
        f"parameters per rank {8 * params_per_rank(CONFIG, t):,} B; "
        f"logits per rank {per_rank[0]['local_logits']}"
    )
    for rank, r in enumerate(per_rank):
        (f_calls, f_bytes), (b_calls, b_bytes) = r["block"]
        grads = max((r["grads"][n] - p.grad).abs().max().item() for n, p in ref.named_parameters())
        print(
            f"  rank {rank}: block forward {f_calls} {f_bytes}, backward {b_calls} {b_bytes}; "
            f"parameters {r['param_bytes']:,} B; max |Δ| logits "
            f"{(r['logits'] - ref_logits).abs().max():.0e}, loss "
            f"{abs(r['loss'] - ref_loss.item()):.0e}, gradients {grads:.0e}"
        )


compare_with_one_process(cluster.run(whole_model_counted), 2)
with dtlab.Cluster(4, device=FOUR_RANK_DEVICE) as four_ranks:
    four_rank_model = four_ranks.run(whole_model_counted)
compare_with_one_process(four_rank_model, 4)

# %% [markdown]
# ### The timeline: two collectives per block per pass <a id="block-timeline"></a>
#
# Now a few training steps on the backend's own collectives, each pass traced and labelled. The
# timeline colours communication by the **group** it ran in (`color_by="group"`): everything here
# is the `tp` group, drawn in the lower lane of each rank under the compute it interrupts. Look
# for, inside each forward, a pair of short all-reduces per block (one per region) and the loss's
# three tiny ones at the end; the same pairs in backward; and the counts printed below: per pass
# `2·L` for the blocks plus one for the embedding (forward) or the LM head (backward). Hover
# over a bar for its bytes.


# %%
def train_traced(steps: int) -> dict:
    t, device = dtlab.world_size(), dtlab.device()
    tp = parallelize_gpt(GPT(CONFIG, seed=0, device=device), Mesh(tp=t))
    opt = torch.optim.AdamW(tp.model.parameters(), lr=1e-3)
    data = SyntheticTokens(CONFIG, n_batches=steps, batch_size=B, seed=0)
    for step, (tokens, targets) in enumerate(data):
        tokens, targets = tokens.to(device), targets.to(device)
        dtlab.barrier()
        opt.zero_grad()
        with trace.labels(phase="forward"), trace.span("forward", step=step):
            loss = tp.loss(tp.model(tokens), targets)
        with trace.labels(phase="backward"), trace.span("backward", step=step):
            loss.backward()
        tp.finish_gradients()
        with trace.span("optimizer", kind="optimizer", step=step):
            opt.step()
    return {"loss": loss.item()}


STEPS = 3
traced = cluster.run(train_traced, STEPS)
comm = traced.trace.filter(rank=0, kind="comm").spans
L = CONFIG.n_layers
for phase in ("forward", "backward"):
    names = [s.name for s in comm if s.labels.get("phase") == phase]
    loss_calls = [n for n in names if "cross_entropy" in n]
    print(
        f"{phase:<8}: {(len(names) - len(loss_calls)) // STEPS} all-reduces of b·s·h per step "
        f"(formula 2·L + 1 = {2 * L + 1}), plus {len(loss_calls) // STEPS} of the loss's b·s"
    )
dtlab.viz.timeline(
    traced.trace,
    title="Tensor-parallel GPT, 2 ranks",
    color_by="group",
    caption="The tensor-parallel all-reduces (tp) sit inside every block, between its computations.",
)

# %% [markdown]
# ## 7. The loss, from logits split by vocabulary <a id="vocab-parallel-ce"></a>
#
# The LM head is column-parallel over the **vocabulary**: rank `r` computes logits for token ids
# `r·V/t …`. Gathering the full logits for the loss would move `(t-1)/t · b·s·V` numbers per rank —
# `V/h` times a hidden state; for GPT-2 (`V` = 50,257, `h` = 768) 65×. It is never needed. The
# loss of token `i` with target `y` is
#
# `ℓ_i = log Σ_v exp(z_iv − m_i) − (z_iy − m_i)`, with `m_i = max_v z_iv`,
#
# and each term is a reduction over the vocabulary that splits into per-rank pieces:
#
# | step | on each rank | communication |
# |---|---|---|
# | max `m_i` | max over its `V/t` logits | all-reduce (max) of `b·s` numbers |
# | `Σ exp(z − m)` | sum over its logits | all-reduce (sum) of `b·s` numbers |
# | `z_y − m` | its value if it owns `y`, else 0 | all-reduce (sum) of `b·s` numbers |
#
# `m` is only there so `exp` cannot overflow. Backward needs **nothing**: `∂ℓ_i/∂z_iv = softmax_iv
# − [v = y]` on the rank's own `v`, with the global sum already known. Look for: the loss equal to
# `F.cross_entropy` of the full logits, and bytes on the wire that stay flat as `V` grows while a
# gather grows with it.


# %%
VOCABS = (128, 1024, 8192) if FAST else (1024, 8192, 50304)


def loss_from_vocab_slices(vocab: int) -> dict:
    rank, t, device = dtlab.rank(), dtlab.world_size(), dtlab.device()
    g = torch.Generator(device).manual_seed(vocab)
    logits = 4 * torch.randn(B, S, vocab, generator=g, device=device)  # the same on every rank...
    targets = torch.randint(vocab, (B, S), generator=g, device=device)
    shard = logits.chunk(t, dim=-1)[rank]  # ...of which a rank keeps V/t columns
    comm = Communicator.along(Mesh(tp=t), "tp", collectives="dtlab")
    loss = tensor_parallel.vocab_parallel_cross_entropy(shard, targets, comm)
    return {
        "loss": loss.item(),
        "want": F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item(),
        "sent": comm.comm_stats.bytes_sent,
        "calls": comm.comm_stats.calls,
    }


print(
    f"{'V':>6} {'loss':>8} {'F.cross_entropy':>16} {'sent B (counted)':>17} {'gather would send':>18}"
)
for vocab in VOCABS:
    r = cluster.run(loss_from_vocab_slices, vocab)[0]
    gather = ring_bytes_sent("all_gather", B * S * vocab * 4, cluster.world_size)
    print(f"{vocab:>6} {r['loss']:>8.5f} {r['want']:>16.5f} {r['sent']:>17,.0f} {gather:>18,.0f}")
print(
    f"formula: 3 all-reduces of b·s numbers, 3 · 2(t-1)/t · b·s · 4 = "
    f"{3 * ring_bytes_sent('all_reduce', B * S * 4, cluster.world_size):,.0f} B, whatever V"
)

# %% [markdown]
# ### Exercise: vocabulary-parallel cross-entropy <a id="exercise-vocab-ce"></a>
#
# Write the forward and backward of `VocabParallelCrossEntropy`; `vocab_parallel_cross_entropy`
# below calls it and averages over tokens. The inputs:
#
# - `logits` `(n, V/t)`: this rank's vocabulary slice, columns for token ids `vocab_start …
#   vocab_start + V/t`;
# - `targets` `(n,)`: the full token ids, the same on every rank.
#
# Forward, per token: the local max, all-reduced with `op=dist.ReduceOp.MAX`; the sum of
# `exp(z − m)` over the slice, all-reduced (sum); the target's `z_y − m` from the rank that owns `y`
# and 0 on the others, all-reduced (sum); return `log Σ − (z_y − m)`, one loss per token. Save what
# backward needs (`ctx.save_for_backward`). Backward: `(softmax − one-hot) · grad_loss` on the
# slice, the one-hot only where this rank owns the target; no communication. Inside `forward` the
# tensors are detached, so in-place all-reduces are safe; `backward` returns one value per
# `forward` input (`None` for the last three).
#
# The grader runs it on 2 ranks at two vocabulary sizes with logits near ±100 (where `exp`
# overflows fp32 without the max) and compares loss and gradient with `F.cross_entropy` of the full
# logits. Every collective but all-reduce is refused (no all-gather of the logits), the bytes sent
# must be the same at both vocabulary sizes, and backward must move nothing.


# %%
class VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token loss from this rank's vocabulary slice; three all-reduces of one number per token."""

    @staticmethod
    def forward(ctx, logits, targets, vocab_start, group):
        # BEGIN SOLUTION
        local = targets - vocab_start
        mine = (local >= 0) & (local < logits.shape[-1])  # does this rank own the target?
        local = local.masked_fill(~mine, 0)
        token_max = logits.amax(dim=-1)
        dist.all_reduce(token_max, op=dist.ReduceOp.MAX, group=group)
        exp = (logits - token_max.unsqueeze(-1)).exp()
        sum_exp = exp.sum(dim=-1)
        dist.all_reduce(sum_exp, group=group)
        target = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1) - token_max
        target = target.masked_fill(~mine, 0.0)
        dist.all_reduce(target, group=group)
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local, mine)
        return sum_exp.log() - target
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad_loss):
        # BEGIN SOLUTION
        softmax, local, mine = ctx.saved_tensors
        one_hot = mine.to(softmax.dtype).unsqueeze(-1)  # 1 only where this rank owns the target
        grad = softmax.scatter_add(-1, local.unsqueeze(-1), -one_hot)
        return grad * grad_loss.unsqueeze(-1), None, None, None
        # END SOLUTION


def vocab_parallel_cross_entropy(logits, targets, vocab_start, group):
    """Mean cross-entropy over tokens, from this rank's vocabulary slice of the logits."""
    return VocabParallelCrossEntropy.apply(logits, targets, vocab_start, group).mean()


# %%
check_exercise(
    "tensor_parallel.vocab_parallel_cross_entropy", vocab_parallel_cross_entropy, cluster
)

# %% [markdown]
# ## 8. Attention by heads, and the limit of grouped-query attention <a id="head-sharding"></a>
#
# Heads are independent until the output projection, so attention splits by **heads**: q, k, v
# column-parallel, `H/t` query heads per rank, attention computed locally, the output projection
# row-parallel. With grouped-query attention (Ainslie et al. 2023) `H` query heads share `Hkv`
# key/value heads — query head `i` reads KV head `i // (H/Hkv)`. Cutting the heads into `t`
# contiguous blocks keeps every query head on the rank of its KV head exactly when `t` divides
# `Hkv`: the number of KV heads, not of query heads, bounds `t`. (Megatron replicates KV heads
# past that; dtlab refuses and says what to choose.)
#
# Below, a GPT with 8 query heads and 2 KV heads on 2 ranks: look for 4 query heads and 1 KV head
# per rank, and attention output equal to one process.

# %%
GQA = GPTConfig.tiny(n_heads=8, n_kv_heads=2)


def split_attention() -> dict:
    t, device = dtlab.world_size(), dtlab.device()
    attn = GPT(GQA, seed=0, device=device).blocks[0].attn
    parallelize_attention(attn, Communicator.along(Mesh(tp=t), "tp"))
    x = torch.randn(2, GQA.seq_len, GQA.d_model, generator=torch.Generator().manual_seed(1))
    return {
        "q_heads": attn.q_proj.weight.shape[0] // GQA.head_dim,
        "kv_heads": attn.k_proj.weight.shape[0] // GQA.head_dim,
        "out": attn(x.to(device)).detach().cpu(),
    }


x = torch.randn(2, GQA.seq_len, GQA.d_model, generator=torch.Generator().manual_seed(1))
want = GPT(GQA, seed=0).blocks[0].attn(x)
for rank, r in enumerate(cluster.run(split_attention)):
    print(
        f"rank {rank}: {r['q_heads']} query heads, {r['kv_heads']} KV head(s); "
        f"max |out - one process| = {(r['out'] - want).abs().max():.1e}"
    )

# %% [markdown]
# A degree that would cut a head, or a KV group, is refused **before any process starts** — the
# layout is checked against the model, and the message says what to choose instead:

# %%
for tp in (3, 4):
    try:
        Layout(tp=tp).check(tp, model_check=tensor_parallel_check(GQA))
    except ValueError as error:
        print(f"{error}\n")

# %% [markdown]
# ## 9. Sequence parallelism <a id="sequence-parallel"></a>
#
# Tensor parallelism splits what happens *inside* the regions. Between them — LayerNorms, dropout,
# the residual adds — every rank still holds the whole `(b, s, h)` activation and does the same
# work `t` times. Sequence parallelism (Korthikanti et al. 2022) cuts those along the
# **sequence**: rank `r` keeps tokens `r·s/t …`. Entering a region becomes an **all-gather** along
# the sequence (every rank needs all tokens for its heads), leaving it a **reduce-scatter** (sum the
# partial results, keep your tokens). An all-reduce *is* a reduce-scatter followed by an
# all-gather, so the bytes do not change — only the activation memory outside the regions, now
# divided by `t`. (The replicated LayerNorm weights and row biases then see only their rank's
# tokens, so their gradients get one all-reduce after backward: `tp.finish_gradients()`.)
#
# Look for: per block per pass 2 all-gathers + 2 reduce-scatters instead of 2 all-reduces, with
# the same total bytes.


# %%
def one_block(sequence_parallel: bool) -> dict:
    t, device = dtlab.world_size(), dtlab.device()
    tp = parallelize_gpt(GPT(CONFIG, seed=0, device=device), Mesh(tp=t), sequence_parallel, "dtlab")
    block, stats = tp.model.blocks[0], tp.comm.comm_stats
    local_seq = S // t if sequence_parallel else S  # with SP a block sees only this rank's tokens
    x = torch.randn(B, local_seq, H, device=device, requires_grad=True)
    stats.reset()
    with ActivationMeter(block) as meter:
        y = block(x, torch.arange(S, device=device))
    forward = stats.snapshot()
    y.backward(torch.randn_like(y))
    backward = stats - forward
    return {
        "passes": [(s.calls, s.bytes_by_op) for s in (forward, backward)],
        "saved": meter.total_bytes,
        "by_module": meter.by_module,
    }


blocks = {sp: cluster.run(one_block, sp) for sp in (False, True)}
for sp, per_rank in blocks.items():
    label = "TP + SP" if sp else "TP     "
    (f_calls, f_bytes), (b_calls, b_bytes) = per_rank[0]["passes"]
    print(
        f"{label}: forward {f_calls} collectives {f_bytes}; backward {b_calls} {b_bytes}; "
        f"total per pass {sum(f_bytes.values()):,} B"
    )
    print(f"         formula {comm_bytes_per_layer(B, S, H, 2, sp)}")

# %% [markdown]
# ### Activation memory per rank, against the formula <a id="sp-memory"></a>
#
# What one block saves for backward, measured per rank with saved-tensor hooks (`ActivationMeter`),
# beside `activation_bytes_per_layer` — the exact count for this GPT in fp32 without dropout, the
# lab GPT's version of Korthikanti et al.'s `s·b·h·(34 + 5·a·s/h)` bytes. Look for: solid =
# hatched on every rank, and the bar shrinking with SP. The table after the figure shows where:
# the LayerNorms (outside the regions) drop by `t`; the inside of the regions was already split.

# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=("TP", "TP + SP"), shared_yaxes=True)
for col, (sp, per_rank) in enumerate(blocks.items(), start=1):
    formula = {"activations": activation_bytes_per_layer(CONFIG, B, S, 2, sp)}
    panel = dtlab.viz.memory_bars([{"activations": r["saved"]} for r in per_rank], formula)
    for bar in panel.data:
        bar.showlegend = bar.showlegend is not False and col == 1
        fig.add_trace(bar, row=1, col=col)
fig.update_layout(
    template=dtlab.viz.DTLAB_TEMPLATE, barmode="stack", height=400,
    title="Activations one block saves, per rank (solid measured, hatched formula)",
    yaxis={"title": {"text": "saved activations per rank (MiB)"}},
)  # fmt: skip
dtlab.viz.describe(fig, x="rank", caption="Solid = hatched on every rank; with SP the bar shrinks.")

# %%
modules = sorted({m for per_rank in blocks.values() for m in per_rank[0]["by_module"]})
print(f"{'module':<16} {'TP bytes':>10} {'TP+SP bytes':>12}")
for module in modules:
    tp_only, with_sp = (blocks[sp][0]["by_module"].get(module, 0) for sp in (False, True))
    print(f"{module or '(block)':<16} {tp_only:>10,} {with_sp:>12,}")
for sp, per_rank in blocks.items():
    formula = activation_bytes_per_layer(CONFIG, B, S, 2, sp)
    print(f"sp={sp!s:<5}: measured {per_rank[0]['saved']:,} B, formula {formula:,} B")

# %% [markdown]
# At real scale the same formula (Korthikanti et al., 16-bit, no recomputation) for a GPT-3-sized
# layer — `h` = 12,288, 96 heads, `s` = 2,048, `b` = 1 — per rank: TP alone leaves
# `10·s·b·h` bytes replicated, SP divides them too.

# %%
for t in (1, 2, 4, 8):
    tp_only = korthikanti_bytes(2048, 1, 12288, 96, tensor_parallel=t)
    with_sp = korthikanti_bytes(2048, 1, 12288, 96, tensor_parallel=t, sequence_parallel=True)
    print(f"t = {t}: TP {tp_only / MB:7.0f} MB per layer   TP + SP {with_sp / MB:7.0f} MB")

# %% [markdown]
# ## 10. What the all-reduces cost: NVLink against InfiniBand <a id="tp-cost"></a>
#
# Not every one of those collectives sits on the critical path. Forward's two (g after attention
# and after the MLP; with SP the all-gather before each block and the reduce-scatter after) feed
# the next matmul, so they are exposed unless async TP (collective matmul) splits the GEMM into
# chunks that compute while others communicate. Backward's input-gradient all-reduce (f's; with
# SP a reduce-scatter) is not needed by the same layer's weight-gradient GEMM: Megatron-LM
# launches it asynchronously and computes wgrad meanwhile (with `CUDA_DEVICE_MAX_CONNECTIONS=1`,
# so the collective is queued first), and under SP the re-all-gather of the saved input overlaps
# the dgrad GEMM. Without SP that hides up to half of a layer's TP bytes, bounded by how long the
# wgrad GEMM lasts (under SP the output-gradient all-gather before the row-parallel layer stays
# exposed too). At real sizes — a 70B-class layer, `h` = 8,192, one 4,096-token sequence, bf16 — each all-reduce
# carries `s·b·h·2` = 67 MB, four per layer per micro-batch. The alpha-beta model
# (`dtlab.cost.collective_time`, ring) prices them on an H100 node's NVLink (450 GB/s per direction)
# and on one InfiniBand NDR link per GPU (50 GB/s), next to the layer's own compute on `t` GPUs at
# 50% of the H100's bf16 peak (`flops_per_token` of a `12·h²`-parameter layer, attention included).
#
# Look for: on NVLink the communication stays a small fraction of the compute (3% at `t` = 2,
# 22% at `t` = 8). On InfiniBand it is already a quarter of the compute at `t` = 2 (26%), three
# quarters at `t` = 4 (78%), and overtakes it at `t` = 8 (186%, almost twice the compute). The
# share grows with `t`: compute shrinks as `1/t`, while the bytes each rank sends per all-reduce
# grow towards twice the tensor (`2(t-1)/t` of it). And forward's half blocks: it is added to the
# step, not hidden, while backward's half hides only as far as the weight-gradient GEMM (about a
# third of the compute) lasts — on InfiniBand at `t` = 8 it does not. That is why TP stays inside
# the NVLink domain — 8 GPUs on an H100 node.

# %%
SEQ, HIDDEN, BF16, MFU = 4096, 8192, 2, 0.5
FABRICS = {"NVLink 4": NVLINK4_H100, "InfiniBand NDR": IB_NDR_400}
layer_flops = flops_per_token(12 * HIDDEN**2, n_layers=1, seq_len=SEQ, d_model=HIDDEN) * SEQ
rows = []
for t in (2, 4, 8):
    volume = tp_allreduce_volume_per_layer(SEQ, 1, HIDDEN, t, BF16)
    compute_ms = layer_flops / t / (H100_SXM.bf16_dense_flops * MFU) * 1e3
    comm_ms = {
        name: volume.collectives
        * collective_time("all_reduce", "ring", volume.payload_bytes, t, link)
        * 1e3
        for name, link in FABRICS.items()
    }
    rows.append((t, compute_ms, comm_ms))
    print(
        f"t = {t}: {volume.collectives} all-reduces of {volume.payload_bytes / MB:.0f} MB, "
        f"{volume.bytes_sent_per_rank / MB:.0f} MB sent per rank; compute {compute_ms:.2f} ms; "
        + "; ".join(f"{n} {ms:.2f} ms ({ms / compute_ms:.0%})" for n, ms in comm_ms.items())
    )

# %%
fig = go.Figure()
degrees = [f"t = {t}" for t, _, _ in rows]
fig.add_bar(x=degrees, y=[c for _, c, _ in rows], name="compute (50% of bf16 peak)")
for name in FABRICS:
    fig.add_bar(x=degrees, y=[comm[name] for *_, comm in rows], name=f"all-reduces on {name}")
fig.update_layout(
    template=dtlab.viz.DTLAB_TEMPLATE, barmode="group",
    title="One 70B-class layer, forward + backward: compute vs TP communication",
    yaxis={"title": {"text": "time per layer per micro-batch (ms)"}},
)  # fmt: skip
dtlab.viz.describe(
    fig,
    x="tensor-parallel degree",
    caption="Compute shrinks with t; the all-reduces do not, and on InfiniBand overtake it at t = 8.",
)

# %% [markdown]
# The model says backward's all-reduce can hide behind wgrad; here it is on the two ranks. Two
# column → GELU → row layers run forward and backward twice per step, interleaved: once with the
# input-gradient all-reduce waited for as soon as it is launched, once waited for after the
# weight-gradient GEMM (`backward_overlap=True`, `dtlab.parallel.tensor.backward_overlap`).
# From the trace, per layer: how long the all-reduce took from launch to completion, how much of
# that no compute covered (*exposed*: launch plus wait), and the wgrad GEMM it can hide under.
# Look for: `equal` — the gradients are bit-identical either way, only the order changes; the
# forward all-reduce (g) exposed in both; with the overlap, part of the backward all-reduce ran
# under wgrad. On this CPU the two ranks share two cores with the GEMM they hide behind, so the
# hidden share is small and moves run to run; on GPUs the NCCL kernel runs on a few SMs of its
# own beside the GEMM, with the links doing the moving.

# %%
measured = tensor_parallel.measure_tp_backward_overlap(
    cluster, layers=2, batch=2, seq=32, d_model=64, d_ff=256, steps=3
)
print(f"gradients bit-identical with and without: {measured.equal}")
print(f"forward all-reduce (g), exposed either way: {measured.detail['forward_exposed_ms']:.2f} ms")
for side in (measured.off, measured.on):
    when = "after wgrad" if side.technique_on else "at once    "
    print(
        f"dL/dX all-reduce waited {when}: {side.comm_ms:.2f} ms in flight, "
        f"{side.exposed_ms:.2f} ms exposed ({side.hidden_share:.0%} hidden), "
        f"wgrad {side.compute_ms:.2f} ms"
    )

# %% [markdown]
# ## 11. TP or FSDP? <a id="tp-or-fsdp"></a>
#
# Both split a model that does not fit; they move very different things.
#
# - **FSDP (ZeRO-3)** moves **parameters and gradients**: `3(N-1)/N · Ψ` elements per rank per
#   step, whatever the batch — and all of it can hide behind compute (prefetch, lab 03).
# - **TP** moves **activations**: `4 · 2(t-1)/t · b·s·h` per layer per micro-batch — proportional
#   to the tokens. Forward's half blocks, on the critical path (unless async TP chunks it);
#   backward's half hides only as far as the weight-gradient GEMMs last (section 10). In exchange
#   it divides each layer's compute,
#   weights *and* activations by `t`, and lets more GPUs work on one replica without growing the
#   global batch.
#
# First, measured on the ranks: one training step of the GPT under each, at two global batch sizes,
# every byte counted (for FSDP each rank takes half the batch; for TP both ranks take all of it).
# Look for: FSDP's bytes flat, TP's doubling with the batch, both equal to their formulas.


# %%
def bytes_per_step(method: str, batch: int) -> float:
    rank, t, device = dtlab.rank(), dtlab.world_size(), dtlab.device()
    tokens, targets = SyntheticTokens(CONFIG, n_batches=1, batch_size=batch, seed=0)[0]
    model = GPT(CONFIG, seed=0).to(device)
    if method == "TP":
        tp = parallelize_gpt(model, Mesh(tp=t), collectives="dtlab")
        tp.loss(tp.model(tokens.to(device)), targets.to(device)).backward()
        tp.finish_gradients()
        return tp.comm.comm_stats.bytes_sent
    setup = shard_by_zero_stage(
        model, 3, torch.optim.SGD, units=list(model.blocks), collectives="dtlab", lr=0.1
    )
    x, y = (v.to(device) for v in shard_for_rank((tokens, targets), rank, t))
    loss_fn(setup.forward(x), y).backward()
    return setup.comm_stats.bytes_sent


def tp_formula(batch: int, t: int) -> float:
    """(4L + 2) all-reduces of b·s·h (blocks, embedding, head) + the loss's 3 of b·s, fp32."""
    hidden = (4 * CONFIG.n_layers + 2) * ring_bytes_sent("all_reduce", batch * S * H * 4, t)
    return hidden + 3 * ring_bytes_sent("all_reduce", batch * S * 4, t)


PSI = CONFIG.num_params()
for batch in (BATCH, 2 * BATCH):
    tp_sent = cluster.run(bytes_per_step, "TP", batch)[0]
    fsdp_sent = cluster.run(bytes_per_step, "FSDP", batch)[0]
    print(
        f"global batch {batch:>2}: TP {tp_sent:>10,.0f} B (formula {tp_formula(batch, 2):>10,.0f})"
        f"   FSDP {fsdp_sent:>10,.0f} B (formula 3(N-1)/N·Ψ·4 = "
        f"{zero_comm_bytes_per_rank(PSI, 2, 3, bytes_per_elem=4):>9,})"
    )

# %% [markdown]
# At scale, the same two formulas for a 7B-class model (`h` = 4,096, 32 layers, `Ψ ≈ 12·L·h²`,
# bf16) on one 8-GPU node, against the tokens each step pushes through the node. The lines cross
# where `4L · 2 · s·b·h = 3Ψ`, at about `3Ψ / (8·L·h) ≈ 4.5·h` tokens. Below that TP moves fewer
# bytes; above it FSDP does, *and* FSDP's bytes hide behind compute while TP's block.
#
# So, roughly: **FSDP** (plus DDP across nodes) when the model state is the problem and each GPU
# has enough tokens to hide the all-gathers; **TP** inside the NVLink domain when a single layer's
# weights or activations do not fit, when per-GPU batches get too small for FSDP to hide its
# traffic (very large jobs, whose global batch is capped), or to shrink activations — and usually
# both together (lab 11): TP within a node, FSDP/DP across nodes.

# %%
L7, H7, T = 32, 4096, 8
PSI7 = 12 * L7 * H7**2
tokens_per_step = [2**k for k in range(10, 19)]
fsdp_gb = zero_comm_bytes_per_rank(PSI7, T, 3, bytes_per_elem=BF16) / 1e9
tp_gb = [
    L7 * tp_allreduce_volume_per_layer(n, 1, H7, T, BF16).bytes_sent_per_rank / 1e9
    for n in tokens_per_step
]
crossover = 3 * PSI7 / (8 * L7 * H7)
print(
    f"FSDP: {fsdp_gb:.1f} GB per GPU per step at any batch; TP crosses it at ≈ {crossover:,.0f} tokens per step"
)
fig = go.Figure()
fig.add_scatter(x=tokens_per_step, y=tp_gb, name="TP (t = 8): activations", mode="lines+markers")
fig.add_scatter(
    x=tokens_per_step,
    y=[fsdp_gb] * len(tokens_per_step),
    name="FSDP (N = 8): parameters",
    mode="lines",
)
fig.update_layout(
    template=dtlab.viz.DTLAB_TEMPLATE, title="7B-class model on one 8-GPU node: bytes each GPU sends per step",
    xaxis={"title": {"text": "tokens per step through the node (tokens, log)"}, "type": "log", "dtick": 1},
    yaxis={"title": {"text": "bytes sent per GPU per step (GB, log)"}, "type": "log", "dtick": 1},
)  # fmt: skip
dtlab.viz.describe(
    fig,
    caption="TP's traffic grows with the tokens; FSDP's is fixed by the parameters: they cross.",
)

# %% [markdown]
# ## 12. Check your understanding

# %%
ask("tensor_parallel.column_then_row")

# %%
ask("tensor_parallel.forward_order")

# %%
ask("tensor_parallel.f_and_g")

# %%
ask("tensor_parallel.row_parallel_bug")

# %%
ask("tensor_parallel.allreduces_per_layer")

# %%
ask("tensor_parallel.vocab_parallel_loss")

# %%
ask("tensor_parallel.logit_gather_bytes")

# %%
ask("tensor_parallel.head_split")

# %%
ask("tensor_parallel.sequence_parallel")

# %%
ask("tensor_parallel.sp_same_bytes")

# %%
ask("tensor_parallel.sp_activation_memory")

# %%
ask("tensor_parallel.sp_activation_memory_with_sp")

# %%
ask("tensor_parallel.bytes_per_layer_70b")

# %%
ask("tensor_parallel.ib_allreduce_ms")

# %%
ask("tensor_parallel.inside_nvlink")

# %%
ask("tensor_parallel.backward_allreduce_hides_behind")

# %%
ask("tensor_parallel.sp_backward_what_hides")

# %%
ask("tensor_parallel.backward_overlap_exposed_ms")

# %%
ask("tensor_parallel.async_tp_exposed_ms")

# %%
ask("tensor_parallel.tp_or_fsdp")

# %%
ask("tensor_parallel.when_tp")

# %%
ask("tensor_parallel.tp_vs_pp")

# %%
ask("tensor_parallel.explain")

# %% [markdown]
# ## 13. Shut the cluster down

# %%
cluster.close()
