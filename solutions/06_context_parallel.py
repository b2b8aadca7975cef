# %% [markdown]
# # Lab 06 — Context parallelism
#
# Data parallelism splits the batch, tensor parallelism the layers' width, pipeline parallelism
# their depth. None of them splits a *sequence*, and at 128k tokens one sequence's activations no
# longer fit on one GPU. **Context parallelism** (CP) gives each of `N` ranks `S/N` of every
# sequence's tokens. Every layer except attention works token by token and does not care. But
# attention needs every query to see every earlier key, so the ranks must exchange keys and
# values, and the result must still be *exact*.
#
# One idea at a time:
#
# 1. why sequence length hurts: activation memory grows with `s·h` and with `s²`;
# 2. the online-softmax merge: two key blocks combined exactly, by hand, then you write it;
# 3. ring attention on the timeline: K/V blocks travel while the rank computes;
# 4. the causal imbalance, per rank, and zig-zag flattening it — then you write the layout;
# 5. Ulysses: two all-to-alls around full attention, and its head limit;
# 6. ring vs Ulysses vs all-gather: bytes counted, and time priced at realistic sizes;
# 7. packed documents: the document mask in the ring, its imbalance, document-aware sharding.

# %%
import math

import plotly.graph_objects as go
import torch

import dtlab
import dtlab.viz
from dtlab import trace
from dtlab.comm import Communicator
from dtlab.config import fast_mode, lab_world_size
from dtlab.cost import ring_attention_kv_bytes, ulysses_all_to_all_bytes
from dtlab.cost.hardware import gpu, link
from dtlab.memory.formulas import activation_bytes_per_layer
from dtlab.models.attention import math_attention
from dtlab.parallel.context import (
    AttentionWork,
    allgather_attention,
    block_attention,
    check_heads,
    ring_attention,
    shard_positions,
    shard_sequence,
    ulysses_attention,
    unmasked_scores,
)
from dtlab.parallel.context.documents import STYLES as DOC_STYLES
from dtlab.parallel.context.documents import (
    document_ids,
    document_mask,
    document_ring_attention,
    positions_for,
    unmasked_scores_per_rank,
)
from dtlab.quiz import ask, check_exercise

dtlab.viz.setup_notebook()
FAST = fast_mode()

# %% [markdown]
# ## 1. The cluster <a id="setup"></a>
#
# `N` context-parallel ranks (2 in fast mode, one per GPU otherwise). Every rank will hold `S/N`
# tokens of the same sequences. Look for the CP degree and the sizes used throughout: a batch
# `B`, `H` heads of width `DH`, and a sequence of `S` tokens.

# %%
cluster = dtlab.Cluster(lab_world_size(2))
N = cluster.world_size
B, H, DH = 1, 4, 16
S = 256 if FAST else 4096
print(f"N = {N} CP ranks on {cluster.device_type}; B={B}, H={H}, Dh={DH}, S={S}")

# %% [markdown]
# ## 2. Why sequence length hurts <a id="why-sequence-length"></a>
#
# Korthikanti et al. (2022) count the bytes one transformer layer keeps for backward (16-bit):
# `34·s·b·h` for the token-wise tensors, plus `5·a·s²·b` for the attention scores, softmax and
# its dropout mask. The first grows with `s`, the second with `s²`. `dtlab.memory.formulas`
# computes it. Look for: for a 7B-sized layer (h = 4096, a = 32) the `s²` term is already five
# times the `s·h` term at 4k tokens, and at 128k one layer would need terabytes. FlashAttention
# removes the `s²` term (it never stores the scores, and ring attention keeps that property). The
# `s·h` term remains: 18 GB per layer at 128k, times every layer. Only splitting the sequence
# divides it. The last column is one CP rank's share of it with `N = 8`.

# %%
HIDDEN, HEADS = 4096, 32
print(f"{'s':>8} {'34·s·b·h':>12} {'5·a·s²·b':>12} {'one layer':>12} {'s·h per rank, N=8':>18}")
for s in (4096, 16384, 32768, 131072):
    total = activation_bytes_per_layer(s, 1, HIDDEN, HEADS)
    linear = activation_bytes_per_layer(s, 1, HIDDEN, HEADS, recompute="selective")  # 34·s·b·h
    print(
        f"{s:>8,} {linear / 1e9:>10.2f}GB {(total - linear) / 1e9:>10.2f}GB "
        f"{total / 1e9:>10.2f}GB {linear / 8 / 1e9:>16.2f}GB"
    )

