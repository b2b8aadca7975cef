# %% [markdown]
# # Lab 01 — Collectives from point-to-point messages
#
# Every later lab is a recipe of collectives: DDP all-reduces gradients, ZeRO reduce-scatters them
# and all-gathers parameters, tensor parallelism all-reduces activations, mixture-of-experts
# all-to-alls tokens. In this lab you build those collectives from plain **send** and **receive**,
# count the bytes each one moves, time them against `torch.distributed`'s built-in versions, and
# hold the times to the **alpha-beta model**: a message of `n` bytes costs `α + n·β`.
#
# What you will see:
#
# 1. point-to-point messages, and why a step posts its send and receive *together*;
# 2. each collective as a picture of who sends how many bytes to whom;
# 3. the ring all-reduce's `2(N-1)` steps on the timeline — and you will write it;
# 4. the identity *all-reduce = reduce-scatter + all-gather*, in bytes;
# 5. measured bandwidth against the fitted model; latency-bound vs bandwidth-bound sizes;
# 6. why NCCL is topology-aware: the hierarchical all-reduce on a rail-optimised two-tier model;
# 7. why a BF16 all-reduce is not exact, measured on the ranks;
# 8. past the ring: one-shot and two-shot all-reduce, the switch that adds (NVLS, SHARP), ECMP
#    collisions, collectives over two levels, and a network checklist.

# %%
import itertools
import time

import plotly.graph_objects as go
import torch
import torch.distributed as dist

import dtlab
import dtlab.viz
from dtlab import collectives as C
from dtlab.bench.collectives import run_sweep, summarize
from dtlab.cli.doctor import format_report
from dtlab.cli.doctor_network import network_report
from dtlab.collectives.reduction_precision import measure_reduction_errors, reduction_error_table
from dtlab.collectives.ring_pipeline import pipelined_ring_all_reduce_
from dtlab.config import fast_mode
from dtlab.cost import (
    Link,
    TwoTierCluster,
    bytes_sent_per_rank,
    collective_time,
    crossover_bytes,
    flat_ring_all_reduce_time,
    hierarchical_all_reduce_time,
)
from dtlab.cost.ecmp import ecmp_collisions, expected_idle_share
from dtlab.cost.nccl_protocols import in_network_busbw
from dtlab.cost.two_level import nodes_where_network_limits, two_level_all_gather
from dtlab.quiz import ask, check_exercise
from dtlab.runtime.devices import visible_gpu_count

dtlab.viz.setup_notebook()
FAST = fast_mode()

# %% [markdown]
# ## 1. Four ranks
#
# Four ranks make every picture below non-trivial (a ring of 2 is just a swap). On a laptop
# they are four CPU processes passing messages over loopback TCP; on a GPU box, one process per
# GPU. The code is the same either way; the cell prints which backend carries the messages.

# %%
WORLD_SIZE = 4 if FAST else max(4, visible_gpu_count())
cluster = dtlab.Cluster(WORLD_SIZE)
print(f"{WORLD_SIZE} ranks on {cluster.backend}")

# %% [markdown]
# ## 2. Point-to-point: send and receive
#
# `dist.send(t, dst)` blocks until the message is handed off; `dist.recv(t, src)` blocks until it
# arrives. If two ranks both *send first* and both wait for the other to *receive*, they can
# deadlock (with large messages they do). The cure used by every algorithm in `dtlab.collectives`:
# post the step's send and receive together with the non-blocking `isend`/`irecv` (or
# `batch_isend_irecv`, which NCCL launches as one group), *then* wait for both.
#
# Below, every rank swaps a tensor with its ring neighbours. Look for: rank `r` ends up holding
# `r - 1` (its left neighbour's number).


# %%
def swap_with_neighbours():
    rank, n = dtlab.rank(), dtlab.world_size()
    mine = torch.full((4,), float(rank))
    theirs = torch.empty(4)
    send = dist.isend(mine, dst=(rank + 1) % n)
    recv = dist.irecv(theirs, src=(rank - 1) % n)
    send.wait()
    recv.wait()
    return theirs[0].item()


cluster.run(swap_with_neighbours)

# %% [markdown]
# ## 3. Who sends what: each collective as a traffic matrix
#
# Every collective in `dtlab.collectives` is built only from such steps, and each step is recorded
# as a trace span labelled with the bytes it sent to each peer. `C.traffic_matrix` turns a run's
# trace into `matrix[src][dst]` = bytes. Look for the shape of each algorithm:
#
# - **flat broadcast**: one row full (the root sends to everyone);
# - **binomial broadcast**: rank 0 sends `log₂N` times, rank 1 once — a tree;
# - **ring all-reduce**: the diagonal above the main one — each rank talks to its right
#   neighbour — plus the bottom-left corner: rank N-1 sends to rank 0, closing the ring;
# - **recursive doubling**: partners at distance 1, then 2 — a butterfly;
# - **pairwise all-to-all**: everyone to everyone, nothing to itself.

# %%
PICTURES = [
    ("broadcast", "flat"),
    ("broadcast", "binomial"),
    ("all_reduce", "ring"),
    ("all_reduce", "recursive_doubling"),
    ("all_to_all", "pairwise"),
]


def run_each_collective_once():
    for op, algorithm in PICTURES:
        C.ALGORITHMS[op][algorithm](torch.ones(1024))  # 4 KiB per rank


res = cluster.run(run_each_collective_once)
for op, algorithm in PICTURES:
    window = [s for s in res.trace.spans if s.name.startswith(f"{op}.{algorithm}")]
    matrix = C.traffic_matrix(window, WORLD_SIZE)
    print(f"{op} / {algorithm}: KiB sent, row = sender, column = receiver")
    for src, row in enumerate(matrix):
        print(f"  rank {src}: " + " ".join(f"{b / 1024:5.1f}" for b in row))

