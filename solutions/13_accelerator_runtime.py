# %% [markdown]
# # Lab 13 — The accelerator runtime
#
# Half of a distributed step's time is decided on one device, before any rank talks to another:
# is each kernel waiting on memory or on arithmetic, how many kernels does the step launch, does
# the host stop to wait for the device, and does the memory fit. An interviewer hands over a
# profile and asks what is wrong. This lab answers with measurements, on the machine it runs on
# (this laptop's CPU, or a GPU when the lab runs on one), and says which is which.
#
# One idea at a time:
#
# 1. the roofline of this machine, measured;
# 2. one training step's ops, each placed on it with counted FLOPs and bytes and measured time;
# 3. fusion: the same arithmetic in fewer passes over memory, by hand and by `torch.compile`;
# 4. launch-bound steps: the fixed cost of every op, and what a device graph removes;
# 5. host syncs: every place the step makes the host wait, found on the timeline, and the fix;
# 6. memory: the caching allocator, fragmentation from varying shapes, and a snapshot;
# 7. what would you change? A provided trace to diagnose.

# %%
import dtlab
import dtlab.viz
from dtlab import trace
from dtlab.config import fast_mode
from dtlab.models import GPTConfig
from dtlab.perf.charts import roofline_chart, segments_chart, syncs_chart, time_per_op_chart
from dtlab.perf.fusion import (
    c_compiler,
    compare_step_compiled,
    compile_and_measure,
    compile_break_even_steps,
    rmsnorm_eager,
    rmsnorm_eager_reusing,
    rmsnorm_fewer_passes,
    rmsnorm_fewer_passes_bytes,
    rmsnorm_fused_bytes,
    rmsnorm_unfused_bytes,
)
from dtlab.perf.launch import (
    TinyMLP,
    dispatch_floor,
    graph_report,
    launch_bound_share,
    step_time_by_width,
    time_per_op,
)
from dtlab.perf.memory import allocator_view
from dtlab.perf.op_census import count_ops, place_on_roofline
from dtlab.perf.roofline import best_seconds, datasheet_for, measure_roofline
from dtlab.perf.sample_trace import gpu_idle_us, planted_profile, summarise
from dtlab.perf.syncs import SyncCounter, host_syncs_in_profile, seconds_per_step
from dtlab.perf.workloads import (
    SYNCS,
    gpt_training_step,
    gpt_training_step_compiled,
    gpt_training_step_fixed,
)
from dtlab.quiz import ask, check_exercise

dtlab.viz.setup_notebook()
FAST = fast_mode()

# %% [markdown]
# ## 1. One rank, one device <a id="setup"></a>
#
# Everything in this lab runs on a single rank: the point is what happens *inside* one device.
# The rank computes on its own device (a GPU when the lab runs on one, else this CPU), and
# every function below is handed that device. Look for which device the measurements come
# from: every number in this lab belongs to it.

# %%
cluster = dtlab.Cluster(1, timeout=600.0)


def on_rank(fn, *args):
    """Run ``fn(*args)`` on the rank and return its value."""
    return cluster.run(fn, *args)[0]


CONFIG = GPTConfig(
    vocab_size=256,
    seq_len=64 if FAST else 256,
    d_model=64 if FAST else 256,
    n_layers=2 if FAST else 4,
    n_heads=4,
    d_ff=256 if FAST else 1024,
    dropout=0.0,
)
BATCH = 4 if FAST else 8
print(f"one rank on {cluster.device_type}; lab GPT: {CONFIG}, batch {BATCH}")

# %% [markdown]
# ## 2. The roofline of this machine <a id="roofline"></a>
#
# An op that does `F` FLOPs and moves `Q` bytes has **arithmetic intensity** `I = F / Q`. The
# chip cannot run it faster than `min(peak FLOP/s, I × bandwidth)` (Williams, Waterman &
# Patterson, 2009). Below the **ridge point** `peak / bandwidth` it waits on memory; above, on
# arithmetic.
#
# Both roofs are measured, not read off a datasheet: the peak is the best FLOP/s of a square
# matmul sweep (`2n³` FLOPs each), the bandwidth a streaming copy of a buffer far larger than
# the caches (`2 × bytes`: read and write). On an H100 or H200 the vendor's figures are printed
# beside them. Look for the ridge point: the FLOP per byte an op needs to use the arithmetic.