# %% [markdown]
# The `s²` term is there because naive attention materialises a (S, S) score matrix per head.
# Here is that matrix for this lab's small sizes: its bytes, computed from the formula and
# counted from the tensor itself. Look for the two numbers agreeing.

# %%
q_demo = torch.randn(B, H, S, DH)
scores = q_demo @ q_demo.transpose(-2, -1)
print(
    f"scores of (B, H, S, S) fp32: B·H·S²·4 = {B * H * S * S * 4:,} B; "
    f"the tensor holds {scores.numel() * scores.element_size():,} B"
)

# %% [markdown]
# ## 3. The online-softmax merge, by hand <a id="merge-by-hand"></a>
#
# Softmax over a row of scores needs the whole row. But it can be assembled from pieces. Cut the
# keys into blocks `A` and `B`. For one query, keep per block the **normalised** output and the
# **log-sum-exp** of its scores (Milakov & Gimelshein 2018; FlashAttention's recurrence):
#
#     lse_A = log Σ_{j∈A} exp(s_j)          o_A = Σ_{j∈A} exp(s_j − lse_A) · v_j
#     lse   = log(exp(lse_A) + exp(lse_B))
#     o     = exp(lse_A − lse) · o_A + exp(lse_B − lse) · o_B
#
# A worked example: one query, three keys with scores `[1, 2, 3]` and scalar values
# `[10, 20, 30]`. Block A holds the first two keys, block B the third. Look for: the merged
# `o` and `lse` equal to the full softmax's, to the last digit.

# %%
scores_a, values_a = [1.0, 2.0], [10.0, 20.0]  # block A: keys 0 and 1
scores_b, values_b = [3.0], [30.0]  # block B: key 2


def one_block(scores: list[float], values: list[float]) -> tuple[float, float]:
    """(o, lse) of one query over one block, straight from the definitions."""
    lse_block = math.log(sum(math.exp(s) for s in scores))
    return sum(math.exp(s - lse_block) * v for s, v in zip(scores, values, strict=True)), lse_block


(o_a, lse_a), (o_b, lse_b) = one_block(scores_a, values_a), one_block(scores_b, values_b)
lse_ab = math.log(math.exp(lse_a) + math.exp(lse_b))
o_ab = math.exp(lse_a - lse_ab) * o_a + math.exp(lse_b - lse_ab) * o_b
o_full, lse_full = one_block(scores_a + scores_b, values_a + values_b)
print(f"block A: o = {o_a:.6f}, lse = {lse_a:.6f};  block B: o = {o_b:.6f}, lse = {lse_b:.6f}")
print(f"merged:  o = {o_ab:.12f}, lse = {lse_ab:.12f}")
print(f"full:    o = {o_full:.12f}, lse = {lse_full:.12f}")

# %% [markdown]
# ### Exercise: write the merge <a id="exercise-merge"></a>
#
# Write `merge(o_a, lse_a, o_b, lse_b) -> (o, lse)` for whole tensors. `o` has shape
# (B, H, S, Dh) and `lse` (B, H, S). Mind one case: under a causal mask a query may see **no**
# key of a block. Its `lse` is then `−inf` and its `o` is 0. The weight `exp(−inf − lse)` must
# come out 0, and two such blocks must not produce `−inf − (−inf) = nan`.
#
# The grader cuts the keys of a causal fp64 attention at several points (once into three blocks),
# computes each block with `block_attention`, folds the blocks with your merge in both orders on
# every rank, and compares with full attention and its log-sum-exp. Calling the library's
# `merge` is refused.


