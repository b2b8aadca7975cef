# %% [markdown]
# # Lab 07 — Mixture of experts and expert parallelism
#
# A dense MLP runs every parameter on every token. A **mixture of experts** (MoE) holds `E`
# MLPs, the *experts*, and a small **router** sends each token to `k` of them. Parameters grow
# with `E`; the compute per token grows only with `k`. The price is paid elsewhere: tokens must
# travel to their experts, some experts get too many, and a popular expert sets everyone's pace.
#
# One idea at a time:
#
# 1. dense MLP → top-k MoE on one rank: parameters vs *active* parameters;
# 2. routing histograms, and the tokens dropped as the capacity factor varies; then you write
#    top-k routing with capacity;
# 3. the load-balancing loss at work on a planted hot expert, and where its counts are taken
#    (per micro-batch, over the global batch, per sequence);
# 4. expert parallelism on the cluster: the all-to-alls on the timeline, their bytes counted;
#    then you write the dispatch all-to-all's splits;
# 5. the count message that is also the call's agreement, and the exchange beside PyTorch's
#    `all_to_all_single`;
# 6. which parameters synchronise over which group;
# 7. what the all-to-all costs at scale, inside a node and across nodes;
# 8. the dispatch at the node boundary: each token sent once per node, then fanned out inside it;
# 9. dispatch and combine behind the other micro-batch's compute;
# 10. rows per expert and GEMM efficiency, and why experts are spread with EP, not FSDP;
# 11. parallel folding: the MoE layers' own mapping of the ranks, trained beside tensor parallel.

# %%
import math
import time

import plotly.graph_objects as go
import torch

import dtlab
import dtlab.collectives
import dtlab.viz
from dtlab.config import fast_mode, lab_world_size
from dtlab.cost.moe import (
    all_to_all_seconds,
    dedup_dispatch_bytes,
    dispatch_bytes_from_counts,
    inter_node_dispatch_bytes,
)
from dtlab.cost.volumes import moe_all_to_all_bytes_per_layer
from dtlab.mesh import Layout
from dtlab.models import GPT, MLP, GPTConfig, SyntheticTokens, loss_fn
from dtlab.models.moe import MoE, MoEConfig, moe_layers, moe_mlp_factory
from dtlab.models.moe_router import sequence_aux_loss, switch_aux_loss
from dtlab.quiz import ask, check_exercise

dtlab.viz.setup_notebook()
FAST = fast_mode()

# %% [markdown]
# ## 1. The cluster and the model <a id="setup"></a>
#
# `N` ranks (2 in fast mode, one per GPU otherwise). Every MoE layer below has `E = 2·N`
# experts, so expert parallelism over the `N` ranks puts two experts on each rank. Look for the
# sizes used throughout.

# %%
cluster = dtlab.Cluster(lab_world_size(2))
N = cluster.world_size
E, K = 2 * N, 2
CONFIG = GPTConfig.tiny(d_model=32, n_heads=2) if FAST else GPTConfig.small()
TOKENS = 256 if FAST else 4096
print(f"N = {N} ranks on {cluster.device_type}; E = {E} experts, top-{K}; d = {CONFIG.d_model}")

# %% [markdown]
# ## 2. Dense MLP → top-k MoE <a id="params-vs-active"></a>
#
# The dense MLP is `fc_out(GELU(fc_in(x)))`, `d → 4d → d`. The MoE keeps `E` of them as two
# batched tensors, `(E, d, 4d)` and `(E, 4d, d)`, plus a router `(E, d)`. A token computes with
# the router and its `k` experts only. Look for: the MoE holding about `E` times the dense
# parameters, but each token computing with about `k` times them.

# %%
torch.manual_seed(0)
dense = MLP(CONFIG)
moe = MoE(CONFIG, MoEConfig(n_experts=E, top_k=K))
dense_params = sum(p.numel() for p in dense.parameters())
moe_params = sum(p.numel() for p in moe.parameters())
print(f"dense MLP: {dense_params:,} parameters, all active")
print(
    f"MoE, E={E}, k={K}: {moe_params:,} parameters ({moe_params / dense_params:.1f}× dense), "
    f"{moe.active_params():,} active per token ({moe.active_params() / dense_params:.1f}× dense)"
)

# %% [markdown]
# The experts' compute, two ways. After routing, the token rows are sorted by expert. The
# textbook way loops over experts, one matmul each. A **grouped GEMM** (`torch._grouped_mm`, where
# this torch has it) runs all groups in one call from their offsets. The default backend,
# `"auto"`, picks the grouped GEMM on each call where it can run, else the loop, and records what
# ran in `experts.last_backend`. Look for: the same values, the path `auto` took, and the best of
# several timings of each, taken here and interleaved (so they vary from run to run on a shared
# machine). The gap matters with many small experts, where the loop pays one kernel launch per
# expert on a GPU.
#
# On a CPU, expect no win, and do not read much into the ratio printed below. PyTorch has no
# grouped kernel for the CPU: there `torch._grouped_mm` runs ATen's fallback
# (`_grouped_mm_fallback` in `ATen/native/GroupedMMUtils.h`), a C++ loop of one `mm` per
# group. Those are the same matmuls as our Python loop, less its per-expert Python overhead and
# final `cat`. On a quiet CPU the two land within tens of percent of each other. A ratio far
# from 1 in either direction comes from timing tiny matmuls on a busy machine (the ranks, other
# notebooks), not from the kernels. The grouped GEMM pays off on a GPU, where it is one kernel
# launch for all `E` experts instead of `E`.

# %%
x_rows = torch.randn(TOKENS * K, CONFIG.d_model)
counts = torch.bincount(torch.randint(0, E, (TOKENS * K,)), minlength=E).tolist()
backends = ("grouped", "loop") if moe.experts.resolved_backend(x_rows) == "grouped" else ("loop",)
timings = {b: [] for b in backends}
outputs = {}
with torch.no_grad():
    for _ in range(7):
        for backend in backends:
            moe.experts.backend = backend
            start = time.perf_counter()
            outputs[backend] = moe.experts(x_rows, counts)
            timings[backend].append(time.perf_counter() - start)
moe.experts.backend = "auto"
for backend, seconds in timings.items():
    print(
        f"{backend:>8}: best {min(seconds) * 1e3:.3f} ms for {len(x_rows):,} rows over {E} experts"
    )
if len(outputs) == 2:
    print(f"largest gap grouped vs loop: {(outputs['grouped'] - outputs['loop']).abs().max():.1e}")
    ratio = min(timings["grouped"]) / min(timings["loop"])
    print(
        f"grouped / loop here: {ratio:.2f}× on {x_rows.device.type}"
        + (" (the CPU fallback is a loop of mm too: see above)" if x_rows.is_cpu else "")
    )
with torch.no_grad():
    moe.experts(x_rows, counts)
why = moe.experts.fallback_reason
print(f"auto ran: {moe.experts.last_backend}" + (f", because {why}" if why else ""))

# %% [markdown]
# The grouped kernel has a rule of its own: every matrix row must start a multiple of 16 bytes
# after the previous one, so `d` and the hidden width must be multiples of 4 in fp32 (8 in
# bf16). A width of 30 makes 120-byte rows. Look for: `auto` running the loop there, and saying
# why.

# %%
odd = MoE(GPTConfig.tiny(d_model=30, n_heads=3), MoEConfig(n_experts=E, top_k=K))
with torch.no_grad():
    odd(torch.randn(16, 30))
print(f"d = 30: auto ran {odd.experts.last_backend}, because {odd.experts.fallback_reason}")