# %%
def measure_this_device(fast):
    return measure_roofline(dtlab.device(), fast=fast)


ROOF = on_rank(measure_this_device, FAST)
for n, flops in ROOF.gemm_points:
    print(f"matmul {n:>5} × {n:<5}: {flops / 1e9:8.1f} GFLOP/s (measured, 2n³ / time)")
print(
    f"\npeak {ROOF.peak_flops / 1e9:.1f} GFLOP/s, copy bandwidth {ROOF.bandwidth / 1e9:.1f} GB/s "
    f"(measured) → ridge point {ROOF.ridge:.1f} FLOP/byte"
)
SHEET = datasheet_for(ROOF.device)
if SHEET is not None:
    print(
        f"datasheet {SHEET.name}: {SHEET.bf16_dense_flops / 1e12:.0f} TFLOP/s dense BF16, "
        f"{SHEET.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s → ridge "
        f"{SHEET.bf16_dense_flops / SHEET.hbm_bandwidth_bytes_per_s:.0f} FLOP/byte"
    )

# %% [markdown]
# ## 3. One training step on the roofline <a id="profile"></a>
#
# One forward, backward and optimizer step of the lab GPT, twice: once under a dispatcher hook
# that counts every ATen op's FLOPs (PyTorch's `FlopCounterMode`) and bytes (each tensor read
# once, each result written once, views free), once under `torch.profiler` for each op's
# measured self time. Look for the ops that take the time: where they sit against the ridge
# point, and how much of the step is memory-bound.


# %%
def profile_one_step(config, batch, roof, steps):
    step = gpt_training_step(config, batch, dtlab.device())
    return place_on_roofline(step, roof, steps=steps, device=dtlab.device())


PLACED = on_rank(profile_one_step, CONFIG, BATCH, ROOF, 2 if FAST else 5)
total = sum(p.seconds for p in PLACED)
print(f"{'op':<28}{'calls':>6}{'MFLOP':>10}{'MB':>9}{'FLOP/B':>8}{'ms':>9}  bound")
for p in PLACED[:14]:
    print(
        f"{p.name:<28}{p.calls:>6}{p.flops / 1e6:>10.2f}{p.nbytes / 1e6:>9.2f}"
        f"{p.intensity:>8.2f}{p.seconds * 1e3:>9.3f}  {p.bound}"
    )
memory_time = sum(p.seconds for p in PLACED if p.bound == "memory")
print(
    f"\nmemory-bound ops: {memory_time / total:.0%} of the profiled op time ({total * 1e3:.1f} ms)"
)

# %%
roofline_chart(ROOF, PLACED, SHEET)

# %% [markdown]
# The matmuls (`mm`, `addmm`, `bmm`) are the only ops with counted FLOPs; everything else —
# softmax, GELU, LayerNorm, the adds, the optimizer's updates — does a few FLOPs per element
# and is memory-bound on any machine. A small model's matmuls can fall below the ridge too: an
# `m × k` by `k × n` product has intensity `2mkn / (e·(mk + kn + mn))`, which grows with the
# smallest dimension.
#
# ### Exercise: an op on the roofline <a id="exercise-bound"></a>
#
# Write `intensity_and_bound(op, dims, bytes_per_element, peak_flops, bandwidth)` returning
# `(intensity, bound)`: FLOP per byte and `"memory"` or `"compute"`. The cost model is the one
# the census uses — each input read once, the output written once:
#
# - `matmul` `{m, k, n}`: `2mkn` FLOPs;
# - `add` `{n}`: `n` FLOPs, two inputs; `gelu` `{n}`: `n` FLOPs, one input;
# - `bias_gelu` `{rows, cols}` (fused): `2·rows·cols` FLOPs; the input and a `cols` bias read.
#
# The grader tries ten ops on a CPU-like machine and on an H100, in FP32 and BF16, including a
# decode-time matmul (`m = 1`). Calling the library's `op_cost` or `intensity_and_bound` is
# refused.