# %%
def merge(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    # BEGIN SOLUTION fallback=dtlab.parallel.context:merge
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # both blocks empty
    w_a = torch.exp(lse_a - safe).unsqueeze(-1)
    w_b = torch.exp(lse_b - safe).unsqueeze(-1)
    return w_a * o_a + w_b * o_b, lse
    # END SOLUTION


# %%
check_exercise("context_parallel.merge", merge, cluster)

# %% [markdown]
# Your merge on this lab's sizes: a causal attention over `S` keys, cut into `N` blocks as the
# ring will see them, folded block by block. Look for the largest gap to full attention: float32
# rounding (around 1e-7), nothing more.

# %%
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(B, H, S, DH, generator=g) for _ in range(3))
positions = torch.arange(S)
want = math_attention(q, k, v, positions, positions, causal=True)
blocks = [
    block_attention(q, k_blk, v_blk, positions, p_blk)
    for k_blk, v_blk, p_blk in zip(k.chunk(N, 2), v.chunk(N, 2), positions.chunk(N), strict=True)
]
o, lse = blocks[0]
for o_b, lse_b in blocks[1:]:
    o, lse = merge(o, lse, o_b, lse_b)
print(f"{N} blocks merged vs full causal attention: max gap {(o - want).abs().max():.2e}")

# %% [markdown]
# ## 4. The ring on the timeline <a id="ring-timeline"></a>
#
# Ring attention (Liu et al. 2023): queries stay put, K/V blocks travel. At step `t`, rank `r`
# holds the K/V block of rank `r − t` and merges it into its running `(o, lse)`. Before it
# computes on that block it **posts** the transfer of the block to its right neighbour, so the
# transfer runs during the compute. After `N − 1` steps every query has seen every key, and no
# rank ever held all of K/V.
#
# Each rank below runs ring attention forward and backward on its contiguous shard of the same
# q, k, v (non-causal, so every rank computes every block). It then compares its slice of the
# output with one process's full attention. Look for: the gap at float32 rounding, and every rank
# sending the same number of bytes (a ring is symmetric).


# %%
def ring_on_rank(style: str, causal: bool, steps: int, seq_len: int = S) -> dict:
    comm = Communicator(None, collectives="dtlab", dim="cp")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, seq_len, DH, generator=g) for _ in range(3))
    want = math_attention(q, k, v, torch.arange(seq_len), torch.arange(seq_len), causal=causal)
    local = [shard_sequence(t, comm.world_size, comm.rank, style, dim=2)[0] for t in (q, k, v)]
    pos = shard_positions(seq_len, comm.world_size, comm.rank, style)
    work = AttentionWork()
    for step in range(-1, steps):  # step -1 warms up
        comm.comm_stats.reset()
        with trace.labels(step=step):
            mine = [t.clone().requires_grad_() for t in local]
            out = ring_attention(*mine, pos, pos, comm, causal=causal, work=work)
            out.sum().backward()
        if step == -1:
            sent_forward_and_backward = comm.comm_stats.bytes_sent
            work = AttentionWork()  # count one pass per timed step
    gap = (out.detach() - want.index_select(2, pos)).abs().max().item()
    return {
        "gap": gap,
        "sent": sent_forward_and_backward,
        "work": work.unmasked_scores // steps,
        "computed": work.blocks_computed // steps,
        "skipped": work.blocks_skipped // steps,
        "flops": work.forward_flops // steps,
        "cpu_ms": work.forward_cpu_ns / 1e6 / steps,
    }