# %% [markdown]
# ## 4. The ring all-reduce, step by step <a id="ring"></a>
#
# The buffer of `M` bytes is cut into `N` chunks. **Reduce-scatter**: in `N-1` steps each rank
# sends one chunk to its right neighbour and adds the chunk arriving from its left; afterwards
# rank `r` owns the full sum of chunk `r`. **All-gather**: `N-1` more steps pass the finished
# chunks around. Each rank sends `2(N-1)/N·M` bytes — about `2M` whatever `N` — in `2(N-1)` steps.
#
# Look for `2(N-1)` orange spans per rank on the timeline, all the same width: every link is busy
# every step (that is what "bandwidth-optimal" means).


# %%
def ring_all_reduce_traced():
    x = torch.ones(1 << 18)  # 1 MiB of fp32
    C.all_reduce(x, algorithm="ring")
    return x[0].item()


res = cluster.run(ring_all_reduce_traced)
dtlab.viz.timeline(res.trace, title=f"Ring all-reduce of 1 MiB on {WORLD_SIZE} ranks")

# %% [markdown]
# ### Exercise: ring all-reduce <a id="exercise-ring-all-reduce"></a>
#
# Write `ring_all_reduce(tensor)`: sum `tensor` over all ranks, **in place**, using only
# `dist.isend`/`dist.irecv` (or `dist.batch_isend_irecv`). It must work for any world size and any
# length — `torch.tensor_split(flat, n)` cuts a buffer into `n` chunks even when `n` does not divide
# it. The grader runs it on this lab's cluster (4 ranks on a laptop) with lengths 1, 7, 12 and
# 1001. While it runs, every built-in collective (`dist.all_reduce`, but also `dist.reduce`,
# `dist.broadcast`, `dist.all_gather`, …) and `dtlab.collectives` are switched off, and it counts
# the bytes your messages carry: each rank must send `2(N-1)/N·M`, to its ring neighbours only.
# Everything through rank 0 gives the right sum with the wrong traffic, and fails.