# %% [markdown]
# ## 3. Routing, and the capacity factor <a id="capacity"></a>
#
# The router scores every expert for every token (softmax of `x · W_rᵀ`) and picks the top `k`
# (exactly equal scores go to the lower expert index, so every rank and every run route a tie
# alike).
# A freshly initialised router is nearly random, so the load is uneven by chance alone. To fix
# buffer sizes, each expert accepts at most `C = ⌈c·T·k/E⌉` assignments (`c` the **capacity
# factor**). The rest are **dropped**: that token gets nothing from that expert, only its
# residual. Look for: the tokens each expert was chosen for against the capacity line, on
# `T` tokens of one batch.

# %%
torch.manual_seed(1)
router_layer = MoE(CONFIG, MoEConfig(n_experts=E, top_k=K, capacity_factor=1.0))
x = torch.randn(TOKENS, CONFIG.d_model)
with torch.no_grad():
    router_layer(x)
stats = router_layer.stats
fig = go.Figure(go.Bar(x=list(range(E)), y=stats.tokens_per_expert, name="chosen"))
fig.add_bar(x=list(range(E)), y=stats.kept_per_expert, name="kept")
fig.add_hline(y=stats.capacity, line_dash="dash", annotation_text=f"capacity C = {stats.capacity}")
fig.update_layout(
    title=f"Tokens per expert, T = {TOKENS}, k = {K}, c = 1.0",
    xaxis_title="expert (index)",
    yaxis_title="token assignments (count)",
    barmode="group",
)
dtlab.viz.describe(fig, caption="Chosen past the dashed capacity line is dropped: kept stops at C.")
fig

# %% [markdown]
# Now the capacity factor from tight to generous. The drops are counted from the routing; the
# capacity column is `⌈c·T·k/E⌉`. A dropped assignment costs the token one of its `k` experts; the
# last column counts tokens that lost all of them and pass on their residual alone. Look for:
# drops falling to zero as `c` grows past the most loaded expert's share (`c ≥ imbalance`). But
# every slot of capacity is also buffer space that travels and computes padded in a fixed-shape
# implementation.

# %%
print(f"imbalance (max/mean tokens per expert): {stats.imbalance:.2f}")
print(f"{'c':>5} {'capacity':>9} {'dropped':>8} {'dropped %':>10} {'tokens with no expert':>22}")
for c in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0):
    router_layer.moe = MoEConfig(n_experts=E, top_k=K, capacity_factor=c)
    with torch.no_grad():
        router_layer(x)
    s = router_layer.stats
    print(
        f"{c:>5} {s.capacity:>9} {s.dropped:>8} {s.dropped / (TOKENS * K):>10.1%} "
        f"{s.dropped_tokens:>22}"
    )

# %% [markdown]
# ### Exercise: top-k routing with capacity <a id="exercise-routing"></a>
#
# Write `top_k_routing(scores, top_k, capacity) -> (expert_index, weight, keep)`. `scores` has
# shape (T, E). Return, each of shape (T, k): the `k` best experts per token, **best first**
# (int64); their scores as weights; and `keep` (bool), False where the expert was already full.
# The order of filling matters (GShard): every token's **first** choice is served before any
# token's second choice, and tokens in order within a choice. `capacity=None` keeps everything.
#
# The grader runs your function on every rank with its own scores, including a hot expert that
# overflows, and compares with the library's routing. Calling the library's routing is refused.
# On exactly equal scores the library ranks the lower expert index first (a stable sort);
# `topk` promises no order for ties, but the grader's scores have none, so `topk` will do.


# %%
def top_k_routing(
    scores: torch.Tensor, top_k: int, capacity: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # BEGIN SOLUTION
    weight, expert_index = scores.topk(top_k, dim=-1)
    if capacity is None:
        return expert_index, weight, torch.ones_like(expert_index, dtype=torch.bool)
    slot_major = expert_index.t().reshape(-1)  # all first choices, then all second choices
    one_hot = torch.nn.functional.one_hot(slot_major, scores.shape[-1])
    position = (one_hot.cumsum(0) - 1).gather(1, slot_major[:, None]).squeeze(1)
    keep = (position < capacity).view(top_k, -1).t()
    return expert_index, weight, keep
    # END SOLUTION


# %%
check_exercise("moe.top_k_routing", top_k_routing, cluster)

# %% [markdown]
# ## 4. The load-balancing loss at work <a id="aux-loss"></a>
#
# Left alone, routing collapses: an expert that wins a little gets trained more and wins more.
# The Switch Transformer's auxiliary loss (Fedus et al. 2021) is `E · Σ_i f_i · P_i`: `f_i` the
# fraction of assignments that went to expert `i`, `P_i` its mean router probability. It is 1
# when the load is uniform and grows as the load concentrates. Only `P` has a gradient, so the
# loss lowers the probability of overloaded experts. Here one expert is planted hot (its router
# row points along every token's shared direction), and a small MoE is trained for a few steps
# with and without the loss, on the same data. DeepSeek-V3's loss-free alternative, a per-expert
# bias on the choice nudged after each step, runs alongside. Look for: the imbalance (max/mean)
# staying high without the loss and falling towards 1 with it.


# %%
def imbalance_curve(
    aux_weight: float, bias: bool = False, steps: int = 20 if FAST else 100
) -> list[float]:
    torch.manual_seed(0)
    cfg = MoEConfig(
        n_experts=4, top_k=1, aux_loss_weight=aux_weight, bias_balancing=bias, bias_update_rate=0.05
    )
    layer = MoE(CONFIG, cfg)
    shift = torch.ones(CONFIG.d_model) / math.sqrt(CONFIG.d_model)
    with torch.no_grad():
        layer.router.weight[0] += 2 * shift  # the planted hot expert
    g = torch.Generator().manual_seed(1)
    data = torch.randn(128, CONFIG.d_model, generator=g) + 2 * shift
    target = torch.randn(128, CONFIG.d_model, generator=g)
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-2)
    curve = []
    for _ in range(steps):
        out, aux = layer(data)
        loss = (out - target).pow(2).mean() + aux
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if bias:
            layer.update_balancing_bias()
        curve.append(layer.stats.imbalance)
    return curve


curves = {
    "no balancing": imbalance_curve(0.0),
    "aux loss 0.1": imbalance_curve(0.1),
    "bias (loss-free)": imbalance_curve(0.0, bias=True),
}
fig = go.Figure()
for name, curve in curves.items():
    fig.add_scatter(y=curve, name=name, mode="lines")
fig.update_layout(title="Imbalance (max/mean tokens per expert), E = 4", xaxis_title="step")
dtlab.viz.describe(
    fig,
    caption="Without balancing the imbalance stays high; the loss or the bias brings it toward 1.",
    y="imbalance (max ÷ mean)",
)
for name, curve in curves.items():
    print(f"{name:>17}: imbalance {curve[0]:.2f} → {curve[-1]:.2f}")
fig

# %% [markdown]
# ### Global-batch balance on skewed ranks <a id="global-batch-balance"></a>
#
# The loss above counts `f` on one micro-batch of one rank. In data-parallel training each rank
# holds a different shard, and shards are often skewed (one rank's documents are mostly code).
# Per micro-batch, the loss then asks every rank to spread *its* tokens over all experts, so no
# expert can specialise. Counted over the **global batch**, the tokens per expert summed over
# the data-parallel ranks (one all-reduce of `E` counts per layer) and the step's micro-batches,
# it asks only the whole step to be balanced (Qiu et al. 2025; Megatron-Core's
# `global_aux_loss`). `P` stays each rank's own. In `MoEConfig(aux_loss_scope="global")`,
# `dtlab.parallel.expert.balance.use_global_batch_balance` supplies the summed counts.
#
# Below, each of the `N` ranks holds tokens that lean towards two experts of its own (rank `r`:
# experts `2r` and `2r+1`). A 4-expert layer trains with the loss counted per micro-batch, then
# over the global batch, gradients averaged over the ranks. Look for: both keeping the global
# load balanced (max ÷ mean near 1); the per-micro-batch loss also driving each rank's own load
# to 1 (its experts stop specialising), the global one leaving each rank on its two experts.