# %%
def intensity_and_bound(op, dims, bytes_per_element, peak_flops, bandwidth):
    # BEGIN SOLUTION
    e = bytes_per_element
    if op == "matmul":
        m, k, n = dims["m"], dims["k"], dims["n"]
        flops, nbytes = 2 * m * k * n, (m * k + k * n + m * n) * e
    elif op == "add":
        flops, nbytes = dims["n"], 3 * dims["n"] * e
    elif op == "gelu":
        flops, nbytes = dims["n"], 2 * dims["n"] * e
    else:
        rows, cols = dims["rows"], dims["cols"]
        flops, nbytes = 2 * rows * cols, (2 * rows * cols + cols) * e
    intensity = flops / nbytes
    return intensity, "memory" if intensity < peak_flops / bandwidth else "compute"
    # END SOLUTION


# %%
check_exercise("runtime.intensity_and_bound", intensity_and_bound, cluster)

# %% [markdown]
# ## 4. Fusion <a id="fusion"></a>
#
# RMSNorm, `y = x · rsqrt(mean(x²) + ε) · w`, in eager PyTorch is six kernels (`pow`, `mean`,
# `add`, `rsqrt`, `mul`, `mul`), each reading its input from memory and writing its output
# back: about `7·r·c` elements of traffic for an `r × c` input. A fused kernel reads `x` once
# and writes `y` once: `2·r·c`. Every piece is memory-bound, so the roofline predicts the fused
# form takes about `2/7` of the time.
#
# Three forms run on the rank: eager; eager with its buffers kept from call to call (the same
# ops and bytes, but no fresh memory per call); and **fewer passes by hand**, as far as PyTorch's
# own kernels allow: `torch.linalg.vector_norm` sums `x²` in one reduction pass without writing
# `x²`, and the two multiplies share one output buffer (`5·r·c`). Only a generated kernel gets
# to `2·r·c` — that is what `torch.compile` is for, and the next cell compiles a whole training
# step. Look for the counted bytes against each formula, and each form's measured time against
# its roofline floor.


# %%
def fusion_on_rank(rows, cols, repeats, compile_rows):
    import torch

    device = dtlab.device()
    x, w = torch.randn(rows, cols, device=device), torch.randn(cols, device=device)
    work = {}
    forms = {
        "eager": lambda: rmsnorm_eager(x, w),
        "eager, kept buffers": lambda: rmsnorm_eager_reusing(x, w, work=work),
        "fewer passes": lambda: rmsnorm_fewer_passes(x, w),
    }
    for form in forms.values():
        form()  # the kept buffers are allocated here, outside the count
    census = {name: count_ops(form) for name, form in forms.items()}
    counted = {name: sum(op.nbytes for op in ops.values()) for name, ops in census.items()}
    times = {name: best_seconds(form, device, repeats) for name, form in forms.items()}
    compiled = None
    if compile_rows:  # full mode only: fast mode compiles the whole step below instead
        small = torch.randn(compile_rows, cols, device=device)
        compiled = compile_and_measure(rmsnorm_eager, small, w)
    return counted, times, compiled


ROWS, COLS = (2048, 2048) if FAST else (8192, 4096)
counted, times, compiled = on_rank(
    fusion_on_rank, ROWS, COLS, 3 if FAST else 5, 0 if FAST else ROWS
)
formula = {
    "eager": rmsnorm_unfused_bytes(ROWS, COLS, 4),
    "eager, kept buffers": rmsnorm_unfused_bytes(ROWS, COLS, 4),
    "fewer passes": rmsnorm_fewer_passes_bytes(ROWS, COLS, 4),
}
fused = rmsnorm_fused_bytes(ROWS, COLS, 4)
print(f"RMSNorm of {ROWS} × {COLS} fp32 ({ROWS * COLS * 4 / 2**20:.0f} MiB input):")
for name, seconds in times.items():
    floor = ROOF.predicted_seconds(0, counted[name])
    print(
        f"  {name:<20} {counted[name] / 1e6:6.1f} MB counted (formula {formula[name] / 1e6:6.1f}); "
        f"{seconds * 1e3:7.2f} ms measured, roofline floor {floor * 1e3:.2f} ms"
    )
print(
    f"  fully fused: {fused / 1e6:.1f} MB predicted by the formula (2rc + c)·4 — not measured; "
    f"floor {ROOF.predicted_seconds(0, fused) * 1e3:.2f} ms"
)
ratio = times["fewer passes"] / times["eager, kept buffers"]
print(
    f"  measured time ratio fewer passes / eager with kept buffers: {ratio:.2f} "
    f"(bytes ratio {counted['fewer passes'] / counted['eager, kept buffers']:.2f})"
)
if compiled is not None and compiled.ok:
    print(
        f"torch.compile(rmsnorm_eager): cold start {compiled.cold_start_s:.1f} s (measured), "
        f"{compiled.kernels} generated kernel(s) {list(compiled.kernel_names)}; warm call "
        f"{compiled.warm_call_s * 1e3:.2f} ms (measured)"
    )