ring = cluster.run(ring_on_rank, "contiguous", False, 2)
kv_bytes = 2 * B * H * (S // N) * DH * 4
pos_bytes = (S // N) * 8
for rank, r in enumerate(ring):
    print(f"rank {rank}: gap to full attention {r['gap']:.1e}; sent {r['sent']:,} B in one step")

# %% [markdown]
# Where those bytes come from. The forward sends the K/V block a rank holds (and its positions,
# int64) `N−1` times: `(N−1)·(kv + p)`. The backward sends K/V around again, plus each block's
# dK/dV accumulator after every step, `N` times (the last send takes it home):
# `(N−1)·(kv + p) + N·kv`. Look for the measured total matching forward + backward.

# %%
forward = (N - 1) * (kv_bytes + pos_bytes)
backward = (N - 1) * (kv_bytes + pos_bytes) + N * kv_bytes
print(f"kv = {kv_bytes:,} B, p = {pos_bytes:,} B per block")
print(
    f"forward {forward:,} + backward {backward:,} = {forward + backward:,} B predicted; "
    f"measured {ring[0]['sent']:,} B per rank"
)

# %% [markdown]
# Now the timeline of one timed step. Each rank draws `ring_block_forward` and
# `ring_block_backward` spans (compute, one per block) and a `ring_kv`/`ring_dkv` span (comm)
# from posting a transfer to its arrival. A `wait:` span (idle) marks the part of the transfer
# that compute did **not** cover. Look for the comm spans sitting under compute spans. The
# printed hidden fraction is the share of transfer time during which the same rank was
# computing. On tiny CPU blocks the transfer often outlasts the compute; on GPUs with long
# sequences the compute per block grows with `(S/N)²` and the transfer only with `S/N`, so it
# hides.

# %%
step0 = ring.trace.filter(step=0).cropped()  # step 0 on its own clock (after the warm-up)
print(f"hidden fraction of the ring's transfers: {step0.hidden_fraction():.0%}")
dtlab.viz.timeline(
    step0,
    title="Ring attention, forward and backward, one step",
    caption="K/V transfers (orange) overlap the block computations (blue): that part is hidden.",
)

# %% [markdown]
# ## 5. The causal imbalance <a id="causal-imbalance"></a>
#
# With a causal mask, query `i` sees keys `0 … i`. Cut the sequence contiguously and rank 0's
# queries see only the first block, while the last rank's see all of them. The ring skips fully
# masked blocks, so rank 0 finishes early and waits. `AttentionWork` counts, per rank, the score
# elements it computed that survive the mask. Look for: on the cluster, rank 1 doing about three
# times rank 0's work with contiguous sharding.

# %%
S_BALANCE = 1024 if FAST else S  # long enough that a block's compute outweighs timer noise
BALANCE_STEPS = 3
contiguous = cluster.run(ring_on_rank, "contiguous", True, BALANCE_STEPS, S_BALANCE)
for rank, r in enumerate(contiguous):
    print(
        f"rank {rank}: {r['work']:,} unmasked scores; {r['computed']} blocks computed, "
        f"{r['skipped']} skipped"
    )

# %% [markdown]
# The same count at `N = 8`, without running anything: `unmasked_scores` of each rank's query
# positions against the whole sequence. Look for the contiguous bars rising from rank 0 to rank 7
# (the last rank works `2N−1 = 15` times as hard as the first) and the zig-zag bars all level.
# Zig-zag (Brandon et al. 2023; Megatron's load-balanced CP) cuts the sequence into `2N` chunks
# and gives rank `r` chunks `r` and `2N−1−r`: an early, cheap chunk paired with a late,
# expensive one.


# %%
def causal_work(seq_len: int, cp: int, style: str) -> list[int]:
    everyone = torch.arange(seq_len)
    return [
        unmasked_scores(shard_positions(seq_len, cp, r, style), everyone, causal=True)
        for r in range(cp)
    ]


fig = go.Figure()
for style in ("contiguous", "zigzag"):
    fig.add_bar(x=list(range(8)), y=causal_work(1024, 8, style), name=style)
fig.update_layout(
    title="Unmasked causal scores per rank, S = 1024, N = 8",
    xaxis_title="CP rank",
    yaxis_title="unmasked scores (count)",
    barmode="group",
)
dtlab.viz.describe(
    fig, caption="Contiguous bars rise from rank 0 to rank 7; zig-zag bars are level."
)

# %% [markdown]
# ### Exercise: write the zig-zag layout <a id="exercise-zigzag"></a>
#
# Write `zigzag_positions(seq_len, cp, rank)`: the global positions (an int64 tensor, ascending)
# of the tokens rank `rank` holds under zig-zag sharding. Cut `seq_len` into `2·cp` chunks of
# `seq_len / (2·cp)` tokens, and take chunk `rank` and chunk `2·cp − 1 − rank`.
#
# The grader compares your layout with zig-zag sharding for several `(seq_len, cp)`, checks that
# the ranks cover every token once and that every rank gets the same unmasked causal scores.
# It runs on every rank of the cluster. Calling `shard_positions` or `shard_sequence` is refused.


# %%
def zigzag_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    # BEGIN SOLUTION
    chunk = seq_len // (2 * cp)
    head = torch.arange(rank * chunk, (rank + 1) * chunk)
    tail = (2 * cp - 1 - rank) * chunk
    return torch.cat([head, torch.arange(tail, tail + chunk)])
    # END SOLUTION


# %%
check_exercise("context_parallel.zigzag_positions", zigzag_positions, cluster)

# %% [markdown]
# Zig-zag on the cluster: the same causal ring, each rank holding its two chunks and carrying
# their global positions (the causal mask reads them). Look for: equal work on every rank, and
# the output still exact.

# %%
zigzag = cluster.run(ring_on_rank, "zigzag", True, BALANCE_STEPS, S_BALANCE)
for rank, (c, z) in enumerate(zip(contiguous, zigzag, strict=True)):
    print(
        f"rank {rank}: contiguous {c['work']:,} scores, zig-zag {z['work']:,} "
        f"(gap to full attention {z['gap']:.1e})"
    )

# %% [markdown]
# The counts predict time, once the ring stops computing what the mask throws away. Of a partly
# masked block this ring computes only the visible part (`visible_part`: the queries that see
# some key, the keys that some query sees); `AttentionWork` counts the matmul FLOPs it executed
# from the shapes it multiplied, and the CPU time its thread spent on them. Under zig-zag every
# block but a rank's own is visible only half (an earlier rank's block through its head chunk,
# a later rank's only to the tail queries), so every rank executes the same FLOPs. Contiguous
# sharding follows the blocks computed (1 : 2 at `N = 2`), not the scores' 1 : 3, because the
# diagonal block is computed whole; a FlashAttention kernel also skips the masked tiles inside
# it. Look for: contiguous rank 0 below rank 1 on every line, zig-zag level on every line. The
# wall-clock sums of the trace's compute spans also count the time a rank waited for a core
# shared with another process; the CPU time does not, so trust it, and the counts, where they
# disagree.


# %%
def forward_compute_ms(run) -> list[float]:
    spans = [s for s in run.trace.filter(name="ring_block_forward").spans if s.labels["step"] >= 0]
    return [sum(s.duration_s for s in spans if s.rank == r) * 1e3 / BALANCE_STEPS for r in range(N)]


for style, run in (("contiguous", contiguous), ("zigzag", zigzag)):
    flops = ", ".join(f"{r['flops'] / 1e6:.1f}" for r in run)
    cpu = ", ".join(f"{r['cpu_ms']:.2f}" for r in run)
    wall = ", ".join(f"{ms:.2f}" for ms in forward_compute_ms(run))
    print(f"{style:>10}: MFLOP executed [{flops}]; CPU ms [{cpu}]; wall ms [{wall}]")


# %% [markdown]
# ## 6. Ulysses and its head limit <a id="ulysses"></a>
#
# DeepSpeed-Ulysses (Jacobs et al. 2023) does not move K/V around a ring. An **all-to-all**
# turns each rank's (all heads, `S/N` tokens) into (`H/N` heads, all `S` tokens). Every rank then
# runs ordinary full attention on its heads, and a second all-to-all turns the result back. Look
# for: exact output, and the all-to-all bytes sent per rank next to the formula
# `(N−1)/N · (S/N)·b·(2h + 2·kv_hidden)·e` (Q, K, V in, the output back). The small all-gather
# shares the token positions. The same cell runs the all-gather variant of section 7 for
# comparison: each rank sends its K/V block to the `N−1` others.


# %%
def ulysses_on_rank() -> dict:
    comm = Communicator(None, collectives="dtlab", dim="cp")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, S, DH, generator=g) for _ in range(3))
    want = math_attention(q, k, v, torch.arange(S), torch.arange(S), causal=True)
    local = [shard_sequence(t, comm.world_size, comm.rank, "zigzag", dim=2)[0] for t in (q, k, v)]
    pos = shard_positions(S, comm.world_size, comm.rank, "zigzag")
    sent = {}
    for name, attend in (("ulysses", ulysses_attention), ("allgather", allgather_attention)):
        comm.comm_stats.reset()
        out = attend(*local, pos, pos, comm, causal=True)
        gap = (out - want.index_select(2, pos)).abs().max().item()
        sent[name] = (gap, comm.comm_stats.bytes_by_op)
    return sent