# %%
def skewed_run(scope: str, steps: int = 12 if FAST else 60) -> dict:
    from dtlab.comm import Communicator
    from dtlab.parallel.expert.balance import use_global_batch_balance

    rank = dtlab.rank()
    torch.manual_seed(0)
    cfg = MoEConfig(n_experts=4, top_k=1, aux_loss_weight=1.0, aux_loss_scope=scope)
    layer = MoE(CONFIG, cfg)
    with torch.no_grad():
        layer.router.weight.copy_(torch.eye(4, CONFIG.d_model) * 2)  # expert i reads direction i
    dp = Communicator(None, collectives="torch", dim="dp")
    (load,) = use_global_batch_balance(layer, dp)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(128, CONFIG.d_model, generator=g)
    x[:, 2 * rank % 4 : 2 * rank % 4 + 2] += 2.0  # this rank's domain: two experts of its own
    target = torch.randn(128, CONFIG.d_model, generator=g)
    optimizer = torch.optim.Adam(layer.parameters(), lr=5e-2)
    mine, everyone = [], []
    for _ in range(steps):
        load.new_step()
        out, aux = layer(x)
        loss = (out - target).pow(2).mean() + aux
        optimizer.zero_grad()
        loss.backward()
        for p in layer.parameters():
            dp.all_reduce(p.grad)
            p.grad /= dp.world_size
        optimizer.step()
        counts = torch.tensor(layer.stats.tokens_per_expert, dtype=torch.float64)
        mine.append(layer.stats.imbalance)
        dp.all_reduce_control(counts, name="global load report")
        everyone.append((counts.max() * 4 / counts.sum()).item())
    return {"mine": mine, "global": everyone}


skew = {scope: cluster.run(skewed_run, scope) for scope in ("micro_batch", "global")}
fig = go.Figure()
for scope, runs in skew.items():
    fig.add_scatter(y=runs[0]["mine"], name=f"{scope} loss: rank 0's own load", mode="lines")
    fig.add_scatter(y=runs[0]["global"], name=f"{scope} loss: the global load", mode="lines")
dtlab.viz.describe(
    fig,
    title="Balance counted per micro-batch vs over the global batch, skewed ranks",
    caption="Both balance the global load; only the per-micro-batch loss flattens each rank's own.",
    x="step",
    y="imbalance (max ÷ mean)",
)
for scope, runs in skew.items():
    print(
        f"{scope:>11}: rank 0's own load {runs[0]['mine'][-1]:.2f}, "
        f"global {runs[0]['global'][-1]:.2f}"
    )
fig

# %% [markdown]
# DeepSeek-V3 balances the global load with its bias and keeps only a tiny **sequence-wise**
# loss (weight 0.0001): `f` and `P` counted per sequence, so that no single sequence piles onto
# a few experts. A batch can look balanced while each sequence is not. Look for: two sequences,
# each sent whole to one expert, balanced as a batch (Switch loss 1) but not per sequence (2).

# %%
seq_experts = torch.cat([torch.zeros(8, 1), torch.ones(8, 1)]).long()
seq_probs = torch.nn.functional.one_hot(seq_experts[:, 0], 2).float()
print(f"Switch loss over the batch: {switch_aux_loss(seq_probs, seq_experts, 2).item():.2f}")
print(f"sequence-wise loss:         {sequence_aux_loss(seq_probs, seq_experts, 2, 8).item():.2f}")

# %% [markdown]
# ## 5. Expert parallelism on the cluster <a id="expert-parallel"></a>
#
# With expert parallelism (EP) each of the `N` ranks keeps `E/N` experts and its own tokens.
# Every MoE layer then moves tokens, not weights:
#
# 1. each rank counts its rows per expert and **exchanges the counts** (a small all-to-all), so
#    every rank knows how many rows will arrive from whom;
# 2. **dispatch**: an all-to-all with uneven splits sends each row to the rank of its expert;
# 3. the rank runs its experts on what arrived;
# 4. **combine**: the inverse all-to-all brings every row home, where it is weighted and summed.
#
# Backward runs both all-to-alls again, the other way. Below, each rank builds the same MoE GPT,
# keeps its experts (`parallelize_experts`) and trains one step on its own batch. The reference
# is one process running the full model on every rank's batch. Look for: the loss and every
# gradient equal to one process (float64), and per rank the bytes of each exchange, counted
# from the messages.


# %%
def ep_step(capacity_factor: float | None, hot: float = 0.0) -> dict:
    import torch.distributed as dist

    from dtlab import trace
    from dtlab.mesh import Mesh
    from dtlab.parallel.expert import ExpertParallel

    device = dtlab.device()
    world = dist.get_world_size()
    cfg = MoEConfig(
        n_experts=E, top_k=K, capacity_factor=capacity_factor, backend="loop", bias_balancing=True
    )
    factory = moe_mlp_factory(cfg)
    tokens, targets = SyntheticTokens(CONFIG, n_batches=1, batch_size=2 * world, seed=7)[0]
    shards = list(zip(tokens.to(device).chunk(world), targets.to(device).chunk(world), strict=True))

    def build() -> GPT:
        model = GPT(CONFIG, seed=0, dtype=torch.float64, device=device, mlp_factory=factory)
        for layer in moe_layers(model):
            layer.balancing_bias[0] = hot  # hot ≥ 1: every token's choice includes expert 0
        return model

    reference, total = build(), 0.0
    for x, y in shards:
        total = total + (loss_fn(reference(x), y) + reference.aux_loss) / world
    total.backward()

    parallel = ExpertParallel(Mesh(dp=world, ep=world), "dtlab")
    model = build()
    parallel.parallelize(model)
    x, y = shards[dist.get_rank()]
    with trace.labels(step=0, phase="forward"):
        loss = loss_fn(model(x), y) + model.aux_loss
    with trace.labels(step=0, phase="backward"):
        loss.backward()
    sent = parallel.ep.comm_stats.bytes_sent
    parallel.average_gradients(model)
    synced = {"dp": parallel.dp.comm_stats.bytes_sent, "edp": parallel.edp.comm_stats.bytes_sent}
    expert_params = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    dense_params = sum(p.numel() for p in model.parameters()) - expert_params
    mean = loss.detach().clone()
    parallel.dp.all_reduce(mean)
    ref = dict(reference.named_parameters())
    per, rank = E // world, dist.get_rank()
    gap = 0.0
    for name, p in model.named_parameters():
        want = (
            ref[name].grad[rank * per : (rank + 1) * per] if ".experts." in name else ref[name].grad
        )
        gap = max(gap, (p.grad - want).abs().max().item())
    layers = moe_layers(model)
    return {
        "loss_gap": abs(mean.item() / world - total.item()),
        "grad_gap": gap,
        "kept": [m.stats.kept_per_expert for m in layers],
        "bytes": [m.stats.all_to_all_bytes for m in layers],
        "dropped": sum(m.stats.dropped for m in layers),
        "capacity": layers[0].stats.capacity,
        "received": layers[0].stats.received_per_local_expert,
        "imbalance": max(m.stats.imbalance for m in layers),
        "sent": sent,
        "synced": synced,
        "params": {"dp": dense_params, "edp": expert_params},
        "group_sizes": {"dp": parallel.dp.world_size, "edp": parallel.edp.world_size},
    }