# %% [markdown]
# Read the times together, and trust only what they show. Plain eager can be slower than its
# bytes predict on a CPU because each multi-MiB temporary is fresh memory that the system
# allocator maps and faults in on every call — a cost of *allocation*, not of bytes, which a
# caching allocator (section 7) removes; keeping the buffers shows how much of it there was.
#
# Then compare the measured time ratio (fewer passes ÷ eager with kept buffers) with the bytes
# ratio. If they agree, both forms run at the speed of their bytes and the roofline explains the
# saving. If the time ratio is much smaller, some eager kernel is slower than its bytes — profile
# it op by op as in section 3 before crediting fusion. If it is larger, the machine is busy or
# the data sat in cache. A time *below* its floor means the data never left the cache: the floor
# uses the DRAM copy bandwidth, and a fast-mode input of 16 MiB fits a large last-level cache. On
# busy cores the times move from run to run; the counted bytes do not.
#
# Now a whole training step of a tiny lab GPT (one layer), eager against `torch.compile`. The
# compiled step's blocks, head and loss become two graphs (forward and backward) of generated
# kernels; the embedding stays eager, because on a CPU the model reads its positions with
# `int(...)` — a host read that would split the graph (section 6). Look for the ATen ops the
# profiler sees per step, the kernels Inductor generated instead, the measured step times, and
# the cold start: it is paid once per shape, before the first step. The compiled step's bytes
# are not measured here (the census cannot see inside a generated kernel).


# %%
TINY = GPTConfig(
    vocab_size=256, seq_len=32, d_model=32, n_layers=1, n_heads=2, d_ff=64, dropout=0.0
)


def compile_step_on_rank(config, batch):
    device = dtlab.device()
    eager_bytes = sum(
        op.nbytes for op in count_ops(gpt_training_step(config, batch, device)).values()
    )
    eager, compiled = (
        gpt_training_step(config, batch, device),
        gpt_training_step_compiled(config, batch, device),
    )
    return eager_bytes, compare_step_compiled(eager, compiled, device)


STEP_CONFIG = TINY if FAST else CONFIG
step_bytes, cmp = on_rank(compile_step_on_rank, STEP_CONFIG, 2 if FAST else BATCH)
print(
    f"eager step: {cmp.eager_aten_ops} ATen ops (profiler), {step_bytes / 1e6:.2f} MB (counted; "
    f"roofline floor {ROOF.predicted_seconds(0, step_bytes) * 1e3:.2f} ms), {cmp.eager_s * 1e3:.2f} ms (measured)"
)
if cmp.ok:
    print(
        f"compiled:   {cmp.compiled_aten_ops} ATen ops (profiler) + {cmp.kernels} kernels in Inductor's "
        f"code over {cmp.graphs} graphs (counted), {cmp.compiled_s * 1e3:.2f} ms (measured)"
    )
    print(f"cold start: {cmp.cold_start_s:.1f} s (measured: the first compiled step, both graphs)")
    steps = compile_break_even_steps(cmp.cold_start_s, cmp.eager_s, cmp.compiled_s)
    if steps < float("inf"):
        print(f"→ pays for its cold start after ≈ {steps:.0f} steps at these times")
    else:
        print("→ never pays for its cold start at these times: the compiled step was not faster")
else:
    print(f"torch.compile failed on this machine: {cmp.error}")
    print(
        f"(C++ compiler found: {c_compiler()}; on a CPU Inductor needs g++ — install it to see this part)"
    )

# %% [markdown]
# The ATen ops left in the compiled step are the eager embedding, the optimizer's updates, the
# matmuls Inductor hands to the library (`extern_kernels`) and autograd's own ops; the blocks'
# pointwise ops and norms run inside the generated kernels. Compare the eager step's measured
# time with the roofline floor of its counted bytes: at this size the bytes explain a small part
# of the step, so whatever time compiling saves is host work — dispatch — more than bytes: the
# launch-bound regime of the next section.
#
# The cold start is the compiler's price (Inductor caches compiled graphs on disk, so a rerun of
# this cell in a new process may start faster): at seconds per new shape, a job whose shapes
# change every step (variable sequence lengths without padding) recompiles — mark such
# dimensions dynamic, or pad to a few bucket sizes. If the compiled step is not faster here, the
# break-even line says so with a negative or huge number: believe the measurement.