ulysses = cluster.run(ulysses_on_rank)
for name, (gap, by_op) in ulysses[0].items():
    print(f"{name}: gap to full attention {gap:.1e}; rank 0 sent {by_op}")
formula = ulysses_all_to_all_bytes(S, B, H * DH, N, bytes_per_elem=4)
print(f"Ulysses formula, q, k, v in and the output back: {formula:,.0f} B")
print(f"all-gather of K, V and positions: (N-1)·(kv + p) = {(N - 1) * (kv_bytes + pos_bytes):,} B")

# %% [markdown]
# The catch: after the all-to-all every rank must hold **whole** heads, so `N` must divide the
# query heads and the KV heads. A model with 8 KV heads cannot run Ulysses on 16 ranks. Look for
# the error naming the degrees that fit.

# %%
try:
    check_heads(heads=32, kv_heads=8, cp=16)
except ValueError as error:
    print(error)

# %% [markdown]
# ## 7. Ring vs Ulysses vs all-gather <a id="ring-vs-ulysses"></a>
#
# A third design, Llama 3's CP, all-gathers K/V once and attends locally. It is simple, and it
# holds all of K/V for a moment. Per rank and per layer forward:
#
# - ring: `N−1` messages of one K/V block, each overlapping one block's compute;
# - all-gather: the same `(N−1)` blocks' bytes, received at once, not overlapped;
# - Ulysses: 4 all-to-alls of `(N−1)/N` of the local Q, K, V, output; the volume *falls* with `N`.
#
# Priced with the α-β model (`time = messages·α + bytes/bandwidth`) at realistic sizes: a
# Llama-3-8B-like layer (h = 4096, 8 KV heads of 128, bf16), 128k tokens, `N = 8`, inside a node
# over NVLink and across nodes over InfiniBand. Next to it, one block's attention compute on an
# H100 (`4·(S/N)²·h` FLOPs for QKᵀ and PV, at peak): the time the ring has to hide each transfer.
# Look for: the ring's step hidden behind its block on both links; Ulysses moving fewer bytes,
# but exposed unless overlapped by other means.