ep = cluster.run(ep_step, None)
for rank, r in enumerate(ep):
    print(
        f"rank {rank}: loss gap {r['loss_gap']:.1e}, largest gradient gap {r['grad_gap']:.1e}; "
        f"layer 0 sent {r['bytes'][0]}"
    )

# %% [markdown]
# Where those bytes come from: the formula reads the **actual** kept counts of every rank (they
# differ, so the ranks' bytes differ too). Rank `r` dispatches the rows it routed to other ranks'
# experts and combines back the rows other ranks sent it, `d` float64 values each; the count
# exchange is one message per peer, a 4-word header and that peer's `E/N` counts:
# `(N−1)·(4 + E/N)` int64s (section 6). Backward repeats dispatch and combine. Look for: formula
# equal to the counted total, per rank.

# %%
layers_n = len(ep[0]["kept"])
for rank, r in enumerate(ep):
    want = sum(
        dispatch_bytes_from_counts(
            [ep[s]["kept"][i] for s in range(N)], rank, CONFIG.d_model, 8
        ).forward_and_backward
        for i in range(layers_n)
    )
    print(f"rank {rank}: formula from the counts {want:,} B; counted {r['sent']:,} B")

# %% [markdown]
# The same step with a hot expert and a capacity factor of 1. The expert is planted through the
# router's choice bias (section 4's loss-free balancing knob, turned the wrong way): expert 0, on
# rank 0, is in every token's top-k. Drops appear, and rank 0 computes more rows than the
# others.
#
# Under expert parallelism **capacity is per rank**. Each rank routes its own `T` tokens, so
# its router computes `C = ⌈c·T·k/E⌉` from them and lets each expert keep `C` of *its own*
# assignments before anything moves. An expert therefore receives up to `N·C` rows, `C` from
# each rank (one process routing all `N·T` tokens at once would cap it at `⌈c·N·T·k/E⌉`, and can
# drop other assignments). Look for: each rank's `C`, and expert 0 computing `N·C` rows.
#
# The timeline shows this step's forward pass, both ranks on one clock from the moment the last
# of them started it (`align="latest_start"`: on a busy machine one rank can start tens of ms
# late, and the others' wait for it is cut off). Look for the `moe_experts` compute spans in
# magenta, one per MoE layer (hover: their `tokens` label says how many rows each rank
# computed), and the `moe_dispatch` / `moe_combine` exchanges around them in navy and green,
# where the other ranks wait for the busiest, and before each dispatch the `moe_count_exchange`
# (section 6 says why it is the only check). Everything else is dimmed.

# %%
hot = cluster.run(ep_step, 1.0, 1.0)
for rank, r in enumerate(hot):
    print(
        f"rank {rank}: imbalance {r['imbalance']:.2f}, dropped {r['dropped']} assignments; "
        f"layer 0: C = {r['capacity']} per expert from this rank, its experts computed "
        f"{r['received']} rows"
    )
moe_spans = [s for s in hot.trace.filter(step=0).spans if s.name == "moe_experts"]
for span in sorted(moe_spans, key=lambda s: (s.rank, s.start_ns)):
    print(f"rank {span.rank}: moe_experts computed {span.labels['tokens']} rows")
dtlab.viz.timeline(
    hot.trace.filter(step=0, phase="forward").cropped(),
    title="EP forward pass with a hot expert",
    align="latest_start",
    highlight=("moe_experts", "moe_count_exchange", "moe_dispatch", "moe_combine"),
    caption="Magenta: each rank's experts at work; the exchanges around them wait for the busiest.",
)

# %% [markdown]
# ### Exercise: the dispatch all-to-all's splits <a id="exercise-splits"></a>
#
# Before any row moves, every rank must know how many rows it sends to each rank and how many it
# receives from each. Write `dispatch_splits(tokens_per_expert) -> (send_splits, recv_splits)`.
# It runs on every rank of the EP group (here the whole cluster, `torch.distributed`'s default
# group). `tokens_per_expert` (E,) counts this rank's rows per expert, and rank `j` holds
# experts `j·E/N … (j+1)·E/N − 1`. `send_splits[j]` is the number of rows for rank `j`'s experts;
# `recv_splits[s]` the number rank `s` sends you. Only the other ranks know the second, so
# exchange the counts first (`dist.all_to_all_single` moves tensor rows the same way).
#
# The grader checks your splits against every rank's counts, then drives a real all-to-all of
# labelled rows with them: every row must land on the rank of its expert.


# %%
def dispatch_splits(tokens_per_expert: torch.Tensor) -> tuple[list[int], list[int]]:
    import torch.distributed as dist

    # BEGIN SOLUTION
    ep = dist.get_world_size()
    received = torch.empty_like(tokens_per_expert)
    dist.all_to_all_single(received, tokens_per_expert)  # block j of my counts goes to rank j
    send = tokens_per_expert.view(ep, -1).sum(1).tolist()
    recv = received.view(ep, -1).sum(1).tolist()
    return send, recv
    # END SOLUTION


# %%
check_exercise("moe.dispatch_splits", dispatch_splits, cluster)

# %% [markdown]
# ## 6. One message that is also the check <a id="count-exchange-agreement"></a>
#
# dtlab's generic all-to-all (`dtlab.collectives.all_to_all`) checks every call before its rows
# move: a small control all-gather of each rank's call (sizes, dtype, splits), so ranks that
# disagree raise instead of hanging. The MoE layer would pay that three times per forward
# (counts, dispatch, combine), each a synchronisation of every rank, plus `N−1` pairwise steps
# per payload. Its exchange (`dtlab.parallel.expert.TokenExchange`) pays once:
#
# - the **count message** to each peer starts with a header, *(call number, experts, row width,
#   dtype)*. Every rank receives every other rank's header, so every rank can compare them all:
#   the count exchange *is* the agreement;
# - each **payload** (dispatch, combine) is posted in one call, every message at once;
# - its receive buffers are **kept across steps**, one per micro-batch.
#
# The benchmark below (`dtlab bench moe` at lab size) times four ways of moving the same routed
# rows, interleaved round by round: this exchange on dtlab's counted messages; the very same
# exchange over PyTorch's `all_to_all_single`; bare `all_to_all_single` calls into fresh tensors;
# and the generic checked all-to-all. Look for: the generic one, with a control all-gather before
# each of its three exchanges, behind the exchange; the ratio of dtlab's exchange to the same over
# `all_to_all_single` (at this lab size each exchange moves a few hundred kB, so fixed per-call
# costs weigh most: on the counted path the exchange posts a send and a receive per peer, each a
# call into the backend, where `all_to_all_single` is one call); and the counted bytes equal to
# the formula from the routed counts. Times on a shared 2-core machine vary from run to run; `dtlab bench moe` measures the
# default size.

# %%
from dtlab.bench import moe as moe_bench

bench = moe_bench.run(
    cluster,
    tokens=TOKENS * 2,
    dim=64 if FAST else 1024,
    experts=E,
    steps=2 if FAST else 4,
    repeats=3,
)
names = {
    "a2a_dtlab": "dtlab exchange",
    "a2a_torch": "same over all_to_all_single",
    "a2a_torch_plain": "bare all_to_all_single",
    "a2a_generic": "generic checked all-to-all",
}
fig = go.Figure(go.Bar(x=list(names.values()), y=[bench.step_s[k] * 1e3 for k in names]))
dtlab.viz.describe(
    fig,
    title=f"Counts + dispatch + combine on {N} ranks (median per round)",
    caption="One count message per peer is the check; the generic all-to-all checks each call.",
    y="ms per exchange",
)
for key, label in names.items():
    print(f"{label:>28}: {bench.step_s[key] * 1e3:.2f} ms (median round)")