# %% [markdown]
# ## 5. Launch-bound steps <a id="launch"></a>
#
# Every eager op pays a fixed host cost before any arithmetic: Python, the dispatcher, autograd
# and, on a GPU, a kernel launch (a few µs). Shrink an op and its time falls until only that cost
# is left. Then shrink a whole model — 24 narrow `Linear → GELU` layers — and its step stops
# getting faster: it is **launch-bound**, and a faster chip would not help. Look for the floor
# on the chart, and for the width below which the step time stops falling.


# %%
def launch_on_rank(widths):
    floor_points = time_per_op((1, 16, 256, 4096, 65536, 1 << 20), dtlab.device())
    return floor_points, step_time_by_width(widths, device=dtlab.device())


WIDTHS = (4, 16, 64, 256) if FAST else (4, 16, 64, 256, 1024)
floor_points, by_width = on_rank(launch_on_rank, WIDTHS)
FLOOR = dispatch_floor(floor_points)
per_op = min(r["per_op_s"] for r in by_width)
print(f"one elementwise op, smallest size: {FLOOR * 1e6:.1f} µs (measured floor)")
for row in by_width:
    print(
        f"width {row['width']:>5}: {row['ops']} ops, {row['seconds'] * 1e3:7.2f} ms per step "
        f"(measured), {row['flops'] / row['seconds'] / 1e9:6.2f} GFLOP/s, "
        f"ops × per-op cost explains {launch_bound_share(row, per_op):.0%}"
    )
print(f"per-op cost inside a training step (module + autograd + dispatch): {per_op * 1e6:.0f} µs")

# %%
time_per_op_chart(floor_points, FLOOR)

# %% [markdown]
# A **device graph** (`CUDAGraph` in PyTorch) records a step's kernels once and replays them
# with one launch: the host cost per op disappears, the kernels still run. On a GPU the next
# cell captures the tiny model's forward and times eager against replay. On a CPU there is no
# graph to capture, so it prints what a graph would remove — the measured forward time minus
# its arithmetic at the measured peak — labelled as the estimate it is.


# %%
def graph_on_rank(peak_flops):
    import torch

    model = TinyMLP(16, 24).to(dtlab.device())
    return graph_report(model, torch.randn(8, 16, device=dtlab.device()), peak_flops)


graph = on_rank(graph_on_rank, ROOF.peak_flops)
print(
    f"tiny forward: {graph['ops']} ops (counted), {graph['eager_s'] * 1e6:.0f} µs eager (measured); "
    f"its arithmetic at the measured peak: {graph['arithmetic_s'] * 1e6:.2f} µs (formula)"
)
if graph["measured"]:
    print(
        f"graph replay {graph['graph_s'] * 1e6:.0f} µs (measured); outputs differ by {graph['max_abs_diff']:.1e}"
    )
print(
    f"a graph would remove ≈ {graph['estimate_s'] * 1e6:.0f} µs of host cost per forward (estimate)"
)

# %% [markdown]
# ## 6. Host syncs on the timeline <a id="syncs"></a>
#
# The host fills the device's queue ahead of it, until it needs a *value*: `.item()`, `.tolist()`
# (MoE split sizes), `print(loss)`, an op whose output shape depends on the data (`nonzero`,
# `x[mask]`). Then it waits for the queue to drain, and the device idles while the host catches
# up.
#
# How dtlab finds them, honestly: on a CPU there is no queue to wait for, so timing cannot show a
# sync. `SyncCounter` finds them by what the code asks for — it intercepts the Python calls that
# read a tensor's data on the host — and puts each on the rank's timeline as a span (`sync:item`,
# `sync:tolist`, …) with the time the call took. On a GPU that time includes the wait; on a CPU
# it is only the read. Look for: the planted step's syncs, and the two reads the model makes on
# a CPU only (its position check, skipped on a GPU because it would be a sync).