# %%
SEQ, HID, KV_HID, CP, ELEM = 131072, 4096, 1024, 8, 2
ring_vol = ring_attention_kv_bytes(SEQ, 1, KV_HID, CP, bytes_per_elem=ELEM)
uly_bytes = ulysses_all_to_all_bytes(SEQ, 1, HID, CP, kv_hidden=KV_HID, bytes_per_elem=ELEM)
block_s = 4 * (SEQ // CP) ** 2 * HID / gpu("h100_sxm").bf16_dense_flops
print(f"one block's attention on an H100 at peak: {block_s * 1e3:.2f} ms")
for name in ("nvlink4", "ib_ndr_400"):
    net = link(name)
    ring_step = net.time(ring_vol.bytes_per_step)
    print(
        f"{net.name}: ring {ring_vol.steps} steps × {ring_step * 1e3:.2f} ms "
        f"({'hidden' if ring_step < block_s else 'exposed'}); all-gather "
        f"{net.time(ring_vol.bytes_sent_per_rank, CP - 1) * 1e3:.2f} ms up front; Ulysses "
        f"{uly_bytes / 1e6:.0f} MB in 4 all-to-alls = {net.time(uly_bytes, 4 * (CP - 1)) * 1e3:.2f} ms"
    )

# %% [markdown]
# ## 8. Packed documents: the document mask and its imbalance <a id="packed-documents"></a>
#
# Pre-training packs several documents into one sequence and masks attention so a token sees only
# earlier tokens of **its own document**. Under CP the mask does two things. Key blocks that no
# document spans are skipped, not only future ones. And the load balance changes: zig-zag balances
# one causal triangle, but the work is now a triangle per document, and where the long documents'
# tails fall decides each rank's share. **Document-aware sharding** cuts *each document* into `2N`
# chunks and deals them zig-zag, so every rank holds a balanced piece of every triangle
# (`dtlab.parallel.context.documents`). On the cluster: a packed sequence with one long document,
# attended by a forward ring that applies the document mask. Look for: every layout equal to one
# process, the per-rank work counted by the ring equal to the formula, zig-zag no longer level, and
# document-aware sharding flat. Which of contiguous and zig-zag is worse depends on where the
# boundaries fall against the chunks: with these lengths on 2 or 4 ranks the long document's tail
# lands on one rank and zig-zag is the worse of the two; on 8 ranks contiguous is (the last line
# prints which, from the counted work).

# %%
DOCS = [16, 48, 16, 16] if FAST else [256, 768, 256, 256]  # the same proportions


def packed_qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, sum(DOCS), 8, generator=g, dtype=torch.float64) for _ in range(3)]