spread = bench.a2a_dtlab_vs_torch
print(
    f"dtlab exchange ÷ the same over all_to_all_single: {spread.median:.2f}× "
    f"(range {spread.low:.2f}–{spread.high:.2f} over repeats)"
)
print(
    f"bytes per exchange per rank: counted {bench.dtlab_bytes_per_exchange}, "
    f"formula {bench.formula_bytes_per_exchange}"
)
fig

# %% [markdown]
# The check still fires. Below, rank 1 dispatches rows of another width (a model built with
# another `d_model` on one rank). Every rank raises `CollectiveMismatch` from the count message
# alone, before any row moves, and names what each rank passed. Look for: the same message on
# both ranks, with each rank's width.


# %%
def mismatched_width() -> str:
    from dtlab.collectives import CollectiveMismatch
    from dtlab.comm import Communicator
    from dtlab.parallel.expert import TokenExchange

    exchange = TokenExchange(Communicator(None, collectives="dtlab", dim="ep"))
    width = CONFIG.d_model + (8 if dtlab.rank() == 1 else 0)
    try:
        exchange.exchange_counts(torch.ones(E, dtype=torch.int64), width, torch.float32)
    except CollectiveMismatch as error:
        return str(error)
    return "no error"


for rank, message in enumerate(cluster.run(mismatched_width)):
    print(f"rank {rank}: {message[:150]}…")

# %% [markdown]
# ## 7. Which parameters synchronise over which group <a id="sync-groups"></a>
#
# EP is carved out of data parallelism: the `dp` ranks are cut into blocks of `ep` consecutive
# ranks. Inside a block, ranks hold **different** experts (the `ep` group, for the all-to-alls).
# Ranks at the same place in different blocks hold the **same** experts: that is the
# expert-data-parallel group `edp`, `dp/ep` ranks. So:
#
# - dense parameters (attention, embeddings, router, shared expert): all-reduce over `dp`;
# - expert parameters: all-reduce over `edp`;
# - DeepSeek-V3's balancing bias is a buffer, not a gradient: its step uses the tokens per expert
#   summed over `dp` (`ExpertParallel.update_balancing_biases`), so every rank routes alike.
#
# Both are then divided by `dp`, not `dp/ep`: an expert's gradient already sums the tokens of
# every rank of its EP block. Look for the groups of a 16-rank layout, `dp = 8`, `ep = 4`, `tp = 2`.

# %%
layout = Layout(dp=8, ep=4, tp=2)
for dim in ("dp", "ep", "edp"):
    print(f"first two {dim:>3} groups: {layout.groups(dim)[:2]} …")
print(
    f"rank 0 all-to-alls with {layout.group_of('ep', 0)}; its experts' gradients meet "
    f"{layout.group_of('edp', 0)}; its dense gradients meet {layout.group_of('dp', 0)}"
)

# %% [markdown]
# On this cluster, `ep = dp = N`: every rank holds different experts, so the `edp` group has one
# rank and expert gradients do not move at all. The step of section 5 counted what each group's
# gradient all-reduce sent. Look for: the dense gradients' bytes close to the ring all-reduce's
# `2(N−1)/N · M` (float64, `M` = 8 bytes per dense parameter; uneven ring chunks add a little),
# and zero bytes for the experts' gradients.

# %%
r = ep[0]
for group in ("dp", "edp"):
    size, params = r["group_sizes"][group], r["params"][group]
    ring = 2 * (size - 1) / size * params * 8
    print(
        f"{group:>4} ({size} rank{'s' if size > 1 else ''}): {params:,} parameters; "
        f"counted {r['synced'][group]:,} B, ring formula {ring:,.0f} B"
    )

# %% [markdown]
# ## 8. The all-to-all at scale <a id="all-to-all-cost"></a>
#
# Uniform routing, DeepSeek-V3-like sizes: hidden 7168, top-8 of 256 experts, 4096 tokens per
# rank, bf16, EP = 64 over 8 nodes of 8 GPUs. Each token's vector travels `k` times in dispatch
# and comes back in combine, and backward does both again: the per-layer bytes per rank from the
# cost model. Inside a node they move over NVLink; across nodes over InfiniBand, about 10 times
# slower. Look for: the same bytes costing milliseconds more across nodes.

# %%
vol = moe_all_to_all_bytes_per_layer(4096, 7168, 8, 64, capacity_factor=1.0, bytes_per_elem=2)
print(f"{vol.all_to_alls} all-to-alls × {vol.bytes_per_all_to_all / 1e6:.0f} MB per rank")
for name in ("nvlink4", "ib_ndr_400"):
    seconds = vol.all_to_alls * all_to_all_seconds(vol.bytes_per_all_to_all, 63, name)
    print(f"  all over {name}: {seconds * 1e3:.1f} ms per layer")

# %% [markdown]
# **Node-limited routing** (DeepSeek-V3): each token's experts must sit on at most `M` nodes.
# Sending a token once per remote node, then forwarding over NVLink inside it, the inter-node
# copies per token fall from `k·(n−1)/n` (one per expert) to the distinct remote nodes, at most
# `M·(n−1)/n`. Look for: the inter-node dispatch bytes per rank falling with `M`.

# %%
print(f"{'routing':>28} {'copies/token':>13} {'inter-node MB':>14} {'IB ms':>7}")
cases = [("every expert, one copy each", None, False), ("dedup per node, no limit", None, True)]
cases += [(f"dedup, node limit M = {m}", m, True) for m in (4, 2)]
for name, limit, dedup in cases:
    t = inter_node_dispatch_bytes(4096, 7168, 8, 256, 8, limit, dedup)
    ms = all_to_all_seconds(t.bytes_per_rank, 7, "ib_ndr_400") * 1e3
    print(
        f"{name:>28} {t.remote_copies_per_token:>13.2f} {t.bytes_per_rank / 1e6:>14.0f} {ms:>7.2f}"
    )

# %% [markdown]
# The router option behind it, on one rank: with `node_limit=M` the experts a token chooses lie
# on at most `M` nodes. Look for the most nodes any token touches, with and without the limit.