# %%
def count_syncs(config, batch, syncs, steps):
    step = gpt_training_step(config, batch, dtlab.device(), syncs=syncs)
    step()  # warm-up, outside the count
    with SyncCounter(dtlab.device()) as counter:
        for i in range(steps):
            with trace.span("step", "compute", step=i):
                step()
    return counter.counts(), [(s.call, s.where, s.seconds) for s in counter.found[:8]]


planted = cluster.run(count_syncs, CONFIG, BATCH, SYNCS, 2)
plain_counts, _ = on_rank(count_syncs, CONFIG, BATCH, (), 2)
counts, first = planted[0]
print(f"planted step, 2 steps: {counts}")
print(f"plain step, 2 steps:   {plain_counts}")
if plain_counts:  # the model checks its positions with int(...), on a CPU only
    print("  ↳ reads the model makes itself: its position check, skipped on a GPU (it would sync)")
for call, where, seconds in first:
    print(f"  sync:{call:<8} at {where:<16} {seconds * 1e6:8.1f} µs")

# %%
syncs_chart(planted.trace)

# %% [markdown]
# The fix for each: keep the loss on the device and read it once every `N` steps; keep split
# sizes as a tensor (or compute them one step ahead and overlap the copy); use a mask
# (`torch.where`) instead of positions; print every `N` steps. The next cell times the two
# steps. On a CPU the difference is only the reads themselves — the cost a sync adds on a GPU is
# the idle queue, which the GPU suite measures.


# %%
def sync_cost(config, batch, steps):
    device = dtlab.device()
    slow = gpt_training_step(config, batch, device, syncs=SYNCS)
    fast = gpt_training_step_fixed(config, batch, device, read_every=10)
    for step in (slow, fast):
        step()
    with SyncCounter(device) as fixed_syncs:
        for _ in range(10):
            fast()
    return (
        seconds_per_step(slow, steps, device),
        seconds_per_step(fast, steps, device),
        fixed_syncs.counts(),
    )


slow_s, fixed_s, fixed_counts = on_rank(sync_cost, CONFIG, BATCH, 3 if FAST else 20)
print(f"with syncs {slow_s * 1e3:.2f} ms/step, fixed {fixed_s * 1e3:.2f} ms/step (measured)")
print(f"fixed step, 10 steps: {fixed_counts} — one loss read per 10 steps (+ the model's check)")

# %% [markdown]
# What the same two steps measured on a GPU (one NVIDIA H200, torch 2.11, `dtlab bench
# runtime-perf --fast`, 27 Nov 2026): **9.80 ms with the 4 syncs, 10.09 ms fixed** — no
# difference. The lab GPT's step is *host-bound* there: the host spends ~18.5 µs launching each
# op while each kernel runs for a few µs, so the queue is empty whenever the host reads a value
# and a sync has nothing to wait for. A sync costs the queue's depth: it matters when the device
# has work queued ahead — a model whose kernels outlast their launches, or a step replayed as one
# captured graph (the same run replayed a small step in 85 µs against 1,370 µs eager) — and that is
# where the GPU suite's test plants one behind a long kernel and measures the wait.

# %% [markdown]
# ### Exercise: find the host syncs in a profile <a id="exercise-syncs"></a>
#
# A profile of a GPU step arrives as a list of events, as `torch.profiler` exports them:
# `cpu_op` events (`aten::…`), the `cuda_runtime` calls made inside them, and the `kernel`
# events on the device, each with `ts` and `dur` in µs and `args`. The one below is generated
# by `dtlab.perf.sample_trace` (a model of a real trace, with planted syncs: this laptop has no
# GPU to record one). Write `find_host_syncs(events)` returning the indices of the `cpu_op`
# events inside which the host waited for the device. Careful: not every copy waits, and not
# every "wait" is the host's. Calling the library's `host_syncs_in_profile` is refused.

# %%
EVENTS, _ = planted_profile(seed=0)
for i, e in enumerate(EVENTS[40:52], start=40):
    print(
        f"{i:>3} {e['cat']:<13} {e['name']:<38} ts {e['ts']:9.1f} dur {e['dur']:7.1f} {e['args']}"
    )


# %%
def find_host_syncs(events):
    # BEGIN SOLUTION
    blocking = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"}
    found = []
    for i, op in enumerate(events):
        if op["cat"] != "cpu_op":
            continue
        end = op["ts"] + op["dur"]
        for call in events:
            if call["cat"] != "cuda_runtime" or not op["ts"] <= call["ts"] <= end:
                continue
            pageable = call["name"] == "cudaMemcpyAsync" and "Pageable" in call["args"].get(
                "kind", ""
            )
            if call["name"] in blocking or call["name"] == "cudaMemcpy" or pageable:
                found.append(i)
                break
    return found
    # END SOLUTION