# %%
def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` across every rank in place with a ring reduce-scatter + all-gather."""
    # BEGIN SOLUTION
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    chunks = list(torch.tensor_split(flat, n))
    right, left = (rank + 1) % n, (rank - 1) % n

    def step(send_chunk, recv_chunk):
        ops = [dist.P2POp(dist.isend, send_chunk, right), dist.P2POp(dist.irecv, recv_chunk, left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    for s in range(n - 1):  # reduce-scatter: afterwards chunk `rank` is complete here
        incoming = torch.empty_like(chunks[(rank - 2 - s) % n])
        step(chunks[(rank - 1 - s) % n], incoming)
        chunks[(rank - 2 - s) % n].add_(incoming)
    for s in range(n - 1):  # all-gather: pass the finished chunks around
        step(chunks[(rank - s) % n], chunks[(rank - s - 1) % n])
    return tensor
    # END SOLUTION


# %%
check_exercise("collectives.ring_all_reduce", ring_all_reduce, cluster)

# %% [markdown]
# ### Exercise: ring all-gather
#
# Write `ring_all_gather(chunk)`: every rank passes in one chunk (all the same length); return
# all `N` chunks concatenated in rank order. In step `s`, forward chunk `r - s` to the right and
# receive chunk `r - s - 1` from the left. Graded the same way: messages only, and each rank
# sends `(N-1)/N·M` bytes (`M` the gathered buffer), to its neighbours only.


# %%
def ring_all_gather(chunk: torch.Tensor) -> torch.Tensor:
    """Every rank's ``chunk``, concatenated in rank order, by a ring of ``N - 1`` steps."""
    # BEGIN SOLUTION
    rank, n = dist.get_rank(), dist.get_world_size()
    out = chunk.new_empty((n, chunk.numel()))
    out[rank] = chunk.view(-1)
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):
        outgoing = dist.P2POp(dist.isend, out[(rank - s) % n], right)
        incoming = dist.P2POp(dist.irecv, out[(rank - s - 1) % n], left)
        for work in dist.batch_isend_irecv([outgoing, incoming]):
            work.wait()
    return out.view(-1)
    # END SOLUTION


# %%
check_exercise("collectives.ring_all_gather", ring_all_gather, cluster)

# %% [markdown]
# ## 5. All-reduce = reduce-scatter + all-gather, in bytes <a id="identity"></a>
#
# `C.counting()` measures the messages and bytes a block sends on each rank. The ring all-reduce
# sends exactly what a reduce-scatter followed by an all-gather sends: `(N-1)/N·M` each. ZeRO and
# FSDP (lab 03) use the two halves separately. Look for three equal columns.

# %%
M = 1 << 20  # bytes: 256 Ki fp32 elements


def identity_in_bytes():
    x = torch.ones(M // 4)
    with C.counting() as all_reduce:
        C.all_reduce(x.clone(), algorithm="ring")
    with C.counting() as reduce_scatter:
        shard = C.reduce_scatter(x)
    with C.counting() as all_gather:
        C.all_gather(shard)
    return all_reduce.bytes_sent, reduce_scatter.bytes_sent, all_gather.bytes_sent


formula = bytes_sent_per_rank("all_reduce", "ring", M, WORLD_SIZE)[0]
for rank, (ar, rs, ag) in enumerate(cluster.run(identity_in_bytes)):
    print(
        f"rank {rank}: all-reduce {ar:>8} B = reduce-scatter {rs:>7} + all-gather {ag:>7}"
        f" = {rs + ag:>8};  formula 2(N-1)/N·M = {formula:.0f}"
    )

# %% [markdown]
# ## 6. Measured bandwidth against the model <a id="bandwidth"></a>
#
# The benchmark (`dtlab bench collectives` in a terminal) times every all-reduce algorithm and the
# built-in `dist.all_reduce` side by side, interleaved, and reports nccl-tests' two numbers:
# **algbw** = size / time and **busbw** = algbw · 2(N-1)/N — the rate at which each rank's link
# would carry a *ring* all-reduce's bytes (2(N-1)/N·M per rank), so runs on any N compare with each
# other and with the link's speed. busbw is a normalisation, not a wire measurement: when the switch
# adds (NVLS, SHARP), each GPU puts only (1 + 1/N)·M on its link, and busbw over-states that by
# 2(N-1)/(N+1), 1.56× at N = 8 (`dtlab.cost.nccl_protocols.in_network_busbw`). It then fits one
# `α` and one `β` to all our algorithms at once. Dashed lines are the model's prediction from that
# single fit.
#
# Look for: every curve climbs on the left (latency-bound) and flattens on the right
# (bandwidth-bound); our ring tracks the built-in collective at large sizes.
# (On a shared CPU the numbers are noisy; run it twice.)

# %%
SIZES = [1024 * 4**k for k in range(7)] if FAST else [1024 * 2**k for k in range(17)]
records = run_sweep(cluster, op="all_reduce", sizes=SIZES, iters=3 if FAST else 10, warmup=1)
summary = summarize(records)
fit = summary[WORLD_SIZE]
print(
    f"fitted α = {fit['fitted_alpha_us']:.0f} µs, bandwidth = {fit['fitted_bandwidth_gbps']:.2f} GB/s"
)
dtlab.viz.bandwidth_curve(records, summary)

# %% [markdown]
# ### Why production rings stream segments <a id="segments"></a>
#
# Section 4 drew the textbook ring: every step waits for a whole chunk to land and be added
# before anything moves on, so the link idles while the rank adds and the adder idles while the
# link moves. Production libraries (NCCL on GPUs, torch's CPU backend too) cut each chunk into
# **segments** and forward a segment the moment it has been added in, with several receives
# posted ahead. The bytes are the same; the steps overlap. `C.all_reduce(algorithm="ring")` does
# this with 4 MiB segments — that is how it keeps up with the built-in all-reduce above. Below, a
# 4 MiB buffer is forced into 8 segments per chunk.
#
# Look for: identical bytes, 8× the messages, and steps that overlap (step `t+1` starts before
# step `t` has ended: its first segment is on its way while the last ones of step `t` land).
# With one segment per chunk no step starts before the previous one ends. At this small size
# 8× the messages can cost more latency than the overlap saves; streaming pays off at the
# benchmark's 16–64 MiB, where the β-term dominates.


# %%
def ring_in_segments(segment_bytes: int):
    x = torch.ones(1 << 20)  # 4 MiB of fp32: chunks of 1 MiB on 4 ranks
    with C.counting() as moved:
        pipelined_ring_all_reduce_(x, "sum", C.peers_of(), segment_bytes=segment_bytes)
    return moved.bytes_sent, moved.messages_sent


def steps_of_rank_0(trace):
    return [s for s in trace.spans if s.rank == 0 and s.kind == "comm"]


chunk_bytes = (4 << 20) // WORLD_SIZE
for label, segment_bytes in (
    ("one segment per chunk", 4 << 20),
    ("8 segments per chunk", chunk_bytes // 8),
):
    streamed = cluster.run(ring_in_segments, segment_bytes)
    sent, messages = streamed[0]
    steps = steps_of_rank_0(streamed.trace)
    overlapping = sum(b.start_ns < a.end_ns for a, b in itertools.pairwise(steps))
    print(
        f"{label:>22}: {sent:>8} B sent in {messages:>3} messages per rank; "
        f"{overlapping} of {len(steps) - 1} steps started before the previous one ended"
    )
for s in steps:  # same-colour bars merge on the chart; the numbers show the overlap
    start, end = ((t - streamed.trace.origin_ns) / 1e6 for t in (s.start_ns, s.end_ns))
    print(
        f"rank 0, step {s.labels['comm_step']} ({s.name.split()[-1]:>14}): {start:6.2f} → {end:6.2f} ms"
    )
dtlab.viz.timeline(streamed.trace, title="Ring all-reduce, 8 segments per chunk: steps overlap")

# %% [markdown]
# ## 7. Latency-bound vs bandwidth-bound <a id="regimes"></a>
#
# Time = (messages in sequence)·α + (bytes through the busiest link)·β. The ring pays `2(N-1)`
# latencies, recursive doubling `log₂N`, a binary tree about `2·log₂N`; for bytes it is the other
# way round. So below some size the tree/recursive doubling wins and above it the ring does.
# Look for the measured crossover next to the one the fitted model predicts (expect the same
# order of magnitude, not the same number: the CPU's scheduler adds noise the model does not have).

# %%
for algorithm, sizes in fit["crossover"].items():
    measured, predicted = sizes["measured_bytes"], sizes["predicted_bytes"]
    show = lambda b: "never" if b is None else f"{b / 1024:,.0f} KiB"  # noqa: E731
    print(
        f"{algorithm:>18} beats ring below: measured {show(measured)}, predicted {show(predicted)}"
    )

# %% [markdown]
# ### Exercise: price a ring all-reduce
#
# Write the ring all-reduce's time in the alpha-beta model for `nbytes` per rank over `n` ranks on a
# link with latency `alpha_s` and `bandwidth_bytes_per_s` per direction.


# %%
def ring_all_reduce_time(
    nbytes: float, n: int, alpha_s: float, bandwidth_bytes_per_s: float
) -> float:
    """Seconds for a ring all-reduce: 2(N-1) messages of M/N bytes each, in sequence."""
    # BEGIN SOLUTION
    steps = 2 * (n - 1)
    return steps * alpha_s + steps * (nbytes / n) / bandwidth_bytes_per_s
    # END SOLUTION


# %%
check_exercise("collectives.ring_time", ring_all_reduce_time, cluster)

# %% [markdown]
# ### The same ring over another transport <a id="transport"></a>
#
# The α–β model has no term for *how* a message travels, yet on one machine that is most of β.
# Our ring above posts its segments through the backend's sockets: each segment is copied into
# the kernel by the sender and out of it by the receiver, and the sum is a third pass. NCCL never
# uses sockets between GPUs of one node: it uses NVLink/P2P, or a shared-memory buffer
# (its SHM transport). `C.all_reduce(t, transport="shm")` is that idea on CPU ranks of one host:
# the **same ring** — the same steps, segments and counted bytes, the same order of sums, so the
# same result bit for bit — through a shared-memory buffer per ring neighbour, with a one-byte
# doorbell that a waiting rank sleeps on. The reduce step reads the neighbour's segment where it
# lies and writes the partial sum straight into the next rank's slot: one pass over memory.
#
# Look for: the bytes each rank counted are the same for both transports (the algorithm did not
# change), and the shared-memory ring's bus bandwidth several times the socket ring's and the
# backend's own all-reduce (README's table: 2.3–3.8× at 16–64 MiB on this kind of machine). On a
# GPU cluster the cell says it does not apply: device memory takes NVLink, not this.

# %%
TRANSPORT_BYTES = (16 if FAST else 64) << 20


def time_transports(nbytes: int, repeats: int) -> dict:
    if dtlab.device().type != "cpu":
        return {}
    x = torch.ones(nbytes // 4)
    runs = {
        "sockets (our ring)": lambda: C.all_reduce(x.clone(), algorithm="ring"),
        "shared memory (our ring)": lambda: C.all_reduce(x.clone(), transport="shm"),
        "the backend's all_reduce": lambda: dist.all_reduce(x.clone()),
    }
    out = {}
    for name, run in runs.items():
        run()  # warm-up: connections and buffers made once
        times, sent = [], []
        for _ in range(repeats):
            dist.barrier()
            with C.counting() as stats:
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            sent.append(stats.bytes_sent)
        out[name] = (sorted(times)[len(times) // 2], sent[0])
    return out


transports = cluster.run(time_transports, TRANSPORT_BYTES, 3 if FAST else 9)[0]
if not transports:
    print("device tensors: the shared-memory transport is for CPU ranks of one host")
for name, (seconds, sent) in transports.items():
    busbw = 2 * (WORLD_SIZE - 1) / WORLD_SIZE * TRANSPORT_BYTES / seconds / 1e9
    counted = f"{sent:,} B counted" if sent else "not counted (the backend's own)"
    print(f"{name:>26}: {seconds * 1e3:7.1f} ms, busbw {busbw:5.2f} GB/s (measured), {counted}")
print(f"ring formula: 2(N-1)/N·M = {2 * (WORLD_SIZE - 1) * TRANSPORT_BYTES // WORLD_SIZE:,} B")

# %% [markdown]
# ## 8. Why NCCL is topology-aware <a id="topology"></a>
#
# A GPU cluster has two tiers. Inside a node, NVSwitch joins every GPU to every other (H100:
# 450 GB/s per direction per GPU). Between nodes, the topology assumed here and in `dtlab.cost` is
# today's training node: **one 400 Gb/s NIC per GPU** (50 GB/s per direction each, 400 GB/s per
# node), wired **rail-optimised** — NIC `j` of every node plugs into leaf switch `j`, so GPUs with
# the same local rank reach each other in one switch hop. (Older boxes and many cloud VMs have one
# NIC per node; pass `nics_per_node=1` to model them.)
#
# The **hierarchical all-reduce** reduce-scatters inside each node, all-reduces only `1/g` of the
# buffer across nodes (`g` GPUs per node, every local rank on its own rail), then all-gathers
# inside the node. Here four ranks play two "nodes" of two. Look for: the same result as a flat
# all-reduce, and each rank sending `2(g-1)/g·M + 2(k-1)/k·M/g` bytes (`g` = 2 ranks per node,
# `k` = 2 nodes): 32 + 16 = 48 bytes for the 32-byte buffer, of which only 16 cross "nodes".


# %%
def hierarchical_vs_flat():
    x = torch.arange(8.0) + dtlab.rank()
    flat = C.all_reduce(x.clone())
    with C.counting() as moved:
        C.hierarchical_all_reduce(x, ranks_per_node=2)
    return torch.equal(x, flat), moved.bytes_sent


print(cluster.run(hierarchical_vs_flat))

# %% [markdown]
# Is the hierarchical schedule faster at full scale? It depends on the NICs, which is why the
# topology must be stated. A flat ring over all `N` GPUs sends `2(N-1)/N·M` per GPU, but only the
# GPU whose ring neighbour is in the next node uses the network: NCCL runs one ring per NIC, each
# carrying `M/8`, so every NIC carries about `2M/8` — the same as the hierarchical schedule's
# `2(k-1)/k·M/8`. On rails the flat ring's NVLink and network traffic overlap, so for large
# buffers it is as fast or faster; the hierarchical schedule wins on **latency** (`2(k-1)` network
# steps instead of `2(N-1)`), for small messages and many nodes. With one NIC per node, all eight
# GPUs squeeze through one 50 GB/s port in either schedule. Look for: hierarchical faster at
# 16 KiB everywhere and slower at 1 GiB on rails; with one NIC per node the flat ring ~8× slower
# at 1 GiB, and the hierarchical schedule ahead only for a few nodes (`2(k-1)/k` is 1 at `k = 2`).

# %%
for nics in (8, 1):
    for nodes in (2, 4, 16):
        topo = TwoTierCluster(nodes=nodes, gpus_per_node=8, nics_per_node=nics)
        row = []
        for nbytes, unit, scale in ((16 * 1024, "µs", 1e6), (1 << 30, "ms", 1e3)):
            flat = flat_ring_all_reduce_time(nbytes, topo) * scale
            hier = hierarchical_all_reduce_time(nbytes, topo) * scale
            row.append(f"{flat:7.1f} vs {hier:6.1f} {unit}")
        print(
            f"{nics} NIC(s)/node, {nodes:>2} nodes: flat vs hierarchical  16 KiB: {row[0]}   1 GiB: {row[1]}"
        )

# %% [markdown]
# NCCL does this kind of routing itself: at start-up it detects NVLink/NVSwitch, PCIe and NIC
# placement and builds rings and trees that stay on the fast links (and picks ring or tree by
# message size — section 7). Three environment variables let you look inside when a job is slow:
#
# - `NCCL_DEBUG=INFO` logs the topology, the transports (P2P/NVLink, shared memory, IB, sockets)
#   and the rings/trees chosen. It only observes.
# - `NCCL_IB_DISABLE=1` turns InfiniBand/RoCE off: inter-node traffic falls back to TCP sockets.
#   A diagnosis switch (is the fabric the problem?), never a speed-up.
# - `NCCL_P2P_DISABLE=1` turns off direct GPU-to-GPU copies (NVLink or PCIe peer-to-peer); intra-node
#   traffic is staged through host memory instead.
#
# An **NCCL timeout** ("Watchdog caught collective operation timeout … ran for 600000 ms") almost
# always means that some rank never joined that collective: it crashed, hung (data loader,
# deadlock, failing GPU or host), or took another code path and called a different collective.
# A slow network makes steps slower; it does not make one take ten minutes. Find the rank whose
# last collective differs. The dtlab Cluster does exactly that when a run hangs.
#
# One kind of desynchronisation need not hang at all: ranks that reach the *same* collective
# with *different* sizes. Before it moves any data, every collective in `dtlab.collectives`
# checks its call against every rank's: one tiny all-reduce of a 62-bit digest of the call
# (lengths, dtype, op, algorithm), and only when the digests differ an all-gather of the full
# descriptors, which names every rank's value. Both are control messages (drawn as their own
# spans, not counted in the bytes above); the agreed case costs ~0.2–1 ms on these CPU ranks,
# 1–3 % of a 16 MiB ring (`dtlab bench collectives` prints it). Below, rank `r` all-reduces
# `1000 + r` elements. Look for: an error, not a ten-minute wait, naming each rank's length.


# %%
def lengths_that_disagree():
    x = torch.ones(1000 + dtlab.rank())
    try:
        C.all_reduce(x)
    except C.CollectiveMismatch as error:
        return str(error)
    return "no error"


print(cluster.run(lengths_that_disagree)[0])

# %% [markdown]
# The single-link model at full scale, from the cost module: 32 ranks that each reach the next
# over one 50 GB/s NIC (one tier only — the two-tier picture is above). Compare 16 KiB and 1 GiB:
# the latency-optimal schedules win the first, the ring the second.

# %%
ib = Link(alpha_s=5e-6, bandwidth_bytes_per_s=50e9, name="IB NDR")
for algorithm in ("ring", "recursive_doubling", "rabenseifner", "binary_tree"):
    small = collective_time("all_reduce", algorithm, 16 * 1024, 32, ib) * 1e6
    large = collective_time("all_reduce", algorithm, 1 << 30, 32, ib) * 1e3
    print(f"{algorithm:>18}: 16 KiB {small:7.1f} µs   1 GiB {large:7.1f} ms")

# %% [markdown]
# ## 9. Summing in BF16 is not exact <a id="reduction-precision"></a>
#
# Halving the bytes of a gradient all-reduce by sending BF16 is tempting, and it is often sold as
# free. It is not exact: a collective *adds in the dtype of its buffer*. In the ring, chunk `c`
# starts at rank `c+1` and picks up one rank's gradient per hop, and each partial sum is stored
# back in BF16 (8 bits of mantissa) before it moves on — `N-1` roundings in a row, so the error
# grows with the number of ranks. A tree adds in pairs, `log₂ N` roundings deep. Accumulating in
# FP32 and rounding once at the end leaves only that one rounding (the "floor" below).
#
# First, on the four ranks: each holds a BF16 gradient-like tensor; we all-reduce it by ring and by
# recursive doubling (a tree order) in BF16, and by ring in FP32, and compare each with the FP64
# sum. The one-process replay of the ring's order gives the same bits (checked on every rank), so
# the second table can replay the order for hundreds of ranks. Look for: FP32 accumulation at the
# floor at every size; BF16 tree a little above it and flat; BF16 ring growing with the ranks,
# and — in a full run, which adds 1,024 ranks — falling apart: the running sum grows so large
# that a rank's contribution is smaller than half a BF16 step and is rounded away (*swamping*).

# %%
measured = cluster.run(measure_reduction_errors, 4096)
row = measured[0]
print(
    f"{WORLD_SIZE} ranks, measured: ring BF16 {row['ring_bf16']:.2e}, tree BF16 {row.get('tree_bf16', float('nan')):.2e}, "
    f"ring FP32 {row['ring_fp32']:.2e}, floor {row['rounding_floor']:.2e}; replay identical on "
    f"every rank: {all(r['ring_matches_simulation'] == 1.0 for r in measured)}"
)
ranks = [2, 4, 8, 16, 64, 256] if FAST else [2, 4, 8, 16, 64, 256, 1024]
table = reduction_error_table(ranks, numel=2048)
print(f"{'ranks':>6} {'ring BF16':>10} {'tree BF16':>10} {'ring FP32':>10} {'floor':>10}")
for r in table:
    print(
        f"{r['ranks']:>6} {r['ring_bf16']:>10.2e} {r['tree_bf16']:>10.2e} "
        f"{r['ring_fp32']:>10.2e} {r['rounding_floor']:>10.2e}"
    )

# %% [markdown]
# The same table as a figure. What to see: the BF16 ring's line climbing away from the others as
# ranks grow, the BF16 tree staying close to the floor, and FP32 accumulation on the floor.

# %%
fig = go.Figure()
for key, label in (
    ("ring_bf16", "ring, BF16 adds"),
    ("tree_bf16", "tree (recursive doubling), BF16 adds"),
    ("ring_fp32", "ring, FP32 adds, one final rounding"),
    ("rounding_floor", "exact sum rounded to BF16 (floor)"),
):
    fig.add_scatter(
        x=[r["ranks"] for r in table], y=[r[key] for r in table], name=label, mode="lines+markers"
    )
fig.update_layout(
    template=dtlab.viz.DTLAB_TEMPLATE,
    title="Relative error of a gradient all-reduce against the FP64 sum",
    xaxis={"title": {"text": "ranks in the all-reduce (log scale)"}, "type": "log"},
    yaxis={
        "title": {"text": "relative error (log scale)"},
        "type": "log",
    },
    height=460,
)
dtlab.viz.describe(
    fig,
    caption="The BF16 ring climbs as ranks grow; the tree and FP32 accumulation stay near the floor.",
)


# %% [markdown]
# What production frameworks let you choose: FSDP's `MixedPrecision(reduce_dtype=torch.float32)`
# (FSDP2: `MixedPrecisionPolicy(reduce_dtype=...)`), Megatron-LM's
# `--accumulate-allreduce-grads-in-fp32`, DeepSpeed's `communication_data_type`. Reducing in FP32
# costs twice the bytes of BF16; reducing in BF16 is a deliberate trade (DDP's
# `bf16_compress_hook`) whose error grows with the data-parallel degree — state it, do not call
# it exact.

# %%
ask("data_parallel.bf16_reduction_not_exact")

# %% [markdown]
# ## 10. Beyond the ring: peer memory, the switch, and the fabric <a id="fabric"></a>
#
# The ring is bandwidth-optimal but pays `2(N-1)` latencies. Inside an NVSwitch node every GPU
# can read every other GPU's memory directly ("symmetric memory"), and two shorter schedules
# appear. **One-shot**: every rank takes every peer's whole buffer and adds all `N` itself —
# one step, `(N-1)·M` bytes per rank. **Two-shot**: rank `j` takes chunk `j` of every buffer and
# adds them (a direct reduce-scatter), then hands its summed chunk to every peer — two steps,
# the ring's `2(N-1)/N·M` bytes. PyTorch's symmetric-memory ops (`one_shot_all_reduce`,
# `two_shot_all_reduce_`) and inference engines' custom all-reduces (vLLM, TensorRT-LLM, SGLang)
# use them for the small tensor-parallel all-reduces of decoding, and call NCCL above a size
# cap. Below they run on the ranks, built from the same counted point-to-point messages.
#
# Look for: the same result as the ring; one-shot's bytes `N/2` times the ring's in `N-1`
# messages, two-shot's equal to the ring's in `2(N-1)` messages.


# %%
def one_shot_two_shot_and_ring():
    x = (torch.arange(1200.0) % 7) * (dtlab.rank() + 1)
    row = {}
    for label, run in (
        ("ring", lambda t: C.all_reduce(t, algorithm="ring")),
        ("one_shot", lambda t: C.peer_all_reduce(t, algorithm="one_shot")),
        ("two_shot", lambda t: C.peer_all_reduce(t, algorithm="two_shot")),
    ):
        with C.counting() as moved:
            result = run(x.clone())
        row[label] = (result, moved.bytes_sent, moved.messages_sent)
    return row


shots = cluster.run(one_shot_two_shot_and_ring)[0]
for label, (result, sent, messages) in shots.items():
    formula = bytes_sent_per_rank("all_reduce", label, 1200 * 4, WORLD_SIZE)[0]
    print(
        f"{label:>9}: same as ring {torch.equal(result, shots['ring'][0])}; "
        f"{sent:>6} B in {messages} messages (formula {formula:.0f} B)"
    )

# %% [markdown]
# ### Exercise: two-shot all-reduce <a id="exercise-two-shot"></a>
#
# Write `two_shot_all_reduce(tensor)`: sum `tensor` over all ranks, in place, in **two** steps of
# point-to-point messages. Step 1: send chunk `j` (`torch.tensor_split(flat, n)[j]`) to rank `j`,
# receive every peer's copy of your own chunk, and add them. Step 2: send your summed chunk to
# every peer and receive theirs into place. The grader counts your bytes peer by peer: rank `r`
# must send peer `p` exactly chunk `p` plus its own summed chunk — a ring (neighbours only) or a
# one-shot (the whole buffer to everyone) gets the sum right and fails.


# %%
def two_shot_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over every rank in place: a direct reduce-scatter, then a direct all-gather."""
    # BEGIN SOLUTION
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    peers = [p for p in range(n) if p != rank]

    def exchange(sends, recvs):
        ops = [dist.P2POp(dist.isend, t, p) for p, t in sends]
        ops += [dist.P2POp(dist.irecv, t, p) for p, t in recvs]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    if chunks[rank].numel():
        inbox = {p: torch.empty_like(chunks[rank]) for p in peers}
        exchange([(p, chunks[p]) for p in peers if chunks[p].numel()], list(inbox.items()))
        for p in peers:
            chunks[rank].add_(inbox[p])
    else:
        exchange([(p, chunks[p]) for p in peers if chunks[p].numel()], [])
    exchange(
        [(p, chunks[rank]) for p in peers if chunks[rank].numel()],
        [(p, chunks[p]) for p in peers if chunks[p].numel()],
    )
    return tensor
    # END SOLUTION


# %%
check_exercise("collectives.two_shot_all_reduce", two_shot_all_reduce, cluster)

# %% [markdown]
# Which one when? Price them with `α + (N-1)·M·β` (one-shot), `2α + 2(N-1)/N·M·β` (two-shot)
# and the ring's `2(N-1)(α + M/N·β)` on an NVLink 4 link (`α` = 2 µs, 450 GB/s) for 8 GPUs.
# Look for: one-shot fastest for the smallest buffers (one latency), two-shot in the middle, and
# the ring's extra latencies mattering less and less as the β-term takes over. The model never
# lets two-shot lose to the ring (same bytes, fewer steps); in practice reading seven peers at
# once takes SMs from compute and needs a copy into a registered buffer, which is why engines
# cap it.

# %%
nvlink = Link(alpha_s=2e-6, bandwidth_bytes_per_s=450e9, name="NVLink 4")
shot_sizes = [2**k for k in range(10, 31)]
shot_figure = go.Figure()
for label in ("one_shot", "two_shot", "ring"):
    times = [collective_time("all_reduce", label, m, 8, nvlink) * 1e6 for m in shot_sizes]
    shot_figure.add_scatter(x=shot_sizes, y=times, name=label, mode="lines")
one_vs_ring = crossover_bytes("all_reduce", "one_shot", "ring", 8, nvlink)
one_vs_two = crossover_bytes("all_reduce", "one_shot", "two_shot", 8, nvlink)
shot_figure.update_layout(
    title=f"8 GPUs on NVLink 4: one-shot wins below {one_vs_two / 1e3:.0f} KB "
    f"(beats the ring below {one_vs_ring / 1e6:.1f} MB)",
    xaxis={"type": "log", "title": "all-reduce size (bytes)"},
    yaxis={"type": "log", "title": "α-β time (µs)"},
)
dtlab.viz.describe(
    shot_figure,
    caption="One-shot pays one latency and (N−1)·M bytes: cheapest for small messages; the ring "
    "pays 2(N−1) latencies and wins once bytes dominate; two-shot sits between them.",
)

# %% [markdown]
# **In-network reduction.** With NVLS (NVLink SHARP) or SHARP in InfiniBand switches, the
# *switch* adds. Each GPU sends its buffer once to be summed and gets its `1/N` slice of the
# sum back, then writes that slice once and the switch multicasts it to all: `(1 + 1/N)·M`
# each way per GPU, in two steps. Below, rank 3 plays the switch for three "GPUs"
# (`C.switch_all_reduce`). Look for: the counted bytes equal to `(1 + 1/3)·M` — at `N = 3`
# exactly the ring's `2(N-1)/N·M`; the saving starts at `N = 4` and tends to half. nccl-tests
# still prints busbw with the ring's factor, so it over-states what the wire carries by
# `2(N-1)/(N+1)` (1.56× at 8 GPUs); the last line reads an illustrative figure (not a run of
# ours): 1 GB in 3.6 ms on 8 H100s.


# %%
def through_the_switch():
    x = torch.ones(1200) * (dtlab.rank() + 1)
    with C.counting() as moved:
        C.switch_all_reduce(x, switch=WORLD_SIZE - 1)
    return x[0].item(), moved.bytes_sent, moved.bytes_received


gpus = WORLD_SIZE - 1
for rank, (value, sent, received) in enumerate(cluster.run(through_the_switch)[:gpus]):
    print(
        f"GPU {rank}: sum {value:.0f}; sent {sent} B, received {received} B; "
        f"(1 + 1/N)·M = {(1 + 1 / gpus) * 4800:.0f} B; ring 2(N-1)/N·M = "
        f"{2 * (gpus - 1) / gpus * 4800:.0f} B"
    )
for n in (4, 8, 72):
    print(
        f"N = {n:>2}: busbw over-states the NVLS wire by 2(N-1)/(N+1) = {2 * (n - 1) / (n + 1):.2f}×"
    )
nvls = in_network_busbw(1e9, 3.6e-3, 8)
print(
    f"1 GB in 3.6 ms on 8 GPUs: algbw {nvls['algbw'] / 1e9:.0f}, busbw {nvls['busbw'] / 1e9:.0f}, "
    f"on each GPU's wire {nvls['sent_per_gpu'] / 1e9:.0f} GB/s (NVLink 4 carries 450)"
)

# %% [markdown]
# **ECMP and flow collisions.** Between leaf and spine a switch spreads flows over its equal
# uplinks by hashing each flow's header (ECMP). A collective has a few elephant flows — one per
# queue pair, each as fast as a NIC — and eight flows hashed onto eight uplinks collide like balls
# in bins: on average `(7/8)^8 ≈ 34 %` of the links idle while the busiest carries ~2.6 flows,
# and the step waits for the flows sharing it. The simulation below places 8 flows 2000 times.
# Look for: the fixes — more queue pairs per connection (each flow split into 4 hashed parts),
# adaptive routing (least-loaded uplink), rail-aligned placement (and NCCL's PXN, which moves
# data over NVLink to the GPU on the destination's rail first) — each cutting the slowdown.

# %%
scenarios = {
    "ECMP hash, 1 QP": ecmp_collisions(8, 8),
    "ECMP hash, 4 QPs": ecmp_collisions(8, 8, subflows_per_flow=4),
    "adaptive routing": ecmp_collisions(8, 8, placement="adaptive"),
    "rail-aligned / PXN": ecmp_collisions(8, 8, placement="rail"),
}
for label, result in scenarios.items():
    print(
        f"{label:>19}: idle uplinks {result.idle_share:5.1%}, busiest carries "
        f"{result.busiest_load:.2f} flows, step {result.slowdown:.2f}× slower than ideal"
    )
print(f"balls in bins: (1 - 1/8)^8 = {expected_idle_share(8, 8):.1%} idle expected")
ecmp_figure = go.Figure(
    [
        go.Bar(x=list(scenarios), y=[r.slowdown for r in scenarios.values()], name="slowdown"),
        go.Bar(x=list(scenarios), y=[r.idle_share for r in scenarios.values()], name="idle share"),
    ]
)
ecmp_figure.update_layout(
    title=f"8 elephant flows on 8 uplinks: hashing leaves {scenarios['ECMP hash, 1 QP'].idle_share:.0%} "
    f"idle and the busiest carries {scenarios['ECMP hash, 1 QP'].busiest_load:.1f} flows",
    barmode="group",
    yaxis={"title": "slowdown (×) / idle share"},
)
dtlab.viz.describe(
    ecmp_figure,
    caption="Hashing few large flows onto many uplinks collides: some links idle while the busiest "
    "carries several flows; more queue pairs spread the load, adaptive routing and rails level it.",
)

# %% [markdown]
# **Two levels.** A collective across nodes runs one collective per level: an all-gather of
# `M` moves `(k-1)/k · M/g` through each NIC (its rail's share) and `(g-1)/g · M` over NVLink.
# One level after the other costs the sum; streamed in segments the slower level paces the
# pipeline and the cost tends to the **maximum**. Which level is slower depends on the node
# count: the network's share `(k-1)/k` grows with `k`, NVLink's does not. Look for: NVLink
# limiting at 2 nodes, the network at 32, and the crossover at 5 nodes for H100s with a NIC per
# GPU.

# %%
level_nodes = [2, 3, 4, 5, 8, 16, 32]
level_rows = {k: two_level_all_gather(1 << 30, TwoTierCluster(k, 8)) for k in level_nodes}
for k in (2, 32):
    t = level_rows[k]
    print(
        f"{k:>2} nodes, 1 GiB all-gather: NVLink {t.intra_s * 1e3:.2f} ms, network "
        f"{t.inter_s * 1e3:.2f} ms → sequential {t.sequential_s * 1e3:.2f}, pipelined "
        f"{t.pipelined_s * 1e3:.2f} ms; {t.limiting_level} limits"
    )
print("network limits from", nodes_where_network_limits("all_gather", 1 << 30), "nodes on")
level_figure = go.Figure()
level_figure.add_scatter(
    x=level_nodes, y=[level_rows[k].intra_s * 1e3 for k in level_nodes], name="NVLink level"
)
level_figure.add_scatter(
    x=level_nodes, y=[level_rows[k].inter_s * 1e3 for k in level_nodes], name="network level"
)
level_figure.update_layout(
    title="1 GiB all-gather over 8-GPU nodes: the network level overtakes NVLink at "
    f"{nodes_where_network_limits('all_gather', 1 << 30)} nodes",
    xaxis={"type": "log", "title": "nodes"},
    yaxis={"title": "time of the level (ms)"},
)
dtlab.viz.describe(
    level_figure,
    caption="When the two levels pipeline, the step costs the slower level: NVLink at a few nodes, "
    "the network once its share of the bytes grows with the node count.",
)

# %% [markdown]
# **A network checklist.** When a multi-node job is slow or hangs, check the plumbing before the
# algorithm: which network interface the backend uses, whether the host name resolves to
# loopback, the RDMA ports, GPUDirect's `nvidia_peermem`, and `nvidia-smi topo -m`.
# `dtlab doctor --network` runs these checks; each says what it found and what to change, and
# `n/a` where it cannot check on this machine (a laptop has no RDMA NIC or GPU topology to read).

# %%
print(format_report(network_report()))

# %%
ask("nccl.one_shot_crossover")

# %%
ask("nccl.nvls_saves_from")

# %%
ask("hardware.ecmp_idle_share")

# %%
ask("hardware.two_level_limit_nodes")

# %%
ask("hardware.network_checklist_first")

# %% [markdown]
# ## 11. Check your understanding

# %%
ask("collectives.ring_bytes_per_rank")

# %%
ask("collectives.busbw_from_algbw")

# %%
ask("collectives.latency_or_bandwidth")

# %%
ask("collectives.ring_segments_in_flight")

# %%
ask("collectives.hierarchical_speedup")

# %%
ask("hardware.flat_ring_on_rails")

# %%
ask("data_parallel.ring_vs_tree_rounding")

# %%
ask("collectives.nccl_timeout")

# %%
ask("collectives.transport_not_algorithm")

# %% [markdown]
# ## 12. Shut the cluster down

# %%
cluster.close()