# %%
torch.manual_seed(0)
for limit in (None, 2):
    cfg = MoEConfig(n_experts=16, top_k=4, n_nodes=4, node_limit=limit)
    layer = MoE(CONFIG, cfg)
    with torch.no_grad():
        layer(torch.randn(TOKENS, CONFIG.d_model))
    nodes = torch.stack([(layer.routing.expert_index // 4 == n).any(1) for n in range(4)], 1)
    print(
        f"node_limit={limit}: a token's experts span at most {int(nodes.sum(1).max())} of 4 nodes"
    )

# %% [markdown]
# ## 9. Deduplicated dispatch at the node boundary <a id="dedup-dispatch"></a>
#
# The plain dispatch sends one row per (token, expert on another rank). A token whose experts
# sit on three GPUs of one remote node crosses the inter-node network three times, though the
# three copies are the same vector. DeepSeek-V3's dispatch (its DeepEP kernels) sends it **once
# per remote node**, to the GPU with the same local index there, which forwards it over NVLink
# to every GPU of that node that needs it (`dtlab.parallel.expert.dedup_dispatch`). Each stage
# starts with a count message, so the receiver can size its buffers: the host waits for it.
#
# Four ranks below pretend to be 2 nodes of 2 (`ranks_per_node=2`, as lab 11 does), each
# routing its tokens top-4 of 16 experts with a real router. Each rank runs the plain dispatch
# and the deduplicated one on the same routing. The plain bytes per link class are read from the
# trace (who sent how many bytes to whom, counted from the messages); the deduplicated ones
# from its two stages, also counted. Look for: the inter-node bytes falling, the NVLink bytes
# rising, the rows each rank receives identical, and every count equal to the formula from the
# routed choices (`dtlab.cost.moe.dedup_dispatch_bytes`).


# %%
def node_boundary(node_limit: int | None) -> dict:
    from dtlab import trace
    from dtlab.comm import Communicator
    from dtlab.models.moe_router import route
    from dtlab.parallel.expert import TokenExchange, dedup_dispatch

    rank, experts, d = dtlab.rank(), 16, CONFIG.d_model
    x = torch.randn(TOKENS, d, generator=torch.Generator().manual_seed(rank))
    router = torch.randn(experts, d, generator=torch.Generator().manual_seed(0))
    routing = route(x, router, 4, n_nodes=2, node_limit=node_limit)
    kept = torch.where(routing.keep, routing.expert_index, -1)
    token, expert = torch.nonzero(kept >= 0, as_tuple=True)
    order = torch.argsort(kept[token, expert], stable=True)
    rows = x[token[order]]
    exchange = TokenExchange(Communicator(None, collectives="dtlab", dim="ep"))
    with trace.labels(variant="plain"):
        splits = exchange.exchange_counts(
            torch.bincount(kept[kept >= 0], minlength=experts), d, x.dtype
        )
        plain = exchange.exchange_rows(rows, splits.send, splits.recv, "dispatch").clone()
    with trace.labels(variant="dedup"):
        comm = Communicator(None, collectives="dtlab", dim="ep")
        dedup = dedup_dispatch(x, kept, comm, experts, ranks_per_node=2)
    return {
        "same_rows": torch.equal(plain, dedup.rows),
        "bytes": dedup.bytes_sent,
        "routed": [[e for e in row if e >= 0] for row in kept.tolist()],
    }


nodes = dtlab.Cluster(4)
boundary = {limit: nodes.run(node_boundary, limit) for limit in (None, 1)}
plain_matrix = dtlab.collectives.traffic_matrix(
    boundary[None].trace.filter(variant="plain", kind="comm", name="moe_dispatch").spans, 4
)
want = dedup_dispatch_bytes([r["routed"] for r in boundary[None]], 16, 2, CONFIG.d_model)
print(f"{'rank':>4} {'plain IB':>9} {'dedup IB':>9} {'plain NVL':>10} {'dedup NVL':>10}  same rows")
for rank, r in enumerate(boundary[None]):
    inter = sum(b for dst, b in enumerate(plain_matrix[rank]) if dst // 2 != rank // 2)
    intra = sum(
        b for dst, b in enumerate(plain_matrix[rank]) if dst // 2 == rank // 2 and dst != rank
    )
    w = want[rank]
    assert (inter, intra) == (w.plain_inter, w.plain_intra)
    assert (r["bytes"]["inter_rows"], r["bytes"]["intra_rows"]) == (
        w.dedup_inter_rows,
        w.dedup_intra_rows,
    )
    print(
        f"{rank:>4} {inter:>9,} {r['bytes']['inter_rows']:>9,} {intra:>10,} "
        f"{r['bytes']['intra_rows']:>10,}  {r['same_rows']}"
    )
fig = go.Figure()
for label, values in (
    ("plain, across nodes", [w.plain_inter for w in want]),
    ("dedup, across nodes", [r["bytes"]["inter_rows"] for r in boundary[None]]),
    ("plain, inside the node", [w.plain_intra for w in want]),
    ("dedup, inside the node", [r["bytes"]["intra_rows"] for r in boundary[None]]),
):
    fig.add_bar(x=[f"rank {i}" for i in range(4)], y=[v / 1e3 for v in values], name=label)
dtlab.viz.describe(
    fig,
    title="Dispatch bytes per link class, 2 nodes of 2, top-4 of 16 experts",
    caption="Dedup sends each token once per remote node: fewer inter-node bytes, more NVLink bytes.",
    y="kB sent per rank (counted)",
)
fig

# %% [markdown]
# **Node-limited routing** bounds the same quantity from the router's side. With `node_limit=1`
# every token's experts sit on one node, so a deduplicated token crosses at most once; the plain
# dispatch still sends one copy per expert. The share of the plain dispatch that crosses the node
# boundary is what a hierarchical schedule attacks. What it cannot shrink: the rows each node
# must receive for its own experts, and the fan-out inside the node, which grows (a forwarded row
# moves twice). Look for: the inter-node bytes of both routings, deduplicated, beside the plain
# dispatch's share across nodes.

# %%
for limit, out in boundary.items():
    links = dedup_dispatch_bytes([r["routed"] for r in out], 16, 2, CONFIG.d_model)
    inter = sum(r["bytes"]["inter_rows"] for r in out)
    plain = sum(w.plain_inter for w in links)
    share = sum(w.plain_inter for w in links) / sum(w.plain_inter + w.plain_intra for w in links)
    print(
        f"node_limit={limit}: inter-node dispatch bytes, plain {plain:,} → dedup {inter:,} "
        f"({inter / plain:.0%}); plain share across nodes {share:.0%}"
    )

# %% [markdown]
# The timeline of one deduplicated dispatch, rank by rank: the count message of each stage
# (`moe_dedup_inter_counts`, `moe_dedup_intra_counts`) and the host's wait on it, then the rows
# across nodes, then the fan-out inside the node. Look for: the intra-node stage starting only
# after the inter-node rows have landed — a rail peer forwards what it received.

# %%
dtlab.viz.timeline(
    boundary[None].trace.filter(variant="dedup").cropped(),
    title="Deduplicated dispatch: counts, across nodes, then inside the node",
    highlight=(
        "moe_dedup_inter_counts",
        "moe_dedup_inter",
        "moe_dedup_intra_counts",
        "moe_dedup_intra",
    ),
    caption="Each stage waits on its count message; the NVLink fan-out follows the inter-node rows.",
)

# %%
nodes.close()

# %% [markdown]
# ## 10. Dispatch and combine behind compute <a id="moe-overlap"></a>
#
# Run one micro-batch's MoE block at a time and every all-to-all is exposed: while rows travel,
# the rank has nothing to do. With two micro-batches in flight, each transfer can travel under
# the other's compute — DeepSeek-V3's DualPipe is built on this pairing. A's dispatch travels
# while B's attention runs; B's dispatch under A's experts; A's combine under B's experts
# (`dtlab.parallel.expert.overlap`: the order is written out there). Only the small count
# exchanges stay blocking: a receiver needs them to size its buffers.
#
# Below, both schedules run on the cluster, interleaved round by round, on the same data; the
# exposed time is what each rank spent posting and blocked in `wait`, on its clock. Look for:
# equal outputs, and the exposed time of each schedule. On this CPU, mind what the transfer
# costs: the CPU backend's I/O thread copies every byte on a core, the same cores the compute
# uses (one thread per rank here), so overlap hides less than on GPUs, where copy engines and NICs
# move bytes without the compute units; on a busy 2-core machine it can even cost.

# %%
from dtlab.parallel.expert.overlap import measure_two_microbatch_overlap

overlap = measure_two_microbatch_overlap(
    cluster, tokens=256 if FAST else 4096, dim=32 if FAST else 1024, rounds=2 if FAST else 5
)
fig = go.Figure()
fig.add_bar(
    x=list(overlap.exposed_s),
    y=[v * 1e3 for v in overlap.exposed_s.values()],
    name="exposed all-to-all",
)
fig.add_bar(x=list(overlap.step_s), y=[v * 1e3 for v in overlap.step_s.values()], name="step")
dtlab.viz.describe(
    fig,
    title="One MoE block on two micro-batches: one after the other vs overlapped",
    caption="Exposed: time blocked posting and waiting for the all-to-alls; step: the whole forward.",
    y="ms (median round, slowest rank)",
)
print(
    f"outputs equal: {overlap.equal}; exposed all-to-all {overlap.exposed_s['sequential'] * 1e3:.1f}"
    f" → {overlap.exposed_s['overlapped'] * 1e3:.1f} ms (hidden share {overlap.hidden_share:.0%})"
)
fig

# %% [markdown]
# ## 11. Rows per expert, GEMM efficiency, and EP vs FSDP <a id="tokens-per-expert"></a>
#
# An expert's GEMM reads its whole weight however few rows use it, so its arithmetic intensity
# is about the number of rows (`dtlab.cost.moe_gemm.expert_gemm_intensity`). Below the GPU's
# ridge point (dense BF16 FLOP/s ÷ HBM bytes/s) it runs at memory speed. Expert parallelism
# brings every rank's rows for an expert to one rank: `ep·T·k/E` rows per expert instead of
# `T·k/E` if every rank ran every expert on its own tokens. Look for: DeepSeek-V3-like sizes
# reaching the H100's ridge only with EP, then the same effect measured on this CPU (matmul
# throughput against rows, a few timings each, best kept).

# %%
from dtlab.cost.moe_gemm import (
    ep_vs_fsdp_expert_bytes,
    expert_gemm_intensity,
    ridge_rows,
    rows_per_expert,
)

need = ridge_rows("h100_sxm", 7168, 2048)
print(f"H100 ridge for a 7168 × 2048 expert GEMM (bf16): {need} rows")
for degree in (1, 8, 64):
    rows = rows_per_expert(4096, 8, 256, degree)
    intensity = expert_gemm_intensity(rows, 7168, 2048)
    print(f"EP = {degree:>2}: {rows:>6.0f} rows per expert, {intensity:>6.0f} FLOP/B")
d_cpu, h_cpu = CONFIG.d_model * 8, CONFIG.d_model * 32
weight = torch.randn(d_cpu, h_cpu)
sweep = (8, 64, 512) if FAST else (8, 32, 128, 512, 2048)


def best_seconds(fn, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


throughput = []
for rows in sweep:
    a = torch.randn(rows, d_cpu)
    seconds = best_seconds(lambda a=a: a @ weight)
    throughput.append(2 * rows * d_cpu * h_cpu / seconds / 1e9)
fig = go.Figure(go.Scatter(x=list(sweep), y=throughput, mode="lines+markers"))
fig.update_xaxes(type="log")
dtlab.viz.describe(
    fig,
    title=f"Measured matmul throughput on this {cluster.device_type}, ({d_cpu} → {h_cpu})",
    caption="Thin expert GEMMs waste the machine: throughput climbs with the rows per expert.",
    x="rows per expert GEMM",
    y="GFLOP/s (best of 5)",
)
fig

# %% [markdown]
# Spreading experts over ranks with FSDP instead of EP keeps each rank's tokens home and moves
# the weights: all experts gathered for forward, again for backward, gradients
# reduce-scattered, every step (`ep_vs_fsdp_expert_bytes`). Below, the same 2-rank split of this
# lab's experts both ways: EP's bytes are the ones section 5 counted (real routing, forward and
# backward, with the count messages); FSDP's are counted here from a real all-gather,
# all-gather and reduce-scatter of the experts' float64 weights. Both are printed beside the
# formula (uniform routing for EP). Look for: FSDP moving more at this small batch, and far
# more at DeepSeek-V3's sizes.


# %%
def fsdp_expert_bytes() -> int:
    from dtlab.comm import Communicator

    model = GPT(CONFIG, seed=0, dtype=torch.float64, mlp_factory=moe_mlp_factory(MoEConfig(E, K)))
    flat = torch.cat(
        [p.detach().reshape(-1) for n, p in model.named_parameters() if ".experts." in n]
    )
    comm = Communicator(None, collectives="dtlab", dim="dp")
    n = comm.world_size
    flat = torch.nn.functional.pad(flat, (0, -len(flat) % n))
    shard = flat.chunk(n)[comm.rank].clone()
    comm.all_gather(flat, shard)  # forward: gather every expert
    comm.all_gather(flat, shard)  # backward: gather them again
    comm.reduce_scatter(shard, flat)  # gradients: each rank keeps its shard's sum
    return comm.comm_stats.bytes_sent


fsdp_counted = cluster.run(fsdp_expert_bytes)
tokens_per_rank = 2 * CONFIG.seq_len  # section 5: a batch of 2 sequences per rank
want = ep_vs_fsdp_expert_bytes(
    tokens_per_rank, CONFIG.d_model, CONFIG.d_ff, E, K, N, bytes_per_elem=8
)
layers_n = len(ep[0]["kept"])
print(
    f"this lab, per rank and step ({layers_n} MoE layers): EP counted {ep[0]['sent']:,} B "
    f"(uniform-routing formula {layers_n * want.ep_bytes:,.0f} B); FSDP counted "
    f"{fsdp_counted[0]:,} B (formula {layers_n * want.fsdp_bytes:,.0f} B)"
)
big = ep_vs_fsdp_expert_bytes(4096, 7168, 2048, 256, 8, 64, matrices=3)
print(
    f"DeepSeek-V3-like layer, 64 ranks: EP {big.ep_bytes / 1e9:.1f} GB, FSDP "
    f"{big.fsdp_bytes / 1e9:.1f} GB per rank and step ({big.fsdp_over_ep:.0f}×)"
)

# %% [markdown]
# ## 12. Parallel folding <a id="parallel-folding"></a>
#
# So far EP was carved out of data parallel: an EP group is a block of consecutive *dp* indices
# at the same tp/cp coordinate — ranks `tp·cp` apart. Megatron-Core's **MoE parallel folding**
# (Liu et al. 2025, arXiv 2504.14960) gives the MoE layers their own mapping of the same ranks:
# attention keeps `tp × cp × dp`, the MoE layers use `etp × ep × edp` (expert-TP, EP,
# expert-DP; `etp·ep·edp = tp·cp·dp`), both inside the same pipeline stage. With thin experts
# `etp = 1`: experts stay whole and EP can take the ranks TP uses for attention. The table below
# is rank arithmetic (`FoldedMapping`, no run) for two nodes of 4 ranks, attention `tp = 4`,
# `dp = 2`: each rank's groups, folded (`ep = 4` over the tp ranks) beside carved from dp (`ep`
# at most `dp = 2`). Look for: the folded EP group inside one node, the carved one across both.

# %%
from dtlab.parallel.compose.folding import FoldedMapping, ep_carved_from_dp, ep_group_nodes

RANKS_PER_NODE = 4
folded = FoldedMapping(tp=4, dp=2, ep=4)
carved = ep_carved_from_dp(tp=4, cp=1, dp=2, ep=2)
print("rank node | attention tp     dp     | folded ep        edp    | carved-from-dp ep")
for row in folded.rank_table(RANKS_PER_NODE):
    mine = next(g for g in carved if row["rank"] in g)
    print(
        f"{row['rank']:>4} {row['node']:>4} | {row['tp']!s:<16} {row['dp']!s:<6} | "
        f"{row['ep']!s:<16} {row['edp']!s:<6} | {mine}"
    )
crossing = folded.node_crossings(RANKS_PER_NODE)
print("crosses a node (folded):", {d: "yes" if c else "no" for d, c in crossing.items()})
print(
    "EP group spans, tp=8 dp=16 on 8-rank nodes, ep=8: carved from dp "
    f"{ep_group_nodes(8, 1, 16, 8, 8, folded=False)} nodes, folded "
    f"{ep_group_nodes(8, 1, 16, 8, 8, folded=True)} node"
)

# %% [markdown]
# Why the carved group crosses: dp is the *outer* dimension, so consecutive dp indices are
# `tp·cp` ranks apart, and once `tp·cp` fills a node (TP kept on NVLink) every EP group has one
# rank per node — every dispatch and combine all-to-all goes over the network, and EP can never
# exceed dp. Folded, the all-to-all stays on NVLink and the expert gradients' all-reduce (edp) is
# what crosses, once per step.
#
# **The folded layout, trained.** `compose_gpt` runs it whenever `tp > 1`: attention and dense
# MLPs tensor-parallel as in lab 04, the MoE layers' experts over EP groups of consecutive ranks
# (`expert_parallel=` sets `ep`, which may now exceed `dp`). The residual stream is replicated
# over a TP group, so each TP rank routes only its own `1/tp` slice of the sequence (with
# sequence parallelism, its shard) and the outputs are all-gathered back: every token is routed
# once. The router's gradient is then partial over tp (summed there), an expert's gradient sums
# over `edp` and is divided by the `cp·dp` loss shards. Below, four CPU ranks (whatever this
# machine has) train `Mesh(tp=2, dp=2)` with `ep = 2` (EP = the two TP groups) and `ep = 4`
# (the whole stage, twice what carving from dp allows), beside one process on the same batches;
# pretend a node holds 2 ranks. Look for: the losses equal to one process at every step, the EP
# groups inside a node for `ep = 2`, and the all-to-all bytes counted on each rank.


# %%
def folded_steps(expert_parallel: int, steps: int) -> dict:
    import torch.distributed as dist

    from dtlab.mesh import Mesh
    from dtlab.parallel.compose import compose_gpt

    config = GPTConfig.tiny(seq_len=16, d_model=32, n_heads=4, vocab_size=64, dropout=0.0)
    moe = MoEConfig(n_experts=4, top_k=2, every=2, aux_loss_weight=0.0, backend="loop")
    factory = moe_mlp_factory(moe)  # no balancing loss: one loss for the whole batch
    batches = SyntheticTokens(config, n_batches=steps, batch_size=4, seed=5)
    reference = GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    composed = compose_gpt(
        GPT(config, seed=0, dtype=torch.float64, mlp_factory=factory), Mesh(tp=2, dp=2),
        collectives="dtlab", expert_parallel=expert_parallel,
    )  # fmt: skip
    opt = torch.optim.SGD(composed.parameters(), lr=0.1)
    losses, layer = [], moe_layers(composed.module)[0]
    for x, y in batches:
        ref_opt.zero_grad()
        want = loss_fn(reference(x), y)
        want.backward()
        ref_opt.step()
        opt.zero_grad()
        losses.append((want.item(), composed.train_step(x, y)))
        opt.step()
        if len(losses) == 1:  # the first step's routing and bytes
            kept, sent = layer.stats.kept_per_expert, layer.stats.all_to_all_bytes
    return {
        "rank": dist.get_rank(),
        "losses": losses,
        "groups": {"tp": composed.tp.comm.ranks, "ep": composed.folded.ep.ranks,
                   "edp": composed.folded.edp.ranks},
        "ep_rank": composed.coordinates["ep"],
        "kept": kept,
        "sent": sent,
    }  # fmt: skip


FOLD_STEPS = 3 if FAST else 10
fold_cluster = dtlab.Cluster(4, device="cpu")
runs = {ep: fold_cluster.run(folded_steps, ep, FOLD_STEPS) for ep in (2, 4)}
fold_cluster.close()
print("step | one process | folded ep=2 | folded ep=4 | largest gap")
for step in range(FOLD_STEPS):
    want = runs[2][0]["losses"][step][0]
    got = [runs[ep][0]["losses"][step][1] for ep in (2, 4)]
    print(f"{step:>4} | {want:.9f} | {got[0]:.9f} | {got[1]:.9f} | "
          f"{max(abs(g - want) for g in got):.1e}")  # fmt: skip
NODE = 2  # ranks per node, pretended
for ep, results in runs.items():
    print(
        f"ep = {ep}: rank (node), its groups; step 0's dispatch+combine bytes, counted vs formula"
    )
    for r in results:
        group = sorted((x for x in results if x["groups"]["ep"] == r["groups"]["ep"]),
                       key=lambda x: x["ep_rank"])  # fmt: skip
        want = dispatch_bytes_from_counts([x["kept"] for x in group], r["ep_rank"], 32, 8)
        inside = {d: len({q // NODE for q in g}) == 1 for d, g in r["groups"].items()}
        print(
            f"  {r['rank']} ({r['rank'] // NODE}) | "
            + " ".join(f"{d} {g}{'' if inside[d] else ' crosses'}" for d, g in r["groups"].items())
            + f" | {r['sent']['dispatch']}+{r['sent']['combine']} B "
            f"(formula {want.dispatch}+{want.combine})"
        )

# %% [markdown]
# With `ep = 2` each EP group is a TP group — on one node — and only the edp all-reduce of the
# expert gradients crosses; with `ep = 4` the all-to-all itself spans both nodes. The same rule
# holds at scale: an EP group stays inside a node while `etp·ep ≤` ranks per node. The bytes
# differ per rank because routing is uneven; each equals the formula from the routed counts.
# A balancing loss is composed too: each TP rank routes a share of every sequence, so its
# counts are summed over the `tp × cp` ranks that hold the same sequences, as Megatron-Core
# does; so is DeepSeek-V3's bias step (`composed.step_balancing_biases()` sums the load over
# the same ranks, then dp). Still refused, with what to change: EP with FSDP, capacity (token
# dropping) with `tp > 1`, and the bias step with pipeline stages. Also composed, each equal
# to one process: the folded layout with context parallel and inside pipeline stages, EP
# carved from dp inside pipeline stages and with context parallel, and FSDP and sequence
# parallel with pipeline stages (`tests/test_compose_ep_tp.py`, `test_compose_ep_review.py`,
# `test_compose_ep_folding.py`, `test_compose_fsdp_pp.py`, `test_compose_sp_pp.py`). Two byte
# counts that go with pipeline stages, per rank and step
# (formula, the tests count them from real messages): FSDP over a stage gathers it once per
# step, as torchtitan does, not around every micro-batch; sequence parallel sends the `S/t`
# shard between stages.

# %%
from dtlab.parallel.compose.sequence_pipeline import stage_boundary_bytes
from dtlab.parallel.compose.stage_fsdp import stage_fsdp_bytes

once = stage_fsdp_bytes({0: [2_000_000_000]}, dp=8, element_size=2, n_micro=16)
every = stage_fsdp_bytes({0: [2_000_000_000]}, 8, 2, 16, per_micro_batch=True)
print(
    f"a 2e9-parameter bf16 stage, dp = 8, 16 micro-batches: all-gather "
    f"{once['all_gather'] / 1e9:.1f} GB once per step, {every['all_gather'] / 1e9:.0f} GB if "
    "gathered for every micro-batch's forward and backward"
)
whole, shard = (stage_boundary_bytes(1, 8192, 8192, 2, tp=8, sp=sp) for sp in (False, True))
print(f"one stage boundary, b = 1, S = d = 8192, tp = 8: {whole / 1e6:.0f} MB without SP, "
      f"{shard / 1e6:.0f} MB with SP")  # fmt: skip

# %% [markdown]
# ## 13. Quiz <a id="quiz"></a>
#
# Graded questions from the bank on what this lab showed.

# %%
ask("moe.what_is_ep")

# %%
ask("moe.active_params")

# %%
ask("moe.capacity_formula")

# %%
ask("moe.capacity_factor")

# %%
ask("moe.switch_loss_value")

# %%
ask("moe.count_exchange")

# %%
ask("moe.expert_grad_group")

# %%
ask("moe.node_limited")

# %%
ask("moe.all_to_all_bytes")

# %%
ask("moe.folded_ep_nodes")

# %%
ask("moe.fsdp_pp_gather_bytes")

# %%
cluster.close()