def packed_ring(style: str) -> dict:
    comm, device = Communicator(collectives="dtlab", dim="cp"), dtlab.device()
    positions = positions_for(DOCS, comm.world_size, comm.rank, style)
    q, k, v = (t.index_select(2, positions).to(device) for t in packed_qkv())
    work = AttentionWork()
    doc = document_ids(DOCS).to(device)
    out = document_ring_attention(q, k, v, positions.to(device), doc, comm, work)
    return {"out": out.cpu(), "positions": positions, "work": work}


q_all, k_all, v_all = packed_qkv()
everything = torch.arange(sum(DOCS))
mask = document_mask(everything, everything, document_ids(DOCS))
scores = (q_all @ k_all.transpose(-2, -1) / math.sqrt(8)).masked_fill(~mask, float("-inf"))
reference = torch.softmax(scores, -1) @ v_all
packed = {style: cluster.run(packed_ring, style) for style in DOC_STYLES}
print(
    f"{'layout':<11} {'equal':>6} {'work per rank (counted)':>26} {'formula':>22} {'skipped':>8} {'imbalance':>10}"
)
for style in DOC_STYLES:
    runs = packed[style]
    equal = all(torch.allclose(r["out"], reference.index_select(2, r["positions"])) for r in runs)
    counted = [r["work"].unmasked_scores for r in runs]
    skipped = sum(r["work"].blocks_skipped for r in runs)
    formula = unmasked_scores_per_rank(DOCS, N, style)
    busiest = max(counted) / (sum(counted) / N)  # from the counted work, not the formula
    print(
        f"{style:<11} {equal!s:>6} {str(counted):>26} {str(formula):>22} {skipped:>8} {busiest:>10.2f}"
    )
worse = max(
    ("contiguous", "zigzag"), key=lambda s: max(r["work"].unmasked_scores for r in packed[s])
)
print(
    f"busiest rank (counted): {worse} is the worse plain layout on {N} ranks with these documents"
)

# %%
fig = go.Figure()
for style in DOC_STYLES:
    fig.add_bar(
        x=[f"rank {r}" for r in range(N)],
        y=[r["work"].unmasked_scores for r in packed[style]],
        name=style,
    )
fig.update_layout(template=dtlab.viz.DTLAB_TEMPLATE, barmode="group", height=340)
dtlab.viz.describe(
    fig,
    title=f"Unmasked scores per rank, documents {DOCS} (counted by the ring)",
    x="rank",
    y="score elements computed",
    caption="Zig-zag can be worse than contiguous with documents; cutting each document evens it.",
)
fig.show()

# %%
ask("context_parallel.packed_imbalance")

# %%
ask("context_parallel.document_sharding")

# %% [markdown]
# ## 9. Quiz <a id="quiz"></a>
#
# Graded questions from the bank on what this lab showed.

# %%
ask("context_parallel.purpose")

# %%
ask("context_parallel.activation_growth")

# %%
ask("context_parallel.merge_exact")

# %%
ask("context_parallel.causal_imbalance")

# %%
ask("context_parallel.striped")

# %%
ask("context_parallel.ring_vs_ulysses")

# %%
ask("context_parallel.ring_kv_bytes")

# %%
ask("context_parallel.ulysses_bytes")

# %%
ask("context_parallel.usp")

# %%
cluster.close()