# %%
check_exercise("runtime.find_host_syncs", find_host_syncs, cluster)

# %% [markdown]
# ## 7. Memory: the caching allocator <a id="memory"></a>
#
# PyTorch's GPU allocator keeps freed blocks for reuse instead of returning them to the driver:
# `memory_reserved` (held from the device) exceeds `memory_allocated` (live tensors). When shapes
# change from step to step — MoE token counts, variable sequence lengths — a larger request fits
# no cached block and reserves a new segment, and free pieces strand in segments that cannot
# merge: **fragmentation**. `expandable_segments:True` grows one segment instead.
#
# The rank runs a forward-and-backward allocation pattern at six token counts and records every
# allocation and free it makes; the chart shows the allocator while the last step's activations
# are still alive. On a GPU the real allocator serves them and its snapshot is drawn below. On a CPU there is no caching allocator (the system `malloc` serves them), so the
# recorded trace is fed to dtlab's **simulated** caching allocator — the chart title says which
# one you are looking at. Look for the red: memory reserved that no tensor uses.


# %%
def memory_on_rank(token_counts, width, layers):
    return allocator_view(token_counts, width, layers, dtlab.device())


TOKENS = [1024, 768, 1280, 512, 1536, 896]
view = on_rank(memory_on_rank, TOKENS, 2048, 3)
sim = view["simulated"]
MiB = 1 << 20
print(f"{view['events']} allocation events recorded on the rank")
print(
    f"simulated: peak allocated {sim['peak_allocated'] / MiB:.0f} MiB, peak reserved "
    f"{sim['peak_reserved'] / MiB:.0f} MiB → {sim['overhead'] / MiB:.0f} MiB held beyond the peak need"
)
grown = view["expandable"]
print(f"simulated with expandable segments: peak reserved {grown['peak_reserved'] / MiB:.0f} MiB")
real = view["real"]
if real is not None:
    print(
        f"real allocator ({real['source']}): reserved {real['reserved'] / MiB:.0f} MiB, allocated {real['allocated'] / MiB:.0f} MiB"
    )
segments_chart(
    real["segments"] if real else sim["segments"],
    real["source"] if real else "simulated caching allocator fed this rank's recorded trace",
)

# %% [markdown]
# ## 8. What would you change? <a id="diagnose"></a>
#
# Another trace from the same generator, of a different model: read it as an interviewer would
# hand it over. Look at how long the kernels are against the host's time per op, how busy the
# device is, and where the host waits. Write down what you would change and in what order, then
# check yourself against the question below it.

# %%
PROVIDED, _ = planted_profile(seed=7, n_ops=60, n_syncs=1, kernel_us=(2, 9))
summary = summarise(PROVIDED)
print(
    f"{summary['kernels']} kernels, mean {summary['mean_kernel_us']:.1f} µs each; the host spends "
    f"{summary['mean_host_us_per_op']:.1f} µs per op"
)
print(
    f"step {summary['step_us']:.0f} µs, device busy {summary['device_busy_share']:.0%}, idle "
    f"{gpu_idle_us(PROVIDED):.0f} µs between kernels"
)
print(
    f"host syncs (dtlab's reader): {[PROVIDED[i]['name'] for i in host_syncs_in_profile(PROVIDED)]}"
)

# %%
ask("runtime.what_to_change")

# %% [markdown]
# ## 9. Check yourself <a id="quiz"></a>

# %%
ask("runtime.ridge_point_h100")

# %%
ask("runtime.decode_matmul_bound")

# %%
ask("runtime.elementwise_time")

# %%
ask("runtime.launch_bound_step")

# %%
ask("runtime.rmsnorm_fusion_speedup")

# %%
ask("runtime.fragmentation_overhead")

# %%
ask("runtime.expandable_segments")

# %%
ask("runtime.mfu_with_attention")

# %%
ask("runtime.compile_break_even")

# %%
ask("runtime.recompiles")

# %%
ask("runtime.which_syncs")

# %%
ask("runtime.sync_idle")

# %%
cluster.close()
