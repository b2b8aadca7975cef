"""Launch- and dispatch-bound steps: the fixed cost every op pays, and what a CUDA graph removes.

Every eager op pays a fixed host cost before any arithmetic: Python → the dispatcher → autograd
→ the kernel (and on a GPU a ``cudaLaunchKernel``, a few µs). Shrink the op and its time falls
until only that cost is left: :func:`time_per_op` sweeps an elementwise add over sizes and the
**floor** (the smallest size's time) is the measured per-op overhead. A training step adds more
per op (the module call, autograd recording the op and running its backward):
:func:`step_time_by_width` shrinks a :class:`TinyMLP` (narrow layers, many of them) until its step
time stops falling — that floor over the ops it dispatches is the per-op cost *in a step*. Such a
step runs at ``ops × per-op cost`` however fast the chip: it is **launch-bound**, and a faster GPU
does not help.

A **CUDA graph** (``torch.cuda.CUDAGraph``) records a step's kernels once and replays them with
one launch: the per-op host cost disappears (the kernels still run). :func:`graph_replay_seconds`
measures it on a GPU. On a CPU there is no graph to capture; what one would remove is the
measured forward time minus its arithmetic at the measured peak — :func:`graph_report`'s
``estimate_s``, a prediction labelled as such.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from dtlab.perf.dispatch import DispatchMode


def _seconds(fn: Callable[[], object], device: torch.device, calls: int) -> float:
    """Mean seconds per call over ``calls`` back-to-back calls, best of three runs."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def time_per_op(
    sizes: tuple[int, ...], device: torch.device | str = "cpu", calls: int = 200
) -> list[tuple[int, float]]:
    """Measured seconds of one ``a + b`` of ``n`` float32 elements, for each ``n``."""
    device = torch.device(device)
    points = []
    for n in sizes:
        a, b = torch.randn(n, device=device), torch.randn(n, device=device)
        points.append(
            (n, _seconds(lambda a=a, b=b: a + b, device, max(5, calls * 64 // max(n, 64))))
        )
    return points


def dispatch_floor(points: list[tuple[int, float]]) -> float:
    """The per-op overhead: the time of the smallest op of a :func:`time_per_op` sweep."""
    return min(points)[1]


class TinyMLP(nn.Module):
    """``depth`` narrow ``Linear → GELU`` layers: little arithmetic, many ops."""

    def __init__(self, width: int = 16, depth: int = 24) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            *[m for _ in range(depth) for m in (nn.Linear(width, width), nn.GELU())]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class _OpCounter(DispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def ops_per_call(fn: Callable[[], object]) -> int:
    """How many ATen ops ``fn`` dispatches (counted, forward and backward)."""
    with _OpCounter() as counter:
        fn()
    return counter.ops


def _training_step(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    return step


def step_time_by_width(
    widths: tuple[int, ...],
    depth: int = 24,
    batch: int = 8,
    calls: int = 10,
    device: torch.device | str = "cpu",
) -> list[dict[str, float]]:
    """A :class:`TinyMLP` training step (forward + backward) at each width: the ops it
    dispatches (counted), its measured time, and the time per op. As the width shrinks the time
    stops falling: the step is then all per-op overhead (module call, autograd, dispatch)."""
    rows = []
    for width in widths:
        model = TinyMLP(width, depth).to(device)
        step = _training_step(model, torch.randn(batch, width, device=device))
        ops = ops_per_call(step)
        seconds = _seconds(step, torch.device(device), calls)
        flops = 6 * batch * width * width * depth  # 2 forward + 4 backward per weight
        rows.append({"width": width, "ops": ops, "seconds": seconds,
                     "per_op_s": seconds / ops, "flops": flops})  # fmt: skip
    return rows


def launch_bound_step_seconds(ops: int, per_op_s: float, device_s: float) -> float:
    """A step's time when the host issues ``ops`` ops at ``per_op_s`` each and the device needs
    ``device_s`` for their kernels: the longer of the two. The host queues work asynchronously and
    runs ahead of the device only while it is the faster one; when ``ops × per_op_s`` is longer,
    the device waits on the host and the step is launch-bound."""
    return max(ops * per_op_s, device_s)


def launch_bound_share(row: dict[str, float], floor_per_op_s: float) -> float:
    """Share of a step's measured time that its ops' fixed cost explains: ``ops × floor / t``."""
    return min(1.0, row["ops"] * floor_per_op_s / row["seconds"])


def graph_replay_seconds(model: nn.Module, x: torch.Tensor, calls: int = 50) -> dict[str, float]:
    """On a GPU: eager forward vs the same forward captured in a CUDA graph and replayed."""
    if x.device.type != "cuda":
        raise RuntimeError(
            "CUDA graphs need a CUDA device; on a CPU graph_report gives the estimate"
        )
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(3):  # warm up on a side stream, as the CUDA-graph docs require
            model(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_y = model(static_x)
    with torch.no_grad():
        eager = _seconds(lambda: model(static_x), x.device, calls)
        want = model(static_x)
    replay = _seconds(graph.replay, x.device, calls)
    return {
        "eager_s": eager,
        "graph_s": replay,
        "max_abs_diff": float((static_y - want).abs().max()),
    }


def graph_report(model: TinyMLP, x: torch.Tensor, peak_flops: float) -> dict:
    """What a device graph does to a :class:`TinyMLP` forward.

    Always measured: the eager forward's time and the ops it dispatches (counted). The
    arithmetic's share is the formula ``2·batch·width²·depth / peak_flops``; everything above it
    is per-op host cost, which is what a graph removes — ``estimate_s``, labelled an estimate.
    On a GPU the graph is also captured and replayed (``graph_s``, measured, ``measured=True``).
    """
    first = model.layers[0]
    flops = 2 * x.shape[0] * first.in_features * first.out_features * (len(model.layers) // 2)
    with torch.no_grad():
        ops = ops_per_call(lambda: model(x))
        eager = _seconds(lambda: model(x), x.device, 20)
    arithmetic = flops / peak_flops
    report = {"measured": False, "ops": ops, "eager_s": eager, "arithmetic_s": arithmetic,
              "estimate_s": max(0.0, eager - arithmetic)}  # fmt: skip
    if x.device.type == "cuda":
        report |= {"measured": True, **graph_replay_seconds(model, x)}
    return report
